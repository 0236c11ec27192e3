// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/gemm.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/launch_group.h"
#include "hw/board.h"
#include "hw/core/core_model.h"
#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"
#include "hw/mem/hbm_timing.h"
#include "sim/metrics.h"

namespace tpu::driver {

std::vector<std::pair<int, int>> mxu_passes(Precision p) {
    switch (p) {
        case Precision::Bf16:
            return {{0, 0}};
        case Precision::Fp32Pass3:
            return {{1, 0}, {0, 1}, {0, 0}};
        case Precision::Fp32Pass6:
            return {{2, 0}, {0, 2}, {1, 1}, {1, 0}, {0, 1}, {0, 0}};
    }
    return {};
}

namespace {

std::vector<std::pair<int, int>> passes(Precision p) {
    return mxu_passes(p);
}

int parts(Precision p) {
    return p == Precision::Bf16 ? 1 : p == Precision::Fp32Pass3 ? 2 : 3;
}

uint32_t round_up(uint32_t x, uint32_t m) {
    return (x + m - 1) / m * m;
}

/// `n` fp32 values from `src` as bf16 into `dst` (parts `part_stride` apart, P of them), then
/// zeros up to `width`: one row of a tile in the kernel's HBM layout. The one-part loop is the
/// common case and vectorises.
void pack_row(const float* src, uint32_t n, uint32_t width, int P, size_t part_stride,
              uint16_t* dst) {
    if (P == 1) {
        for (uint32_t i = 0; i < n; ++i) dst[i] = hw::f32_to_bf16(src[i]);
    } else {
        for (uint32_t i = 0; i < n; ++i) {
            const auto s = hw::split3(src[i]);
            for (int q = 0; q < P; ++q) dst[q * part_stride + i] = s[q];
        }
    }
    for (int q = 0; q < P; ++q)
        std::fill(dst + q * part_stride + n, dst + q * part_stride + width, 0);
}

/// VMEM map of the kernel: A block panels, double-buffered W tiles per MXU, double-buffered C
/// panels per MXU.
struct VmemMap {
    uint64_t a, w, c, end;
};
VmemMap vmem_map(const GemmTiling& t) {
    const uint64_t kt = t.Kp / t.R, pa = parts(t.precision);
    VmemMap m{};
    m.a = 0;
    m.w = m.a + pa * (t.a_stream ? 2 : kt) * t.block_rows * t.R * 2;
    m.c = m.w + uint64_t(t.mxus) * 2 * pa * t.R * t.C * 2;
    m.end = m.c + uint64_t(t.mxus) * 2 * t.block_rows * t.C * 4;
    return m;
}

}  // namespace

std::string_view precision_name(Precision p) {
    switch (p) {
        case Precision::Bf16:
            return "bf16";
        case Precision::Fp32Pass3:
            return "fp32-3pass";
        case Precision::Fp32Pass6:
            return "fp32-6pass";
    }
    return "?";
}

Precision parse_precision(std::string_view name) {
    for (Precision p : {Precision::Bf16, Precision::Fp32Pass3, Precision::Fp32Pass6})
        if (precision_name(p) == name) return p;
    throw DeviceError(ErrorKind::Usage,
                      fmt::format("unknown precision '{}' (expected bf16, fp32-3pass or "
                                  "fp32-6pass)",
                                  name));
}

namespace {

/// HBM bytes per value of A, W and C (bf16 parts of the GEMM, or a fused kernel's fp32 / bf16).
struct ValueBytes {
    uint64_t a, w, c;
};
ValueBytes value_bytes(const GemmTiling& t, const GemmTraffic& x) {
    const uint64_t P = parts(t.precision);
    return {x.a_fp32 ? 4 : 2 * P, x.w_fp32 ? 4 : 2 * P, x.c_bf16 ? 2u : 4u};
}

/// HBM bytes of one core's kernel on `rows` rows: A once (once per column group when
/// streamed), W once per row block, C once, and `x`'s side inputs (fp32 operands are counted
/// at their padded width Kp, Np: at most R - 1 columns more than they hold).
uint64_t traffic_bytes(const GemmTiling& t, uint32_t rows, const GemmTraffic& x = {}) {
    const ValueBytes v = value_bytes(t, x);
    const uint64_t blocks = (rows + t.block_rows - 1) / t.block_rows;
    const uint64_t groups = (t.Np / t.C + t.mxus - 1) / t.mxus;
    return (t.a_stream ? groups : 1) * v.a * rows * t.Kp + blocks * v.w * t.Kp * t.Np +
           uint64_t(rows) * t.Np * v.c + uint64_t(x.full_sides) * rows * t.Np * 4 +
           uint64_t(x.column_sides) * t.Np * 4;
}

/// The share of HBM peak the planner counts on while the MXUs work. One sequential stream gets
/// 92.5% of peak from the banked HBM2 model (bench/hbm_bench), but the kernel keeps A panels,
/// weight tiles and C pieces in flight together and measures 60-77% on the shapes of
/// driver/README.md; planning at peak picks HBM-bound tilings (2048^3 with wavefront swaps:
/// 435 k cycles planned at peak, 332 k at this share).
constexpr double kPlannedHbmShare = kGemmPlannedHbmShare;

/// gemm_estimate_cycles at `bw` HBM bytes per cycle; `drains` = CoreConfig::mxu_swap_drains.
double estimate_cycles(const GemmTiling& t, uint32_t rows, double bw, bool drains,
                       const GemmTraffic& x = {}) {
    const uint64_t R = t.R, C = t.C, KT = t.Kp / t.R, NT = t.Np / t.C, T = t.block_rows;
    const uint64_t npass = passes(t.precision).size();
    const ValueBytes v = value_bytes(t, x);
    const uint64_t groups = (NT + t.mxus - 1) / t.mxus, blocks = (rows + T - 1) / T;
    const uint64_t last_rows = rows - (blocks - 1) * T;
    const uint64_t last_panels = NT % t.mxus ? NT % t.mxus : t.mxus;
    // A step streams its rows through a new weight tile on each MXU: what the MXU charges per
    // tile (hw/README.md, "MXU timing").
    auto step = [&](uint64_t r) {
        return hw::MxuTimer::swap_step_cycles(uint32_t(R), uint32_t(C), drains, r);
    };
    const uint64_t compute = ((blocks - 1) * step(T) + step(last_rows)) * KT * groups * npass;
    // A first panel that waits for the previous matmuls to free its place: in every later group
    // when A streams and KT is odd, in every later block when A is kept (see GemmGen).
    const uint64_t waits = t.a_stream ? (KT % 2 ? blocks * groups - 1 : 0) : blocks - 1;
    const uint64_t regroup = waits * v.a * std::min<uint64_t>(rows, T) * R;
    // Exposed: what moves before the first matmul (an A panel, the first weight tiles) and
    // after the last one (the last group's C and the side tiles its epilogue reads).
    const uint64_t exposed =
        v.a * std::min<uint64_t>(rows, T) * R + v.w * std::min<uint64_t>(NT, t.mxus) * R * C +
        last_rows * last_panels * C * (v.c + 4 * uint64_t(x.full_sides)) + regroup;
    return double(exposed) / bw +
           std::max(double(compute),
                    double(traffic_bytes(t, rows, x) - exposed) / (bw * kPlannedHbmShare));
}

double hbm_peak(const hw::BoardConfig& cfg) {
    return hw::hbm_peak_bytes_per_cycle(cfg);
}

/// Largest block the planner considers: beyond it the arrays' fill and drain are amortised.
constexpr uint32_t kMaxBlockRows = 4096;

}  // namespace

double gemm_estimate_cycles(const hw::BoardConfig& cfg, const GemmTiling& t, uint32_t rows) {
    return estimate_cycles(t, rows, hbm_peak(cfg), cfg.core.mxu_swap_drains);
}

double gemm_estimate_cycles(const hw::BoardConfig& cfg, const GemmTiling& t, uint32_t rows,
                            const GemmTraffic& extra) {
    return estimate_cycles(t, rows, hbm_peak(cfg), cfg.core.mxu_swap_drains, extra);
}

GemmTiling plan_gemm(const hw::BoardConfig& cfg, uint32_t max_rows, uint32_t K, uint32_t N,
                     Precision precision) {
    GemmTiling base;
    base.R = cfg.core.mxu_rows;
    base.C = cfg.core.mxu_cols;
    base.Kp = round_up(K, base.R);
    base.Np = round_up(N, base.C);
    // Every MXU of the core: a group of column panels has one per MXU.
    base.mxus = cfg.core.mxus;
    base.precision = precision;
    const uint32_t rows = std::max<uint32_t>(max_rows, 1);
    // Blocks of up to kMaxBlockRows rows (VMEM bounds them; long blocks amortise the arrays' fill
    // and drain), cut evenly; below R rows a block only adds steps bound by the weight load.
    const double bw = hbm_peak(cfg);
    GemmTiling best;
    double best_est = -1;
    for (bool stream : {false, true})
        for (uint32_t nb = 1; nb <= (rows + 7) / 8; ++nb) {
            GemmTiling t = base;
            t.a_stream = stream;
            t.block_rows = round_up((rows + nb - 1) / nb, 8);
            if (t.block_rows > kMaxBlockRows) continue;
            if (best_est >= 0 && t.block_rows < std::min(rows, t.R)) break;
            if (vmem_map(t).end > cfg.core.vmem_bytes) continue;
            const double est = estimate_cycles(t, rows, bw, cfg.core.mxu_swap_drains);
            if (best_est < 0 || est < best_est) {
                best = t;
                best_est = est;
            }
        }
    if (best_est < 0)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("GEMM with K = {} in {} does not fit in {} bytes of VMEM "
                                      "(core.vmem_bytes) even 8 rows at a time",
                                      K, precision_name(precision), cfg.core.vmem_bytes));
    return best;
}

