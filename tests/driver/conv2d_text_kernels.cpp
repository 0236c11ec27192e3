// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the assembly-text conv2d kernels (and the text streaming engine
// they ran on) as they were before the builder, to compare binaries with the builder versions.
// Deleted once they agree.
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/assembler.h"

namespace tpu::driver::text {
namespace {

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

uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

/// Most matmuls one step's body may hold: the body is unrolled (its addresses are immediates),
/// and two bodies plus the per-image epilogues must fit in instruction memory (8192 words).
constexpr uint32_t kMaxRunsPerStep = 1024;
/// Most images per block: each adds an unrolled epilogue to the last step's body.
constexpr uint32_t kMaxBlockImages = 64;

/// Derived sizes of one core's kernel.
struct Geometry {
    uint32_t k, s, Ho, Wo, qmax, hb, hin, G, runs, run_rows, S, nbands, nm;
    uint64_t pix;      // bytes of one input pixel of one Cin tile (R bf16)
    uint64_t plane_h;  // HBM bytes of one (phase, Cin tile) plane
    uint64_t plane_v;  // VMEM bytes of a block's part of one plane (hin rows)
    uint64_t xv_img, yv_img, x_img_h;
    // VMEM map: two X slots, two Y slots, two W slots, the bias.
    uint64_t vx, vy, vw, vb, vend;
};

Geometry geometry(const Conv2dShape& s, const Conv2dTiling& t) {
    Geometry g{};
    g.k = s.kernel;
    g.s = s.stride;
    g.Ho = s.out_height();
    g.Wo = s.out_width();
    g.qmax = (g.k - 1) / g.s;
    g.hb = t.band_rows;
    g.hin = g.hb + g.qmax;
    g.G = t.block_images;
    // Without halo columns (Wq == Wo) a band's rows are contiguous in every plane, so one
    // matmul streams the whole band; otherwise each output row is its own run of Wo rows.
    g.runs = t.Wq == g.Wo ? 1 : g.hb;
    g.run_rows = t.Wq == g.Wo ? g.hb * g.Wo : g.Wo;
    g.S = g.k * g.k * t.CT;
    g.nbands = g.Ho / g.hb;
    g.nm = std::min(t.mxus, g.G * g.runs);
    g.pix = uint64_t(t.R) * 2;
    g.plane_h = uint64_t(t.Hq) * t.Wq * g.pix;
    g.plane_v = uint64_t(g.hin) * t.Wq * g.pix;
    g.xv_img = uint64_t(t.phases) * t.phases * t.CT * g.plane_v;
    g.x_img_h = uint64_t(t.phases) * t.phases * t.CT * g.plane_h;
    g.yv_img = uint64_t(g.hb) * g.Wo * t.C * 4;
    g.vx = 0;
    g.vy = g.vx + 2 * g.G * g.xv_img;
    g.vw = g.vy + 2 * g.G * g.yv_img;
    g.vb = g.vw + 2 * uint64_t(t.R) * t.C * 2;
    g.vend = g.vb + uint64_t(t.NT) * t.C * 4;
    return g;
}
}  // namespace

isa::Program conv2d_program_text(const Conv2dShape& sh, const Conv2dTiling& t) {
    const Geometry g = geometry(sh, t);
    const uint32_t R = t.R, C = t.C, NT = t.NT, S = g.S, G = g.G, nm = g.nm;
    const uint64_t wtile = uint64_t(R) * C * 2;
    const uint64_t y_pix_h = uint64_t(sh.cout) * 4;  // bytes of one output pixel in HBM
    const uint64_t y_img_h = uint64_t(g.Ho) * g.Wo * y_pix_h;
    const uint32_t y_rows = g.hb * g.Wo;  // output pixels of one image of a block
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    L("# conv2d (implicit GEMM): k={} stride={} CT={} NT={} G={} band={} runs={}x{} mxus={}", g.k,
      g.s, t.CT, NT, G, g.hb, g.runs, g.run_rows, nm);
    L("# s1 X, s2 W, s3 bias, s4 Y (HBM), s5 blocks; s6 block, s7 Cout tile, s8 step of the");
    L("# group, s9 step overall, s10 tap's LHS base, s11-s18 temporaries, s19 accumulate, s20 X");
    L("# slot, s21 Y slot, s22/s23 lw issued, s24/s25 flagged mm issued (MXU 0/1), s26/s27 W");
    L("# tiles into slot 0/1, s28/s29 X blocks into slot 0/1, s30/s31 Y stores from slot 0/1");
    L("# flags: f1/f8 W slot 0/1 in, f2/f3 lw done, f4/f5 mm done, f6 VPU, f9/f10 X slot 0/1");
    L("# in, f11/f12 Y slot 0/1 out, f13 bias in");
    // Scalar memory words: VPU ops issued, the group's HBM output base, its row bytes, its Y
    // slot and bias address, and the image whose epilogue waits for the next step (pending:
    // flag, Y address, HBM address, mm counts of MXU 0/1, row bytes, slot, bias).
    constexpr int kVpu = 0, kYdst = 4, kYBytes = 8, kYSlot = 12, kYBias = 16, kPend = 20, kPY = 24,
                  kPD = 28, kPC0 = 32, kPC1 = 36, kPBytes = 40, kPSlot = 44, kPBias = 48;
    // Scalar memory keeps its words across launches.
    L("        sw s0, [{}]", kVpu);
    L("        sw s0, [{}]", kPend);
    for (int r = 22; r <= 31; ++r) L("        li s{}, 0", r);

    // Runs the code `f(slot)` for the slot in register `reg` (0 or 1): flags are per slot
    // because the banked HBM can finish a DMA before an earlier one, so only a count of one
    // slot's transfers proves that slot complete.
    int uniq = 0;
    auto by_slot = [&](const char* reg, const std::function<void(int)>& f) {
        const int id = uniq++;
        L("        bne {}, 0, sl1_{}", reg, id);
        f(0);
        L("        jmp sld_{}", id);
        L("sl1_{}:", id);
        f(1);
        L("sld_{}:", id);
    };
    // The X block in register `breg` into the X slot (breg & 1).
    auto x_load = [&](const char* breg) {
        if (g.nbands == 1) {
            L("        mul s11, {}, {}", breg, uint64_t(G) * g.x_img_h);
        } else {
            L("        divu s11, {}, {}", breg, g.nbands);
            L("        mul s11, s11, {}", g.x_img_h);
            L("        remu s12, {}, {}", breg, g.nbands);
            L("        mul s12, s12, {}", uint64_t(g.hb) * t.Wq * g.pix);
            L("        add s11, s11, s12");
        }
        L("        add s11, s11, s1");
        L("        and s12, {}, 1", breg);
        L("        mul s13, s12, {}", uint64_t(G) * g.xv_img);
        by_slot("s12", [&](int slot) {
            if (g.nbands == 1)  // whole images: one contiguous run
                L("        dma.hv [s13+{}], [s11], 1, {}, {}, {}, f{}", g.vx, G * g.x_img_h,
                  G * g.x_img_h, G * g.x_img_h, 9 + slot);
            else  // a band: hin rows of every plane
                L("        dma.hv [s13+{}], [s11], {}, {}, {}, {}, f{}", g.vx,
                  t.phases * t.phases * t.CT, g.plane_v, g.plane_v, g.plane_h, 9 + slot);
            L("        add s{}, s{}, 1", 28 + slot, 28 + slot);
        });
    };
    // The epilogue of one image: s11 Y address, s12 HBM address, s13/s14 the mm counts that
    // complete it, s15 row bytes, s16 Y slot, s17 bias address. Bias add on the VPU, then the
    // store (NHWC rows of the tile's channels).
    auto finish = [&] {
        for (uint32_t m = 0; m < nm; ++m) L("        wait f{}, s{}", 4 + m, 13 + m);
        L("        v.addrow [s11], [s11], [s17], {}, {}, f6", y_rows, C);
        L("        lw s18, [{}]", kVpu);
        L("        add s18, s18, 1");
        L("        sw s18, [{}]", kVpu);
        L("        wait f6, s18");
        by_slot("s16", [&](int slot) {
            if (NT == 1 && sh.cout == C)  // the tile is the whole pixel: one contiguous run
                L("        dma.vh [s12], [s11], 1, {}, {}, {}, f{}", uint64_t(y_rows) * C * 4,
                  uint64_t(y_rows) * C * 4, uint64_t(y_rows) * C * 4, 11 + slot);
            else
                L("        dma.vh [s12], [s11], {}, s15, {}, {}, f{}", y_rows, y_pix_h, C * 4,
                  11 + slot);
            L("        add s{}, s{}, 1", 30 + slot, 30 + slot);
        });
    };
    auto flush_pending = [&] {
        const int id = uniq++;
        L("        lw s11, [{}]", kPend);
        L("        beq s11, 0, nop_{}", id);
        L("        lw s11, [{}]", kPY);
        L("        lw s12, [{}]", kPD);
        L("        lw s13, [{}]", kPC0);
        L("        lw s14, [{}]", kPC1);
        L("        lw s15, [{}]", kPBytes);
        L("        lw s16, [{}]", kPSlot);
        L("        lw s17, [{}]", kPBias);
        finish();
        L("        sw s0, [{}]", kPend);
        L("nop_{}:", id);
    };
    // Registers s11..s17 of image `img` of the current group; `cnt` = its mm counts per MXU
    // past s24/s25.
    auto image_regs = [&](uint32_t img, const uint32_t cnt[2]) {
        L("        add s11, s21, {}", img * g.yv_img);
        L("        lw s12, [{}]", kYdst);
        L("        add s12, s12, {}", uint64_t(img) * y_rows * y_pix_h);
        L("        add s13, s24, {}", cnt[0]);
        L("        add s14, s25, {}", cnt[1]);
        L("        lw s15, [{}]", kYBytes);
        L("        lw s16, [{}]", kYSlot);
        L("        lw s17, [{}]", kYBias);
    };

    // Weight tile of step s9 + `ahead` (the tile index wraps per block) into its slot, unless
    // the kernel has no such step. The slot was last read by the lw of step s9 + ahead - 2.
    auto w_prefetch = [&](int ahead) {
        const int id = uniq++;
        L("        add s11, s9, {}", ahead);
        L("        mul s12, s5, {}", NT * S);
        L("        bge s11, s12, nopf_{}", id);
        L("        remu s13, s11, {}", NT * S);
        L("        mul s13, s13, {}", wtile);
        L("        add s13, s13, s2");
        L("        and s14, s11, 1");
        by_slot("s14", [&](int slot) {
            L("        dma.hv [{}], [s13], 1, {}, {}, {}, f{}", g.vw + slot * wtile, wtile, wtile,
              wtile, slot ? 8 : 1);
            L("        add s{}, s{}, 1", 26 + slot, 26 + slot);
        });
        L("nopf_{}:", id);
    };
    // The lw of step s9 + `ahead` into every MXU's shadow weights, once its tile is in.
    auto w_load = [&](int ahead) {
        const int id = uniq++;
        L("        add s11, s9, {}", ahead);
        L("        mul s12, s5, {}", NT * S);
        L("        bge s11, s12, nolw_{}", id);
        L("        and s14, s11, 1");
        by_slot("s14", [&](int slot) { L("        wait f{}, s{}", slot ? 8 : 1, 26 + slot); });
        L("        mul s14, s14, {}", wtile);
        for (uint32_t m = 0; m < nm; ++m) {
            L("        mxu.lw {}, [s14+{}], {}, {}, f{}", m, g.vw, R, C, 2 + m);
            L("        add s{}, s{}, 1", 22 + m, 22 + m);
        }
        L("nolw_{}:", id);
    };

    // Prologue: the bias, the first two weight tiles (ahead of the X block in the in-order DMA
    // queue: the first matmul needs both), the first X block, the first lw.
    L("        dma.hv [{}], [s3], 1, {}, {}, {}, f13", g.vb, NT * C * 4, NT * C * 4, NT * C * 4);
    L("        li s9, 0");
    w_prefetch(0);
    w_prefetch(1);
    L("        li s6, 0");
    x_load("s6");
    w_load(0);
    L("        wait f13, 1");

    L("block:  and s11, s6, 1");
    L("        mul s20, s11, {}", uint64_t(G) * g.xv_img);
    L("        add s20, s20, {}", g.vx);
    L("        li s7, 0");
    // Per group: its Y slot (group index b NT + nt, parity), HBM output base, row bytes, bias.
    L("group:  mul s11, s6, {}", NT);
    L("        add s11, s11, s7");
    L("        and s11, s11, 1");
    L("        sw s11, [{}]", kYSlot);
    L("        mul s21, s11, {}", uint64_t(G) * g.yv_img);
    L("        add s21, s21, {}", g.vy);
    if (g.nbands == 1) {
        L("        mul s12, s6, {}", uint64_t(G) * y_img_h);
    } else {
        L("        divu s12, s6, {}", g.nbands);
        L("        mul s12, s12, {}", y_img_h);
        L("        remu s13, s6, {}", g.nbands);
        L("        mul s13, s13, {}", uint64_t(y_rows) * y_pix_h);
        L("        add s12, s12, s13");
    }
    L("        add s12, s12, s4");
    L("        mul s13, s7, {}", C * 4);
    L("        add s12, s12, s13");
    L("        sw s12, [{}]", kYdst);
    L("        li s14, {}", C * 4);
    L("        bne s7, {}, rb_ok", NT - 1);
    L("        li s14, {}", (sh.cout - (NT - 1) * C) * 4);
    L("rb_ok:  sw s14, [{}]", kYBytes);
    L("        add s13, s13, {}", g.vb);
    L("        sw s13, [{}]", kYBias);
    L("        li s8, 0");

    // One K step: tap (kh, kw) and Cin tile ct of step s8, Cout tile s7. (1) prefetch the
    // weight tile two steps ahead, so it is not queued behind the stores of a group's images in
    // the in-order DMA queue; (2) stream every run of every image of the block through the
    // loaded tile, then queue the next step's lw at once (the matmul after an lw swaps the new
    // tile in, so the lw cannot go earlier; the R-cycle load hides in the array's drain).
    // `last` (the group's last step) flags every matmul and stores each image as soon as the
    // next one is queued, so stores overlap the matmuls; the last image's epilogue waits until
    // the next step has queued its first image (pending), so the MXUs never run dry.
    auto step = [&](bool last) {
        const int id = uniq++;
        // (1) This step's lw was issued in the previous step; once it is done its slot takes
        // the tile after next.
        for (uint32_t m = 0; m < nm; ++m) L("        wait f{}, s{}", 2 + m, 22 + m);
        w_prefetch(2);
        // A group's first step waits until its Y slot is stored; a block's first, for its X.
        L("        bne s8, 0, w_ok_{}", id);
        L("        lw s11, [{}]", kYSlot);
        by_slot("s11", [&](int slot) { L("        wait f{}, s{}", 11 + slot, 30 + slot); });
        L("        bne s7, 0, w_ok_{}", id);
        L("        and s11, s6, 1");
        by_slot("s11", [&](int slot) { L("        wait f{}, s{}", 9 + slot, 28 + slot); });
        L("w_ok_{}:", id);
        // (2) The tap's LHS base: plane (phase (kh % s, kw % s), ct), shifted by (kh / s,
        // kw / s) pixels.
        L("        divu s11, s8, {}", t.CT);  // tap
        L("        remu s12, s8, {}", t.CT);  // ct
        L("        divu s13, s11, {}", g.k);  // kh
        L("        remu s14, s11, {}", g.k);  // kw
        L("        remu s15, s13, {}", g.s);  // phase row
        L("        mul s15, s15, {}", t.phases);
        L("        remu s16, s14, {}", g.s);  // phase column
        L("        add s15, s15, s16");
        L("        mul s15, s15, {}", t.CT);
        L("        add s15, s15, s12");
        L("        mul s15, s15, {}", g.plane_v);
        L("        divu s13, s13, {}", g.s);
        L("        mul s13, s13, {}", t.Wq);
        L("        divu s14, s14, {}", g.s);
        L("        add s13, s13, s14");
        L("        mul s13, s13, {}", g.pix);
        L("        add s10, s15, s13");
        L("        add s10, s10, s20");
        L("        sltu s19, 0, s8");
        uint32_t cnt[2] = {0, 0};
        for (uint32_t img = 0; img < G; ++img) {
            for (uint32_t r = 0; r < g.runs; ++r) {
                const uint32_t p = img * g.runs + r, m = p % nm;
                const bool flag = last || p + nm >= G * g.runs;
                if (flag) ++cnt[m];
                L("        mxu.mm {}, [s21+{}], [s10+{}], {}, s19{}", m,
                  img * g.yv_img + uint64_t(r) * g.run_rows * C * 4,
                  img * g.xv_img + uint64_t(r) * t.Wq * g.pix, g.run_rows,
                  flag ? fmt::format(", f{}", 4 + m) : "");
                if (p + 1 == G * g.runs) w_load(1);
            }
            if (img == 0) {
                flush_pending();
                // A block's first step: every matmul of the previous block is done (the
                // pending image was its last), so the next block's X may replace it.
                const int xid = uniq++;
                L("        bne s8, 0, nox_{}", xid);
                L("        bne s7, 0, nox_{}", xid);
                L("        add s18, s6, 1");
                L("        bge s18, s5, nox_{}", xid);
                x_load("s18");
                L("nox_{}:", xid);
            }
            if (last && img > 0) {
                uint32_t prev[2] = {0, 0};
                for (uint32_t p = 0; p < img * g.runs; ++p) ++prev[p % nm];
                image_regs(img - 1, prev);
                finish();
            }
        }
        if (last) {
            image_regs(G - 1, cnt);
            L("        sw s11, [{}]", kPY);
            L("        sw s12, [{}]", kPD);
            L("        sw s13, [{}]", kPC0);
            L("        sw s14, [{}]", kPC1);
            L("        sw s15, [{}]", kPBytes);
            L("        sw s16, [{}]", kPSlot);
            L("        sw s17, [{}]", kPBias);
            L("        li s18, 1");
            L("        sw s18, [{}]", kPend);
        }
        for (uint32_t m = 0; m < nm; ++m) L("        add s{}, s{}, {}", 24 + m, 24 + m, cnt[m]);
        L("        add s8, s8, 1");
        L("        add s9, s9, 1");
    };
    if (S > 1) {
        L("kstep:");
        step(false);
        L("        bltu s8, {}, kstep", S - 1);
    }
    step(true);
    L("        add s7, s7, 1");
    L("        bltu s7, {}, group", NT);
    L("        add s6, s6, 1");
    L("        blt s6, s5, block");
    flush_pending();
    L("        wait f11, s30");
    L("        wait f12, s31");
    L("        halt");
    return isa::assemble(s, "conv2d.s");
}

namespace {

/// How one unit of a gather pack reaches the staging area: a strided fp32 DMA (rows of
/// row_bytes) at `vmem_offset` into it, or (zero) a copy of the zero area.
struct GatherClass {
    bool zero = false;  ///< copy the zero area instead of loading from HBM
    uint64_t hbm_offset = 0, vmem_offset = 0, rows = 0, row_bytes = 0, vstride = 0, hstride = 0;
};

/// A gather pack: unit u of `units` is `vals` fp32 values gathered from HBM (s1) into the
/// staging area, rounded to bf16 and stored contiguously at s2 + u vals 2 bytes. The staging
/// area is zero before every unit (zeroed once, then again after each conversion), so the zeros
/// the kernel layouts need (padding pixels and channels) are whatever a class does not load.
/// `decode(unit register)` leaves the class index in s14 and, for loading classes, the HBM
/// source address (before hbm_offset) in s13; it may use s3..s12.
Spec gather_pack_spec(std::string name, uint64_t units, uint32_t vals,
                              std::vector<GatherClass> classes,
                              std::function<void(Body&, const std::string&)> decode) {
    Spec sp;
    sp.name = std::move(name);
    sp.units = units;
    // A unit's source is not affine in its index across units, so every tile is one unit.
    sp.max_tile_units = 1;
    sp.areas = {vals / 2, vals};
    const bool zeros = std::any_of(classes.begin(), classes.end(), [](auto& g) { return g.zero; });
    if (zeros) sp.fixed = {vals};
    const uint64_t bytes = uint64_t(vals) * 4;
    auto uniq = std::make_shared<int>(0);
    sp.ins = {Stream(
        1, 1,
        [=](Body& b, const std::string& first, const std::string&, const std::string& slot,
            const std::string& flag) {
            const int id = (*uniq)++;
            decode(b, first);
            for (size_t c = 0; c < classes.size(); ++c) {
                const GatherClass& g = classes[c];
                const uint64_t at = b.off(1);
                b.line(fmt::format("        bne s14, {}, gp_{}_{}", c, id, c));
                if (g.zero) {
                    b.line(fmt::format("        dma.vv [{}+{}], {}, 1, {}, {}, {}, {}", slot, at,
                                       b.f(0), bytes, bytes, bytes, flag));
                } else {
                    b.line(fmt::format("        add s13, s13, {}", g.hbm_offset));
                    b.line(fmt::format("        dma.hv [{}+{}], [s13], {}, {}, {}, {}, {}", slot,
                                       at + g.vmem_offset, g.rows, g.row_bytes, g.vstride,
                                       g.hstride, flag));
                }
                b.line(fmt::format("        jmp gp_{}_end", id));
                b.line(fmt::format("gp_{}_{}:", id, c));
            }
            b.line(fmt::format("gp_{}_end:", id));
        })};
    sp.outs = {{2, 0}};
    sp.body = [=](Body& b) {
        b.vpu(fmt::format("        v.f2bf {}, {}, {}", b.a(0), b.a(1), vals));
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(1), b.a(1), b.a(1), vals));
    };
    // Zeros: x > x is false for every x (NaN too), whatever VMEM held before.
    sp.prologue = [=](Body& b) {
        for (int slot = 0; slot < 2; ++slot) {
            const std::string z = b.slot(slot, 1);
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", z, z, z, vals));
        }
        if (zeros)
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", b.f(0), b.f(0), b.f(0), vals));
        b.line(fmt::format("        wait f5, {}", zeros ? 3 : 2));
    };
    return sp;
}

