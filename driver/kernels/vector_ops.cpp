// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/vector_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "isa/assembler.h"

namespace tpu::driver {
namespace detail {

/// Where the body finds its operands: slot areas relative to s19 and fixed areas.
struct Layout {
    uint32_t tile_units = 0;         ///< units (elements or rows) per tile
    uint64_t slot_bytes = 0;         ///< one of the two tile slots
    std::vector<uint64_t> area_off;  ///< per slot area, bytes from the slot base
    std::vector<uint64_t> fixed_at;  ///< per fixed area, absolute VMEM address
    uint64_t end = 0;                ///< VMEM bytes used
};

std::string Body::a(int k) const {
    return fmt::format("[s19+{}]", m_l.area_off[k]);
}
std::string Body::at(const std::string& slot, int k) const {
    return fmt::format("[{}+{}]", slot, m_l.area_off[k]);
}
std::string Body::slot(int which, int k) const {
    return fmt::format("[{}]", uint64_t(which) * m_l.slot_bytes + m_l.area_off[k]);
}
std::string Body::f(int k) const {
    return fmt::format("[{}]", m_l.fixed_at[k]);
}
uint64_t Body::off(int k) const {
    return m_l.area_off[k];
}
uint64_t Body::fixed_addr(int k) const {
    return m_l.fixed_at[k];
}
uint32_t Body::tile_units() const {
    return m_l.tile_units;
}
void Body::vpu(const std::string& ins) {
    line(ins + ", f2");
    line("        add s26, s26, 1");
}
std::string Body::label(const std::string& name) const {
    return name + "_" + m_tag;
}
void Body::line(const std::string& text) {
    m_s += text;
    m_s += '\n';
}

uint32_t f32_bits(float x) {
    return std::bit_cast<uint32_t>(x);
}

}  // namespace detail

namespace {

using detail::Body;
using detail::FixedIo;
using detail::Layout;
using detail::Spec;
using detail::Stream;

/// Values of the widest stream per tile: large enough that the DMA's fixed latency is small
/// against the transfer, small enough that a 70 000-value tensor still runs as a pipeline.
constexpr uint32_t kMaxTileValues = 32768;
/// Alignment of tile slots and fixed areas in VMEM.
constexpr uint64_t kVmemAlign = 256;

uint64_t round_up(uint64_t x, uint64_t m) {
    return (x + m - 1) / m * m;
}

uint32_t bits(float x) {
    return std::bit_cast<uint32_t>(x);
}

Layout plan(const Spec& sp, uint64_t vmem_bytes) {
    Layout l;
    uint64_t fixed_bytes = 0;
    for (uint32_t v : sp.fixed) fixed_bytes += round_up(uint64_t(v) * 4, kVmemAlign);
    uint64_t unit_bytes = 0;
    uint32_t widest = 1;
    for (uint32_t v : sp.areas) {
        unit_bytes += uint64_t(v) * 4;
        widest = std::max(widest, v);
    }
    auto slot_of = [&](uint64_t units, std::vector<uint64_t>* off) {
        uint64_t at = 0;
        for (uint32_t v : sp.areas) {
            if (off) off->push_back(at);
            at += round_up(units * v * 4, kVmemAlign);
        }
        return at;
    };
    // Two slots of one unit each plus the fixed areas.
    const uint64_t min_need = 2 * slot_of(1, nullptr) + fixed_bytes;
    if (min_need > vmem_bytes)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: a row of {} values needs {} bytes of VMEM in two tile "
                                      "slots; the core has {}",
                                      sp.name, widest, min_need, vmem_bytes));
    // Each area rounds up by less than the alignment, so this many units always fit.
    const uint64_t fit =
        ((vmem_bytes - fixed_bytes) / 2 - sp.areas.size() * kVmemAlign) / unit_bytes;
    uint64_t t = std::min<uint64_t>(
        {sp.units, std::max<uint64_t>(1, kMaxTileValues / widest), std::max<uint64_t>(1, fit)});
    if (sp.max_tile_units) t = std::min(t, sp.max_tile_units);
    l.tile_units = static_cast<uint32_t>(t);
    l.slot_bytes = slot_of(t, &l.area_off);
    uint64_t at = 2 * l.slot_bytes;
    for (uint32_t v : sp.fixed) {
        l.fixed_at.push_back(at);
        at += round_up(uint64_t(v) * 4, kVmemAlign);
    }
    l.end = at;
    return l;
}