size_t hash_value(const GemmKey& k) {
    const GemmTiling& t = k.tiling;
    return hash_fields(t.R, t.C, t.Kp, t.Np, t.block_rows, t.mxus, t.precision, t.tiled, t.a_stream,
                       k.compact_cols);
}

namespace {

using isa::imm;
using isa::Opcode;

/// A flag and the register that counts the instructions issued on it, several at a time (the
/// kernel adds a step's count after its instructions, then waits for the register).
struct Tally {
    isa::Flag flag;
    isa::Reg count;
};

/// Most MXUs the kernel drives: a weight-load and a matmul flag each, besides its four DMA flags.
constexpr uint32_t kGemmMaxMxus = 8;

/// VMEM areas are placed at the next multiple of this (every area of the kernel is a multiple of
/// it for any MXU of at least 4 x 4, so they lie back to back as in the original map).
constexpr uint64_t kGemmAlign = 32;

/// The kernel for `key` (see emit_gemm). Registers and flags keep the numbering of the text
/// kernel it replaced as hints: s6 row, s7 block rows, s8 group, s9 K step, s10/s11/s14/s15
/// scratch, s12 C parity, s13 block bytes of an A panel (tiled), s16-s19 per step, s20 the
/// block's offset in an A panel, s21 C panel bytes, s22/s23 weight loads and s24/s25 matmuls
/// per MXU (f2/f3, f4/f5), s27/s30 transfers into step slot 0/1 (f1/f8), s26/s28 C stores out
/// of C slot 0/1 (f6/f7), s29 groups done, s31 bytes of an A panel (tiled).
class GemmGen {
    using enum isa::Opcode;

public:
    GemmGen(isa::Builder& b, const GemmKey& key, const GemmOperands& ops)
        : m_b(b), m_t(key.tiling), m_nout(key.compact_cols), m_ops(ops) {}