/// Packs x (N H W x Cin fp32, NHWC) into the kernel's bf16 stride-phase planes (conv2d.h). One
/// unit is one plane row (image, phase row a, phase column b, Cin tile, row i): Wq pixels read
/// from input row i s + a - pad at a stride of s pixels; rows in the padding are zeros.
Spec pack_input_spec(const Conv2dShape& sh, const Conv2dTiling& t) {
    const uint32_t P = t.phases, R = t.R, CT = t.CT, s = sh.stride, p = sh.pad;
    const uint32_t last = sh.cin - (CT - 1) * R;  // channels of the last Cin tile
    const uint64_t units = uint64_t(sh.batch) * P * P * CT * t.Hq;
    // Classes 2 b + (last Cin tile): columns j of phase b hold input column j s + b - pad.
    std::vector<GatherClass> cls;
    std::vector<bool> empty(P);
    for (uint32_t b = 0; b < P; ++b) {
        const uint32_t j0 = p > b ? (p - b + s - 1) / s : 0;
        const int64_t hi = (int64_t(sh.width) - 1 + p - b);
        const uint32_t j1 = hi < 0 ? 0 : std::min<uint32_t>(t.Wq, uint32_t(hi / s) + 1);
        empty[b] = j1 <= j0;
        for (uint32_t part = 0; part < 2; ++part) {
            GatherClass g;
            g.hbm_offset = (uint64_t(j0) * s + b - p) * sh.cin * 4;
            g.vmem_offset = uint64_t(j0) * R * 4;
            g.rows = empty[b] ? 1 : j1 - j0;
            g.row_bytes = uint64_t(part ? last : R) * 4;
            g.vstride = uint64_t(R) * 4;
            g.hstride = uint64_t(s) * sh.cin * 4;
            cls.push_back(g);
        }
    }
    GatherClass zero;
    zero.zero = true;
    const uint32_t kZero = static_cast<uint32_t>(cls.size());
    cls.push_back(zero);
    auto uniq = std::make_shared<int>(0);  // the decoder is emitted several times per program
    auto decode = [=](Body& b, const std::string& u) {
        const int k = (*uniq)++;
        b.line(fmt::format("        remu s3, {}, {}", u, t.Hq));  // i
        b.line(fmt::format("        divu s4, {}, {}", u, t.Hq));
        b.line(fmt::format("        remu s5, s4, {}", CT));  // ct
        b.line(fmt::format("        divu s4, s4, {}", CT));
        b.line(fmt::format("        remu s6, s4, {}", P));  // b
        b.line(fmt::format("        divu s4, s4, {}", P));
        b.line(fmt::format("        remu s7, s4, {}", P));  // a
        b.line(fmt::format("        divu s4, s4, {}", P));  // image
        b.line(fmt::format("        mul s8, s3, {}", s));
        b.line("        add s8, s8, s7");  // padded input row
        b.line(fmt::format("        li s14, {}", kZero));
        b.line(fmt::format("        bltu s8, {}, pz_{}", p, k));
        b.line(fmt::format("        bltu s8, {}, pv_{}", sh.height + p, k));
        b.line(fmt::format("        jmp pz_{}", k));
        b.line(fmt::format("pv_{}:", k));
        for (uint32_t c = 0; c < P; ++c)
            if (empty[c]) b.line(fmt::format("        beq s6, {}, pz_{}", c, k));
        b.line("        mul s14, s6, 2");
        b.line(fmt::format("        sltu s9, s5, {}", CT - 1));
        b.line("        add s14, s14, 1");
        b.line("        sub s14, s14, s9");
        b.line(fmt::format("        mul s9, s4, {}", sh.height));
        b.line("        add s9, s9, s8");
        b.line(fmt::format("        sub s9, s9, {}", p));
        b.line(fmt::format("        mul s9, s9, {}", uint64_t(sh.width) * sh.cin * 4));
        b.line("        add s13, s9, s1");
        b.line(fmt::format("        mul s9, s5, {}", uint64_t(R) * 4));
        b.line("        add s13, s13, s9");
        b.line(fmt::format("pz_{}:", k));
    };
    return gather_pack_spec(fmt::format("conv2d_pack_x N{} H{} W{} Cin{} k{} s{} p{} R{}", sh.batch,
                                        sh.height, sh.width, sh.cin, sh.kernel, s, p, R),
                            units, t.Wq * R, cls, decode);
}