isa::Program build(const Spec& sp, const Layout& l) {
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    Body body(s, l);
    const uint64_t U = sp.units, T = l.tile_units, tiles = (U + T - 1) / T;
    const size_t NI = sp.ins.size(), NO = sp.outs.size();
    // Per-slot flags: a banked HBM can finish a DMA before an earlier one, so a count over
    // both slots would not prove that this slot's transfers are done.
    const char* ld[2] = {"f1", "f8"};
    const char* st[2] = {"f3", "f9"};
    L("# {}: {} units, {} per tile, two slots of {} bytes at 0 and {}", sp.name, U, T, l.slot_bytes,
      l.slot_bytes);
    L("# s16 tile i, s17/s18/s19 its first unit, units and slot; s20/s21/s22 tile i+1;");
    L("# s23/s24/s25 tile i-1; s26 VPU ops issued; s29/s30 stores/loads to wait for.");
    L("# Flags: f1/f8 loads and f3/f9 stores of slot 0/1, f2 VPU, f4 fixed loads, f10 fixed");
    L("# stores. The loop is unrolled twice so that tile i (slot i & 1) uses fixed flags.");
    // One dma per stream: HBM address = base + first unit * per * 4, one row of units * per * 4.
    auto transfer = [&](const std::vector<Stream>& streams, bool in, const char* off,
                        const char* len, const char* slot, const char* flag) {
        for (const Stream& st : streams) {
            if (st.dma) {
                st.dma(body, off, len, slot, flag);
                continue;
            }
            const uint64_t per_bytes = uint64_t(sp.areas[st.area]) * 4;
            L("        mul s13, {}, {}", off, per_bytes);
            L("        add s13, s13, s{}", st.arg);
            L("        mul s14, {}, {}", len, per_bytes);
            if (in)
                L("        dma.hv [{}+{}], [s13], 1, s14, s14, s14, {}", slot, l.area_off[st.area],
                  flag);
            else
                L("        dma.vh [s13], [{}+{}], 1, s14, s14, s14, {}", slot, l.area_off[st.area],
                  flag);
        }
    };
    for (int r : {16, 17, 19, 26}) L("        li s{}, 0", r);
    L("        li s18, {}", std::min(U, T));
    if (sp.prologue) sp.prologue(body);
    for (const FixedIo& io : sp.fixed_ins) {
        const uint64_t b = uint64_t(sp.fixed[io.fixed]) * 4;
        L("        dma.hv [{}], [s{}], 1, {}, {}, {}, f4", l.fixed_at[io.fixed], io.arg, b, b, b);
    }
    transfer(sp.ins, true, "s17", "s18", "s19", ld[0]);
    if (!sp.fixed_ins.empty()) L("        wait f4, {}", sp.fixed_ins.size());
    for (int p = 0; p < 2; ++p) {
        body.set_tag(std::to_string(p));
        // (1) Store tile i-1 once its VPU work is done; that also frees its slot for tile i+1.
        L("loop_{}:", p);
        if (p == 0) L("        beq s16, 0, first_0");
        L("        wait f2, s26");
        transfer(sp.outs, false, "s23", "s24", "s25", st[1 - p]);
        // (2) Prefetch tile i+1 into the other slot while the VPU works on tile i.
        L("first_{}: add s20, s17, s18", p);
        L("        bge s20, {}, compute_{}", U, p);
        L("        sub s21, {}, s20", U);
        L("        bltu s21, {}, ragged_{}", T, p);
        L("        li s21, {}", T);
        L("ragged_{}: xor s22, s19, {}", p, l.slot_bytes);
        transfer(sp.ins, true, "s20", "s21", "s22", ld[1 - p]);
        // (3) Tile i's inputs are in (this slot has had i / 2 + 1 tiles loaded), and the stores
        // of tile i-2 (same slot, i / 2 tiles stored) have read its outputs.
        L("compute_{}: shr s30, s16, 1", p);
        L("        mul s29, s30, {}", NO);
        L("        add s30, s30, 1");
        L("        mul s30, s30, {}", NI);
        L("        wait {}, s30", ld[p]);
        L("        wait {}, s29", st[p]);
        sp.body(body);
        // (4) Rotate: i-1 <- i <- i+1.
        L("        add s23, s17, 0");
        L("        add s24, s18, 0");
        L("        add s25, s19, 0");
        L("        add s17, s20, 0");
        L("        add s18, s21, 0");
        L("        add s19, s22, 0");
        L("        add s16, s16, 1");
        L("        bltu s17, {}, loop_{}", U, 1 - p);
        if (p == 0) L("        jmp done");
    }
    // (5) Store the last tile and the fixed results, then wait for every store.
    L("done:   wait f2, s26");
    transfer(sp.outs, false, "s23", "s24", "s25", st[(tiles - 1) & 1]);
    for (const FixedIo& io : sp.fixed_outs) {
        const uint64_t b = uint64_t(sp.fixed[io.fixed]) * 4;
        L("        dma.vh [s{}], [{}], 1, {}, {}, {}, f10", io.arg, l.fixed_at[io.fixed], b, b, b);
    }
    if (NO) {
        L("        wait f3, {}", NO * ((tiles + 1) / 2));
        if (tiles > 1) L("        wait f9, {}", NO * (tiles / 2));
    }
    if (!sp.fixed_outs.empty()) L("        wait f10, {}", sp.fixed_outs.size());
    if (sp.epilogue) sp.epilogue(body);
    L("        halt");
    return isa::assemble(s, sp.name + ".s");
}

