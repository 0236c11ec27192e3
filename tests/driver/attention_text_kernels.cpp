// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the assembly-text fused attention kernels as they were before
// the builder, to compare binaries with the builder versions. Deleted once they agree.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/attention.h"
#include "isa/assembler.h"

namespace tpu::driver::text_attention {
namespace {

/// A bump allocator of VMEM areas, 512-byte aligned so every DMA and MXU operand starts on a
/// fresh row of the banked memory.
struct VmemAreas {
    uint64_t end = 0;
    uint64_t take(uint64_t bytes) {
        const uint64_t at = end;
        end += (bytes + 511) / 512 * 512;
        return at;
    }
};

/// Shape of one block of the fused kernels: G heads of S x D, KT key tiles of up to C columns.
struct Block {
    uint32_t S = 0, D = 0, G = 1, KT = 1, C = 128, blocks = 1;
    bool causal = false;
    /// Columns of key tile j.
    uint32_t n(uint32_t j) const { return std::min(C, S - j * C); }
    uint64_t sd() const { return uint64_t(G) * S * D; }  ///< values of a G x S x D area
    uint64_t ss() const { return uint64_t(G) * S * S; }  ///< values of a G x S x S area
};

/// Emits a fused kernel. Every unit has one completion flag and a register counting what was
/// issued to it, so a wait covers exactly the work issued before it: f1/s20 loads and VMEM
/// moves, f5/s24 stores, f2/s21 the VPU, f3/s22 and f4/s23 the MXUs.
class FusedGen {
public:
    explicit FusedGen(const Block& b) : m_b(b) {
        for (int r = 20; r <= 24; ++r) line("        li s{}, 0", r);
    }

    template <class... A>
    void line(fmt::format_string<A...> f, A&&... a) {
        m_s += fmt::format(f, std::forward<A>(a)...);
        m_s += '\n';
    }
    /// An instruction with no completion flag.
    void raw(const std::string& ins) { m_s += ins + '\n'; }
    void dma(const std::string& ins) { issue(ins, 1, 20); }
    void store(const std::string& ins) { issue(ins, 5, 24); }
    void vpu(const std::string& ins) { issue(ins, 2, 21); }
    /// A matmul (weight loads take no flag: a load queued behind a matmul finishes first, and
    /// would make a count of completions pass before the matmul is done).
    void mxu(uint32_t m, const std::string& ins) { issue(ins, 3 + int(m), 22 + int(m)); }
    void wait_dma() { line("        wait f1, s20"); }
    void wait_store() { line("        wait f5, s24"); }
    void wait_vpu() { line("        wait f2, s21"); }
    void wait_mxu() {
        line("        wait f3, s22");
        line("        wait f4, s23");
    }