/// Packs w (k k Cin x Cout fp32, HWIO) into the kernel's R x C bf16 tiles (conv2d.h). One unit
/// is one tile (Cout tile, tap, Cin tile): its Cin rows x Cout columns at the row stride Cout.
Spec pack_weight_spec(const Conv2dShape& sh, const Conv2dTiling& t) {
    const uint32_t R = t.R, C = t.C, CT = t.CT, NT = t.NT, kk = sh.kernel * sh.kernel;
    const uint32_t last_r = sh.cin - (CT - 1) * R, last_c = sh.cout - (NT - 1) * C;
    std::vector<GatherClass> cls;
    for (uint32_t pr = 0; pr < 2; ++pr)
        for (uint32_t pc = 0; pc < 2; ++pc) {
            GatherClass g;
            g.rows = pr ? last_r : R;
            g.row_bytes = uint64_t(pc ? last_c : C) * 4;
            g.vstride = uint64_t(C) * 4;
            g.hstride = uint64_t(sh.cout) * 4;
            cls.push_back(g);
        }
    auto decode = [=](Body& b, const std::string& u) {
        b.line(fmt::format("        remu s3, {}, {}", u, CT));  // ct
        b.line(fmt::format("        divu s4, {}, {}", u, CT));
        b.line(fmt::format("        remu s5, s4, {}", kk));  // tap
        b.line(fmt::format("        divu s6, s4, {}", kk));  // Cout tile
        b.line(fmt::format("        sltu s7, s3, {}", CT - 1));
        b.line("        li s14, 3");
        b.line("        sub s14, s14, s7");
        b.line("        sub s14, s14, s7");
        b.line(fmt::format("        sltu s7, s6, {}", NT - 1));
        b.line("        sub s14, s14, s7");
        b.line(fmt::format("        mul s8, s5, {}", sh.cin));
        b.line(fmt::format("        mul s9, s3, {}", R));
        b.line("        add s8, s8, s9");
        b.line(fmt::format("        mul s8, s8, {}", uint64_t(sh.cout) * 4));
        b.line(fmt::format("        mul s9, s6, {}", uint64_t(C) * 4));
        b.line("        add s8, s8, s9");
        b.line("        add s13, s8, s1");
    };
    return gather_pack_spec(
        fmt::format("conv2d_pack_w k{} Cin{} Cout{} R{} C{}", sh.kernel, sh.cin, sh.cout, R, C),
        uint64_t(NT) * kk * CT, R * C, cls, decode);
}