/// A buffer argument and the fp32 values the shape needs in it.
struct Arg {
    const Buffer* buf;
    const char* label;
    uint64_t values;
};

/// Checks the arguments (one core, large enough, addressable) and returns their core.
uint32_t check_args(const std::string& name, const std::vector<Arg>& args) {
    const uint32_t core = args.front().buf->core;
    for (const Arg& a : args) {
        if (a.buf->core != core)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: {} is on core {} but {} is on core {}; all buffers "
                                          "must be on one core",
                                          name, a.label, a.buf->core, args.front().label, core));
        const uint64_t need = a.values * 4;
        if (a.buf->bytes < need)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: {} holds {} bytes; {} fp32 values need {}", name,
                                          a.label, a.buf->bytes, a.values, need));
        // As lengths: an address near 2^64 plus the need wraps to a small end.
        if (a.buf->addr > kHbmWindowBytes || need > kHbmWindowBytes - a.buf->addr)
            throw DeviceError(
                ErrorKind::Usage,
                fmt::format("{}: {} ends past the 4 GiB of HBM a kernel addresses", name, a.label));
    }
    return core;
}

void check_shape(const std::string& name, uint64_t rows, uint64_t cols) {
    if (rows == 0 || cols == 0)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: empty shape ({} x {})", name, rows, cols));
}

/// One core: the Buffer kernels.
Event run(Device& dev, ProgramCache& cache, const Spec& sp, uint32_t core,
          std::vector<uint32_t> args) {
    return detail::run(dev, cache, sp, {core}, [&](size_t) { return args; });
}

uint32_t addr(const Buffer& b) {
    return static_cast<uint32_t>(b.addr);
}

/// Elementwise kernels over n values: slot areas of one value per unit.
Spec elementwise(const std::string& name, uint64_t n, int areas) {
    Spec sp;
    sp.name = name;
    sp.units = n;
    sp.areas.assign(areas, 1);
    return sp;
}

Spec binary_spec(const char* name, const char* op, uint64_t n) {
    Spec sp = elementwise(name, n, 3);
    sp.ins = {{1, 0}, {2, 1}};
    sp.outs = {{3, 2}};
    sp.body = [op](Body& b) {
        b.vpu(fmt::format("        {} {}, {}, {}, s18", op, b.a(2), b.a(0), b.a(1)));
    };
    return sp;
}

Event binary(Device& dev, ProgramCache& cache, const char* name, const char* op, const Buffer& a,
             const Buffer& b, const Buffer& out, uint64_t n) {
    check_shape(name, n, 1);
    const uint32_t core = check_args(name, {{&a, "a", n}, {&b, "b", n}, {&out, "out", n}});
    return run(dev, cache, binary_spec(name, op, n), core, {addr(a), addr(b), addr(out)});
}

Spec scale_spec(uint64_t n) {
    Spec sp = elementwise("scale", n, 2);
    sp.ins = {{1, 0}};
    sp.outs = {{2, 1}};
    sp.body = [](Body& b) { b.vpu(fmt::format("        v.muls {}, {}, s3, s18", b.a(1), b.a(0))); };
    return sp;
}

Spec relu_spec(uint64_t n) {
    Spec sp = elementwise("relu", n, 2);
    sp.ins = {{1, 0}};
    sp.outs = {{2, 1}};
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.maxs {}, {}, 0.0, s18", b.a(1), b.a(0)));
    };
    return sp;
}

Spec add_relu_spec(uint64_t n) {
    Spec sp = elementwise("add_relu", n, 3);
    sp.ins = {{1, 0}, {2, 1}};
    sp.outs = {{3, 2}};
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.add {}, {}, {}, s18", b.a(2), b.a(0), b.a(1)));
        b.vpu(fmt::format("        v.maxs {}, {}, 0.0, s18", b.a(2), b.a(2)));
    };
    return sp;
}

Spec relu_grad_spec(uint64_t n) {
    Spec sp = elementwise("relu_grad", n, 5);  // x, dy, zeros, mask, dx
    sp.ins = {{1, 0}, {2, 1}};
    sp.outs = {{3, 4}};
    sp.body = [](Body& b) {
        // x > x is false for every x, NaN included, so this makes +0.0 without a constant in
        // memory; the mask is 1.0 or +0.0 and doubles as the +0.0 operand of the select.
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s18", b.a(2), b.a(0), b.a(0)));
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s18", b.a(3), b.a(0), b.a(2)));
        b.vpu(fmt::format("        v.sel {}, {}, {}, {}, s18", b.a(4), b.a(3), b.a(1), b.a(3)));
    };
    return sp;
}