    void emit() {
        const GemmTiling& t = m_t;
        // At the program's first instruction every register the pool hands out is 0.
        const bool fresh = m_b.pc() == 0;
        const auto scope = m_b.scope("gemm");
        R = t.R;
        C = t.C;
        KT = t.Kp / R;
        NT = t.Np / C;
        Tm = t.block_rows;
        PA = parts(t.precision);
        pass_list = passes(t.precision);
        panel = uint64_t(Tm) * R * 2;
        wtile = uint64_t(R) * C * 2;
        cslot = uint64_t(Tm) * C * 4;
        wpart_stride = uint64_t(t.Kp) * t.Np * 2;
        full = NT / t.mxus;
        tail = NT % t.mxus;
        c_stride = uint64_t(m_nout ? m_nout : t.Np) * 4;
        last_bytes = m_nout ? (m_nout - (NT - 1) * C) * 4 : C * 4;
        stream = t.a_stream;
        defer = t.tiled;
        // Tiled layout: C stores are deferred (see flush); the pending ones in scalar memory.
        if (defer) m_pend = m_b.smem("pending_c", 5);
        // VMEM: A's panels (the block's, or two slots when streamed), two slots of weight tiles
        // per MXU, two C slots per MXU (vmem_map, which the planner checks against VMEM).
        const VmemMap vm = vmem_map(t);
        m_va = m_b.vmem("a", vm.w - vm.a, kGemmAlign);
        m_vw = m_b.vmem("w", vm.c - vm.w, kGemmAlign);
        m_vc = m_b.vmem("c", vm.end - vm.c, kGemmAlign);

        m_row = m_b.reg("row", 6);
        m_rows = m_b.reg("block_rows", 7);
        m_group = m_b.reg("group", 8);
        m_k = m_b.reg("k", 9);
        m_t0 = m_b.reg("tmp0", 10);
        m_t1 = m_b.reg("tmp1", 11);
        m_par = m_b.reg("c_parity", 12);
        if (t.tiled) m_a_rows_bytes = m_b.reg("a_rows_bytes", 13);
        m_t2 = m_b.reg("tmp2", 14);
        m_t3 = m_b.reg("tmp3", 15);
        m_a_row = m_b.reg("a_row", 20);
        // MXUs that run the same groups have the same counts: all of them, except that only
        // MXUs 0 .. tail - 1 run a block's tail group. Up to two MXUs keep a register each (the
        // text kernel's numbering); more share one per class, so the kernel holds at most four
        // count registers (26 registers besides its operands) for any number of MXUs.
        m_per_mxu = t.mxus <= 2;
        for (uint32_t m = 0; m < t.mxus; ++m) {
            const bool own = m < 2;  // the text kernel's flags and registers as hints
            m_lwf[m] = m_b.flag(fmt::format("lw{}", m), own ? 2 + int(m) : -1);
            if (m_per_mxu || cls_first(m, t.mxus))
                m_lwc[cls(m)] = m_b.reg(fmt::format("lw{}.count", m), own ? 22 + int(m) : 0);
            m_mmf[m] = m_b.flag(fmt::format("mm{}", m), own ? 4 + int(m) : -1);
            if (m_per_mxu || cls_first(m, t.mxus))
                m_mmc[cls(m)] = m_b.reg(fmt::format("mm{}.count", m), own ? 24 + int(m) : 0);
        }
        // Per-slot flags and counts: a banked HBM can finish a DMA before one issued earlier,
        // so a count over both slots of one flag would not prove that the slot about to be read
        // is full. Waiting for every transfer issued into one slot is exact: the next one into
        // it is issued only after the wait.
        m_cout[0] = {m_b.flag("c_out0", 6), m_b.reg("c_out0.count", 26)};
        m_loads[0] = {m_b.flag("loads0", 1), m_b.reg("loads0.count", 27)};
        m_cout[1] = {m_b.flag("c_out1", 7), m_b.reg("c_out1.count", 28)};
        m_groups = m_b.reg("groups", 29);
        m_loads[1] = {m_b.flag("loads1", 8), m_b.reg("loads1.count", 30)};
        if (t.tiled) m_a_panel_bytes = m_b.reg("a_panel_bytes", 31);
        if (!fresh) {
            for (uint32_t m = 0; m < t.mxus; ++m)
                if (cls_first(m, t.mxus))
                    for (const isa::Reg* r : {&lwc(m), &mmc(m)}) E(Li, {*r, imm(0)});
            for (const isa::Reg* r : {&m_cout[0].count, &m_cout[1].count, &m_loads[0].count,
                                      &m_loads[1].count, &m_groups})
                E(Li, {*r, imm(0)});
        }

        // Bytes of one column panel of A in the tile-major layout (rows x R bf16).
        if (t.tiled) E(Mul, {m_a_panel_bytes, rows(), imm(R * 2)});
        // Scalar memory keeps its words across launches: no C store is pending yet.
        if (defer) E(Sw, {imm(0), m_pend.word(kPend)});
        E(Li, {m_row, imm(0)});
        const isa::Label block = m_b.label("block"), rows_ok = m_b.label("rows_ok");
        m_b.bind(block);
        E(Sub, {m_rows, rows(), m_row});
        E(Li, {m_t0, imm(Tm)});
        E(Bltu, {m_rows, m_t0, rows_ok});
        E(Li, {m_rows, imm(Tm)});
        m_b.bind(rows_ok);
        // A block: its panels stream in with the first group's weight tiles (a_panel below), so
        // the first matmul waits for one panel, not the whole block. a_row = the block's first
        // row within a panel, a_rows_bytes = bytes of the block's rows of one panel (tiled).
        if (t.tiled) {
            E(Mul, {m_a_row, m_row, imm(R * 2)});
            E(Mul, {m_a_rows_bytes, m_rows, imm(R * 2)});
        } else {
            E(Mul, {m_a_row, m_row, imm(int64_t(t.Kp) * 2)});
        }
        if (full) {
            E(Li, {m_group, imm(0)});
            const isa::Label pair = m_b.label("pair");
            m_b.bind(pair);
            group(int(t.mxus), "full");
            E(Add, {m_group, m_group, imm(1)});
            E(Bne, {m_group, imm(full), pair});
        }
        if (tail) {
            // The last tail < mxus panels on MXUs 0 .. tail - 1: n = group + m with
            // group = full * mxus.
            E(Li, {m_group, imm(int64_t(full) * t.mxus)});
            group(int(tail), "tail");
        }
        E(Add, {m_row, m_row, m_rows});
        E(Bltu, {m_row, rows(), block});
        if (defer) flush("end", true);
        E(Wait, {m_cout[0].flag, m_cout[0].count});
        E(Wait, {m_cout[1].flag, m_cout[1].count});
    }

private:
    static constexpr int kPend = 0, kDst = 1, kRows = 2, kPar = 3, kDone = 4;  // words

    void E(Opcode op, std::initializer_list<isa::Arg> args) { m_b.emit(op, args); }
    isa::Arg rows() const { return m_ops.rows.value; }
    /// MXU m's count class: itself (per MXU), else 0 for MXUs that run the tail group, 1 for
    /// the others.
    uint32_t cls(uint32_t m) const { return m_per_mxu ? m : (m < tail ? 0 : 1); }
    /// MXU m is the first of its class among MXUs 0 .. nm - 1: where a class count is set or
    /// advanced once for the whole class.
    bool cls_first(uint32_t m, uint32_t nm) const {
        return m < nm && (m == 0 || cls(m - 1) != cls(m));
    }
    const isa::Reg& lwc(uint32_t m) const { return m_lwc[cls(m)]; }
    const isa::Reg& mmc(uint32_t m) const { return m_mmc[cls(m)]; }
    isa::Label label(const std::string& name) { return m_b.label(name); }