/// The output rows y0 .. y0 + ny and columns x0 .. x0 + nx whose input pixel under tap
/// (kh, kw) lies inside the image (the others read padding).
struct TapRange {
    uint32_t y0 = 0, ny = 0, x0 = 0, nx = 0;
};

TapRange tap_range(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    auto span = [&](uint32_t size, uint32_t out, uint32_t kpos, uint32_t& first, uint32_t& n) {
        first = s.pad > kpos ? (s.pad - kpos + s.stride - 1) / s.stride : 0;
        const int64_t hi = int64_t(size) - 1 + s.pad - kpos;
        const uint32_t end = hi < 0 ? 0 : std::min<uint32_t>(out, uint32_t(hi / s.stride) + 1);
        n = end > first ? end - first : 0;
    };
    TapRange r;
    span(s.height, s.out_height(), kh, r.y0, r.ny);
    span(s.width, s.out_width(), kw, r.x0, r.nx);
    return r;
}

/// Leaves in s13 the x address (base in s{x_arg}) of the first pixel unit u moves under tap
/// (kh, kw) and in s14 the column-buffer address (base in s{col_arg}). Units are (image, output
/// row) over the tap's valid rows.
void emit_tap_addresses(Body& b, const std::string& u, const Conv2dShape& s, const TapRange& r,
                        uint32_t kh, uint32_t kw, int x_arg, int col_arg) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), kk = s.kernel * s.kernel;
    const uint64_t pix = uint64_t(s.cin) * 4;
    b.line(fmt::format("        remu s3, {}, {}", u, r.ny));
    b.line(fmt::format("        add s3, s3, {}", r.y0));      // output row
    b.line(fmt::format("        divu s4, {}, {}", u, r.ny));  // image
    // Input pixel (image, y s + kh - pad, x0 s + kw - pad), both coordinates >= 0.
    b.line(fmt::format("        mul s5, s3, {}", s.stride));
    b.line(fmt::format("        add s5, s5, {}", kh));
    b.line(fmt::format("        sub s5, s5, {}", s.pad));
    b.line(fmt::format("        mul s6, s4, {}", s.height));
    b.line("        add s5, s5, s6");
    b.line(fmt::format("        mul s5, s5, {}", s.width));
    b.line(fmt::format("        add s5, s5, {}", r.x0 * s.stride + kw - s.pad));
    b.line(fmt::format("        mul s5, s5, {}", pix));
    b.line(fmt::format("        add s13, s5, s{}", x_arg));
    // Column-buffer row (image, y, x0), columns from tap (kh k + kw) Cin.
    b.line(fmt::format("        mul s6, s4, {}", Ho));
    b.line("        add s6, s6, s3");
    b.line(fmt::format("        mul s6, s6, {}", Wo));
    b.line(fmt::format("        add s6, s6, {}", r.x0));
    b.line(fmt::format("        mul s6, s6, {}", kk * pix));
    b.line(fmt::format("        add s6, s6, {}", (kh * s.kernel + kw) * pix));
    b.line(fmt::format("        add s14, s6, s{}", col_arg));
}