Spec bias_add_spec(uint32_t rows, uint32_t cols) {
    Spec sp;
    sp.name = "bias_add";
    sp.units = rows;
    sp.areas = {cols, cols};
    sp.fixed = {cols};
    sp.ins = {{1, 0}};
    sp.outs = {{3, 1}};
    sp.fixed_ins = {{2, 0}};
    sp.body = [cols](Body& b) {
        b.vpu(fmt::format("        v.addrow {}, {}, {}, s18, {}", b.a(1), b.a(0), b.f(0), cols));
    };
    return sp;
}

Spec row_sum_spec(uint32_t rows, uint32_t cols) {
    Spec sp;
    sp.name = "row_sum";
    sp.units = rows;
    sp.areas = {cols, 1};
    sp.ins = {{1, 0}};
    sp.outs = {{2, 1}};
    sp.body = [cols](Body& b) {
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(1), b.a(0), cols));
    };
    return sp;
}

/// The col_sum kernel's spec (also used to report its tiling).
Spec col_sum_spec(uint32_t rows, uint32_t cols) {
    Spec sp;
    sp.name = "col_sum";
    sp.units = rows;
    sp.areas = {cols};
    sp.fixed = {cols, cols};  // running sum, tile sum
    sp.ins = {{1, 0}};
    sp.fixed_outs = {{2, 0}};
    sp.body = [cols](Body& b) {
        // The first tile's sum is stored; later tile sums are added to it.
        b.line(fmt::format("        bne s16, 0, {}", b.label("cs_more")));
        b.vpu(fmt::format("        v.csum {}, {}, s18, {}", b.f(0), b.a(0), cols));
        b.line(fmt::format("        jmp {}", b.label("cs_done")));
        b.line(fmt::format("{}: v.csum {}, {}, s18, {}, f2", b.label("cs_more"), b.f(1), b.a(0),
                           cols));
        b.line("        add s26, s26, 1");
        b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.f(0), b.f(0), b.f(1), cols));
        b.line(b.label("cs_done") + ":");
    };
    return sp;
}

Spec softmax_ce_spec(uint32_t rows, uint32_t classes) {
    enum { Lg, Y, Z, E, P, D, M, S, Ls, Lr, Loss };
    Spec sp;
    sp.name = "softmax_cross_entropy";
    sp.units = rows;
    sp.areas = {classes, classes, classes, classes, classes, classes, 1, 1, 1, 1, 1};
    sp.ins = {{1, Lg}, {2, Y}};
    sp.outs = {{3, Loss}, {4, D}};
    sp.body = [classes](Body& b) {
        const uint32_t C = classes;
        b.line(fmt::format("        mul s15, s18, {}", C));
        b.vpu(fmt::format("        v.rmax {}, {}, s18, {}", b.a(M), b.a(Lg), C));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(Z), b.a(Lg), b.a(M), C));
        b.vpu(fmt::format("        v.exp {}, {}, s15", b.a(E), b.a(Z)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(S), b.a(E), C));
        b.vpu(fmt::format("        v.log {}, {}, s18", b.a(Ls), b.a(S)));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(P), b.a(Z), b.a(Ls), C));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(E), b.a(Y), b.a(P)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(Lr), b.a(E), C));
        b.vpu(fmt::format("        v.muls {}, {}, -1.0, s18", b.a(Loss), b.a(Lr)));
        b.vpu(fmt::format("        v.exp {}, {}, s15", b.a(E), b.a(P)));
        b.vpu(fmt::format("        v.sub {}, {}, {}, s15", b.a(D), b.a(E), b.a(Y)));
        b.vpu(fmt::format("        v.muls {}, {}, s5, s15", b.a(D), b.a(D)));
    };
    return sp;
}

Spec sgd_momentum_spec(uint64_t n) {
    enum { W, G, V, T };
    Spec sp = elementwise("sgd_momentum", n, 4);
    sp.ins = {{1, W}, {2, G}, {3, V}};
    sp.outs = {{1, W}, {3, V}};
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.muls {}, {}, s5, s18", b.a(V), b.a(V)));
        b.vpu(fmt::format("        v.add {}, {}, {}, s18", b.a(V), b.a(V), b.a(G)));
        b.vpu(fmt::format("        v.muls {}, {}, s4, s18", b.a(T), b.a(V)));
        b.vpu(fmt::format("        v.sub {}, {}, {}, s18", b.a(W), b.a(W), b.a(T)));
    };
    return sp;
}

