// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the assembly-text pooling kernels as they were before the
// builder (pool.cpp on the text streaming engine of legacy_stream.cpp, both copied here), to
// compare binaries with the builder versions. Deleted once they agree.
#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/pool.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/vector_ops.h"
#include "isa/assembler.h"

namespace tpu::driver::text_pool {
struct Layout;

/// Emits kernel text for one tile. Registers: s16 tile index, s18 units in the tile, s19 slot
/// base; s15 is free for the body (s13-s15 for custom transfers). Flags f5-f7 are free for
/// prologues and epilogues.
class Body {
public:
    Body(std::string& s, const Layout& l) : m_s(s), m_l(l) {}
    /// Slot area k of the current tile.
    std::string a(int k) const;
    /// Slot area k of the slot whose base is in register `slot` (custom transfers).
    std::string at(const std::string& slot, int k) const;
    /// Slot area k of slot 0 or 1, absolute (prologues).
    std::string slot(int which, int k) const;
    /// Fixed area k.
    std::string f(int k) const;
    /// Bytes from a slot base to slot area k (for operands at an offset inside an area).
    uint64_t off(int k) const;
    /// Absolute VMEM address of fixed area k.
    uint64_t fixed_addr(int k) const;
    /// Units per full tile.
    uint32_t tile_units() const;
    /// A VPU instruction of the body: gets completion flag f2 and is counted in s26, which the
    /// loop waits on before reusing the slot or storing results.
    void vpu(const std::string& ins);
    /// Any other line (labels, branches, scalar arithmetic, waits).
    void line(const std::string& text);
    /// A label unique to this copy of the body (the loop is unrolled twice).
    std::string label(const std::string& name) const;
    /// Sets the suffix label() appends.
    void set_tag(std::string tag) { m_tag = std::move(tag); }

private:
    std::string& m_s;
    const Layout& m_l;
    std::string m_tag;
};

/// A custom transfer of one tile: emits exactly one DMA with completion flag `flag`.
/// Arguments: registers holding the tile's first unit, its units and its slot base.
using TransferFn = std::function<void(Body&, const std::string& first, const std::string& units,
                                      const std::string& slot, const std::string& flag)>;

/// An HBM tensor moved tile by tile (`dma` set: a custom transfer instead of a contiguous one).
struct Stream {
    Stream(int arg_reg, int area_index, TransferFn transfer = {})
        : arg(arg_reg), area(area_index), dma(std::move(transfer)) {}
    int arg;         ///< s-register with the HBM address
    int area;        ///< index into Spec::areas
    TransferFn dma;  ///< optional custom transfer
};

/// A tensor loaded once before the loop (or stored once after it) from a fixed VMEM area.
struct FixedIo {
    int arg;    ///< s-register with the HBM address
    int fixed;  ///< index into Spec::fixed
};

/// A streamed kernel: `units` units (elements or rows) of `areas[k]` fp32 values each per slot
/// area, `ins` loaded and `outs` stored per tile, `body` emitting the VPU work of one tile.
struct Spec {
    std::string name;  ///< also the cache key prefix: must name everything the code depends on
    uint64_t units = 0;
    std::vector<uint32_t> areas;  ///< fp32 values per unit of each slot area
    std::vector<uint32_t> fixed;  ///< fp32 values of each fixed area
    std::vector<Stream> ins, outs;
    std::vector<FixedIo> fixed_ins, fixed_outs;
    std::function<void(Body&)> body;
    /// Before any load; must finish its own work on the slots before returning.
    std::function<void(Body&)> prologue;
    /// After every store has completed (flags f5-f7).
    std::function<void(Body&)> epilogue;
    uint64_t max_tile_units = 0;  ///< 0: no limit beyond the VMEM and tile-value bounds
};
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

namespace {

uint32_t addr(const Buffer& b) {
    return static_cast<uint32_t>(b.addr);
}

streaming::Footprint footprint(const Spec& sp) {
    return {sp.name, sp.units, sp.areas, sp.fixed, sp.max_tile_units};
}

/// The tiling of streaming::plan, laid out as streaming::emit lays it out.
Layout plan(const Spec& sp, uint64_t vmem_bytes) {
    const streaming::Footprint fp = footprint(sp);
    Layout l;
    l.tile_units = streaming::plan(fp, vmem_bytes);
    uint64_t at = 0;
    for (uint32_t v : sp.areas) {
        l.area_off.push_back(at);
        at += (uint64_t(l.tile_units) * v * 4 + streaming::kVmemAlign - 1) / streaming::kVmemAlign *
              streaming::kVmemAlign;
    }
    l.slot_bytes = at;
    at = 2 * l.slot_bytes;
    for (uint32_t v : sp.fixed) {
        l.fixed_at.push_back(at);
        at += (uint64_t(v) * 4 + streaming::kVmemAlign - 1) / streaming::kVmemAlign *
              streaming::kVmemAlign;
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



using detail::f32_bits;



/// -inf as an fp32 immediate (the max-pool padding).
constexpr uint32_t kNegInfBits = 0xff800000u;

/// Emits VPU ops of the body on flag f2 and counts them once at the end: large windows issue
/// hundreds of ops per tile, and one counter update per op would double the program.
class VpuOps {
public:
    explicit VpuOps(Body& b) : m_b(b) {}
    VpuOps(const VpuOps&) = delete;
    VpuOps& operator=(const VpuOps&) = delete;
    ~VpuOps() {
        if (m_n) m_b.line(fmt::format("        add s26, s26, {}", m_n));
    }
    /// One VPU instruction.
    void operator()(const std::string& ins) {
        m_b.line(ins + ", f2");
        ++m_n;
    }

private:
    Body& m_b;
    int m_n = 0;
};

/// The layout the kernels use for one padded input row: its Wp = W + 2 pad columns split into
/// `stride` phases, phase r holding padded columns r, r + s, r + 2 s, ... So window column kw of
/// output columns 0..OW-1 is the contiguous run of phase kw mod s starting at column kw div s,
/// and every VPU op streams whole output rows even with stride > 1: the DMA engine does the
/// strided gather, one 2-D transfer per row and phase.
struct Geo {
    uint32_t N, H, W, C, k, s, p, OH, OW;
    uint32_t J;  ///< columns per phase (covers every window and every input column)

    explicit Geo(const PoolShape& sh)
        : N(sh.batch),
          H(sh.height),
          W(sh.width),
          C(sh.channels),
          k(sh.kernel),
          s(sh.stride),
          p(sh.pad),
          OH(sh.out_height()),
          OW(sh.out_width()),
          J(std::max(OW + (k - 1) / s, (W + 2 * p + s - 1) / s)) {}
    /// Values of one output row.
    uint32_t n() const { return OW * C; }
    /// Phases a window reads (kw mod s for kw < k).
    uint32_t window_phases() const { return std::min(s, k); }
    /// Output rows whose windows hold one input row, at most.
    uint32_t windows_per_row() const { return (k + s - 1) / s; }
    /// Bytes of one phase column (C values).
    uint64_t col_bytes() const { return uint64_t(C) * 4; }
    /// The input columns in phase r: phase columns j0 .. j0 + count - 1, input column iw0 first.
    struct Cols {
        uint32_t j0 = 0, count = 0, iw0 = 0;
    };
    Cols cols(uint32_t r) const {
        Cols c;
        c.j0 = p > r ? (p - r + s - 1) / s : 0;
        if (W + p <= r) return c;
        const uint32_t j1 = std::min(J - 1, (W - 1 + p - r) / s);
        if (j1 < c.j0) return c;
        c.count = j1 - c.j0 + 1;
        c.iw0 = c.j0 * s + r - p;
        return c;
    }
    std::string key() const { return fmt::format("{}x{}x{}x{} k{} s{} p{}", N, H, W, C, k, s, p); }
};

/// Sets `values` fp32 at VMEM operand `at` to +0.0 (x > x is false for every x) or, with
/// `neg_inf`, to -inf; one or two VPU ops on flag f5, returned.
int fill(Body& b, const std::string& at, uint64_t values, bool neg_inf) {
    b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", at, at, at, values));
    if (!neg_inf) return 1;
    b.line(fmt::format("        v.adds {}, {}, {:#x}, {}, f5", at, at, kNegInfBits, values));
    return 2;
}

/// Sets s13 to the output row and s14 to the image of the window a stream loads.
using RowPrefix = std::function<void(Body&, const std::string& first)>;

/// A stream that loads phase r of input row oh * s - p + kh of image n into `area`: one strided
/// DMA from HBM (arg `x_arg`) when the row exists, else one VMEM copy of the padding kept in
/// fixed area `pad_fixed`. Either way exactly one transfer signals the flag.
Stream window_row(const Geo& g, int x_arg, const RowPrefix& prefix, uint32_t q, uint32_t kh,
                  uint32_t r, int area, int pad_fixed) {
    return Stream(x_arg, area,
                  [=](Body& b, const std::string& first, const std::string&,
                      const std::string& slot, const std::string& flag) {
                      const Geo::Cols c = g.cols(r);
                      const uint64_t cb = g.col_bytes(), bytes = c.count * cb;
                      const std::string dst = fmt::format("[{}+{}]", slot, b.off(area) + c.j0 * cb);
                      const std::string ok = b.label(fmt::format("row{}_{}_{}", q, kh, r));
                      const std::string done = b.label(fmt::format("rowd{}_{}_{}", q, kh, r));
                      prefix(b, first);
                      b.line(fmt::format("        mul s13, s13, {}", g.s));
                      b.line(fmt::format("        add s13, s13, {}", int64_t(kh) - int64_t(g.p)));
                      // A row above the image wraps to a large unsigned value.
                      b.line(fmt::format("        bltu s13, {}, {}", g.H, ok));
                      b.line(fmt::format("        dma.vv {}, [{}], 1, {}, {}, {}, {}", dst,
                                         b.fixed_addr(pad_fixed), bytes, bytes, bytes, flag));
                      b.line(fmt::format("        jmp {}", done));
                      b.line(fmt::format("{}: mul s14, s14, {}", ok, g.H));
                      b.line("        add s13, s13, s14");
                      b.line(fmt::format("        mul s13, s13, {}", uint64_t(g.W) * cb));
                      b.line(fmt::format("        add s13, s13, s{}", x_arg));
                      b.line(fmt::format("        dma.hv {}, [s13+{}], {}, {}, {}, {}, {}", dst,
                                         uint64_t(c.iw0) * cb, c.count, cb, cb, cb * g.s, flag));
                      b.line(done + ":");
                  });
}

/// Forward kernels: the output row's image and row from the unit index.
RowPrefix forward_prefix(const Geo& g) {
    return [=](Body& b, const std::string& first) {
        b.line(fmt::format("        remu s13, {}, {}", first, g.OH));
        b.line(fmt::format("        divu s14, {}, {}", first, g.OH));
    };
}

/// Backward kernels (a unit is an input row ih): output row (ih + p) div s - q, which wraps
/// to a large value below 0.
RowPrefix backward_prefix(const Geo& g, uint32_t q) {
    return [=](Body& b, const std::string& first) {
        b.line(fmt::format("        remu s13, {}, {}", first, g.H));
        b.line(fmt::format("        add s13, s13, {}", g.p));
        b.line(fmt::format("        divu s13, s13, {}", g.s));
        b.line(fmt::format("        sub s13, s13, {}", q));
        b.line(fmt::format("        divu s14, {}, {}", first, g.H));
    };
}

/// Window areas A[kh * phases + r] of one output row, appended to `sp`; returns the first.
int add_window(Spec& sp, const Geo& g, int x_arg, const RowPrefix& prefix, uint32_t q,
               int pad_fixed) {
    const int first = static_cast<int>(sp.areas.size());
    for (uint32_t kh = 0; kh < g.k; ++kh)
        for (uint32_t r = 0; r < g.window_phases(); ++r) {
            const int area = static_cast<int>(sp.areas.size());
            sp.areas.push_back(g.J * g.C);
            if (g.cols(r).count)
                sp.ins.push_back(window_row(g, x_arg, prefix, q, kh, r, area, pad_fixed));
        }
    return first;
}

/// Operand of window tap (kh, kw) for output columns 0..OW-1.
std::string tap(const Body& b, const Geo& g, int window, uint32_t kh, uint32_t kw) {
    const int area = window + static_cast<int>(kh * g.window_phases() + kw % g.s);
    return fmt::format("[s19+{}]", b.off(area) + uint64_t(kw / g.s) * g.col_bytes());
}

/// out = max (or the sum) of the taps in window order.
void reduce_window(Body& b, VpuOps& v, const Geo& g, int window, const std::string& out,
                   bool is_max) {
    const char* op = is_max ? "v.max" : "v.add";
    const uint32_t n = g.n();
    if (g.k == 1) {
        if (is_max)
            v(fmt::format("        v.maxs {}, {}, {:#x}, {}", out, tap(b, g, window, 0, 0),
                          kNegInfBits, n));
        else
            v(fmt::format("        v.adds {}, {}, -0.0, {}", out, tap(b, g, window, 0, 0), n));
        return;
    }
    v(fmt::format("        {} {}, {}, {}, {}", op, out, tap(b, g, window, 0, 0),
                  tap(b, g, window, 0, 1), n));
    for (uint32_t t = 2; t < g.k * g.k; ++t)
        v(fmt::format("        {} {}, {}, {}, {}", op, out, out,
                      tap(b, g, window, t / g.k, t % g.k), n));
}

/// Prologue: the padding areas of both slots and the fixed areas hold `pad` (and `zero`
/// fixed areas +0.0) before the first load; loads only ever overwrite the input columns.
void fill_prologue(Body& b, const Geo& g, int window, uint32_t windows, int pad_fixed, bool neg_inf,
                   int zero_fixed, uint32_t zero_values) {
    int ops = 0;
    if (pad_fixed >= 0) ops += fill(b, b.f(pad_fixed), uint64_t(g.J) * g.C, neg_inf);
    if (zero_fixed >= 0) ops += fill(b, b.f(zero_fixed), zero_values, false);
    for (int slot = 0; slot < 2; ++slot)
        for (uint32_t a = 0; a < windows * g.k * g.window_phases(); ++a)
            ops +=
                fill(b, b.slot(slot, window + static_cast<int>(a)), uint64_t(g.J) * g.C, neg_inf);
    b.line(fmt::format("        wait f5, {}", ops));
}

float inv_window(const Geo& g) {
    return 1.0f / static_cast<float>(g.k * g.k);
}

Spec pool_spec(const Geo& g, bool is_max) {
    Spec sp;
    sp.name = fmt::format("{} {}", is_max ? "max_pool2d" : "avg_pool2d", g.key());
    sp.units = uint64_t(g.N) * g.OH;
    sp.max_tile_units = 1;
    sp.fixed = {g.J * g.C};
    const int window = add_window(sp, g, 1, forward_prefix(g), 0, 0);
    const int out = static_cast<int>(sp.areas.size());
    sp.areas.push_back(g.n());
    sp.outs = {{2, out}};
    sp.prologue = [=](Body& b) { fill_prologue(b, g, window, 1, 0, is_max, -1, 0); };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        reduce_window(b, v, g, window, b.a(out), is_max);
        if (!is_max && g.k > 1)
            v(fmt::format("        v.muls {}, {}, {}, {}", b.a(out), b.a(out),
                          f32_bits(inv_window(g)), g.n()));
        if (!is_max && g.k == 1)
            v(fmt::format("        v.muls {}, {}, 1.0, {}", b.a(out), b.a(out), g.n()));
    };
    return sp;
}

/// A stream that loads output row (ih + p) div s - q of dy (arg `dy_arg`) into `area` when
/// that window holds input row ih (kernel row (ih + p) mod s + q s < k, output row in range),
/// else zeros from fixed area `zero_fixed`.
Stream dy_row(const Geo& g, int dy_arg, uint32_t q, int area, int zero_fixed) {
    return Stream(dy_arg, area,
                  [=](Body& b, const std::string& first, const std::string&,
                      const std::string& slot, const std::string& flag) {
                      const uint64_t bytes = uint64_t(g.n()) * 4;
                      const std::string dst = b.at(slot, area);
                      const std::string bad = b.label(fmt::format("dyz{}", q));
                      const std::string done = b.label(fmt::format("dyd{}", q));
                      b.line(fmt::format("        remu s13, {}, {}", first, g.H));
                      b.line(fmt::format("        add s13, s13, {}", g.p));
                      b.line(fmt::format("        remu s14, s13, {}", g.s));
                      b.line(fmt::format("        add s14, s14, {}", q * g.s));
                      b.line(fmt::format("        bge s14, {}, {}", g.k, bad));
                      b.line(fmt::format("        divu s13, s13, {}", g.s));
                      b.line(fmt::format("        blt s13, {}, {}", q, bad));
                      b.line(fmt::format("        sub s13, s13, {}", q));
                      b.line(fmt::format("        bge s13, {}, {}", g.OH, bad));
                      b.line(fmt::format("        divu s14, {}, {}", first, g.H));
                      b.line(fmt::format("        mul s14, s14, {}", g.OH));
                      b.line("        add s13, s13, s14");
                      b.line(fmt::format("        mul s13, s13, {}", bytes));
                      b.line(fmt::format("        add s13, s13, s{}", dy_arg));
                      b.line(fmt::format("        dma.hv {}, [s13], 1, {}, {}, {}, {}", dst, bytes,
                                         bytes, bytes, flag));
                      b.line(fmt::format("        jmp {}", done));
                      b.line(fmt::format("{}: dma.vv {}, {}, 1, {}, {}, {}, {}", bad, dst,
                                         b.f(zero_fixed), bytes, bytes, bytes, flag));
                      b.line(done + ":");
                  });
}

/// Backward: phase areas D[r] (r < s) of the dx row, zeroed per tile, and one store per phase
/// with input columns into dx (arg `dx_arg`) with a strided DMA. Returns the first area.
int add_dx_phases(Spec& sp, const Geo& g, int dx_arg) {
    const int first = static_cast<int>(sp.areas.size());
    for (uint32_t r = 0; r < g.s; ++r) {
        const int area = static_cast<int>(sp.areas.size());
        sp.areas.push_back(g.J * g.C);
        const Geo::Cols c = g.cols(r);
        if (!c.count) continue;
        sp.outs.emplace_back(
            dx_arg, area,
            [=](Body& b, const std::string& first_unit, const std::string&, const std::string& slot,
                const std::string& flag) {
                const uint64_t cb = g.col_bytes();
                b.line(fmt::format("        mul s13, {}, {}", first_unit, uint64_t(g.W) * cb));
                b.line(fmt::format("        add s13, s13, s{}", dx_arg));
                b.line(
                    fmt::format("        dma.vh [s13+{}], [{}+{}], {}, {}, {}, "
                                "{}, {}",
                                uint64_t(c.iw0) * cb, slot, b.off(area) + c.j0 * cb, c.count, cb,
                                cb * g.s, cb, flag));
            });
    }
    return first;
}

/// Operand of phase area D[kw mod s] at the column where window column kw of output column 0
/// lands.
std::string dx_at(const Body& b, const Geo& g, int phases, uint32_t kw) {
    return fmt::format("[s19+{}]", b.off(phases + static_cast<int>(kw % g.s)) +
                                       uint64_t(kw / g.s) * g.col_bytes());
}

void zero_phases(Body& b, VpuOps& v, const Geo& g, int phases) {
    for (uint32_t r = 0; r < g.s; ++r) {
        const std::string d = b.a(phases + static_cast<int>(r));
        v(fmt::format("        v.cmpgt {}, {}, {}, {}", d, d, d, uint64_t(g.J) * g.C));
    }
}

Spec avg_grad_spec(const Geo& g) {
    Spec sp;
    sp.name = fmt::format("avg_pool2d_grad {}", g.key());
    sp.units = uint64_t(g.N) * g.H;
    sp.max_tile_units = 1;
    sp.fixed = {g.n()};
    const uint32_t Q = g.windows_per_row();
    for (uint32_t q = 0; q < Q; ++q) {
        sp.ins.push_back(dy_row(g, 1, q, static_cast<int>(sp.areas.size()), 0));
        sp.areas.push_back(g.n());
    }
    const int gs = static_cast<int>(sp.areas.size());
    sp.areas.push_back(g.n());
    const int phases = add_dx_phases(sp, g, 2);
    sp.prologue = [=](Body& b) {
        b.line(fmt::format("        wait f5, {}", fill(b, b.f(0), g.n(), false)));
    };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        zero_phases(b, v, g, phases);
        for (uint32_t q = 0; q < Q; ++q) {
            v(fmt::format("        v.muls {}, {}, {}, {}", b.a(gs), b.a(static_cast<int>(q)),
                          f32_bits(inv_window(g)), g.n()));
            for (uint32_t kw = 0; kw < g.k; ++kw) {
                const std::string d = dx_at(b, g, phases, kw);
                v(fmt::format("        v.add {}, {}, {}, {}", d, d, b.a(gs), g.n()));
            }
        }
    };
    return sp;
}

Spec max_grad_spec(const Geo& g) {
    Spec sp;
    sp.name = fmt::format("max_pool2d_grad {}", g.key());
    sp.units = uint64_t(g.N) * g.H;
    sp.max_tile_units = 1;
    enum { Pad, Zero };
    sp.fixed = {g.J * g.C, g.n()};
    const uint32_t Q = g.windows_per_row(), n = g.n(), taps = g.k * g.k;
    std::vector<int> window, dy, out, routed;
    for (uint32_t q = 0; q < Q; ++q)
        window.push_back(add_window(sp, g, 1, backward_prefix(g, q), q, Pad));
    for (uint32_t q = 0; q < Q; ++q) {
        dy.push_back(static_cast<int>(sp.areas.size()));
        sp.ins.push_back(dy_row(g, 2, q, dy.back(), Zero));
        out.push_back(dy.back() + 1);
        routed.push_back(dy.back() + 2);
        sp.areas.insert(sp.areas.end(), {n, n, taps * n});
    }
    const int Z = static_cast<int>(sp.areas.size()), NF = Z + 1, GT = Z + 2, MT = Z + 3;
    sp.areas.insert(sp.areas.end(), {n, n, n, n});
    const int phases = add_dx_phases(sp, g, 3);
    sp.prologue = [=](Body& b) { fill_prologue(b, g, window[0], Q, Pad, true, Zero, n); };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        zero_phases(b, v, g, phases);
        v(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(Z), b.a(Z), b.a(Z), n));
        for (uint32_t q = 0; q < Q; ++q) {
            // Route dy to the first tap equal to the window's maximum: NF is 1 until a tap has
            // taken it, so each window's dy lands exactly once.
            reduce_window(b, v, g, window[q], b.a(out[q]), true);
            v(fmt::format("        v.adds {}, {}, 1.0, {}", b.a(NF), b.a(Z), n));
            for (uint32_t t = 0; t < taps; ++t) {
                v(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(GT), b.a(out[q]),
                              tap(b, g, window[q], t / g.k, t % g.k), n));
                v(fmt::format("        v.sel {}, {}, {}, {}, {}", b.a(MT), b.a(GT), b.a(Z), b.a(NF),
                              n));
                v(fmt::format("        v.sub {}, {}, {}, {}", b.a(NF), b.a(NF), b.a(MT), n));
                v(fmt::format("        v.mul [s19+{}], {}, {}, {}",
                              b.off(routed[q]) + uint64_t(t) * n * 4, b.a(MT), b.a(dy[q]), n));
            }
            // Input row ih is kernel row (ih + p) mod s + q s of this window; when that is past
            // the kernel, dy is zeros and any row will do, so take row 0.
            const std::string ok = b.label(fmt::format("kh{}", q));
            b.line(fmt::format("        remu s15, s17, {}", g.H));
            b.line(fmt::format("        add s15, s15, {}", g.p));
            b.line(fmt::format("        remu s15, s15, {}", g.s));
            b.line(fmt::format("        add s15, s15, {}", q * g.s));
            b.line(fmt::format("        blt s15, {}, {}", g.k, ok));
            b.line("        li s15, 0");
            b.line(fmt::format("{}: mul s15, s15, {}", ok, uint64_t(g.k) * n * 4));
            b.line("        add s15, s15, s19");
            for (uint32_t kw = 0; kw < g.k; ++kw) {
                const std::string d = dx_at(b, g, phases, kw);
                v(fmt::format("        v.add {}, {}, [s15+{}], {}", d, d,
                              b.off(routed[q]) + uint64_t(kw) * n * 4, n));
            }
        }
    };
    return sp;
}

