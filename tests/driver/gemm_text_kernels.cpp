// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the assembly-text GEMM and fused matmul kernels as they were
// before the builder, to compare binaries with the builder versions. Deleted once they agree.
#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/gemm.h"
#include "driver/kernels/matmul_kernel.h"
#include "isa/assembler.h"

namespace tpu::driver::text {
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
isa::Program gemm_program_text(const GemmTiling& t, uint32_t n_out) { return gemm_program_impl(t, n_out); }
namespace {
void emit_split_text(const std::function<void(const std::string&)>& vpu, int parts,
                const std::function<std::string(int)>& part, const std::string& x,
                const std::string& f, const std::string& r1, const std::string& r2,
                const std::string& n);
uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

int parts_of(Precision p) {
    return p == Precision::Bf16 ? 1 : p == Precision::Fp32Pass3 ? 2 : 3;
}

/// Largest block the planner considers, as plan_gemm: beyond it the drain is amortised.
constexpr uint32_t kMaxBlockRows = 4096;

/// VMEM areas (byte addresses). A's bf16 parts stay for the whole block (every column group
/// reads them); everything else is per K step, double-buffered where a DMA or the MXUs read one
/// copy while the next is written.
struct Map {
    uint64_t abf, astage, att, af, ar1, ar2, wstage, wtt, wf, wr1, wr2, wbf, c, bias, end;
    uint64_t apanel, wtile, cpanel;  ///< bytes of one A bf16 panel, W bf16 tile, C panel
};
Map vmem_map(const MatmulKey& t) {
    const uint64_t T = t.block_rows, KT = ceil_div(t.K, t.R), P = parts_of(t.precision);
    const uint64_t a32 = T * t.R * 4, w32 = uint64_t(t.R) * t.C * 4;
    Map m{};
    uint64_t end = 0;
    auto take = [&](uint64_t bytes) {
        const uint64_t at = end;
        end += (bytes + 511) / 512 * 512;
        return at;
    };
    m.apanel = T * t.R * 2;
    m.wtile = uint64_t(t.R) * t.C * 2;
    m.cpanel = T * t.C * 4;
    m.abf = take(P * KT * m.apanel);
    m.astage = take(2 * a32);
    m.att = t.ta ? take(a32) : 0;
    m.af = P > 1 ? take(a32) : 0;
    m.ar1 = P > 1 ? take(a32) : 0;
    m.ar2 = P > 2 ? take(a32) : 0;
    m.wstage = take(2 * t.mxus * w32);
    m.wtt = t.tb ? take(t.mxus * w32) : 0;
    m.wf = P > 1 ? take(w32) : 0;
    m.wr1 = P > 1 ? take(w32) : 0;
    m.wr2 = P > 2 ? take(w32) : 0;
    m.wbf = take(2 * t.mxus * P * m.wtile);
    m.c = take(2 * t.mxus * m.cpanel);
    m.bias = t.bias ? take(uint64_t(t.N) * 4) : 0;
    m.end = end;
    return m;
}

/// Emits the kernel. Registers: s1 a, s2 b, s3 c; s4 the block's first row, s7 its rows; s8 a
/// middle group's first column x 4; s19 the C parity offset of the current group; s26..s29 the
/// group whose C waits to be stored (HBM address, rows, parity offset, kind: 0 none, 1 a full
/// group, 2 the last group); with a bias, s5 its HBM address and s9 the waiting group's first
/// column x 4. Flags and the registers counting work issued to them: f1/f6 (s20/
/// s25) loads into step slot 0/1, f2 (s21) the VPU, f3/f4 (s22/s23) the MXUs' steps, f5 (s24)
/// C stores. A flag counts completions, so a wait on it covers all the work issued to it except
/// the most recent `later` items only where the unit finishes in order (VPU, MXU); loads come
/// back out of order from the banked HBM and are waited per slot, in full.
class Gen {
public:
    explicit Gen(const MatmulKey& t)
        : m_t(t),
          m_m(vmem_map(t)),
          m_P(parts_of(t.precision)),
          m_KT(ceil_div(t.K, t.R)),
          m_NT(ceil_div(t.N, t.C)),
          m_G(ceil_div(m_NT, t.mxus)),
          m_passes(mxu_passes(t.precision)) {}