Spec adam_spec(uint64_t n) {
    enum { W, G, M, V, T1, T2 };
    Spec sp = elementwise("adam", n, 6);
    sp.ins = {{1, W}, {2, G}, {3, M}, {4, V}};
    sp.outs = {{1, W}, {3, M}, {4, V}};
    // s5 beta1, s6 1 - beta1, s7 beta2, s8 1 - beta2, s9 c2, s10 eps, s11 lr c1.
    // PyTorch divides by sqrt(v_hat) + eps; the VPU has rsqrt but no sqrt or divide, so
    // sqrt(x) = x * rsqrt(x) (selected back to 0 where x = 0, where rsqrt is inf) and
    // 1 / d = rsqrt(d)^2.
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.muls {}, {}, s6, s18", b.a(T1), b.a(G)));
        b.vpu(fmt::format("        v.muls {}, {}, s5, s18", b.a(M), b.a(M)));
        b.vpu(fmt::format("        v.add {}, {}, {}, s18", b.a(M), b.a(M), b.a(T1)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(T2), b.a(G), b.a(G)));
        b.vpu(fmt::format("        v.muls {}, {}, s8, s18", b.a(T2), b.a(T2)));
        b.vpu(fmt::format("        v.muls {}, {}, s7, s18", b.a(V), b.a(V)));
        b.vpu(fmt::format("        v.add {}, {}, {}, s18", b.a(V), b.a(V), b.a(T2)));
        b.vpu(fmt::format("        v.muls {}, {}, s9, s18", b.a(T2), b.a(V)));
        b.vpu(fmt::format("        v.rsqrt {}, {}, s18", b.a(T1), b.a(T2)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(T1), b.a(T2), b.a(T1)));
        b.vpu(fmt::format("        v.sel {}, {}, {}, {}, s18", b.a(T1), b.a(T2), b.a(T1), b.a(T2)));
        b.vpu(fmt::format("        v.adds {}, {}, s10, s18", b.a(T1), b.a(T1)));
        b.vpu(fmt::format("        v.rsqrt {}, {}, s18", b.a(T1), b.a(T1)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(T1), b.a(T1), b.a(T1)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(T1), b.a(M), b.a(T1)));
        b.vpu(fmt::format("        v.muls {}, {}, s11, s18", b.a(T1), b.a(T1)));
        b.vpu(fmt::format("        v.sub {}, {}, {}, s18", b.a(W), b.a(W), b.a(T1)));
    };
    return sp;
}

std::vector<uint32_t> adam_args(const AdamScalars& k) {
    return {bits(k.beta1), bits(k.one_minus_b1), bits(k.beta2), bits(k.one_minus_b2),
            bits(k.c2),    bits(k.eps),          bits(k.lr_c1)};
}

float max0(float x) {
    if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
    return x > 0.0f ? x : 0.0f;
}

std::string cores_text(const std::vector<uint32_t>& cores) {
    return fmt::format("[{}]", fmt::join(cores, ", "));
}

}  // namespace

// ---- detail ---------------------------------------------------------------------------------

namespace detail {

Event run(Device& dev, ProgramCache& cache, const Spec& sp, const std::vector<uint32_t>& cores,
          const ArgsFn& args) {
    const Layout l = plan(sp, dev.config().core.vmem_bytes);
    std::string key = fmt::format("{} units{} tile{}", sp.name, sp.units, l.tile_units);
    for (uint32_t v : sp.areas) key += fmt::format(" {}", v);
    const isa::Program& prog = cache.get(key, [&] { return build(sp, l); });
    return dev.launch(cores, prog, args);
}

Event run(Device& dev, ProgramCache& cache, const Spec& sp,
          const std::vector<const Tensor*>& tensors, const std::vector<uint32_t>& scalars) {
    const Tensor& first = *tensors.front();
    for (const Tensor* t : tensors)
        if (t->bufs.size() != first.cores.size() || t->cores != first.cores)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: tensors on different core sets ({} and {})", sp.name,
                                          cores_text(first.cores), cores_text(t->cores)));
    std::vector<uint32_t> a(tensors.size() + scalars.size());
    return run(dev, cache, sp, first.cores, [&](size_t i) {
        for (size_t k = 0; k < tensors.size(); ++k) a[k] = addr(tensors[k]->bufs[i]);
        std::copy(scalars.begin(), scalars.end(), a.begin() + tensors.size());
        return a;
    });
}

Event merge(const std::vector<Event>& evs) {
    Event e = evs.back();
    e.start_cycle = evs.front().start_cycle;
    e.host_seconds = 0;
    std::fill(e.core_cycles.begin(), e.core_cycles.end(), 0);
    for (const Event& x : evs) {
        e.host_seconds += x.host_seconds;
        for (size_t i = 0; i < e.core_cycles.size() && i < x.core_cycles.size(); ++i)
            e.core_cycles[i] += x.core_cycles[i];
    }
    return e;
}