    /// VMEM home of W part q for MXU m in `slot`.
    uint64_t w_home(uint32_t m, int slot, int q) const {
        return m_vw.addr() + ((uint64_t(m) * 2 + slot) * PA + q) * wtile;
    }
    /// VMEM home of A part `pa`: the step's slot when streamed, else panel 0 of the block's.
    uint64_t a_home(int slot, int pa) const {
        return stream ? m_va.addr() + (uint64_t(pa) * 2 + slot) * panel
                      : m_va.addr() + uint64_t(pa) * KT * panel;
    }
    /// C slot `slot` of MXU m.
    uint64_t c_home(uint32_t m, int slot) const {
        return m_vc.addr() + (uint64_t(m) * 2 + slot) * cslot;
    }

    /// W tile (k = `kreg`) of panel n for MXU m into `slot`: rows k R.., columns n C...
    void w_dma(const isa::Reg& kreg, uint32_t m, int slot) {
        if (m_t.tiled) {
            // Tile (k, n) is one contiguous run of R x C x 2 bytes.
            E(Mul, {m_t2, kreg, imm(int64_t(NT) * wtile)});
            E(Mul, {m_t3, m_group, imm(int64_t(m_stride) * wtile)});
        } else {
            E(Mul, {m_t2, kreg, imm(int64_t(R) * m_t.Np * 2)});
            E(Mul, {m_t3, m_group, imm(int64_t(m_stride) * C * 2)});
        }
        E(Add, {m_t2, m_t2, m_t3});
        E(Add, {m_t2, m_t2, m_ops.w.value});
        for (int q = 0; q < PA; ++q) {
            if (q) E(Add, {m_t2, m_t2, imm(int64_t(wpart_stride))});
            const isa::Arg dst = imm(int64_t(w_home(m, slot, q)));
            if (m_t.tiled)
                E(DmaHv, {dst, m_t2 + int64_t(m * wtile), imm(1), imm(int64_t(wtile)),
                          imm(int64_t(wtile)), imm(int64_t(wtile)), m_loads[slot].flag});
            else
                E(DmaHv, {dst, m_t2 + int64_t(m) * C * 2, imm(R), imm(C * 2), imm(C * 2),
                          imm(int64_t(m_t.Np) * 2), m_loads[slot].flag});
        }
    }
    void w_tiles(const isa::Reg& kreg, int nm, int slot) {
        for (int m = 0; m < nm; ++m) w_dma(kreg, uint32_t(m), slot);
        E(Add, {m_loads[slot].count, m_loads[slot].count, imm(PA * nm)});
    }

    /// A panel k = `kreg` of this block into the A area, counted with the weight tiles of
    /// `slot`. Kept (a_stream off): only the block's first group (group = 0) loads the panels,
    /// each into its own place, and the later groups reuse them. Streamed: every group loads
    /// panel k into the step's slot, next to the weight tiles, so VMEM holds two panels instead
    /// of the block.
    void a_panel(const isa::Reg& kreg, int slot) {
        const isa::Label skip = label("a_kept");
        if (!stream) E(Bne, {m_group, imm(0), skip});
        if (m_t.tiled)
            E(Mul, {m_t0, kreg, m_a_panel_bytes});
        else
            E(Mul, {m_t0, kreg, imm(R * 2)});
        E(Add, {m_t0, m_t0, m_a_row});
        E(Add, {m_t0, m_t0, m_ops.a.value});
        if (stream)
            E(Li, {m_t1, imm(0)});
        else
            E(Mul, {m_t1, kreg, imm(int64_t(panel))});
        for (int p = 0; p < PA; ++p) {
            if (p) E(Add, {m_t0, m_t0, m_ops.a_part_bytes.value});
            if (m_t.tiled)
                E(DmaHv, {m_t1 + int64_t(a_home(slot, p)), m_t0, imm(1), m_a_rows_bytes,
                          m_a_rows_bytes, m_a_rows_bytes, m_loads[slot].flag});
            else
                E(DmaHv, {m_t1 + int64_t(a_home(slot, p)), m_t0, m_rows, imm(R * 2), imm(R * 2),
                          imm(int64_t(m_t.Kp) * 2), m_loads[slot].flag});
        }
        E(Add, {m_loads[slot].count, m_loads[slot].count, imm(PA)});
        if (!stream) m_b.bind(skip);
    }

    /// Waits until A's place about to be refilled is no longer read: for each MXU m, until its
    /// matmuls counted in mm[m] (every earlier group's) plus `plus` (this group's done so far;
    /// for MXUs in the group) less `back` (the last ones, which read the other slot) are done.
    void a_slot_free(int nm, const isa::Reg* plus, int back) {
        for (uint32_t m = 0; m < m_t.mxus; ++m) {
            const isa::Flag& flag = m_mmf[m];
            const isa::Reg& count = mmc(m);
            if (int(m) < nm && plus) {
                E(Add, {m_t0, count, *plus});
                E(Wait, {flag, m_t0});
            } else if (back > 0) {
                const isa::Label none = label("a_free");
                E(Beq, {count, imm(0), none});
                E(Sub, {m_t0, count, imm(back)});
                E(Wait, {flag, m_t0});
                m_b.bind(none);
            } else {
                E(Wait, {flag, count});
            }
        }
    }