std::string shape_key(const Conv2dShape& s) {
    return fmt::format("N{} H{} W{} Cin{} k{} s{} p{}", s.batch, s.height, s.width, s.cin, s.kernel,
                       s.stride, s.pad);
}

/// im2col of one tap: s1 = x, s2 = the column buffer (N Ho Wo x k k Cin fp32). One unit per
/// valid (image, output row): nx pixels of Cin values at the input pixel stride s, stored at
/// the column buffer's row stride.
Spec im2col_tap_spec(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    const TapRange r = tap_range(s, kh, kw);
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * s.kernel * s.kernel;
    Spec sp;
    sp.name = fmt::format("conv2d_im2col {} tap {} {}", shape_key(s), kh, kw);
    sp.units = uint64_t(s.batch) * r.ny;
    // Consecutive units are not one affine 2-D transfer, so every tile is one unit.
    sp.max_tile_units = 1;
    sp.areas = {r.nx * s.cin};
    sp.ins = {Stream(1, 0,
                             [=](Body& b, const std::string& first, const std::string&,
                                 const std::string& slot, const std::string& flag) {
                                 emit_tap_addresses(b, first, s, r, kh, kw, 1, 2);
                                 b.line(fmt::format("        dma.hv {}, [s13], {}, {}, {}, {}, {}",
                                                    b.at(slot, 0), r.nx, pix, pix, pix * s.stride,
                                                    flag));
                             })};
    sp.outs = {Stream(2, 0,
                              [=](Body& b, const std::string& first, const std::string&,
                                  const std::string& slot, const std::string& flag) {
                                  emit_tap_addresses(b, first, s, r, kh, kw, 1, 2);
                                  b.line(fmt::format("        dma.vh [s14], {}, {}, {}, {}, {}, {}",
                                                     b.at(slot, 0), r.nx, pix, row, pix, flag));
                              })};
    sp.body = [](Body&) {};
    return sp;
}

