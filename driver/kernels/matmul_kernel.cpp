// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/matmul_kernel.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "isa/assembler.h"

namespace tpu::driver {
namespace {

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
Map vmem_map(const MatmulTiling& t) {
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
    explicit Gen(const MatmulTiling& t)
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
        emit_split([&](const std::string& ins) { vpu(ins); }, m_P, part, fmt::format("[{}]", x),
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

    const MatmulTiling& m_t;
    Map m_m;
    int m_P;
    uint32_t m_KT, m_NT, m_G;
    std::vector<std::pair<int, int>> m_passes;
    std::string m_s;
    int m_label = 0;
};

}  // namespace

void emit_split(const std::function<void(const std::string&)>& vpu, int parts,
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

std::optional<MatmulTiling> plan_matmul(const hw::BoardConfig& cfg, uint32_t M, uint32_t K,
                                        uint32_t N, bool ta, bool tb, Precision precision,
                                        bool bias) {
    MatmulTiling t{.M = M,
                   .K = K,
                   .N = N,
                   .ta = ta,
                   .tb = tb,
                   .precision = precision,
                   .R = cfg.core.mxu_rows,
                   .C = cfg.core.mxu_cols,
                   .mxus = std::min<uint32_t>(cfg.core.mxus, 2),
                   .bias = bias};
    // The longest blocks first: each weight tile costs a drain (core.mxu_swap_drains), so rows
    // per tile are worth more than anything a shorter block would save.
    for (uint32_t nb = 1; nb <= ceil_div(M, 8); ++nb) {
        t.block_rows = ceil_div(ceil_div(M, nb), 8) * 8;
        if (t.block_rows > kMaxBlockRows) continue;
        if (vmem_map(t).end <= cfg.core.vmem_bytes) break;
        t.block_rows = 0;
    }
    if (!t.block_rows) return std::nullopt;
    return t;
}

isa::Program matmul_program(const MatmulTiling& t) {
    return Gen(t).program();
}

std::string matmul_key(const MatmulTiling& t) {
    return fmt::format("matmul R{} C{} M{} K{} N{} {}{} T{} mxus{} {}{}", t.R, t.C, t.M, t.K, t.N,
                       t.ta ? "T" : "N", t.tb ? "T" : "N", t.block_rows, t.mxus,
                       precision_name(t.precision), t.bias ? " bias" : "");
}

}  // namespace tpu::driver