    /// K step k (even for slot 0, odd for slot 1) of a group: prefetch step k + 1 into the other
    /// slot, wait for this slot's tiles, run the passes. Kept A: the prefetch goes first, so two
    /// steps' transfers are in flight while the MXUs work. Streamed A: the step's matmuls go
    /// first, because the slot the prefetch refills is free only once the previous step's
    /// matmuls are done, and waiting for that before issuing this step would idle the MXUs.
    void k_step(int nm, int slot, const isa::Label& top) {
        const int npass = int(pass_list.size());
        auto prefetch = [&] {
            const isa::Reg next = m_b.reg("k_next", 16);
            const isa::Label none = label("no_prefetch");
            E(Add, {next, m_k, imm(1)});
            E(Beq, {next, imm(KT), none});
            // The slot about to be refilled was read by the previous step's weight loads (the
            // ones before this step's when this step's are already issued).
            for (int m = 0; m < nm; ++m) {
                if (stream) {
                    E(Sub, {m_t0, lwc(m), imm(npass)});
                    E(Wait, {m_lwf[m], m_t0});
                } else {
                    E(Wait, {m_lwf[m], lwc(m)});
                }
            }
            // ... and, streamed, its A panel by the previous step's matmuls (k of this group's
            // are counted: steps 0 .. k - 1).
            if (stream) a_slot_free(nm, &m_k, 0);
            w_tiles(next, nm, 1 - slot);
            a_panel(next, 1 - slot);
            m_b.bind(none);
        };
        m_b.bind(top);
        if (!stream) prefetch();
        E(Wait, {m_loads[slot].flag, m_loads[slot].count});
        const isa::Reg a_at = m_b.reg("a_at", 17), c_at = m_b.reg("c_at", 18);
        const isa::Reg acc = m_b.reg("accumulate", 19);
        if (!stream) E(Mul, {a_at, m_k, imm(int64_t(panel))});
        E(And, {c_at, m_groups, imm(1)});
        E(Mul, {c_at, c_at, imm(int64_t(cslot))});
        E(Sltu, {acc, imm(0), m_k});
        for (int m = 0; m < nm; ++m) {
            for (size_t i = 0; i < pass_list.size(); ++i) {
                const auto [pa, pw] = pass_list[i];
                E(MxuLw, {imm(m), imm(int64_t(w_home(m, slot, pw))), imm(R), imm(C), m_lwf[m]});
                const isa::Arg a_src =
                    stream ? imm(int64_t(a_home(slot, pa))) : a_at + int64_t(a_home(slot, pa));
                const isa::Arg dst = c_at + int64_t(c_home(m, 0));
                const isa::Arg mode = i == 0 ? isa::Arg(acc) : imm(1);
                if (i + 1 == pass_list.size())
                    E(MxuMm, {imm(m), dst, a_src, m_rows, mode, m_mmf[m]});
                else
                    E(MxuMm, {imm(m), dst, a_src, m_rows, mode});
            }
            if (cls_first(uint32_t(m), uint32_t(nm))) E(Add, {lwc(m), lwc(m), imm(npass)});
        }
        if (stream) prefetch();
        E(Add, {m_k, m_k, imm(1)});
    }

    /// Tiled layout: a group's C stores wait in scalar memory until the next group has queued
    /// its first matmuls and weight tiles, then leave in pieces of `piece` rows, one piece per
    /// odd K step of the next group, so the in-order DMA engine never holds the tiles the MXUs
    /// need next behind a megabyte of results. Scalar memory: pending panels (0 = none), the
    /// first panel's HBM address, rows, C slot parity, rows already stored. `all` stores
    /// everything still pending.
    void flush(const std::string& tag, bool all) {
        const uint32_t half = std::max(KT / 2, 1u);
        const uint32_t piece = round_up((Tm + half - 1) / half, 8);
        const isa::Reg done = m_b.reg("flush.done", 16), n = m_b.reg("flush.rows", 17);
        const isa::Reg par = m_b.reg("flush.parity", 18), pbytes = m_b.reg("flush.panel_bytes", 19);
        const isa::Label fd = label("fd_" + tag), fr = label("fr_" + tag), fs = label("fs_" + tag);
        E(Lw, {m_t1, m_pend.word(kPend)});
        E(Beq, {m_t1, imm(0), fd});
        E(Lw, {m_t0, m_pend.word(kDst)});
        E(Lw, {n, m_pend.word(kRows)});
        E(Lw, {par, m_pend.word(kPar)});
        E(Lw, {done, m_pend.word(kDone)});
        E(Sub, {n, n, done});
        if (!all) {
            E(Li, {m_t2, imm(piece)});
            E(Bltu, {n, m_t2, fr});
            E(Add, {n, m_t2, imm(0)});
        }
        // tmp3: the piece's offset in the C slot and in each HBM panel (both rows x C fp32).
        m_b.bind(fr);
        E(Mul, {m_t3, done, imm(C * 4)});
        E(Add, {m_t0, m_t0, m_t3});
        E(Mul, {pbytes, rows(), imm(C * 4)});
        for (uint32_t m = 0; m < m_t.mxus; ++m) {
            // The pending group's last matmul on MXU m (a count its kend already added).
            E(Wait, {m_mmf[m], mmc(m)});
            if (m > 0) {
                E(Beq, {m_t1, imm(m), fs});
                E(Add, {m_t0, m_t0, pbytes});
            }
            const isa::Label fa = label("fa_" + tag), fb = label("fb_" + tag);
            E(Bne, {par, imm(0), fa});
            for (int slot = 0; slot < 2; ++slot) {
                if (slot) m_b.bind(fa);
                E(DmaVh, {m_t0, m_t3 + int64_t(c_home(m, slot)), n, imm(C * 4), imm(C * 4),
                          imm(C * 4), m_cout[slot].flag});
                if (!slot) E(Jmp, {fb});
            }
            m_b.bind(fb);
        }
        // c_out1 += panels on slot 1, c_out0 += panels on slot 0.
        m_b.bind(fs);
        E(Mul, {m_t2, par, m_t1});
        E(Add, {m_cout[1].count, m_cout[1].count, m_t2});
        E(Sub, {m_t2, m_t1, m_t2});
        E(Add, {m_cout[0].count, m_cout[0].count, m_t2});
        E(Add, {done, done, n});
        E(Sw, {done, m_pend.word(kDone)});
        E(Lw, {m_t2, m_pend.word(kRows)});
        E(Bltu, {done, m_t2, fd});
        E(Sw, {imm(0), m_pend.word(kPend)});
        m_b.bind(fd);
    }