    isa::Program program() {
        L("# fused matmul M={} K={} N={} {}{} {} T={} mxus={}", m_t.M, m_t.K, m_t.N,
          m_t.ta ? "T" : "N", m_t.tb ? "T" : "N", precision_name(m_t.precision), m_t.block_rows,
          m_t.mxus);
        for (int r : {19, 20, 21, 22, 23, 24, 25, 29}) L("        li s{}, 0", r);
        if (m_t.bias) {
            // The bias row stays in VMEM for every block; s4 becomes the row counter below.
            const uint64_t b = uint64_t(m_t.N) * 4;
            L("        add s5, s4, 0");
            L("        dma.hv [{}], [s5], 1, {}, {}, {}, f7", m_m.bias, b, b, b);
            L("        wait f7, 1");
        }
        L("        li s4, 0");
        L("block:  sub s7, {}, s4", m_t.M);
        L("        bltu s7, {}, rows_ok", m_t.block_rows + 1);
        L("        li s7, {}", m_t.block_rows);
        L("rows_ok:");
        if (m_G == 1) {
            group(true, true);
        } else {
            group(true, false);
            if (m_G > 2) {
                L("        li s8, {}", m_t.mxus * m_t.C * 4);
                L("mid:");
                group(false, false);
                L("        add s8, s8, {}", m_t.mxus * m_t.C * 4);
                L("        bltu s8, {}, mid", (m_G - 1) * m_t.mxus * m_t.C * 4);
            }
            group(false, true);
        }
        L("        add s4, s4, s7");
        L("        bltu s4, {}, block", m_t.M);
        flush("end", 0, 0);
        L("        wait f5, s24");
        L("        halt");
        return isa::assemble(m_s, "matmul.s");
    }

private:
    template <class... A>
    void L(fmt::format_string<A...> f, A&&... a) {
        m_s += fmt::format(f, std::forward<A>(a)...);
        m_s += '\n';
    }
    void vpu(const std::string& ins) {
        m_s += ins + ", f2\n";
        L("        add s21, s21, 1");
    }
    std::string label(const char* what) { return fmt::format("{}{}", what, m_label++); }

    /// Waits until MXU m has finished all its steps but the `later` most recent.
    void wait_mxu(uint32_t m, uint32_t later) {
        if (!later) {
            L("        wait f{}, s{}", 3 + m, 22 + m);
            return;
        }
        const std::string skip = label("wm");
        L("        sub s10, s{}, {}", 22 + m, later);
        L("        blt s10, 1, {}", skip);
        L("        wait f{}, s10", 3 + m);
        L("{}:", skip);
    }

    uint32_t kk(uint32_t j) const { return std::min(m_t.R, m_t.K - j * m_t.R); }
    /// Columns of panel m of the group (the last panel of C may be narrow).
    uint32_t nn(bool last, uint32_t m) const {
        const uint32_t panel = (m_G - 1) * m_t.mxus + m;
        return last && panel == m_NT - 1 ? m_t.N - panel * m_t.C : m_t.C;
    }
    uint32_t panels(bool last) const { return last ? m_NT - (m_G - 1) * m_t.mxus : m_t.mxus; }
    uint64_t wbf(int slot, uint32_t m, int q) const {
        return m_m.wbf + ((uint64_t(slot) * m_t.mxus + m) * m_P + q) * m_m.wtile;
    }
    uint64_t wstage(int slot, uint32_t m) const {
        return m_m.wstage + (uint64_t(slot) * m_t.mxus + m) * m_t.R * m_t.C * 4;
    }
    uint64_t abf(int q, uint32_t j) const {
        return m_m.abf + (uint64_t(q) * m_KT + j) * m_m.apanel;
    }

    /// s13 = the HBM address of op(b)'s column n0 of the group (s8 in a middle group).
    void w_base(bool first, bool last) {
        const uint64_t n0 = first ? 0 : uint64_t(m_G - 1) * m_t.mxus * m_t.C;
        const uint64_t per_col = m_t.tb ? uint64_t(m_t.K) * 4 : 4;
        if (first || last) {
            L("        add s13, s2, {}", n0 * per_col);
        } else {
            L("        mul s13, s8, {}", per_col / 4);
            L("        add s13, s13, s2");
        }
    }