Spec gap_spec(const PoolShape& s) {
    enum { X, Sum, Y };
    const uint32_t hw = s.height * s.width, C = s.channels;
    Spec sp;
    sp.name = fmt::format("global_avg_pool {}x{}", hw, C);
    sp.units = s.batch;
    sp.max_tile_units = 1;
    sp.areas = {hw * C, C, C};
    sp.ins = {{1, X}};
    sp.outs = {{2, Y}};
    const float inv = 1.0f / static_cast<float>(hw);
    sp.body = [=](Body& b) {
        VpuOps v(b);
        v(fmt::format("        v.csum {}, {}, {}, {}", b.a(Sum), b.a(X), hw, C));
        v(fmt::format("        v.muls {}, {}, {}, {}", b.a(Y), b.a(Sum), f32_bits(inv), C));
    };
    return sp;
}

Spec gap_grad_spec(const PoolShape& s) {
    enum { G, G2, Nz, Dx };
    const uint32_t hw = s.height * s.width, C = s.channels;
    Spec sp;
    sp.name = fmt::format("global_avg_pool_grad {}x{}", hw, C);
    sp.units = s.batch;
    sp.max_tile_units = 1;
    sp.areas = {C, C, hw * C, hw * C};
    sp.ins = {{1, G}};
    sp.outs = {{2, Dx}};
    const float inv = 1.0f / static_cast<float>(hw);
    const uint64_t n = uint64_t(hw) * C;
    // -0.0 + g == g for every g, so broadcasting onto -0.0 copies the row exactly.
    sp.body = [=](Body& b) {
        VpuOps v(b);
        v(fmt::format("        v.muls {}, {}, {}, {}", b.a(G2), b.a(G), f32_bits(inv), C));
        v(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(Nz), b.a(Nz), b.a(Nz), n));
        v(fmt::format("        v.muls {}, {}, -1.0, {}", b.a(Nz), b.a(Nz), n));
        v(fmt::format("        v.addrow {}, {}, {}, {}, {}", b.a(Dx), b.a(Nz), b.a(G2), hw, C));
    };
    return sp;
}

}  // namespace

/// The text program of pooling kernel `which` (0 max, 1 avg, 2 max grad, 3 avg grad, 4 global,
/// 5 global grad) for `s` on a core of `vmem_bytes`.
isa::Program pool_program_text(int which, const PoolShape& s, uint64_t vmem_bytes) {
    const Geo g(s);
    const Spec sp = which == 0   ? pool_spec(g, true)
                    : which == 1 ? pool_spec(g, false)
                    : which == 2 ? max_grad_spec(g)
                    : which == 3 ? avg_grad_spec(g)
                    : which == 4 ? gap_spec(s)
                                 : gap_grad_spec(s);
    return build(sp, plan(sp, vmem_bytes));
}

}  // namespace tpu::driver::text_pool
