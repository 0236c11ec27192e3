// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/gemm.h"

#include "driver/kernels/launch_group.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "hw/board.h"
#include "hw/core/core_model.h"
#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"
#include "hw/mem/hbm_timing.h"
#include "isa/assembler.h"
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

/// HBM bytes of one core's kernel on `rows` rows: A once (once per column group when
/// streamed), W once per row block, C once.
uint64_t traffic_bytes(const GemmTiling& t, uint32_t rows) {
    const uint64_t P = parts(t.precision), blocks = (rows + t.block_rows - 1) / t.block_rows;
    const uint64_t groups = (t.Np / t.C + t.mxus - 1) / t.mxus;
    return (t.a_stream ? groups : 1) * P * rows * t.Kp * 2 + blocks * P * t.Kp * t.Np * 2 +
           uint64_t(rows) * t.Np * 4;
}

/// The share of HBM peak the planner counts on while the MXUs work. One sequential stream gets
/// 92.5% of peak from the banked HBM2 model (bench/hbm_bench), but the kernel keeps A panels,
/// weight tiles and C pieces in flight together and measures 60-77% on the shapes of
/// driver/README.md; planning at peak picks HBM-bound tilings (2048^3 with wavefront swaps:
/// 435 k cycles planned at peak, 332 k at this share).
constexpr double kPlannedHbmShare = 0.75;

/// gemm_estimate_cycles at `bw` HBM bytes per cycle; `drains` = CoreConfig::mxu_swap_drains.
double estimate_cycles(const GemmTiling& t, uint32_t rows, double bw, bool drains) {
    const uint64_t R = t.R, C = t.C, KT = t.Kp / t.R, NT = t.Np / t.C, T = t.block_rows;
    const uint64_t P = parts(t.precision), npass = passes(t.precision).size();
    const uint64_t groups = (NT + t.mxus - 1) / t.mxus, blocks = (rows + T - 1) / T;
    const uint64_t last_rows = rows - (blocks - 1) * T;
    const uint64_t last_panels = NT % t.mxus ? NT % t.mxus : t.mxus;
    // A step streams its rows, but is never shorter than its weight load (R cycles); when
    // the array swaps weights only once empty, every step also waits for the previous one's
    // results to leave (R + C - 2 cycles; hw/README.md, "MXU").
    auto step = [&](uint64_t r) { return drains ? r + R + C - 2 : std::max(r, R); };
    const uint64_t compute = ((blocks - 1) * step(T) + step(last_rows)) * KT * groups * npass;
    // A first panel that waits for the previous matmuls to free its place: in every later group
    // when A streams and KT is odd, in every later block when A is kept (see gemm_program).
    const uint64_t waits = t.a_stream ? (KT % 2 ? blocks * groups - 1 : 0) : blocks - 1;
    const uint64_t regroup = waits * P * std::min<uint64_t>(rows, T) * R * 2;
    const uint64_t exposed = P * std::min<uint64_t>(rows, T) * R * 2 +
                             P * std::min<uint64_t>(NT, t.mxus) * R * C * 2 +
                             last_rows * last_panels * C * 4 + regroup;
    return double(exposed) / bw +
           std::max(double(compute),
                    double(traffic_bytes(t, rows) - exposed) / (bw * kPlannedHbmShare));
}

double hbm_peak(const hw::BoardConfig& cfg) {
    return hw::make_hbm_timing(cfg)->peak_bytes_per_cycle();
}

/// Largest block the planner considers: beyond it the arrays' fill and drain are amortised.
constexpr uint32_t kMaxBlockRows = 4096;

}  // namespace

double gemm_estimate_cycles(const hw::BoardConfig& cfg, const GemmTiling& t, uint32_t rows) {
    return estimate_cycles(t, rows, hbm_peak(cfg), cfg.core.mxu_swap_drains);
}