/// col2im of one tap: dx (s2) += the tap's columns of dcol (s1), per valid (image, output
/// row). A tap maps distinct outputs to distinct input pixels, so its units never overlap.
Spec col2im_tap_spec(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    const TapRange r = tap_range(s, kh, kw);
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * s.kernel * s.kernel;
    const uint32_t vals = r.nx * s.cin;
    Spec sp;
    sp.name = fmt::format("conv2d_col2im {} tap {} {}", shape_key(s), kh, kw);
    sp.units = uint64_t(s.batch) * r.ny;
    sp.max_tile_units = 1;
    sp.areas = {vals, vals};
    auto load_dx = [=](Body& b, const std::string& first, const std::string&,
                       const std::string& slot, const std::string& flag) {
        emit_tap_addresses(b, first, s, r, kh, kw, 2, 1);
        b.line(fmt::format("        dma.hv {}, [s13], {}, {}, {}, {}, {}", b.at(slot, 0), r.nx, pix,
                           pix, pix * s.stride, flag));
    };
    auto load_dcol = [=](Body& b, const std::string& first, const std::string&,
                         const std::string& slot, const std::string& flag) {
        emit_tap_addresses(b, first, s, r, kh, kw, 2, 1);
        b.line(fmt::format("        dma.hv {}, [s14], {}, {}, {}, {}, {}", b.at(slot, 1), r.nx, pix,
                           pix, row, flag));
    };
    sp.ins = {Stream(2, 0, load_dx), Stream(1, 1, load_dcol)};
    sp.outs = {Stream(2, 0,
                              [=](Body& b, const std::string& first, const std::string&,
                                  const std::string& slot, const std::string& flag) {
                                  emit_tap_addresses(b, first, s, r, kh, kw, 2, 1);
                                  b.line(fmt::format("        dma.vh [s13], {}, {}, {}, {}, {}, {}",
                                                     b.at(slot, 0), r.nx, pix, pix * s.stride, pix,
                                                     flag));
                              })};
    sp.body = [=](Body& b) {
        b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.a(0), b.a(0), b.a(1), vals));
    };
    return sp;
}