    /// VMEM[at] <- HBM[arg + off] (`bytes` contiguous), on the load flag.
    void load(uint64_t at, int arg, const char* off, uint64_t bytes) {
        line("        add s13, s{}, {}", arg, off);
        dma(fmt::format("        dma.hv [{}], [s13], 1, {}, {}, {}", at, bytes, bytes, bytes));
    }
    /// HBM[arg + off] <- VMEM[at], on the store flag.
    void put(int arg, const char* off, uint64_t at, uint64_t bytes) {
        line("        add s14, s{}, {}", arg, off);
        store(fmt::format("        dma.vh [s14], [{}], 1, {}, {}, {}", at, bytes, bytes, bytes));
    }
    /// Per head and key tile j, the n_j x D rows of `src` transposed to D x n_j, the tiles
    /// back to back (each one an MXU weight tile of K = D rows once in bf16).
    void transpose_tiles(uint64_t dst, uint64_t src) {
        for (uint32_t i = 0; i < m_b.G; ++i)
            for (uint32_t j = 0; j < m_b.KT; ++j) {
                const uint64_t at = (uint64_t(i) * m_b.S * m_b.D + uint64_t(j) * m_b.C * m_b.D) * 4;
                vpu(fmt::format("        v.trans [{}], [{}], {}, {}", dst + at, src + at, m_b.n(j),
                                m_b.D));
            }
    }
    /// Per head, the S x S `src` transposed.
    void transpose_heads(uint64_t dst, uint64_t src) {
        for (uint32_t i = 0; i < m_b.G; ++i) {
            const uint64_t at = uint64_t(i) * m_b.S * m_b.S * 4;
            vpu(fmt::format("        v.trans [{}], [{}], {}, {}", dst + at, src + at, m_b.S,
                            m_b.S));
        }
    }
    /// out = lhs x w^T per head: lhs S x D bf16, w the bf16 transposed tiles of transpose_tiles;
    /// out S x S fp32 in key-tile-major order (tile j: S x n_j). The K dimension is D <= R: one
    /// pass per tile, no accumulation.
    void scores(uint64_t out, uint64_t lhs, uint64_t w) {
        const Block& b = m_b;
        m_score_done.assign(size_t(b.G) * b.KT, {0, 0});
        uint32_t job = 0;
        for (uint32_t i = 0; i < b.G; ++i)
            for (uint32_t j = 0; j < b.KT; ++j) {
                const uint64_t wt = w + (uint64_t(i) * b.S * b.D + uint64_t(j) * b.C * b.D) * 2;
                const uint64_t o = out + (uint64_t(i) * b.S * b.S + uint64_t(j) * b.C * b.S) * 4;
                const uint64_t l = lhs + uint64_t(i) * b.S * b.D * 2;
                if (b.G * b.KT == 1) {
                    // One tile: both arrays, half the rows each.
                    for (uint32_t m = 0; m < 2; ++m) {
                        const auto [r0, r1] = half(m);
                        if (r0 == r1) continue;
                        raw(fmt::format("        mxu.lw {}, [{}], {}, {}", m, wt, b.D, b.n(j)));
                        mxu(m, fmt::format("        mxu.mm {}, [{}], [{}], {}, 0", m,
                                           o + uint64_t(r0) * b.n(j) * 4,
                                           l + uint64_t(r0) * b.D * 2, r1 - r0));
                    }
                    continue;
                }
                const uint32_t m = job++ % 2;
                raw(fmt::format("        mxu.lw {}, [{}], {}, {}", m, wt, b.D, b.n(j)));
                mxu(m, fmt::format("        mxu.mm {}, [{}], [{}], {}, 0", m, o, l, b.S));
                m_score_done[size_t(i) * b.KT + j] = {m, m_issued[2 + m]};
            }
    }
    /// scores(out, lhs, w) with w the transposed tiles of `rhs` (S x D fp32 per head) through
    /// the fp32 area `tf` and the bf16 area `w`, once the previous block's stores (which
    /// read the areas the MXUs overwrite) are done.
    void scores_of(uint64_t out, uint64_t lhs, uint64_t rhs, uint64_t tf, uint64_t w) {
        transpose_tiles(tf, rhs);
        vpu(fmt::format("        v.f2bf [{}], [{}], {}", w, tf, m_b.sd()));
        wait_vpu();
        wait_store();
        scores(out, lhs, w);
    }
    /// out = lhs x w per head: lhs S x S bf16 in key-tile-major order, w S x D bf16 row-major
    /// (tile j its rows j C ..), out S x D fp32. The tiles accumulate in order on one array:
    /// heads alternate arrays, or one head's rows are halved over both.
    void contract(uint64_t out, uint64_t lhs, uint64_t w) {
        const Block& b = m_b;
        for (uint32_t j = 0; j < b.KT; ++j)
            for (uint32_t i = 0; i < b.G; ++i) {
                // The tile's LHS may still be on its way from retile (none without one).
                if (!m_tile_moved.empty())
                    wait_all_but(1, 20, m_issued[0] - m_tile_moved[size_t(i) * b.KT + j]);
                for (uint32_t m = 0; m < 2; ++m) {
                    if (b.G > 1 && m != i % 2) continue;
                    const auto [r0, r1] = b.G > 1 ? std::pair<uint32_t, uint32_t>{0, b.S} : half(m);
                    if (r0 == r1) continue;
                    const uint64_t wt = w + (uint64_t(i) * b.S * b.D + uint64_t(j) * b.C * b.D) * 2;
                    const uint64_t l = lhs + (uint64_t(i) * b.S * b.S + uint64_t(j) * b.C * b.S +
                                              uint64_t(r0) * b.n(j)) *
                                                 2;
                    raw(fmt::format("        mxu.lw {}, [{}], {}, {}", m, wt, b.n(j), b.D));
                    mxu(m, fmt::format("        mxu.mm {}, [{}], [{}], {}, {}", m,
                                       out + (uint64_t(i) * b.S + r0) * b.D * 4, l, r1 - r0,
                                       j ? 1 : 0));
                }
            }
    }
    /// Moves S x S matrices of `bytes`-wide values between row-major (`to_tiles` false: dst)
    /// and key-tile-major order with the DMA engine's 2-D VMEM copies. Nothing to do with one
    /// key tile (the two orders are the same; callers then pass the same area).
    void retile(uint64_t dst, uint64_t src, uint32_t bytes, bool to_tiles) {
        const Block& b = m_b;
        m_tile_moved.clear();
        if (b.KT == 1) return;
        m_tile_moved.resize(size_t(b.G) * b.KT);
        for (uint32_t i = 0; i < b.G; ++i)
            for (uint32_t j = 0; j < b.KT; ++j) {
                // Out of the scores: each tile as soon as its matmul is done.
                if (!to_tiles && !m_score_done.empty()) {
                    const auto [m, count] = m_score_done[size_t(i) * b.KT + j];
                    wait_all_but(3 + int(m), 22 + int(m), m_issued[2 + m] - count);
                }
                const uint64_t head = uint64_t(i) * b.S * b.S * bytes;
                const uint64_t tm = head + uint64_t(j) * b.C * b.S * bytes;
                const uint64_t rm = head + uint64_t(j) * b.C * bytes;
                const uint64_t row = uint64_t(b.n(j)) * bytes, full = uint64_t(b.S) * bytes;
                if (to_tiles)
                    dma(fmt::format("        dma.vv [{}], [{}], {}, {}, {}, {}", dst + tm, src + rm,
                                    b.S, row, row, full));
                else
                    dma(fmt::format("        dma.vv [{}], [{}], {}, {}, {}, {}", dst + rm, src + tm,
                                    b.S, row, full, row));
                m_tile_moved[size_t(i) * b.KT + j] = m_issued[0];
            }
    }
    /// The loop over blocks of G heads: s11 = the block's byte offset in S x D tensors, s12 in
    /// S x S ones.
    void loop_begin() {
        line("        li s10, 0");
        line("block:");
        line("        mul s11, s10, {}", m_b.sd() * 4);
        line("        mul s12, s10, {}", m_b.ss() * 4);
    }
    isa::Program loop_end(const char* name) {
        line("        add s10, s10, 1");
        line("        bltu s10, {}, block", m_b.blocks);
        wait_store();
        line("        halt");
        return isa::assemble(m_s, name);
    }

private:
    void issue(const std::string& ins, int flag, int reg) {
        m_s += fmt::format("{}, f{}\n", ins, flag);
        ++m_issued[reg - 20];
        line("        add s{}, s{}, 1", reg, reg);
    }
    std::pair<uint32_t, uint32_t> half(uint32_t m) const {
        const uint32_t h = (m_b.S + 1) / 2;
        return m ? std::pair<uint32_t, uint32_t>{h, m_b.S} : std::pair<uint32_t, uint32_t>{0, h};
    }