    /// One group of `nm` column panels (n = group nm + m on MXU m; the tail: n = group + m),
    /// all K tiles.
    void group(int nm, const std::string& tag) {
        m_stride = tag == "tail" ? 1 : uint32_t(nm);
        // Every store out of the C slot this group writes (groups & 1; the previous group used
        // the other one) has read it.
        const isa::Label c1 = label("c1_" + tag), c = label("c_" + tag);
        E(And, {m_par, m_groups, imm(1)});
        E(Bne, {m_par, imm(0), c1});
        E(Wait, {m_cout[0].flag, m_cout[0].count});
        E(Jmp, {c});
        m_b.bind(c1);
        E(Wait, {m_cout[1].flag, m_cout[1].count});
        m_b.bind(c);
        E(Li, {m_k, imm(0)});
        // Slot 0 may still feed the previous group's last weight loads, and, streamed, its A
        // panel the previous group's matmuls of step KT - 2 (KT even) or KT - 1 (odd): every
        // one of them counted but the last when KT is even.
        for (int m = 0; m < nm; ++m) E(Wait, {m_lwf[m], lwc(m)});
        if (stream) a_slot_free(nm, nullptr, KT % 2 == 0 ? 1 : 0);
        // Kept A: a new block's panels overwrite the ones every matmul so far has read.
        if (!stream) {
            const isa::Label gk = label("gk_" + tag);
            E(Bne, {m_group, imm(0), gk});
            a_slot_free(nm, nullptr, 0);
            m_b.bind(gk);
        }
        w_tiles(m_k, nm, 0);
        a_panel(m_k, 0);
        // Unrolled twice so that each step's slot, and so its flag, is fixed.
        const isa::Label k0 = label("k0_" + tag), k1 = label("k1_" + tag);
        const isa::Label kend = label("kend_" + tag);
        k_step(nm, 0, k0);
        E(Beq, {m_k, imm(KT), kend});
        k_step(nm, 1, k1);
        // The previous group's stores leave a piece per odd step, after that step's matmuls and
        // the next step's tiles are queued: by then that group's last matmul has drained, so
        // waiting for it does not idle the MXUs.
        if (defer) flush(tag, false);
        E(Bne, {m_k, imm(KT), k0});
        // Results out: wait for each MXU's last matmul, then DMA its panel to HBM.
        m_b.bind(kend);
        // What the odd steps did not store of the previous group goes now.
        if (defer) flush(tag + "_rest", true);
        const isa::Reg cbytes = m_b.reg("c_bytes", 21);
        if (m_t.tiled) {
            // Panel n of C is rows x C fp32, contiguous; c_bytes = its bytes.
            E(Mul, {m_t0, m_row, imm(C * 4)});
            E(Add, {m_t0, m_t0, m_ops.c.value});
            E(Mul, {cbytes, rows(), imm(C * 4)});
            E(Mul, {m_t1, m_group, imm(m_stride)});
            E(Mul, {m_t1, m_t1, cbytes});
        } else {
            E(Mul, {m_t0, m_row, imm(int64_t(c_stride))});
            E(Add, {m_t0, m_t0, m_ops.c.value});
            E(Mul, {m_t1, m_group, imm(int64_t(m_stride) * C * 4)});
        }
        E(Add, {m_t0, m_t0, m_t1});
        if (defer) {
            for (int m = 0; m < nm; ++m)
                if (cls_first(uint32_t(m), uint32_t(nm))) E(Add, {mmc(m), mmc(m), imm(KT)});
            E(Sw, {m_t0, m_pend.word(kDst)});
            E(Sw, {m_rows, m_pend.word(kRows)});
            E(Sw, {m_par, m_pend.word(kPar)});
            E(Sw, {imm(0), m_pend.word(kDone)});
            E(Li, {m_t1, imm(nm)});
            E(Sw, {m_t1, m_pend.word(kPend)});
            E(Add, {m_groups, m_groups, imm(1)});
            return;
        }
        for (int m = 0; m < nm; ++m) {
            if (cls_first(uint32_t(m), uint32_t(nm))) E(Add, {mmc(m), mmc(m), imm(KT)});
            E(Wait, {m_mmf[m], mmc(m)});
            // Compact C: the last panel (the tail group's, or the last full group's last MXU
            // when there is no tail) keeps only its valid columns.
            isa::Arg row_bytes = imm(C * 4);
            if (last_bytes != C * 4 && tag == "tail" && m == nm - 1) {
                row_bytes = imm(last_bytes);
            } else if (last_bytes != C * 4 && tail == 0 && m == nm - 1) {
                const isa::Label cw = label("cw_" + tag);
                row_bytes = cbytes;
                E(Li, {cbytes, imm(C * 4)});
                E(Bne, {m_group, imm(full - 1), cw});
                E(Li, {cbytes, imm(last_bytes)});
                m_b.bind(cw);
            }
            // Out of the group's C slot, raising that slot's flag.
            const isa::Label st1 = label("cst1_" + tag), std_ = label("cstd_" + tag);
            auto store = [&](int slot) {
                E(DmaVh, {m_t0 + int64_t(m) * C * 4, imm(int64_t(c_home(m, slot))), m_rows,
                          row_bytes, imm(int64_t(c_stride)), imm(C * 4), m_cout[slot].flag});
            };
            E(Bne, {m_par, imm(0), st1});
            store(0);
            E(Jmp, {std_});
            m_b.bind(st1);
            store(1);
            m_b.bind(std_);
        }
        // c_out1 += nm on slot 1, c_out0 += nm on slot 0.
        E(Mul, {m_t1, m_par, imm(nm)});
        E(Add, {m_cout[1].count, m_cout[1].count, m_t1});
        E(Sub, {m_t1, imm(nm), m_t1});
        E(Add, {m_cout[0].count, m_cout[0].count, m_t1});
        E(Add, {m_groups, m_groups, imm(1)});
    }

    isa::Builder& m_b;
    const GemmTiling& m_t;
    uint32_t m_nout;
    const GemmOperands& m_ops;

    uint32_t R = 0, C = 0, KT = 0, NT = 0, Tm = 0, full = 0, tail = 0, last_bytes = 0;
    int PA = 1;
    std::vector<std::pair<int, int>> pass_list;
    uint64_t panel = 0, wtile = 0, cslot = 0, wpart_stride = 0, c_stride = 0;
    bool stream = false, defer = false;

    isa::Smem m_pend;
    isa::Vmem m_va, m_vw, m_vc;
    isa::Reg m_row, m_rows, m_group, m_k, m_t0, m_t1, m_par, m_a_rows_bytes, m_t2, m_t3, m_a_row;
    isa::Reg m_groups, m_a_panel_bytes;
    Tally m_cout[2], m_loads[2];
    // Per MXU m: a weight-load flag and a matmul flag, each with the count of its instructions
    // issued so far in m_lwc / m_mmc[cls(m)].
    isa::Flag m_lwf[kGemmMaxMxus], m_mmf[kGemmMaxMxus];
    isa::Reg m_lwc[kGemmMaxMxus], m_mmc[kGemmMaxMxus];
    bool m_per_mxu = true;  ///< a count register per MXU, else per class (cls)
    uint32_t m_stride = 0;  ///< column panels between two groups of the current group()
};

}  // namespace