uint32_t tile_units(const Spec& sp, const hw::BoardConfig& cfg) {
    return plan(sp, cfg.core.vmem_bytes).tile_units;
}

}  // namespace detail

void check_tensor(const Tensor& t, uint32_t rows, uint32_t cols, const Tensor& like,
                  const char* kernel, const char* label) {
    if (t.rows != rows || t.cols != cols || t.cores != like.cores)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: {} is {} x {} on cores {}; expected {} x {} on cores {}",
                                      kernel, label, t.rows, t.cols, cores_text(t.cores), rows,
                                      cols, cores_text(like.cores)));
}

// ---- Buffer kernels --------------------------------------------------------------------------

Event add(Device& dev, ProgramCache& cache, const Buffer& a, const Buffer& b, const Buffer& out,
          uint64_t n) {
    return binary(dev, cache, "add", "v.add", a, b, out, n);
}

Event mul(Device& dev, ProgramCache& cache, const Buffer& a, const Buffer& b, const Buffer& out,
          uint64_t n) {
    return binary(dev, cache, "mul", "v.mul", a, b, out, n);
}

Event scale(Device& dev, ProgramCache& cache, const Buffer& a, float s, const Buffer& out,
            uint64_t n) {
    check_shape("scale", n, 1);
    const uint32_t core = check_args("scale", {{&a, "a", n}, {&out, "out", n}});
    return run(dev, cache, scale_spec(n), core, {addr(a), addr(out), bits(s)});
}

Event relu(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint64_t n) {
    check_shape("relu", n, 1);
    const uint32_t core = check_args("relu", {{&x, "x", n}, {&out, "out", n}});
    return run(dev, cache, relu_spec(n), core, {addr(x), addr(out)});
}

Event relu_grad(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& dy,
                const Buffer& dx, uint64_t n) {
    check_shape("relu_grad", n, 1);
    const uint32_t core = check_args("relu_grad", {{&x, "x", n}, {&dy, "dy", n}, {&dx, "dx", n}});
    return run(dev, cache, relu_grad_spec(n), core, {addr(x), addr(dy), addr(dx)});
}

Event bias_add(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& bias,
               const Buffer& out, uint32_t rows, uint32_t cols) {
    check_shape("bias_add", rows, cols);
    const uint64_t n = uint64_t(rows) * cols;
    const uint32_t core =
        check_args("bias_add", {{&x, "x", n}, {&bias, "bias", cols}, {&out, "out", n}});
    return run(dev, cache, bias_add_spec(rows, cols), core, {addr(x), addr(bias), addr(out)});
}

Event row_sum(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint32_t rows,
              uint32_t cols) {
    check_shape("row_sum", rows, cols);
    const uint32_t core =
        check_args("row_sum", {{&x, "x", uint64_t(rows) * cols}, {&out, "out", rows}});
    return run(dev, cache, row_sum_spec(rows, cols), core, {addr(x), addr(out)});
}

Event col_sum(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint32_t rows,
              uint32_t cols) {
    check_shape("col_sum", rows, cols);
    const uint32_t core =
        check_args("col_sum", {{&x, "x", uint64_t(rows) * cols}, {&out, "out", cols}});
    return run(dev, cache, col_sum_spec(rows, cols), core, {addr(x), addr(out)});
}

uint32_t col_sum_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols) {
    check_shape("col_sum", rows, cols);
    return plan(col_sum_spec(rows, cols), cfg.core.vmem_bytes).tile_units;
}

Event softmax_cross_entropy(Device& dev, ProgramCache& cache, const Buffer& logits,
                            const Buffer& labels_onehot, const Buffer& loss_per_row,
                            const Buffer& dlogits, uint32_t rows, uint32_t classes) {
    const char* name = "softmax_cross_entropy";
    check_shape(name, rows, classes);
    const uint64_t n = uint64_t(rows) * classes;
    const uint32_t core = check_args(name, {{&logits, "logits", n},
                                            {&labels_onehot, "labels_onehot", n},
                                            {&loss_per_row, "loss_per_row", rows},
                                            {&dlogits, "dlogits", n}});
    const float inv_rows = 1.0f / static_cast<float>(rows);
    return run(
        dev, cache, softmax_ce_spec(rows, classes), core,
        {addr(logits), addr(labels_onehot), addr(loss_per_row), addr(dlogits), bits(inv_rows)});
}

Event sgd_momentum(Device& dev, ProgramCache& cache, const Buffer& w, const Buffer& g,
                   const Buffer& v, uint64_t n, float lr, float momentum) {
    check_shape("sgd_momentum", n, 1);
    const uint32_t core = check_args("sgd_momentum", {{&w, "w", n}, {&g, "g", n}, {&v, "v", n}});
    return run(dev, cache, sgd_momentum_spec(n), core,
               {addr(w), addr(g), addr(v), bits(lr), bits(momentum)});
}

AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, uint32_t step) {
    if (step == 0) throw DeviceError(ErrorKind::Usage, "adam: step must be >= 1");
    AdamScalars s;
    s.beta1 = beta1;
    s.one_minus_b1 = 1.0f - beta1;
    s.beta2 = beta2;
    s.one_minus_b2 = 1.0f - beta2;
    s.c2 = static_cast<float>(1.0 / (1.0 - std::pow(double(beta2), double(step))));
    s.eps = eps;
    s.lr_c1 = static_cast<float>(double(lr) / (1.0 - std::pow(double(beta1), double(step))));
    return s;
}

Event adam(Device& dev, ProgramCache& cache, const Buffer& w, const Buffer& g, const Buffer& m,
           const Buffer& v, uint64_t n, float lr, float beta1, float beta2, float eps,
           uint32_t step) {
    check_shape("adam", n, 1);
    const uint32_t core =
        check_args("adam", {{&w, "w", n}, {&g, "g", n}, {&m, "m", n}, {&v, "v", n}});
    std::vector<uint32_t> args = {addr(w), addr(g), addr(m), addr(v)};
    for (uint32_t x : adam_args(adam_scalars(lr, beta1, beta2, eps, step))) args.push_back(x);
    return run(dev, cache, adam_spec(n), core, std::move(args));
}

// ---- Tensor kernels --------------------------------------------------------------------------

Event add(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b, const Tensor& out) {
    check_same(a, b, "add");
    check_same(a, out, "add");
    return detail::run(dev, cache, binary_spec("add", "v.add", a.elements()), {&a, &b, &out});
}

Event mul(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b, const Tensor& out) {
    check_same(a, b, "mul");
    check_same(a, out, "mul");
    return detail::run(dev, cache, binary_spec("mul", "v.mul", a.elements()), {&a, &b, &out});
}

Event scale(Device& dev, ProgramCache& cache, const Tensor& a, float s, const Tensor& out) {
    check_same(a, out, "scale");
    return detail::run(dev, cache, scale_spec(a.elements()), {&a, &out}, {bits(s)});
}

Event relu(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_same(x, out, "relu");
    return detail::run(dev, cache, relu_spec(x.elements()), {&x, &out});
}

Event add_relu(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b,
               const Tensor& out) {
    check_same(a, b, "add_relu");
    check_same(a, out, "add_relu");
    return detail::run(dev, cache, add_relu_spec(a.elements()), {&a, &b, &out});
}

Event relu_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                const Tensor& dx) {
    check_same(x, dy, "relu_grad");
    check_same(x, dx, "relu_grad");
    return detail::run(dev, cache, relu_grad_spec(x.elements()), {&x, &dy, &dx});
}

Event bias_add(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& bias,
               const Tensor& out) {
    check_tensor(bias, 1, x.cols, x, "bias_add", "bias");
    check_same(x, out, "bias_add");
    return detail::run(dev, cache, bias_add_spec(x.rows, x.cols), {&x, &bias, &out});
}

Event row_sum(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_tensor(out, x.rows, 1, x, "row_sum", "out");
    return detail::run(dev, cache, row_sum_spec(x.rows, x.cols), {&x, &out});
}

Event col_sum(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_tensor(out, 1, x.cols, x, "col_sum", "out");
    return detail::run(dev, cache, col_sum_spec(x.rows, x.cols), {&x, &out});
}

Event softmax_cross_entropy(Device& dev, ProgramCache& cache, const Tensor& logits,
                            const Tensor& labels_onehot, const Tensor& loss_per_row,
                            const Tensor& dlogits) {
    const char* name = "softmax_cross_entropy";
    check_same(logits, labels_onehot, name);
    check_same(logits, dlogits, name);
    check_tensor(loss_per_row, logits.rows, 1, logits, name, "loss_per_row");
    const float inv_rows = 1.0f / static_cast<float>(logits.rows);
    return detail::run(dev, cache, softmax_ce_spec(logits.rows, logits.cols),
                       {&logits, &labels_onehot, &loss_per_row, &dlogits}, {bits(inv_rows)});
}

Event sgd_momentum(Device& dev, ProgramCache& cache, const Tensor& w, const Tensor& g,
                   const Tensor& v, float lr, float momentum) {
    check_same(w, g, "sgd_momentum");
    check_same(w, v, "sgd_momentum");
    return detail::run(dev, cache, sgd_momentum_spec(w.elements()), {&w, &g, &v},
                       {bits(lr), bits(momentum)});
}