/// Zeroes slot areas `areas` of both slots and every fixed area in the prologue (x > x is
/// false for every x, NaN too): the row kernels below leave whatever a unit does not load zero.
void zero_staging(Body& b, const std::vector<int>& areas, const std::vector<uint32_t>& area_vals,
                  const std::vector<uint32_t>& fixed_vals) {
    int n = 0;
    for (int slot = 0; slot < 2; ++slot)
        for (int a : areas) {
            const std::string z = b.slot(slot, a);
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", z, z, z, area_vals[a]));
            ++n;
        }
    for (size_t f = 0; f < fixed_vals.size(); ++f) {
        const std::string z = b.f(int(f));
        b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", z, z, z, fixed_vals[f]));
        ++n;
    }
    b.line(fmt::format("        wait f5, {}", n));
}

/// im2col with one unit per output row (image, y): the k input rows it reads come in as k
/// contiguous row DMAs (a zero copy for a padding row), each tap's pixels are gathered from
/// them into the tap's columns of a Wo x k k Cin staging row by a VMEM copy, and the row goes
/// out in one contiguous store. Gathering in VMEM keeps every HBM transfer a whole image row:
/// a per-tap DMA straight from HBM moves Cin values per request, which for a small Cin (an RGB
/// stem: 12 bytes) wastes most of each burst. Columns no tap reaches (horizontal padding) keep
/// the prologue's zeros. s1 = x, s2 = the column buffer.
Spec im2col_rows_spec(const Conv2dShape& s) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel, kk = k * k;
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * kk, in_row = pix * s.width;
    Spec sp;
    sp.name = fmt::format("conv2d_im2col_rows {}", shape_key(s));
    sp.units = uint64_t(s.batch) * Ho;
    sp.max_tile_units = 1;
    sp.areas = {Wo * kk * s.cin};
    sp.fixed = {s.width * s.cin};
    auto uniq = std::make_shared<int>(0);
    for (uint32_t kh = 0; kh < k; ++kh) {
        const TapRange r = tap_range(s, kh, 0);  // rows y0 .. y0 + ny read a real input row
        const int area = int(sp.areas.size());
        sp.areas.push_back(s.width * s.cin);
        sp.ins.push_back(Stream(
            1, area,
            [=](Body& b, const std::string& u, const std::string&, const std::string& slot,
                const std::string& flag) {
                const int id = (*uniq)++;
                b.line(fmt::format("        remu s3, {}, {}", u, Ho));  // y
                b.line(fmt::format("        divu s4, {}, {}", u, Ho));  // image
                b.line(fmt::format("        bltu s3, {}, ic_z{}", r.y0, id));
                b.line(fmt::format("        bge s3, {}, ic_z{}", r.y0 + r.ny, id));
                b.line(fmt::format("        mul s5, s3, {}", s.stride));
                b.line(fmt::format("        add s5, s5, {}", kh));
                b.line(fmt::format("        sub s5, s5, {}", s.pad));
                b.line(fmt::format("        mul s6, s4, {}", s.height));
                b.line("        add s5, s5, s6");
                b.line(fmt::format("        mul s5, s5, {}", in_row));
                b.line("        add s13, s5, s1");
                b.line(fmt::format("        dma.hv {}, [s13], 1, {}, {}, {}, {}", b.at(slot, area),
                                   in_row, in_row, in_row, flag));
                b.line(fmt::format("        jmp ic_e{}", id));
                b.line(fmt::format("ic_z{}:", id));
                b.line(fmt::format("        dma.vv {}, {}, 1, {}, {}, {}, {}", b.at(slot, area),
                                   b.f(0), in_row, in_row, in_row, flag));
                b.line(fmt::format("ic_e{}:", id));
            }));
    }
    sp.outs = {{2, 0}};
    sp.body = [=](Body& b) {
        for (uint32_t t = 0; t < kk; ++t) {
            const uint32_t kh = t / k, kw = t % k;
            const TapRange r = tap_range(s, kh, kw);
            if (!r.ny || !r.nx) continue;  // never reads the image: stays zero
            const uint64_t to = b.off(0) + r.x0 * row + t * pix;
            const uint64_t from =
                b.off(1 + int(kh)) + (uint64_t(r.x0) * s.stride + kw - s.pad) * pix;
            b.vpu(fmt::format("        dma.vv [s19+{}], [s19+{}], {}, {}, {}, {}", to, from, r.nx,
                              pix, row, pix * s.stride));
        }
    };
    sp.prologue = [=](Body& b) { zero_staging(b, {0}, {Wo * kk * s.cin}, {s.width * s.cin}); };
    return sp;
}