GemmTiling plan_gemm(const hw::BoardConfig& cfg, uint32_t max_rows, uint32_t K, uint32_t N,
                     Precision precision) {
    GemmTiling base;
    base.R = cfg.core.mxu_rows;
    base.C = cfg.core.mxu_cols;
    base.Kp = round_up(K, base.R);
    base.Np = round_up(N, base.C);
    base.mxus = std::min<uint32_t>(cfg.core.mxus, 2);
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

std::string gemm_key(const GemmTiling& t) {
    return fmt::format("gemm R{} C{} Kp{} Np{} T{} mxus{} {}{}{}", t.R, t.C, t.Kp, t.Np,
                       t.block_rows, t.mxus, precision_name(t.precision), t.tiled ? " tiled" : "",
                       t.a_stream ? " a-stream" : "");
}

namespace {

/// The kernel; `n_out` = 0 writes C padded (rows x Np), otherwise compact (rows x n_out).
isa::Program gemm_program_impl(const GemmTiling& t, uint32_t n_out) {
    const uint32_t R = t.R, C = t.C, KT = t.Kp / R, NT = t.Np / C, Tm = t.block_rows;
    const int PA = parts(t.precision);
    const auto pass_list = passes(t.precision);
    const VmemMap vm = vmem_map(t);
    const uint64_t panel = uint64_t(Tm) * R * 2, wtile = uint64_t(R) * C * 2;
    const uint64_t cslot = uint64_t(Tm) * C * 4, wpart_stride = uint64_t(t.Kp) * t.Np * 2;
    const uint32_t full = NT / t.mxus, tail = NT % t.mxus;
    const uint64_t c_stride = uint64_t(n_out ? n_out : t.Np) * 4;
    const uint32_t last_bytes = n_out ? (n_out - (NT - 1) * C) * 4 : C * 4;
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };

    L("# library GEMM: {} passes, R={} C={} Kp={} Np={} T={} mxus={}", pass_list.size(), R, C, t.Kp,
      t.Np, Tm, t.mxus);
    L("# s1 A, s2 W, s3 C (HBM), s4 rows, s5 A part stride; s6 block row, s7 block rows");
    L("# flags: f1/f8 W and A panels in (slot 0/1), f2/f3 lw done, f4/f5 mm done, f6/f7 C out "
      "(slot");
    L("# 0/1)");
    L("# counters: s22/s23 lw, s24/s25 mm, s27/s30 W+A into slot 0/1, s26/s28 C out of slot");
    L("# 0/1, s29 group (C slot parity)");
    // Tiled layout: C stores are deferred (see flush below); scalar-memory words of the
    // pending ones.
    const bool defer = t.tiled;
    constexpr int kPend = 0, kDst = 4, kRows = 8, kPar = 12, kDone = 16;
    // s31: bytes of one column panel of A in the tile-major layout (rows x R bf16).
    if (t.tiled) L("        mul s31, s4, {}", R * 2);
    // Scalar memory keeps its words across launches: no C store is pending yet.
    if (defer) L("        sw s0, [{}]", kPend);
    L("        li s6, 0");
    L("block:  sub s7, s4, s6");
    L("        li s10, {}", Tm);
    L("        bltu s7, s10, rows_ok");
    L("        li s7, {}", Tm);
    // A block: its panels stream in with the first group's weight tiles (a_panel below), so
    // the first matmul waits for one panel, not the whole block. s20 = the block's first row
    // within a panel, s13 = bytes of the block's rows of one panel (tiled).
    if (t.tiled) {
        L("rows_ok: mul s20, s6, {}", R * 2);
        L("        mul s13, s7, {}", R * 2);
    } else {
        L("rows_ok: mul s20, s6, {}", t.Kp * 2);
    }

    // Per-slot flags and counts: a banked HBM can finish a DMA before one issued earlier, so a
    // count over both slots of one flag would not prove that the slot about to be read is full.
    // Waiting for every transfer issued into one slot is exact: the next one into it is issued
    // only after the wait.
    const int wflag[2] = {1, 8}, cflag[2] = {6, 7};
    const char* wcount[2] = {"s27", "s30"};

    // VMEM home of W part q for MXU m in `slot`.
    auto w_home = [&](int m, int slot, int q) {
        return vm.w + (uint64_t(m) * 2 * PA + uint64_t(slot) * PA + q) * wtile;
    };

    // W tile (k = reg) of panel n for MXU m into `slot`: rows k*R.., columns n*C...
    auto w_dma = [&](const char* kreg, int m, int nm, int slot) {
        if (t.tiled) {
            // Tile (k, n) is one contiguous run of R x C x 2 bytes.
            L("        mul s14, {}, {}", kreg, uint64_t(NT) * wtile);
            L("        mul s15, s8, {}", uint64_t(nm) * wtile);
        } else {
            L("        mul s14, {}, {}", kreg, uint64_t(R) * t.Np * 2);
            L("        mul s15, s8, {}", uint64_t(nm) * C * 2);
        }
        L("        add s14, s14, s15");
        L("        add s14, s14, s2");
        for (int q = 0; q < PA; ++q) {
            if (q) L("        add s14, s14, {}", wpart_stride);
            const uint64_t dst = w_home(m, slot, q);
            if (t.tiled)
                L("        dma.hv [{}], [s14+{}], 1, {}, {}, {}, f{}", dst, uint64_t(m) * wtile,
                  wtile, wtile, wtile, wflag[slot]);
            else
                L("        dma.hv [{}], [s14+{}], {}, {}, {}, {}, f{}", dst, uint64_t(m) * C * 2, R,
                  C * 2, C * 2, t.Np * 2, wflag[slot]);
        }
    };
    auto w_tiles = [&](const char* kreg, int nm, int slot) {
        for (int m = 0; m < nm; ++m) w_dma(kreg, m, nm, slot);
        L("        add {}, {}, {}", wcount[slot], wcount[slot], PA * nm);
    };

    // A panel k = reg of this block into the A area, counted with the weight tiles of `slot`.
    // Kept (a_stream off): only the block's first group (s8 = 0) loads the panels, each into its
    // own place, and the later groups reuse them. Streamed: every group loads panel k into the
    // step's slot, next to the weight tiles, so VMEM holds two panels instead of the block.
    const bool stream = t.a_stream;
    auto a_home = [&](int slot, int pa) {
        return stream ? vm.a + (uint64_t(pa) * 2 + slot) * panel : vm.a + uint64_t(pa) * KT * panel;
    };
    auto a_panel = [&](const char* kreg, int slot, const std::string& label) {
        if (!stream) L("        bne s8, 0, {}", label);
        if (t.tiled)
            L("        mul s10, {}, s31", kreg);
        else
            L("        mul s10, {}, {}", kreg, R * 2);
        L("        add s10, s10, s20");
        L("        add s10, s10, s1");
        if (stream)
            L("        li s11, 0");
        else
            L("        mul s11, {}, {}", kreg, panel);
        for (int p = 0; p < PA; ++p) {
            if (p) L("        add s10, s10, s5");
            if (t.tiled)
                L("        dma.hv [s11+{}], [s10], 1, s13, s13, s13, f{}", a_home(slot, p),
                  wflag[slot]);
            else
                L("        dma.hv [s11+{}], [s10], s7, {}, {}, {}, f{}", a_home(slot, p), R * 2,
                  R * 2, t.Kp * 2, wflag[slot]);
        }
        L("        add {}, {}, {}", wcount[slot], wcount[slot], PA);
        if (!stream) L("{}:", label);
    };
    // Waits until A's place about to be refilled is no longer read: for each MXU m, until its
    // matmuls counted in s24 + m (every earlier group's) plus `plus` (this group's done so far;
    // for MXUs in the group) less `back` (the last ones, which read the other slot) are done.
    auto a_slot_free = [&](int nm, const std::string& plus, int back, const std::string& tag) {
        for (uint32_t m = 0; m < t.mxus; ++m) {
            const std::string cnt = fmt::format("s{}", 24 + m);
            if (int(m) < nm && !plus.empty()) {
                L("        add s10, {}, {}", cnt, plus);
                L("        wait f{}, s10", 4 + m);
            } else if (back > 0) {
                L("        beq {}, 0, af{}_{}", cnt, m, tag);
                L("        sub s10, {}, {}", cnt, back);
                L("        wait f{}, s10", 4 + m);
                L("af{}_{}:", m, tag);
            } else {
                L("        wait f{}, {}", 4 + m, cnt);
            }
        }
    };

    // K step s9 (even for slot 0, odd for slot 1) of a group: prefetch step s9 + 1 into the other
    // slot, wait for this slot's tiles, run the passes. Kept A: the prefetch goes first, so two
    // steps' transfers are in flight while the MXUs work. Streamed A: the step's matmuls go first,
    // because the slot the prefetch refills is free only once the previous step's matmuls are done,
    // and waiting for that before issuing this step would idle the MXUs.
    const int npass = static_cast<int>(pass_list.size());
    auto k_step = [&](int nm, const std::string& tag, int slot) {
        auto prefetch = [&] {
            L("        add s16, s9, 1");
            L("        beq s16, {}, np{}_{}", KT, slot, tag);
            // The slot about to be refilled was read by the previous step's weight loads (the
            // ones before this step's when this step's are already issued).
            for (int m = 0; m < nm; ++m) {
                if (stream) {
                    L("        sub s10, s{}, {}", 22 + m, npass);
                    L("        wait f{}, s10", 2 + m);
                } else {
                    L("        wait f{}, s{}", 2 + m, 22 + m);
                }
            }
            // ... and, streamed, its A panel by the previous step's matmuls (s9 of this group's
            // are counted: steps 0 .. s9 - 1).
            if (stream) a_slot_free(nm, "s9", 0, fmt::format("p{}_{}", slot, tag));
            w_tiles("s16", nm, 1 - slot);
            a_panel("s16", 1 - slot, fmt::format("na{}_{}", slot, tag));
            L("np{}_{}:", slot, tag);
        };
        L("k{}_{}:", slot, tag);
        if (!stream) prefetch();
        L("        wait f{}, {}", wflag[slot], wcount[slot]);
        if (!stream) L("        mul s17, s9, {}", panel);
        L("        and s18, s29, 1");
        L("        mul s18, s18, {}", cslot);
        L("        sltu s19, 0, s9");
        for (int m = 0; m < nm; ++m) {
            for (size_t i = 0; i < pass_list.size(); ++i) {
                const auto [pa, pw] = pass_list[i];
                L("        mxu.lw {}, [{}], {}, {}, f{}", m, w_home(m, slot, pw), R, C, 2 + m);
                const bool last = i + 1 == pass_list.size();
                const std::string a_src = stream ? fmt::format("{}", a_home(slot, pa))
                                                 : fmt::format("s17+{}", a_home(slot, pa));
                L("        mxu.mm {}, [s18+{}], [{}], s7, {}{}", m, vm.c + uint64_t(m) * 2 * cslot,
                  a_src, i == 0 ? "s19" : "1", last ? fmt::format(", f{}", 4 + m) : "");
            }
            L("        add s{}, s{}, {}", 22 + m, 22 + m, npass);
        }
        if (stream) prefetch();
        L("        add s9, s9, 1");
    };

    // Tiled layout: a group's C stores wait in scalar memory until the next group has queued
    // its first matmuls and weight tiles, then leave in pieces of `piece` rows, one piece per
    // odd K step of the next group, so the in-order DMA engine never holds the tiles the MXUs
    // need next behind a megabyte of results. Scalar memory: pending panels (0 = none), the
    // first panel's HBM address, rows, C slot parity, rows already stored (kPend, kDst, kRows,
    // kPar, kDone). `all` stores everything still pending.
    const uint32_t piece = round_up((Tm + std::max(KT / 2, 1u) - 1) / std::max(KT / 2, 1u), 8);
    auto flush = [&](const std::string& tag, bool all) {
        L("        lw s11, [{}]", kPend);
        L("        beq s11, 0, fd_{}", tag);
        L("        lw s10, [{}]", kDst);
        L("        lw s17, [{}]", kRows);
        L("        lw s18, [{}]", kPar);
        L("        lw s16, [{}]", kDone);
        L("        sub s17, s17, s16");
        if (!all) {
            L("        li s14, {}", piece);
            L("        bltu s17, s14, fr_{}", tag);
            L("        add s17, s14, 0");
        }
        // s15: the piece's offset in the C slot and in each HBM panel (both rows x C fp32).
        L("fr_{}:   mul s15, s16, {}", tag, C * 4);
        L("        add s10, s10, s15");
        L("        mul s19, s4, {}", C * 4);
        for (uint32_t m = 0; m < t.mxus; ++m) {
            // The pending group's last matmul on MXU m (a count its kend already added).
            L("        wait f{}, s{}", 4 + m, 24 + m);
            if (m > 0) {
                L("        beq s11, {}, fs_{}", m, tag);
                L("        add s10, s10, s19");
            }
            L("        bne s18, 0, fa{}_{}", m, tag);
            for (int slot = 0; slot < 2; ++slot) {
                if (slot) L("fa{}_{}:", m, tag);
                L("        dma.vh [s10], [s15+{}], s17, {}, {}, {}, f{}",
                  vm.c + (uint64_t(m) * 2 + slot) * cslot, C * 4, C * 4, C * 4, cflag[slot]);
                if (!slot) L("        jmp fb{}_{}", m, tag);
            }
            L("fb{}_{}:", m, tag);
        }
        // s28 += panels on slot 1, s26 += panels on slot 0.
        L("fs_{}:   mul s14, s18, s11", tag);
        L("        add s28, s28, s14");
        L("        sub s14, s11, s14");
        L("        add s26, s26, s14");
        L("        add s16, s16, s17");
        L("        sw s16, [{}]", kDone);
        L("        lw s14, [{}]", kRows);
        L("        bltu s16, s14, fd_{}", tag);
        L("        sw s0, [{}]", kPend);
        L("fd_{}:", tag);
    };

    // One group of `nm` column panels (n = s8 * nm + m on MXU m), all K tiles.
    auto group = [&](int nm, const std::string& tag) {
        // Every store out of the C slot this group writes (s29 & 1; the previous group used the
        // other one) has read it.
        L("        and s12, s29, 1");
        L("        bne s12, 0, c1_{}", tag);
        L("        wait f{}, s26", cflag[0]);
        L("        jmp c_{}", tag);
        L("c1_{}:   wait f{}, s28", tag, cflag[1]);
        L("c_{}:    li s9, 0", tag);
        // Slot 0 may still feed the previous group's last weight loads, and, streamed, its A
        // panel the previous group's matmuls of step KT - 2 (KT even) or KT - 1 (odd): every
        // one of them counted but the last when KT is even.
        for (int m = 0; m < nm; ++m) L("        wait f{}, s{}", 2 + m, 22 + m);
        if (stream) a_slot_free(nm, "", KT % 2 == 0 ? 1 : 0, fmt::format("g_{}", tag));
        // Kept A: a new block's panels overwrite the ones every matmul so far has read.
        if (!stream) {
            L("        bne s8, 0, gk_{}", tag);
            a_slot_free(nm, "", 0, fmt::format("gk_{}", tag));
            L("gk_{}:", tag);
        }
        w_tiles("s9", nm, 0);
        a_panel("s9", 0, fmt::format("na_{}", tag));
        // Unrolled twice so that each step's slot, and so its flag, is fixed.
        k_step(nm, tag, 0);
        L("        beq s9, {}, kend_{}", KT, tag);
        k_step(nm, tag, 1);
        // The previous group's stores leave a piece per odd step, after that step's matmuls and
        // the next step's tiles are queued: by then that group's last matmul has drained, so
        // waiting for it does not idle the MXUs.
        if (defer) flush(tag, false);
        L("        bne s9, {}, k0_{}", KT, tag);
        // Results out: wait for each MXU's last matmul, then DMA its panel to HBM.
        L("kend_{}:", tag);
        // What the odd steps did not store of the previous group goes now.
        if (defer) flush(tag + "_rest", true);
        if (t.tiled) {
            // Panel n of C is rows x C fp32, contiguous; s21 = its bytes.
            L("        mul s10, s6, {}", C * 4);
            L("        add s10, s10, s3");
            L("        mul s21, s4, {}", C * 4);
            L("        mul s11, s8, {}", nm);
            L("        mul s11, s11, s21");
        } else {
            L("        mul s10, s6, {}", c_stride);
            L("        add s10, s10, s3");
            L("        mul s11, s8, {}", uint64_t(nm) * C * 4);
        }
        L("        add s10, s10, s11");
        if (defer) {
            for (int m = 0; m < nm; ++m) L("        add s{}, s{}, {}", 24 + m, 24 + m, KT);
            L("        sw s10, [{}]", kDst);
            L("        sw s7, [{}]", kRows);
            L("        sw s12, [{}]", kPar);
            L("        sw s0, [{}]", kDone);
            L("        li s11, {}", nm);
            L("        sw s11, [{}]", kPend);
            L("        add s29, s29, 1");
            return;
        }
        for (int m = 0; m < nm; ++m) {
            L("        add s{}, s{}, {}", 24 + m, 24 + m, KT);
            L("        wait f{}, s{}", 4 + m, 24 + m);
            // Compact C: the last panel (the tail group's, or the last full group's last MXU
            // when there is no tail) keeps only its valid columns.
            std::string row_bytes = fmt::format("{}", C * 4);
            if (last_bytes != C * 4 && nm == 1 && tag == "tail") {
                row_bytes = fmt::format("{}", last_bytes);
            } else if (last_bytes != C * 4 && tail == 0 && m == nm - 1) {
                row_bytes = "s21";
                L("        li s21, {}", C * 4);
                L("        bne s8, {}, cw_{}", full - 1, tag);
                L("        li s21, {}", last_bytes);
                L("cw_{}:", tag);
            }
            // Out of the group's C slot, raising that slot's flag.
            if (t.tiled && m > 0) L("        add s10, s10, s21");
            auto store = [&](int slot) {
                if (t.tiled)
                    L("        dma.vh [s10], [{}], s7, {}, {}, {}, f{}",
                      vm.c + (uint64_t(m) * 2 + slot) * cslot, C * 4, C * 4, C * 4, cflag[slot]);
                else
                    L("        dma.vh [s10+{}], [{}], s7, {}, {}, {}, f{}", uint64_t(m) * C * 4,
                      vm.c + (uint64_t(m) * 2 + slot) * cslot, row_bytes, c_stride, C * 4,
                      cflag[slot]);
            };
            L("        bne s12, 0, cst1_{}{}", tag, m);
            store(0);
            L("        jmp cstd_{}{}", tag, m);
            L("cst1_{}{}:", tag, m);
            store(1);
            L("cstd_{}{}:", tag, m);
        }
        // s28 += nm on slot 1, s26 += nm on slot 0.
        L("        mul s11, s12, {}", nm);
        L("        add s28, s28, s11");
        L("        sub s11, {}, s11", nm);
        L("        add s26, s26, s11");
        L("        add s29, s29, 1");
    };

    if (full) {
        L("        li s8, 0");
        L("pair:");
        group(static_cast<int>(t.mxus), "full");
        L("        add s8, s8, 1");
        L("        bne s8, {}, pair", full);
    }
    if (tail) {
        // A last single panel: n = s8 * 1 with s8 = full * mxus.
        L("        li s8, {}", full * t.mxus);
        group(1, "tail");
    }
    L("        add s6, s6, s7");
    L("        bltu s6, s4, block");
    if (defer) flush("end", true);
    L("        wait f{}, s26", cflag[0]);
    L("        wait f{}, s28", cflag[1]);
    L("        halt");
    return isa::assemble(s, "gemm.s");
}

}  // namespace

isa::Program gemm_program(const GemmTiling& t) {
    return gemm_program_impl(t, 0);
}

isa::Program gemm_program_compact(const GemmTiling& t, uint32_t n_cols) {
    if (t.tiled)
        throw DeviceError(ErrorKind::Usage, "gemm: compact C is a row-major layout, not tiled");
    if (n_cols == 0 || n_cols > t.Np || n_cols + t.C <= t.Np)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("gemm: compact C of {} columns does not match Np = {}", n_cols, t.Np));
    return gemm_program_impl(t, n_cols);
}

std::string gemm_key_compact(const GemmTiling& t, uint32_t n_cols) {
    return fmt::format("{} compact{}", gemm_key(t), n_cols);
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
            const isa::Program& prog = cache.get(gemm_key(t), [&] { return gemm_program(t); });
            handles.push_back(dev.launch_async(launch_cores, prog, [&, group](size_t j) {
                const Part& p = *group[j];
                return std::vector<uint32_t>{
                    static_cast<uint32_t>(p.a.addr), static_cast<uint32_t>(p.w.addr),
                    static_cast<uint32_t>(p.c.addr), p.rows, p.rows * Kp * 2};
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