    /// Waits for the unit counted in s`reg` until all but `later` of its issued work is done.
    void wait_all_but(int flag, int reg, uint64_t later) {
        if (later)
            line("        wait f{}, s{}-{}", flag, reg, later);
        else
            line("        wait f{}, s{}", flag, reg);
    }

    const Block& m_b;
    std::string m_s;
    /// Work issued per counter (s20..s24) so far in the program text.
    uint64_t m_issued[5] = {};
    /// Per (head, key tile): the MXU of its score matmul and that MXU's count after it.
    std::vector<std::pair<uint32_t, uint64_t>> m_score_done;
    /// Per (head, key tile): the load counter after the last retile's copy of it.
    std::vector<uint64_t> m_tile_moved;
};

/// VMEM areas of the fused forward kernel (byte addresses).
struct FwdMap {
    uint64_t qf, kf, vf, qb, vb, ktf, ktb, st, x, z, e, m, sum, ls, pb, pt, o, bias, end;
};
FwdMap fwd_map(const Block& b) {
    VmemAreas a;
    FwdMap m{};
    for (uint64_t* f : {&m.qf, &m.kf, &m.vf, &m.ktf}) *f = a.take(b.sd() * 4);
    for (uint64_t* h : {&m.qb, &m.vb, &m.ktb}) *h = a.take(b.sd() * 2);
    m.st = a.take(b.ss() * 4);
    m.x = b.KT == 1 ? m.st : a.take(b.ss() * 4);
    m.z = a.take(b.ss() * 4);
    m.e = a.take(b.ss() * 4);
    m.m = a.take(uint64_t(b.G) * b.S * 4);
    m.sum = a.take(uint64_t(b.G) * b.S * 4);
    m.ls = a.take(uint64_t(b.G) * b.S * 4);
    m.pb = a.take(b.ss() * 2);
    m.pt = b.KT == 1 ? m.pb : a.take(b.ss() * 2);
    m.o = a.take(b.sd() * 4);
    m.bias = b.causal ? a.take(b.ss() * 4) : 0;
    m.end = a.end;
    return m;
}

/// VMEM areas of the fused backward kernel.
struct BwdMap {
    uint64_t qf, kf, vf, dof, qb, kb, dob, vtf, vtb, pf, pt, st, x, z, sum, b1, t1, b2, t2, dq, dk,
        dv, end;
};
BwdMap bwd_map(const Block& b) {
    VmemAreas a;
    BwdMap m{};
    for (uint64_t* f : {&m.qf, &m.kf, &m.vf, &m.dof, &m.vtf, &m.dq, &m.dk, &m.dv})
        *f = a.take(b.sd() * 4);
    for (uint64_t* h : {&m.qb, &m.kb, &m.dob, &m.vtb}) *h = a.take(b.sd() * 2);
    m.pf = a.take(b.ss() * 4);
    m.pt = a.take(b.ss() * 4);
    m.st = a.take(b.ss() * 4);
    m.x = b.KT == 1 ? m.st : a.take(b.ss() * 4);
    m.z = a.take(b.ss() * 4);
    m.sum = a.take(uint64_t(b.G) * b.S * 4);
    // Two bf16 S x S operands (P^T, then dS; and dS^T), each row-major and key-tile-major.
    m.b1 = a.take(b.ss() * 2);
    m.t1 = b.KT == 1 ? m.b1 : a.take(b.ss() * 2);
    m.b2 = a.take(b.ss() * 2);
    m.t2 = b.KT == 1 ? m.b2 : a.take(b.ss() * 2);
    m.end = a.end;
    return m;
}


/// Launch args: s1 Q, s2 K, s3 V, s4 O, s5 P, s6 fp32 scale, s7 the causal bias (S x S).
isa::Program attention_fwd_program(const Block& b, bool scaled) {
    const FwdMap m = fwd_map(b);
    FusedGen g(b);
    const uint64_t rows = uint64_t(b.G) * b.S, n = b.ss(), sd = b.sd();
    // The bias rows follow the query index within a head, so each head of the block gets a copy.
    for (uint32_t i = 0; b.causal && i < b.G; ++i)
        g.load(m.bias + uint64_t(i) * b.S * b.S * 4, 7, "0", uint64_t(b.S) * b.S * 4);
    g.loop_begin();
    g.load(m.qf, 1, "s11", sd * 4);
    g.load(m.kf, 2, "s11", sd * 4);
    g.load(m.vf, 3, "s11", sd * 4);
    g.wait_dma();
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.qb, m.qf, sd));
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.vb, m.vf, sd));
    g.scores_of(m.st, m.qb, m.kf, m.ktf, m.ktb);
    g.retile(m.x, m.st, 4, false);
    g.wait_mxu();
    g.wait_dma();
    // scaled_softmax's operations in its order (softmax.h).
    if (scaled) g.vpu(fmt::format("        v.muls [{}], [{}], s6, {}", m.x, m.x, n));
    if (b.causal) g.vpu(fmt::format("        v.add [{}], [{}], [{}], {}", m.x, m.x, m.bias, n));
    g.vpu(fmt::format("        v.rmax [{}], [{}], {}, {}", m.m, m.x, rows, b.S));
    g.vpu(fmt::format("        v.subcol [{}], [{}], [{}], {}, {}", m.z, m.x, m.m, rows, b.S));
    g.vpu(fmt::format("        v.exp [{}], [{}], {}", m.e, m.z, n));
    g.vpu(fmt::format("        v.rsum [{}], [{}], {}, {}", m.sum, m.e, rows, b.S));
    g.vpu(fmt::format("        v.log [{}], [{}], {}", m.ls, m.sum, rows));
    g.vpu(fmt::format("        v.subcol [{}], [{}], [{}], {}, {}", m.z, m.z, m.ls, rows, b.S));
    g.vpu(fmt::format("        v.exp [{}], [{}], {}", m.x, m.z, n));
    g.wait_vpu();
    g.put(5, "s12", m.x, n * 4);
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.pb, m.x, n));
    g.wait_vpu();
    g.retile(m.pt, m.pb, 2, true);
    g.contract(m.o, m.pt, m.vb);
    g.wait_mxu();
    g.put(4, "s11", m.o, sd * 4);
    return g.loop_end("attention_fwd.s");
}