    /// Loads of step j into `slot`: the group's weight tiles and, in a block's first group,
    /// A's panel j.
    void loads(uint32_t j, bool first, bool last, int slot) {
        const int flag = slot ? 6 : 1, reg = slot ? 25 : 20;
        const uint32_t k = kk(j), R = m_t.R;
        int count = 0;
        if (first) {
            const uint64_t at = m_m.astage + uint64_t(slot) * m_t.block_rows * R * 4;
            if (m_t.ta) {
                // a^T: rows j R .. of a, the block's columns; v.trans turns them.
                L("        mul s14, s4, 4");
                L("        add s14, s14, s1");
                L("        mul s15, s7, 4");
                L("        dma.hv [{}], [s14+{}], {}, s15, s15, {}, f{}", at,
                  uint64_t(j) * R * m_t.M * 4, k, uint64_t(m_t.M) * 4, flag);
            } else {
                L("        mul s14, s4, {}", uint64_t(m_t.K) * 4);
                L("        add s14, s14, s1");
                L("        dma.hv [{}], [s14+{}], s7, {}, {}, {}, f{}", at, uint64_t(j) * R * 4,
                  k * 4, k * 4, uint64_t(m_t.K) * 4, flag);
            }
            ++count;
        }
        w_base(first, last);
        for (uint32_t m = 0; m < panels(last); ++m) {
            const uint32_t n = nn(last, m);
            if (m_t.tb)
                L("        dma.hv [{}], [s13+{}], {}, {}, {}, {}, f{}", wstage(slot, m),
                  uint64_t(m) * m_t.C * m_t.K * 4 + uint64_t(j) * R * 4, n, k * 4, k * 4,
                  uint64_t(m_t.K) * 4, flag);
            else
                L("        dma.hv [{}], [s13+{}], {}, {}, {}, {}, f{}", wstage(slot, m),
                  uint64_t(j) * R * m_t.N * 4 + uint64_t(m) * m_t.C * 4, k, n * 4, n * 4,
                  uint64_t(m_t.N) * 4, flag);
            ++count;
        }
        L("        add s{}, s{}, {}", reg, reg, count);
    }

    /// Stores the pending group's C (if any), once its matmuls are done; `issued[m]` = steps of
    /// the current group already issued to MXU m.
    void flush(const std::string& tag, uint32_t steps, uint32_t nm) {
        const std::string done = "fd_" + tag;
        L("        beq s29, 0, {}", done);
        for (uint32_t m = 0; m < m_t.mxus; ++m) wait_mxu(m, m < nm ? steps : 0);
        auto stores = [&](bool last) {
            if (m_t.bias) {
                L("        add s12, s9, {}", m_m.bias);
                for (uint32_t m = 0; m < panels(last); ++m) {
                    const uint64_t at = m_m.c + uint64_t(m) * m_m.cpanel;
                    vpu(fmt::format("        v.addrow [s28+{}], [s28+{}], [s12+{}], s27, {}", at,
                                    at, uint64_t(m) * m_t.C * 4, nn(last, m)));
                }
                L("        wait f2, s21");
            }
            for (uint32_t m = 0; m < panels(last); ++m) {
                const uint32_t n = nn(last, m);
                L("        dma.vh [s26+{}], [s28+{}], s27, {}, {}, {}, f5", uint64_t(m) * m_t.C * 4,
                  m_m.c + uint64_t(m) * m_m.cpanel, n * 4, uint64_t(m_t.N) * 4, n * 4);
                L("        add s24, s24, 1");
            }
        };
        if (m_G > 1) {
            L("        beq s29, 2, fl_{}", tag);
            stores(false);
            L("        jmp fe_{}", tag);
            L("fl_{}:", tag);
        }
        stores(true);
        L("fe_{}:  li s29, 0", tag);
        L("{}:", done);
    }

    /// VPU: fp32 at `x` (rows x cols values, `n` as text) into the bf16 parts `part(q)`.
    void convert(const std::function<std::string(int)>& part, uint64_t x, const std::string& n,
                 uint64_t f, uint64_t r1, uint64_t r2) {
        emit_split_text([&](const std::string& ins) { vpu(ins); }, m_P, part, fmt::format("[{}]", x),
                   fmt::format("[{}]", f), fmt::format("[{}]", r1), fmt::format("[{}]", r2), n);
    }