void emit_gemm(isa::Builder& b, const GemmKey& key, const GemmOperands& ops) {
    const GemmTiling& t = key.tiling;
    if (key.compact_cols && t.tiled)
        throw DeviceError(ErrorKind::Usage, "gemm: compact C is a row-major layout, not tiled");
    if (key.compact_cols && (key.compact_cols > t.Np || key.compact_cols + t.C <= t.Np))
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("gemm: compact C of {} columns does not match Np = {}",
                                      key.compact_cols, t.Np));
    if (t.R == 0 || t.C == 0 || t.Kp % t.R || t.Np % t.C || t.Kp == 0 || t.Np == 0 ||
        t.block_rows == 0 || t.mxus == 0 || t.mxus > kGemmMaxMxus)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("gemm: tiling R{} C{} Kp{} Np{} T{} mxus{} is not a plan",
                                      t.R, t.C, t.Kp, t.Np, t.block_rows, t.mxus));
    GemmGen(b, key, ops).emit();
}

isa::Program generate(const GemmKey& key) {
    isa::Builder b(key.name());
    const isa::Reg a = b.arg("a"), w = b.arg("w"), c = b.arg("c"), rows = b.arg("rows");
    const isa::Reg a_part_bytes = b.arg("a_part_bytes");
    using streaming::Operand;
    emit_gemm(b, key,
              {Operand::hbm(a), Operand::hbm(w), Operand::hbm(c), Operand::scalar(rows),
               Operand::scalar(a_part_bytes)});
    b.emit(Opcode::Halt, {});
    return b.finish();
}

std::vector<float> gemm_reference(const std::vector<float>& a, const std::vector<float>& w,
                                  uint32_t M, uint32_t K, uint32_t N, Precision precision,
                                  uint32_t R) {
    const int P = parts(precision);
    auto split = [&](const std::vector<float>& x) {
        std::vector<std::vector<uint16_t>> out(P, std::vector<uint16_t>(x.size()));
        for (size_t i = 0; i < x.size(); ++i) {
            const auto s = hw::split3(x[i]);
            for (int p = 0; p < P; ++p) out[p][i] = s[p];
        }
        return out;
    };
    const auto ap = split(a), wp = split(w);
    std::vector<float> c(size_t(M) * N, 0.0f);
    bool first = true;
    for (uint32_t k0 = 0; k0 < K; k0 += R) {
        const uint32_t kk = std::min(R, K - k0);
        for (const auto& [pa, pw] : passes(precision)) {
            std::vector<uint16_t> at(size_t(M) * kk), wt(size_t(kk) * N);
            for (uint32_t i = 0; i < M; ++i)
                std::copy_n(&ap[pa][size_t(i) * K + k0], kk, &at[size_t(i) * kk]);
            for (uint32_t k = 0; k < kk; ++k)
                std::copy_n(&wp[pw][size_t(k0 + k) * N], N, &wt[size_t(k) * N]);
            hw::mxu_matmul(at.data(), int(M), int(kk), wt.data(), int(N), c.data(), !first);
            first = false;
        }
    }
    return c;
}

GemmSplit plan_gemm_split(const hw::BoardConfig& cfg, uint32_t M, uint32_t K, uint32_t N,
                          Precision precision, uint32_t cores) {
    const uint32_t C = cfg.core.mxu_cols, NT = (N + C - 1) / C;
    const double bw = hbm_peak(cfg);
    GemmSplit best;
    double best_est = -1;
    std::string unfit;
    uint64_t best_traffic = 0;
    for (uint32_t gm = 1; gm <= std::min(cores, M); ++gm)
        for (uint32_t gn = 1; gm * gn <= cores && gn <= NT; ++gn) {
            // The busiest core: the most rows and the most column tiles.
            const uint32_t Mc = (M + gm - 1) / gm, ntc = (NT + gn - 1) / gn;
            GemmTiling t;
            try {
                t = plan_gemm(cfg, Mc, K, ntc * C, precision);
            } catch (const DeviceError& e) {
                unfit = e.what();  // does not fit in VMEM this way
                continue;
            }
            const uint64_t traffic = traffic_bytes(t, Mc);
            const double est = estimate_cycles(t, Mc, bw, cfg.core.mxu_swap_drains);
            if (best_est < 0 || est < best_est || (est == best_est && traffic < best_traffic)) {
                best = {gm, gn};
                best_est = est;
                best_traffic = traffic;
            }
        }
    if (best_est < 0) throw DeviceError(ErrorKind::Usage, unfit);
    return best;
}