/// Launch args: s1 Q, s2 K, s3 V, s4 P, s5 dO, s6 dQ, s7 dK, s8 dV, s9 fp32 scale.
isa::Program attention_bwd_program(const Block& b, bool scaled) {
    const BwdMap m = bwd_map(b);
    FusedGen g(b);
    const uint64_t rows = uint64_t(b.G) * b.S, n = b.ss(), sd = b.sd();
    g.loop_begin();
    g.load(m.qf, 1, "s11", sd * 4);
    g.load(m.kf, 2, "s11", sd * 4);
    g.load(m.vf, 3, "s11", sd * 4);
    g.load(m.dof, 5, "s11", sd * 4);
    g.load(m.pf, 4, "s12", n * 4);
    g.wait_dma();
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.dob, m.dof, sd));
    // dP = dO V^T on the MXUs while the VPU turns P into P^T.
    g.scores_of(m.st, m.dob, m.vf, m.vtf, m.vtb);
    g.transpose_heads(m.pt, m.pf);
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.b1, m.pt, n));
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.qb, m.qf, sd));
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.kb, m.kf, sd));
    g.wait_vpu();
    g.retile(m.t1, m.b1, 2, true);
    g.contract(m.dv, m.t1, m.dob);
    g.retile(m.x, m.st, 4, false);
    g.wait_mxu();
    g.wait_dma();
    g.put(8, "s11", m.dv, sd * 4);
    // scaled_softmax_grad's operations in its order (softmax.h): dS lands in z.
    g.vpu(fmt::format("        v.mul [{}], [{}], [{}], {}", m.z, m.x, m.pf, n));
    g.vpu(fmt::format("        v.rsum [{}], [{}], {}, {}", m.sum, m.z, rows, b.S));
    g.vpu(fmt::format("        v.subcol [{}], [{}], [{}], {}, {}", m.x, m.x, m.sum, rows, b.S));
    g.vpu(fmt::format("        v.mul [{}], [{}], [{}], {}", m.z, m.pf, m.x, n));
    if (scaled) g.vpu(fmt::format("        v.muls [{}], [{}], s9, {}", m.z, m.z, n));
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.b1, m.z, n));
    g.transpose_heads(m.pt, m.z);
    g.vpu(fmt::format("        v.f2bf [{}], [{}], {}", m.b2, m.pt, n));
    g.wait_vpu();
    g.retile(m.t1, m.b1, 2, true);
    g.contract(m.dq, m.t1, m.kb);
    g.retile(m.t2, m.b2, 2, true);
    g.contract(m.dk, m.t2, m.qb);
    g.wait_mxu();
    g.put(6, "s11", m.dq, sd * 4);
    g.put(7, "s11", m.dk, sd * 4);
    return g.loop_end("attention_bwd.s");
}

}  // namespace

/// The text program of `k`.
isa::Program attention_program_text(const AttentionKey& k) {
    Block b;
    b.S = k.seq;
    b.D = k.dhead;
    b.G = k.heads_per_block;
    b.C = k.key_cols;
    b.KT = (k.seq + b.C - 1) / b.C;
    b.blocks = k.blocks;
    b.causal = k.causal;
    return k.backward ? attention_bwd_program(b, k.scaled) : attention_fwd_program(b, k.scaled);
}

}  // namespace tpu::driver::text_attention