/// col2im with one unit per input row (image, iy): per tap, the dcol values that reach the
/// row are loaded at their pixels into the tap's W x Cin area (a zero copy when the tap does
/// not reach it; the pixels it never reaches stay zero), then dx = +0.0 + area_0, dx += area_t
/// in tap order, one contiguous store. Adding a +0.0 where the reference skips a tap is exact:
/// the sum starts at +0.0, so it is never -0.0. s1 = dcol, s2 = dx.
Spec col2im_rows_spec(const Conv2dShape& s) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel, kk = k * k;
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * kk;
    const uint32_t vals = s.width * s.cin;
    Spec sp;
    sp.name = fmt::format("conv2d_col2im_rows {}", shape_key(s));
    sp.units = uint64_t(s.batch) * s.height;
    sp.max_tile_units = 1;
    sp.areas = {vals};
    sp.fixed = {std::max(s.width, Wo) * s.cin};
    auto uniq = std::make_shared<int>(0);
    std::vector<int> tap_areas;
    for (uint32_t t = 0; t < kk; ++t) {
        const uint32_t kh = t / k, kw = t % k;
        const TapRange r = tap_range(s, kh, kw);
        if (!r.ny || !r.nx) continue;
        const int area = int(sp.areas.size());
        sp.areas.push_back(vals);
        tap_areas.push_back(area);
        sp.ins.push_back(Stream(
            1, area,
            [=](Body& b, const std::string& u, const std::string&, const std::string& slot,
                const std::string& flag) {
                const int id = (*uniq)++;
                const uint64_t at = b.off(area) + uint64_t(r.x0 * s.stride + kw - s.pad) * pix;
                b.line(fmt::format("        remu s3, {}, {}", u, s.height));  // iy
                b.line(fmt::format("        divu s4, {}, {}", u, s.height));  // image
                // Output row y = (iy + pad - kh) / stride when exact and inside 0 .. Ho.
                b.line(fmt::format("        add s5, s3, {}", s.pad));
                b.line(fmt::format("        bltu s5, {}, cc_z{}", kh, id));
                b.line(fmt::format("        sub s5, s5, {}", kh));
                b.line(fmt::format("        remu s6, s5, {}", s.stride));
                b.line(fmt::format("        bne s6, 0, cc_z{}", id));
                b.line(fmt::format("        divu s5, s5, {}", s.stride));
                b.line(fmt::format("        bge s5, {}, cc_z{}", Ho, id));
                b.line(fmt::format("        mul s6, s4, {}", Ho));
                b.line("        add s5, s5, s6");
                b.line(fmt::format("        mul s5, s5, {}", Wo));
                b.line(fmt::format("        add s5, s5, {}", r.x0));
                b.line(fmt::format("        mul s5, s5, {}", row));
                b.line(fmt::format("        add s5, s5, {}", t * pix));
                b.line("        add s13, s5, s1");
                b.line(fmt::format("        dma.hv [{}+{}], [s13], {}, {}, {}, {}, {}", slot, at,
                                   r.nx, pix, pix * s.stride, row, flag));
                b.line(fmt::format("        jmp cc_e{}", id));
                b.line(fmt::format("cc_z{}:", id));
                b.line(fmt::format("        dma.vv [{}+{}], {}, {}, {}, {}, {}, {}", slot, at,
                                   b.f(0), r.nx, pix, pix * s.stride, pix, flag));
                b.line(fmt::format("cc_e{}:", id));
            }));
    }
    sp.outs = {{2, 0}};
    sp.body = [=](Body& b) {
        for (size_t i = 0; i < tap_areas.size(); ++i)
            b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.a(0), i ? b.a(0) : b.f(0),
                              b.a(tap_areas[i]), vals));
    };
    std::vector<uint32_t> area_vals = sp.areas;
    sp.prologue = [=](Body& b) {
        zero_staging(b, tap_areas, area_vals, {std::max(s.width, Wo) * s.cin});
    };
    return sp;
}

Spec zero_spec(uint64_t units) {
    Spec sp;
    sp.name = "conv2d_grad_zero";
    sp.units = units;
    sp.areas = {1};
    sp.ins = {{1, 0}};
    sp.outs = {{1, 0}};
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s18", b.a(0), b.a(0), b.a(0)));
    };
    return sp;
}
}  // namespace

isa::Program pack_input_text(const Conv2dShape& s, const Conv2dTiling& t, uint64_t vmem) {
    const Spec sp = pack_input_spec(s, t);
    return build(sp, plan(sp, vmem));
}
isa::Program pack_weight_text(const Conv2dShape& s, const Conv2dTiling& t, uint64_t vmem) {
    const Spec sp = pack_weight_spec(s, t);
    return build(sp, plan(sp, vmem));
}
isa::Program im2col_tap_text(const Conv2dShape& s, uint32_t kh, uint32_t kw, uint64_t vmem) {
    const Spec sp = im2col_tap_spec(s, kh, kw);
    return build(sp, plan(sp, vmem));
}
isa::Program col2im_tap_text(const Conv2dShape& s, uint32_t kh, uint32_t kw, uint64_t vmem) {
    const Spec sp = col2im_tap_spec(s, kh, kw);
    return build(sp, plan(sp, vmem));
}
isa::Program im2col_rows_text(const Conv2dShape& s, uint64_t vmem) {
    const Spec sp = im2col_rows_spec(s);
    return build(sp, plan(sp, vmem));
}
isa::Program col2im_rows_text(const Conv2dShape& s, uint64_t vmem) {
    const Spec sp = col2im_rows_spec(s);
    return build(sp, plan(sp, vmem));
}
isa::Program zero_text(uint64_t units, uint64_t vmem) {
    const Spec sp = zero_spec(units);
    return build(sp, plan(sp, vmem));
}

}  // namespace tpu::driver::text