GemmResult gemm(Device& dev, ProgramCache& cache, const std::vector<float>& a,
                const std::vector<float>& w, uint32_t M, uint32_t K, uint32_t N,
                Precision precision, const std::vector<uint32_t>& cores) {
    if (M == 0 || K == 0 || N == 0)
        throw DeviceError(ErrorKind::Usage, fmt::format("gemm: empty shape {}x{}x{}", M, K, N));
    if (a.size() != size_t(M) * K || w.size() != size_t(K) * N)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("gemm: A has {} values and W {}; {}x{}x{} needs {} and {}",
                                      a.size(), w.size(), M, K, N, size_t(M) * K, size_t(K) * N));
    if (cores.empty()) throw DeviceError(ErrorKind::Usage, "gemm: no cores");
    const hw::BoardConfig& cfg = dev.config();
    const uint32_t R = cfg.core.mxu_rows, C = cfg.core.mxu_cols, NT = (N + C - 1) / C;
    const GemmSplit split =
        plan_gemm_split(cfg, M, K, N, precision, static_cast<uint32_t>(cores.size()));
    const int P = parts(precision);

    // Core (i, j) = cores[i gn + j] takes row block i and column-tile block j, each as even as
    // the tiles allow.
    auto share = [](uint32_t total, uint32_t parts_n, uint32_t i) {
        return total / parts_n + (i < total % parts_n ? 1 : 0);
    };
    struct Part {
        uint32_t core, row0, rows, tile0, tiles;
        Buffer a, w, c;
    };
    std::vector<Part> work;
    for (uint32_t i = 0, r = 0; i < split.gm; ++i) {
        const uint32_t m = share(M, split.gm, i);
        for (uint32_t j = 0, t0 = 0; j < split.gn; ++j) {
            const uint32_t nt = share(NT, split.gn, j);
            work.push_back({cores[i * split.gn + j], r, m, t0, nt, {}, {}, {}});
            t0 += nt;
        }
        r += m;
    }
    uint32_t max_rows = 0;
    for (const Part& p : work) max_rows = std::max(max_rows, p.rows);
    // One program per column-block width (at most two: the blocks differ by one tile).
    std::map<uint32_t, GemmTiling> tilings;
    for (const Part& p : work)
        if (!tilings.count(p.tiles)) {
            GemmTiling t = plan_gemm(cfg, max_rows, K, p.tiles * C, precision);
            t.tiled = true;
            tilings.emplace(p.tiles, t);
        }
    const uint32_t Kp = tilings.begin()->second.Kp;

    // Host-side split and padding into the kernel's tile-major HBM layouts (gemm.h), as the
    // runtime lays arrays out on transfer.
    auto release = [&] {
        for (Part& p : work)
            for (Buffer* b : {&p.a, &p.w, &p.c})
                if (b->bytes) dev.free(*b);
    };
    GemmResult res;
    const uint64_t bytes_before = kernel_hbm_bytes(dev);
    // Timing only, no unit reads the operands or writes C, so the transfers are timed without
    // their bytes: packing A and W and unpacking C cost more host time than the launch.
    const bool values = cfg.sim.functional;
    try {
        for (Part& p : work) {
            const uint32_t Np = p.tiles * C, m = p.rows;
            p.a = dev.alloc(uint64_t(P) * m * Kp * 2, p.core);
            p.w = dev.alloc(uint64_t(P) * Kp * Np * 2, p.core);
            p.c = dev.alloc(uint64_t(m) * Np * 4, p.core);
            if (!values) {
                dev.write_timing(p.a, p.a.bytes);
                dev.write_timing(p.w, p.w.bytes);
                continue;
            }
            // Every element, padding included, is written below: no zero-fill ahead of it.
            const size_t a_part = size_t(m) * Kp, w_part = size_t(Kp) * Np;
            const std::unique_ptr<uint16_t[]> al(new uint16_t[P * a_part]);
            const std::unique_ptr<uint16_t[]> wl(new uint16_t[P * w_part]);
            for (uint32_t k0 = 0; k0 < Kp; k0 += R)
                for (uint32_t r = 0; r < m; ++r)
                    pack_row(&a[size_t(p.row0 + r) * K + k0], std::min(R, K - std::min(K, k0)), R,
                             P, a_part, &al[(size_t(k0 / R) * m + r) * R]);
            const uint32_t n0 = p.tile0 * C, n1 = std::min(N, n0 + Np);
            for (uint32_t k = 0; k < Kp; ++k)
                for (uint32_t t = 0; t < p.tiles; ++t) {
                    const uint32_t first = n0 + t * C;
                    const uint32_t n = k < K && first < n1 ? std::min(C, n1 - first) : 0;
                    const size_t tile = size_t(k / R) * p.tiles + t;
                    pack_row(n ? &w[size_t(k) * N + first] : nullptr, n, C, P, w_part,
                             &wl[(tile * R + k % R) * C]);
                }
            dev.write(p.a, al.get(), P * a_part * 2);
            dev.write(p.w, wl.get(), P * w_part * 2);
        }
        // Every block starts at once (disjoint cores): one launch per program.
        std::vector<LaunchHandle> handles;
        for (const auto& entry : tilings) {
            // Named, not a structured binding: clang before 16 cannot capture bindings.
            const uint32_t tiles = entry.first;
            const GemmTiling& t = entry.second;
            std::vector<const Part*> group;
            for (const Part& p : work)
                if (p.tiles == tiles) group.push_back(&p);
            std::vector<uint32_t> launch_cores;
            for (const Part* p : group) launch_cores.push_back(p->core);
            const isa::Program& prog = cache.get(GemmKey{t});
            handles.push_back(dev.launch_async(launch_cores, prog, [&, group](size_t j) {
                const Part& p = *group[j];
                return LaunchArgs(prog)
                    .set("a", p.a)
                    .set("w", p.w)
                    .set("c", p.c)
                    .set("rows", p.rows)
                    .set("a_part_bytes", p.rows * Kp * 2)
                    .values();
            }));
        }
        res.event = wait_all(dev, handles);
        size_t part_max = 0;
        for (const Part& p : work) part_max = std::max(part_max, size_t(p.rows) * p.tiles * C);
        // Overwritten whole by each read: no zero-fill.
        const std::unique_ptr<float[]> part(values ? new float[part_max] : nullptr);
        if (values) res.c.assign(size_t(M) * N, 0.0f);
        for (const Part& p : work) {
            if (!values) {
                dev.read_timing(p.c, p.c.bytes);
                continue;
            }
            const uint32_t Np = p.tiles * C, n0 = p.tile0 * C;
            dev.read(p.c, part.get(), size_t(p.rows) * Np * 4);
            for (uint32_t r = 0; r < p.rows; ++r)
                for (uint32_t n = n0; n < std::min(N, n0 + Np); n += C)
                    std::copy_n(&part[(size_t((n - n0) / C) * p.rows + r) * C], std::min(C, N - n),
                                &res.c[size_t(p.row0 + r) * N + n]);
        }
    } catch (...) {
        release();
        throw;
    }
    release();
    res.hbm_bytes = kernel_hbm_bytes(dev) - bytes_before;
    res.split = split;
    res.tiling = tilings.rbegin()->second;
    res.macs = uint64_t(M) * K * N * passes(precision).size();
    const double array = double(cfg.core.mxus) * R * C;
    const uint64_t cycles = res.event.end_cycle - res.event.start_cycle;
    res.mxu_utilization = sim::mxu_utilization(
        double(res.macs), sim::mxu_capacity(array, double(cycles), double(cores.size())));
    res.min_hbm_bytes = uint64_t(P) * (uint64_t(M) * K + uint64_t(K) * N) * 2 + uint64_t(M) * N * 4;
    res.roofline_cycles =
        std::max(double(res.macs) / (array * double(cores.size())),
                 double(res.min_hbm_bytes) / (hbm_peak(cfg) * double(cores.size())));
    return res;
}

}  // namespace tpu::driver