    /// One column group: every K step, unrolled so that each step's slot and flag are fixed.
    void group(bool first, bool last) {
        const uint32_t nm = panels(last), R = m_t.R;
        const std::string tag = first ? (last ? "fl" : "f") : (last ? "l" : "m");
        // The stores of the group before the previous one read the C parity this group writes.
        L("        wait f5, s24");
        loads(0, first, last, 0);
        for (uint32_t j = 0; j < m_KT; ++j) {
            const int slot = int(j % 2);
            const uint32_t k = kk(j);
            // Step j + 1's transfers go first: their slot was last read by step j - 1's
            // conversions, which are done.
            if (j + 1 < m_KT) loads(j + 1, first, last, 1 - slot);
            L("        wait f{}, s{}", slot ? 6 : 1, slot ? 25 : 20);
            // The weight slot is free once the step before the previous one is done on each
            // MXU; at a group's start with KT odd the previous group's last step read it too.
            // A block's first group also overwrites A's panel j, which the previous block's
            // steps read (all but this group's j).
            for (uint32_t m = 0; m < m_t.mxus; ++m) {
                uint32_t later = m < nm ? (j == 0 && m_KT % 2 ? 0 : 1) : m_t.mxus;
                if (first) later = std::min(later, m < nm ? j : 0);
                if (m < nm || first) wait_mxu(m, later);
            }
            if (first) {
                const uint64_t src = m_m.astage + uint64_t(slot) * m_t.block_rows * R * 4;
                uint64_t x = src;
                if (m_t.ta) {
                    L("        v.trans [{}], [{}], {}, s7, f2", m_m.att, src, k);
                    L("        add s21, s21, 1");
                    x = m_m.att;
                }
                L("        mul s16, s7, {}", k);
                convert([&](int q) { return fmt::format("[{}]", abf(q, j)); }, x, "s16", m_m.af,
                        m_m.ar1, m_m.ar2);
            }
            for (uint32_t m = 0; m < nm; ++m) {
                const uint32_t n = nn(last, m);
                uint64_t x = wstage(slot, m);
                if (m_t.tb) {
                    const uint64_t tt = m_m.wtt + uint64_t(m) * R * m_t.C * 4;
                    vpu(fmt::format("        v.trans [{}], [{}], {}, {}", tt, x, n, k));
                    x = tt;
                }
                convert([&](int q) { return fmt::format("[{}]", wbf(slot, m, q)); }, x,
                        fmt::format("{}", uint64_t(k) * n), m_m.wf, m_m.wr1, m_m.wr2);
            }
            // The previous group's results leave after this step's transfers are queued, so
            // the in-order DMA engine does not hold the next tiles behind them.
            if (j == std::min<uint32_t>(1, m_KT - 1)) flush(fmt::format("{}{}", tag, j), j, nm);
            L("        wait f2, s21");
            for (uint32_t m = 0; m < nm; ++m) {
                for (size_t i = 0; i < m_passes.size(); ++i) {
                    const auto [pa, pw] = m_passes[i];
                    const bool fresh = j == 0 && i == 0, end = i + 1 == m_passes.size();
                    L("        mxu.lw {}, [{}], {}, {}", m, wbf(slot, m, pw), k, nn(last, m));
                    L("        mxu.mm {}, [s19+{}], [{}], s7, {}{}", m,
                      m_m.c + uint64_t(m) * m_m.cpanel, abf(pa, j), fresh ? 0 : 1,
                      end ? fmt::format(", f{}", 3 + m) : "");
                }
                L("        add s{}, s{}, 1", 22 + m, 22 + m);
            }
        }
        // This group's C is pending until the next group's step 1 (or the end).
        L("        mul s26, s4, {}", uint64_t(m_t.N) * 4);
        L("        add s26, s26, s3");
        if (first || last)
            L("        add s26, s26, {}", first ? 0 : uint64_t(m_G - 1) * m_t.mxus * m_t.C * 4);
        else
            L("        add s26, s26, s8");
        L("        add s27, s7, 0");
        L("        add s28, s19, 0");
        if (m_t.bias) {
            if (first || last)
                L("        li s9, {}", first ? 0 : uint64_t(m_G - 1) * m_t.mxus * m_t.C * 4);
            else
                L("        add s9, s8, 0");
        }
        L("        li s29, {}", last ? 2 : 1);
        L("        xor s19, s19, {}", uint64_t(m_t.mxus) * m_m.cpanel);
    }

    const MatmulKey& m_t;
    Map m_m;
    int m_P;
    uint32_t m_KT, m_NT, m_G;
    std::vector<std::pair<int, int>> m_passes;
    std::string m_s;
    int m_label = 0;
};

void emit_split_text(const std::function<void(const std::string&)>& vpu, int parts,
                const std::function<std::string(int)>& part, const std::string& x,
                const std::string& f, const std::string& r1, const std::string& r2,
                const std::string& n) {
    vpu(fmt::format("        v.f2bf {}, {}, {}", part(0), x, n));
    if (parts >= 2) {
        vpu(fmt::format("        v.bf2f {}, {}, {}", f, part(0), n));
        vpu(fmt::format("        v.sub {}, {}, {}, {}", r1, x, f, n));
        vpu(fmt::format("        v.f2bf {}, {}, {}", part(1), r1, n));
    }
    if (parts == 3) {
        vpu(fmt::format("        v.bf2f {}, {}, {}", f, part(1), n));
        vpu(fmt::format("        v.sub {}, {}, {}, {}", r2, r1, f, n));
        vpu(fmt::format("        v.f2bf {}, {}, {}", part(2), r2, n));
    }
}
}  // namespace
isa::Program matmul_program_text(const MatmulKey& t) { return Gen(t).program(); }
}  // namespace tpu::driver::text