Event adam(Device& dev, ProgramCache& cache, const Tensor& w, const Tensor& g, const Tensor& m,
           const Tensor& v, float lr, float beta1, float beta2, float eps, uint32_t step) {
    check_same(w, g, "adam");
    check_same(w, m, "adam");
    check_same(w, v, "adam");
    return detail::run(dev, cache, adam_spec(w.elements()), {&w, &g, &m, &v},
                       adam_args(adam_scalars(lr, beta1, beta2, eps, step)));
}

// ---- References ------------------------------------------------------------------------------

std::vector<float> add_reference(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
    return out;
}

std::vector<float> mul_reference(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] * b[i];
    return out;
}

std::vector<float> scale_reference(const std::vector<float>& a, float s) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] * s;
    return out;
}

std::vector<float> relu_reference(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = max0(x[i]);
    return out;
}

std::vector<float> add_relu_reference(const std::vector<float>& a, const std::vector<float>& b) {
    return relu_reference(add_reference(a, b));
}

std::vector<float> relu_grad_reference(const std::vector<float>& x, const std::vector<float>& dy) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return out;
}

std::vector<float> bias_add_reference(const std::vector<float>& x, const std::vector<float>& bias,
                                      uint32_t rows, uint32_t cols) {
    std::vector<float> out(size_t(rows) * cols);
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j) out[r * cols + j] = x[r * cols + j] + bias[j];
    return out;
}

std::vector<float> row_sum_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols) {
    std::vector<float> out(rows);
    for (size_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (size_t j = 0; j < cols; ++j) acc = acc + x[r * cols + j];
        out[r] = acc;
    }
    return out;
}

std::vector<float> col_sum_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                                     uint32_t tile_rows) {
    std::vector<float> out(cols), part(cols);
    for (uint32_t r0 = 0; r0 < rows; r0 += tile_rows) {
        std::fill(part.begin(), part.end(), 0.0f);
        for (size_t r = r0; r < std::min(rows, r0 + tile_rows); ++r)
            for (size_t j = 0; j < cols; ++j) part[j] = part[j] + x[r * cols + j];
        for (size_t j = 0; j < cols; ++j) out[j] = r0 == 0 ? part[j] : out[j] + part[j];
    }
    return out;
}

SoftmaxCeResult softmax_cross_entropy_reference(const std::vector<float>& logits,
                                                const std::vector<float>& labels_onehot,
                                                uint32_t rows, uint32_t classes) {
    SoftmaxCeResult res{std::vector<float>(rows), std::vector<float>(size_t(rows) * classes)};
    const float inv_rows = 1.0f / static_cast<float>(rows);
    std::vector<float> z(classes), lp(classes);
    for (size_t r = 0; r < rows; ++r) {
        const float* l = &logits[r * classes];
        const float* y = &labels_onehot[r * classes];
        float m = -INFINITY;
        for (size_t j = 0; j < classes; ++j)
            m = std::isnan(m) || std::isnan(l[j]) ? std::numeric_limits<float>::quiet_NaN()
                                                  : (m > l[j] ? m : l[j]);
        float s = 0.0f;
        for (size_t j = 0; j < classes; ++j) {
            z[j] = l[j] - m;
            s = s + std::exp(z[j]);
        }
        const float ls = std::log(s);
        float acc = 0.0f;
        for (size_t j = 0; j < classes; ++j) {
            lp[j] = z[j] - ls;
            acc = acc + y[j] * lp[j];
        }
        res.loss[r] = acc * -1.0f;
        for (size_t j = 0; j < classes; ++j)
            res.dlogits[r * classes + j] = (std::exp(lp[j]) - y[j]) * inv_rows;
    }
    return res;
}

void sgd_momentum_reference(std::vector<float>& w, const std::vector<float>& g,
                            std::vector<float>& v, float lr, float momentum) {
    for (size_t i = 0; i < w.size(); ++i) {
        v[i] = v[i] * momentum + g[i];
        w[i] = w[i] - v[i] * lr;
    }
}

void adam_reference(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                    std::vector<float>& v, float lr, float beta1, float beta2, float eps,
                    uint32_t step) {
    const AdamScalars k = adam_scalars(lr, beta1, beta2, eps, step);
    for (size_t i = 0; i < w.size(); ++i) {
        m[i] = m[i] * k.beta1 + g[i] * k.one_minus_b1;
        v[i] = v[i] * k.beta2 + (g[i] * g[i]) * k.one_minus_b2;
        const float vh = v[i] * k.c2;
        const float sq = vh != 0.0f ? vh * (1.0f / std::sqrt(vh)) : vh;
        const float r1 = 1.0f / std::sqrt(sq + k.eps);
        w[i] = w[i] - (m[i] * (r1 * r1)) * k.lr_c1;
    }
}

}  // namespace tpu::driver
