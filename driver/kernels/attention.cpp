// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

using isa::Arg;
using isa::imm;
using isa::Opcode;
using streaming::Operand;
using streaming::Param;

/// Rows [first, first + rows) of every replica of `t`, as a Tensor that aliases its memory.
Tensor rows_of(const Tensor& t, uint64_t first, uint32_t rows) {
    Tensor v = t;
    v.rows = rows;
    for (Buffer& b : v.bufs) {
        b.addr += first * t.cols * 4;
        b.bytes = uint64_t(rows) * t.cols * 4;
    }
    return v;
}

/// q and `per_head` are groups * seq x dhead on q's cores, p groups * seq x seq.
void check_shapes(const AttentionShape& s, const char* kernel, const Tensor& q,
                  std::initializer_list<std::pair<const Tensor*, const char*>> per_head,
                  const Tensor& p) {
    // batch x heads x seq in 64 bits: in 32 it wraps and a smaller problem would pass.
    const uint64_t rows64 = uint64_t(s.batch) * s.heads * s.seq;
    if (rows64 > UINT32_MAX)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: batch {} x heads {} x seq {} = {} rows, more than a "
                                      "tensor holds (2^32 - 1)",
                                      kernel, s.batch, s.heads, s.seq, rows64));
    const auto rows = static_cast<uint32_t>(rows64);
    check_tensor(q, rows, s.dhead, q, kernel, "q");
    for (const auto& [t, label] : per_head) check_tensor(*t, rows, s.dhead, q, kernel, label);
    check_tensor(p, rows, s.seq, q, kernel, "p");
}

/// c_g = op(a_g) x op(b_g) for every head g, bf16 on the MXU.
void per_head(Device& dev, ProgramCache& cache, std::vector<Event>& evs, const AttentionShape& s,
              const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
    for (uint32_t g = 0; g < s.groups(); ++g) {
        const uint64_t r0 = uint64_t(g) * s.seq;
        evs.push_back(matmul(dev, cache, rows_of(a, r0, s.seq), ta, rows_of(b, r0, s.seq), tb,
                             rows_of(c, r0, s.seq), Precision::Bf16));
    }
}

/// Host: the seq x cols block of head g.
std::vector<float> block(const std::vector<float>& x, uint32_t g, uint32_t seq, uint32_t cols) {
    const auto* p = x.data() + size_t(g) * seq * cols;
    return {p, p + size_t(seq) * cols};
}

void put(std::vector<float>& x, uint32_t g, const std::vector<float>& b) {
    std::copy(b.begin(), b.end(), x.begin() + ptrdiff_t(g) * ptrdiff_t(b.size()));
}

// ---- The fused kernels ---------------------------------------------------------------------

/// Shape of one block of the fused kernels: G heads of S x D, KT key tiles of up to C columns.
struct Block {
    uint32_t S = 0, D = 0, G = 1, KT = 1, C = 128, blocks = 1;
    bool causal = false;
    /// Columns of key tile j.
    uint32_t n(uint32_t j) const { return std::min(C, S - j * C); }
    uint64_t sd() const { return uint64_t(G) * S * D; }  ///< values of a G x S x D area
    uint64_t ss() const { return uint64_t(G) * S * S; }  ///< values of a G x S x S area
};

Block block_of(const AttentionKey& k) {
    Block b;
    b.S = k.seq;
    b.D = k.dhead;
    b.G = k.heads_per_block;
    b.C = k.key_cols;
    b.KT = (k.seq + k.key_cols - 1) / k.key_cols;
    b.blocks = k.blocks;
    b.causal = k.causal;
    return b;
}

/// VMEM areas are 512-byte aligned so every DMA and MXU operand starts on a fresh row of the
/// banked memory.
constexpr uint64_t kAreaAlign = 512;

/// Hands out the VMEM areas of a kernel: from a builder's pool (named), or, for planning, from
/// address 0 up (the addresses the pool gives a kernel alone in VMEM).
class Areas {
public:
    /// Planning: no builder.
    Areas() = default;
    explicit Areas(isa::Builder& b) : m_b(&b) {}
    uint64_t take(const char* name, uint64_t bytes) {
        if (m_b) {
            m_held.push_back(m_b->vmem(name, bytes, kAreaAlign));
            return m_held.back().addr();
        }
        const uint64_t at = m_end;
        m_end += (bytes + kAreaAlign - 1) / kAreaAlign * kAreaAlign;
        return at;
    }
    /// Bytes from 0 to the end of the last area (planning).
    uint64_t end() const { return m_end; }

private:
    isa::Builder* m_b = nullptr;
    std::vector<isa::Vmem> m_held;
    uint64_t m_end = 0;
};

/// VMEM areas of the fused forward kernel (byte addresses).
struct FwdMap {
    uint64_t qf, kf, vf, ktf, qb, vb, ktb, st, x, z, e, m, sum, ls, pb, pt, o, bias;
};
FwdMap fwd_map(const Block& b, Areas& a) {
    FwdMap m{};
    const uint64_t sd4 = b.sd() * 4, sd2 = b.sd() * 2, ss4 = b.ss() * 4, ss2 = b.ss() * 2,
                   rows4 = uint64_t(b.G) * b.S * 4;
    m.qf = a.take("q", sd4);
    m.kf = a.take("k", sd4);
    m.vf = a.take("v", sd4);
    m.ktf = a.take("k_tiles", sd4);
    m.qb = a.take("q.bf16", sd2);
    m.vb = a.take("v.bf16", sd2);
    m.ktb = a.take("k_tiles.bf16", sd2);
    m.st = a.take("scores", ss4);
    // With one key tile the tile-major and row-major orders are the same area.
    m.x = b.KT == 1 ? m.st : a.take("scores.rows", ss4);
    m.z = a.take("z", ss4);
    m.e = a.take("e", ss4);
    m.m = a.take("row_max", rows4);
    m.sum = a.take("row_sum", rows4);
    m.ls = a.take("log_sum", rows4);
    m.pb = a.take("p.bf16", ss2);
    m.pt = b.KT == 1 ? m.pb : a.take("p.bf16.tiles", ss2);
    m.o = a.take("o", sd4);
    m.bias = b.causal ? a.take("bias", ss4) : 0;
    return m;
}

/// VMEM areas of the fused backward kernel.
struct BwdMap {
    uint64_t qf, kf, vf, dof, vtf, dq, dk, dv, qb, kb, dob, vtb, pf, pt, st, x, z, sum, b1, t1, b2,
        t2;
};
BwdMap bwd_map(const Block& b, Areas& a) {
    BwdMap m{};
    const uint64_t sd4 = b.sd() * 4, sd2 = b.sd() * 2, ss4 = b.ss() * 4, ss2 = b.ss() * 2;
    m.qf = a.take("q", sd4);
    m.kf = a.take("k", sd4);
    m.vf = a.take("v", sd4);
    m.dof = a.take("dout", sd4);
    m.vtf = a.take("v_tiles", sd4);
    m.dq = a.take("dq", sd4);
    m.dk = a.take("dk", sd4);
    m.dv = a.take("dv", sd4);
    m.qb = a.take("q.bf16", sd2);
    m.kb = a.take("k.bf16", sd2);
    m.dob = a.take("dout.bf16", sd2);
    m.vtb = a.take("v_tiles.bf16", sd2);
    m.pf = a.take("p", ss4);
    m.pt = a.take("p.t", ss4);
    m.st = a.take("dp", ss4);
    m.x = b.KT == 1 ? m.st : a.take("dp.rows", ss4);
    m.z = a.take("ds", ss4);
    m.sum = a.take("row_sum", uint64_t(b.G) * b.S * 4);
    // Two bf16 S x S operands (P^T, then dS; and dS^T), each row-major and key-tile-major.
    m.b1 = a.take("lhs1", ss2);
    m.t1 = b.KT == 1 ? m.b1 : a.take("lhs1.tiles", ss2);
    m.b2 = a.take("lhs2", ss2);
    m.t2 = b.KT == 1 ? m.b2 : a.take("lhs2.tiles", ss2);
    return m;
}

/// VMEM bytes the areas of `b` take.
uint64_t vmem_need(const Block& b, bool backward) {
    Areas a;
    if (backward)
        bwd_map(b, a);
    else
        fwd_map(b, a);
    return a.end();
}

/// Emits a fused kernel. Every unit has a counted flag, so a wait covers exactly the work
/// issued before it: loads and VMEM moves, stores, the VPU and each MXU.
class Fused {
public:
    Fused(isa::Builder& b, const Block& blk, const AttentionKey& key)
        : m_b(b),
          m_blk(blk),
          m_key(key),
          m_block(b.reg("block", 10)),
          m_sd_off(b.reg("block.sd_bytes", 11)),
          m_ss_off(b.reg("block.ss_bytes", 12)),
          m_load_at(b.reg("load_addr", 13)),
          m_store_at(b.reg("store_addr", 14)),
          m_dma(b, "dma", isa::Count::InRegister, 1, 20),
          m_vpu(b, "vpu", isa::Count::InRegister, 2, 21),
          m_mxu0(b, "mxu0", isa::Count::InRegister, 3, 22),
          m_mxu1(b, "mxu1", isa::Count::InRegister, 4, 23),
          m_store(b, "stores", isa::Count::InRegister, 5, 24) {
        if (key.heads) m_head_tmp.emplace(b.reg("head_addr_tmp"));
    }

    /// The block's byte offset in head-major S x S tensors (P).
    const isa::Reg& ss_off() const { return m_ss_off; }

    void vpu(Opcode op, std::initializer_list<Arg> args) { m_vpu.issue(op, args); }
    void wait_dma() { m_dma.wait_all(); }
    void wait_vpu() { m_vpu.wait_all(); }
    void wait_store() { m_store.wait_all(); }
    void wait_mxu() {
        m_mxu0.wait_all();
        m_mxu1.wait_all();
    }

    /// VMEM[at] <- HBM[src + off] (`bytes` contiguous), on the load flag.
    void load(uint64_t at, Arg src, Arg off, uint64_t bytes) {
        m_b.emit(Opcode::Add, {m_load_at, src, off});
        const Arg n = imm(static_cast<int64_t>(bytes));
        m_dma.issue(Opcode::DmaHv, {imm(int64_t(at)), m_load_at, imm(1), n, n, n});
    }
    /// HBM[dst + off] <- VMEM[at], on the store flag.
    void put(Arg dst, Arg off, uint64_t at, uint64_t bytes) {
        m_b.emit(Opcode::Add, {m_store_at, dst, off});
        const Arg n = imm(static_cast<int64_t>(bytes));
        m_store.issue(Opcode::DmaVh, {m_store_at, imm(int64_t(at)), imm(1), n, n, n});
    }
    /// VMEM[at] <- the block's G heads (S x D each, back to back) of tensor `src`, whose token
    /// rows hold `row` values in the token-major layout: one DMA in the head-major layout, else
    /// one strided DMA per head.
    void load_heads(uint64_t at, Arg src, uint32_t row) {
        const Block& b = m_blk;
        if (!m_key.heads) return load(at, src, m_sd_off, b.sd() * 4);
        for (uint32_t i = 0; i < b.G; ++i) {
            head_addr(m_load_at, i, src, row);
            m_dma.issue(Opcode::DmaHv,
                        {at_(at + uint64_t(i) * b.S * b.D * 4), m_load_at, imm(b.S),
                         imm(int64_t(b.D) * 4), imm(int64_t(b.D) * 4), imm(int64_t(row) * 4)});
        }
    }
    /// The block's G heads at VMEM[at] -> tensor `dst` (as load_heads).
    void put_heads(Arg dst, uint32_t row, uint64_t at) {
        const Block& b = m_blk;
        if (!m_key.heads) return put(dst, m_sd_off, at, b.sd() * 4);
        for (uint32_t i = 0; i < b.G; ++i) {
            head_addr(m_store_at, i, dst, row);
            m_store.issue(Opcode::DmaVh,
                          {m_store_at, at_(at + uint64_t(i) * b.S * b.D * 4), imm(b.S),
                           imm(int64_t(b.D) * 4), imm(int64_t(row) * 4), imm(int64_t(b.D) * 4)});
        }
    }
    /// Per head and key tile j, the n_j x D rows of `src` transposed to D x n_j, the tiles
    /// back to back (each one an MXU weight tile of K = D rows once in bf16).
    void transpose_tiles(uint64_t dst, uint64_t src) {
        const Block& b = m_blk;
        for (uint32_t i = 0; i < b.G; ++i)
            for (uint32_t j = 0; j < b.KT; ++j) {
                const uint64_t at = (uint64_t(i) * b.S * b.D + uint64_t(j) * b.C * b.D) * 4;
                vpu(Opcode::VTrans, {at_(dst + at), at_(src + at), imm(b.n(j)), imm(b.D)});
            }
    }
    /// Per head, the S x S `src` transposed.
    void transpose_heads(uint64_t dst, uint64_t src) {
        const Block& b = m_blk;
        for (uint32_t i = 0; i < b.G; ++i) {
            const uint64_t at = uint64_t(i) * b.S * b.S * 4;
            vpu(Opcode::VTrans, {at_(dst + at), at_(src + at), imm(b.S), imm(b.S)});
        }
    }
    /// out = lhs x w^T per head: lhs S x D bf16, w the bf16 transposed tiles of transpose_tiles;
    /// out S x S fp32 in key-tile-major order (tile j: S x n_j). The K dimension is D <= R: one
    /// pass per tile, no accumulation.
    void scores(uint64_t out, uint64_t lhs, uint64_t w) {
        const Block& b = m_blk;
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
                        weights(m, wt, b.D, b.n(j));
                        matmul(m, o + uint64_t(r0) * b.n(j) * 4, l + uint64_t(r0) * b.D * 2,
                               r1 - r0, false);
                    }
                    continue;
                }
                const uint32_t m = job++ % 2;
                weights(m, wt, b.D, b.n(j));
                matmul(m, o, l, b.S, false);
                m_score_done[size_t(i) * b.KT + j] = {m, mxu(m).issued()};
            }
    }
    /// scores(out, lhs, w) with w the transposed tiles of `rhs` (S x D fp32 per head) through
    /// the fp32 area `tf` and the bf16 area `w`, once the previous block's stores (which
    /// read the areas the MXUs overwrite) are done.
    void scores_of(uint64_t out, uint64_t lhs, uint64_t rhs, uint64_t tf, uint64_t w) {
        transpose_tiles(tf, rhs);
        vpu(Opcode::VF2Bf, {at_(w), at_(tf), imm(int64_t(m_blk.sd()))});
        wait_vpu();
        wait_store();
        scores(out, lhs, w);
    }
    /// out = lhs x w per head: lhs S x S bf16 in key-tile-major order, w S x D bf16 row-major
    /// (tile j its rows j C ..), out S x D fp32. The tiles accumulate in order on one array:
    /// heads alternate arrays, or one head's rows are halved over both.
    void contract(uint64_t out, uint64_t lhs, uint64_t w) {
        const Block& b = m_blk;
        for (uint32_t j = 0; j < b.KT; ++j)
            for (uint32_t i = 0; i < b.G; ++i) {
                // The tile's LHS may still be on its way from retile (none without one).
                if (!m_tile_moved.empty())
                    m_dma.wait_all_but(m_dma.issued() - m_tile_moved[size_t(i) * b.KT + j]);
                for (uint32_t m = 0; m < 2; ++m) {
                    if (b.G > 1 && m != i % 2) continue;
                    const auto [r0, r1] = b.G > 1 ? std::pair<uint32_t, uint32_t>{0, b.S} : half(m);
                    if (r0 == r1) continue;
                    const uint64_t wt = w + (uint64_t(i) * b.S * b.D + uint64_t(j) * b.C * b.D) * 2;
                    const uint64_t l = lhs + (uint64_t(i) * b.S * b.S + uint64_t(j) * b.C * b.S +
                                              uint64_t(r0) * b.n(j)) *
                                                 2;
                    weights(m, wt, b.n(j), b.D);
                    matmul(m, out + (uint64_t(i) * b.S + r0) * b.D * 4, l, r1 - r0, j > 0);
                }
            }
    }
    /// Moves S x S matrices of `bytes`-wide values between row-major (`to_tiles` false: dst)
    /// and key-tile-major order with the DMA engine's 2-D VMEM copies. Nothing to do with one
    /// key tile (the two orders are the same; callers then pass the same area).
    void retile(uint64_t dst, uint64_t src, uint32_t bytes, bool to_tiles) {
        const Block& b = m_blk;
        m_tile_moved.clear();
        if (b.KT == 1) return;
        m_tile_moved.resize(size_t(b.G) * b.KT);
        for (uint32_t i = 0; i < b.G; ++i)
            for (uint32_t j = 0; j < b.KT; ++j) {
                // Out of the scores: each tile as soon as its matmul is done.
                if (!to_tiles && !m_score_done.empty()) {
                    const auto [m, count] = m_score_done[size_t(i) * b.KT + j];
                    mxu(m).wait_all_but(mxu(m).issued() - count);
                }
                const uint64_t head = uint64_t(i) * b.S * b.S * bytes;
                const uint64_t tm = head + uint64_t(j) * b.C * b.S * bytes;
                const uint64_t rm = head + uint64_t(j) * b.C * bytes;
                const Arg row = imm(int64_t(b.n(j)) * bytes), full = imm(int64_t(b.S) * bytes);
                if (to_tiles)
                    m_dma.issue(Opcode::DmaVv,
                                {at_(dst + tm), at_(src + rm), imm(b.S), row, row, full});
                else
                    m_dma.issue(Opcode::DmaVv,
                                {at_(dst + rm), at_(src + tm), imm(b.S), row, full, row});
                m_tile_moved[size_t(i) * b.KT + j] = m_dma.issued();
            }
    }
    /// The loop over blocks of G heads (`body` once per block: m_sd_off and ss_off() are the
    /// block's offsets), then a wait for every store. (Not Builder::loop: the count is
    /// compared unsigned.)
    void blocks(const std::function<void()>& body) {
        const Block& b = m_blk;
        m_b.emit(Opcode::Li, {m_block, imm(0)});
        const isa::Label top = m_b.label("block");
        m_b.bind(top);
        m_b.emit(Opcode::Mul, {m_sd_off, m_block, imm(int64_t(b.sd()) * 4)});
        m_b.emit(Opcode::Mul, {m_ss_off, m_block, imm(int64_t(b.ss()) * 4)});
        body();
        m_b.emit(Opcode::Add, {m_block, m_block, imm(1)});
        m_b.emit(Opcode::Bltu, {m_block, imm(b.blocks), top});
        wait_store();
    }

private:
    static Arg at_(uint64_t addr) { return imm(static_cast<int64_t>(addr)); }
    /// out = the address of head i of the block in a token-major tensor at `base`: group
    /// t = block G + i is head t mod heads of sequence t div heads.
    void head_addr(const isa::Reg& out, uint32_t i, Arg base, uint32_t row) {
        const Block& b = m_blk;
        const isa::Reg& seq = *m_head_tmp;
        m_b.emit(Opcode::Mul, {out, m_block, imm(b.G)});
        m_b.emit(Opcode::Add, {out, out, imm(i)});
        m_b.emit(Opcode::Divu, {seq, out, imm(m_key.heads)});
        m_b.emit(Opcode::Remu, {out, out, imm(m_key.heads)});
        m_b.emit(Opcode::Mul, {seq, seq, imm(int64_t(b.S) * row * 4)});
        m_b.emit(Opcode::Mul, {out, out, imm(int64_t(b.D) * 4)});
        m_b.emit(Opcode::Add, {out, out, seq});
        m_b.emit(Opcode::Add, {out, out, base});
    }
    isa::CountedFlag& mxu(uint32_t m) { return m ? m_mxu1 : m_mxu0; }
    /// A weight load takes no flag: a load queued behind a matmul finishes first, and would make
    /// a count of completions pass before the matmul is done.
    void weights(uint32_t m, uint64_t at, uint32_t rows, uint32_t cols) {
        m_b.emit(Opcode::MxuLw, {imm(m), at_(at), imm(rows), imm(cols)});
    }
    void matmul(uint32_t m, uint64_t out, uint64_t lhs, uint32_t rows, bool accumulate) {
        mxu(m).issue(Opcode::MxuMm, {imm(m), at_(out), at_(lhs), imm(rows), imm(accumulate)});
    }
    std::pair<uint32_t, uint32_t> half(uint32_t m) const {
        const uint32_t h = (m_blk.S + 1) / 2;
        return m ? std::pair<uint32_t, uint32_t>{h, m_blk.S} : std::pair<uint32_t, uint32_t>{0, h};
    }

    isa::Builder& m_b;
    const Block& m_blk;
    const AttentionKey& m_key;
    isa::Reg m_block, m_sd_off, m_ss_off, m_load_at, m_store_at;
    isa::CountedFlag m_dma, m_vpu, m_mxu0, m_mxu1, m_store;
    std::optional<isa::Reg> m_head_tmp;  ///< token-major layouts only
    /// Per (head, key tile): the MXU of its score matmul and that MXU's count after it.
    std::vector<std::pair<uint32_t, int64_t>> m_score_done;
    /// Per (head, key tile): the load counter after the last retile's copy of it.
    std::vector<int64_t> m_tile_moved;
};

/// The fused forward kernel; operands as attention_params.
void emit_fwd(isa::Builder& bb, const AttentionKey& k, std::span<const Operand> o) {
    const Block b = block_of(k);
    const Arg q = o[0].value, kk = o[1].value, v = o[2].value, out = o[3].value, p = o[4].value,
              scale = o[5].value, bias = o[6].value;
    Fused g(bb, b, k);
    Areas areas(bb);
    const FwdMap m = fwd_map(b, areas);
    const uint64_t rows = uint64_t(b.G) * b.S, n = b.ss(), sd = b.sd();
    const Arg R = imm(int64_t(rows)), S = imm(b.S), N = imm(int64_t(n)), SD = imm(int64_t(sd));
    auto a = [](uint64_t addr) { return imm(static_cast<int64_t>(addr)); };
    // The bias rows follow the query index within a head, so each head of the block gets a copy.
    for (uint32_t i = 0; b.causal && i < b.G; ++i)
        g.load(m.bias + uint64_t(i) * b.S * b.S * 4, bias, imm(0), uint64_t(b.S) * b.S * 4);
    g.blocks([&] {
        g.load_heads(m.qf, q, k.qkv_row);
        g.load_heads(m.kf, kk, k.qkv_row);
        g.load_heads(m.vf, v, k.qkv_row);
        g.wait_dma();
        g.vpu(Opcode::VF2Bf, {a(m.qb), a(m.qf), SD});
        g.vpu(Opcode::VF2Bf, {a(m.vb), a(m.vf), SD});
        g.scores_of(m.st, m.qb, m.kf, m.ktf, m.ktb);
        g.retile(m.x, m.st, 4, false);
        g.wait_mxu();
        g.wait_dma();
        // scaled_softmax's operations in its order (softmax.h).
        if (k.scaled) g.vpu(Opcode::VMulS, {a(m.x), a(m.x), scale, N});
        if (b.causal) g.vpu(Opcode::VAdd, {a(m.x), a(m.x), a(m.bias), N});
        g.vpu(Opcode::VRMax, {a(m.m), a(m.x), R, S});
        g.vpu(Opcode::VSubCol, {a(m.z), a(m.x), a(m.m), R, S});
        g.vpu(Opcode::VExp, {a(m.e), a(m.z), N});
        g.vpu(Opcode::VRSum, {a(m.sum), a(m.e), R, S});
        g.vpu(Opcode::VLog, {a(m.ls), a(m.sum), R});
        g.vpu(Opcode::VSubCol, {a(m.z), a(m.z), a(m.ls), R, S});
        g.vpu(Opcode::VExp, {a(m.x), a(m.z), N});
        g.wait_vpu();
        g.put(p, g.ss_off(), m.x, n * 4);
        g.vpu(Opcode::VF2Bf, {a(m.pb), a(m.x), N});
        g.wait_vpu();
        g.retile(m.pt, m.pb, 2, true);
        g.contract(m.o, m.pt, m.vb);
        g.wait_mxu();
        g.put_heads(out, k.out_row, m.o);
    });
}

/// The fused backward kernel; operands as attention_params.
void emit_bwd(isa::Builder& bb, const AttentionKey& k, std::span<const Operand> o) {
    const Block b = block_of(k);
    const Arg q = o[0].value, kk = o[1].value, v = o[2].value, p = o[3].value, dout = o[4].value,
              dq = o[5].value, dk = o[6].value, dv = o[7].value, scale = o[8].value;
    Fused g(bb, b, k);
    Areas areas(bb);
    const BwdMap m = bwd_map(b, areas);
    const uint64_t rows = uint64_t(b.G) * b.S, n = b.ss(), sd = b.sd();
    const Arg R = imm(int64_t(rows)), S = imm(b.S), N = imm(int64_t(n)), SD = imm(int64_t(sd));
    auto a = [](uint64_t addr) { return imm(static_cast<int64_t>(addr)); };
    g.blocks([&] {
        g.load_heads(m.qf, q, k.qkv_row);
        g.load_heads(m.kf, kk, k.qkv_row);
        g.load_heads(m.vf, v, k.qkv_row);
        g.load_heads(m.dof, dout, k.out_row);
        g.load(m.pf, p, g.ss_off(), n * 4);
        g.wait_dma();
        g.vpu(Opcode::VF2Bf, {a(m.dob), a(m.dof), SD});
        // dP = dO V^T on the MXUs while the VPU turns P into P^T.
        g.scores_of(m.st, m.dob, m.vf, m.vtf, m.vtb);
        g.transpose_heads(m.pt, m.pf);
        g.vpu(Opcode::VF2Bf, {a(m.b1), a(m.pt), N});
        g.vpu(Opcode::VF2Bf, {a(m.qb), a(m.qf), SD});
        g.vpu(Opcode::VF2Bf, {a(m.kb), a(m.kf), SD});
        g.wait_vpu();
        g.retile(m.t1, m.b1, 2, true);
        g.contract(m.dv, m.t1, m.dob);
        g.retile(m.x, m.st, 4, false);
        g.wait_mxu();
        g.wait_dma();
        g.put_heads(dv, k.qkv_row, m.dv);
        // scaled_softmax_grad's operations in its order (softmax.h): dS lands in z.
        g.vpu(Opcode::VMul, {a(m.z), a(m.x), a(m.pf), N});
        g.vpu(Opcode::VRSum, {a(m.sum), a(m.z), R, S});
        g.vpu(Opcode::VSubCol, {a(m.x), a(m.x), a(m.sum), R, S});
        g.vpu(Opcode::VMul, {a(m.z), a(m.pf), a(m.x), N});
        if (k.scaled) g.vpu(Opcode::VMulS, {a(m.z), a(m.z), scale, N});
        g.vpu(Opcode::VF2Bf, {a(m.b1), a(m.z), N});
        g.transpose_heads(m.pt, m.z);
        g.vpu(Opcode::VF2Bf, {a(m.b2), a(m.pt), N});
        g.wait_vpu();
        g.retile(m.t1, m.b1, 2, true);
        g.contract(m.dq, m.t1, m.kb);
        g.retile(m.t2, m.b2, 2, true);
        g.contract(m.dk, m.t2, m.qb);
        g.wait_mxu();
        g.put_heads(dq, k.qkv_row, m.dq);
        g.put_heads(dk, k.qkv_row, m.dk);
    });
}

/// Heads per block: the most (a divisor of the groups, so every block is alike) whose rows
/// stay within kBlockRows and whose areas fit in VMEM; 0 when not even one head fits or dhead
/// exceeds the array (the per-head composition then runs).
constexpr uint32_t kBlockRows = 512;
Block plan_block(const hw::BoardConfig& cfg, const AttentionShape& s, bool backward,
                 uint64_t vmem_bytes) {
    Block b;
    b.S = s.seq;
    b.D = s.dhead;
    b.C = cfg.core.mxu_cols;
    b.KT = (s.seq + b.C - 1) / b.C;
    b.causal = s.causal && !backward;
    b.G = 0;
    if (s.dhead > cfg.core.mxu_rows || cfg.core.mxus < 2 || cfg.core.mxu_rows != b.C) return b;
    for (uint32_t g = 1; g <= s.groups(); ++g) {
        if (s.groups() % g || (g > 1 && uint64_t(g) * s.seq > kBlockRows)) continue;
        Block t = b;
        t.G = g;
        if (vmem_need(t, backward) > vmem_bytes) break;
        b.G = g;
    }
    if (b.G) b.blocks = s.groups() / b.G;
    return b;
}

}  // namespace

std::optional<AttentionKey> plan_attention(const hw::BoardConfig& cfg, const AttentionShape& s,
                                           bool backward, uint64_t vmem_bytes) {
    const Block b = plan_block(cfg, s, backward, vmem_bytes ? vmem_bytes : cfg.core.vmem_bytes);
    if (!b.G) return std::nullopt;
    return AttentionKey{backward, b.S, b.D, b.G, b.blocks, b.C, b.causal, s.scale() != 1.0f};
}

std::vector<Param> attention_params(const AttentionKey& k) {
    if (k.backward)
        return {{"q"}, {"k"}, {"v"}, {"p"}, {"dout"}, {"dq"}, {"dk"}, {"dv"}, {"scale", true}};
    return {{"q"}, {"k"}, {"v"}, {"o"}, {"p"}, {"scale", true}, {"bias"}};
}

void emit(isa::Builder& b, const AttentionKey& k, std::span<const Operand> ops) {
    const std::vector<Param> params = attention_params(k);
    streaming::check_operands(k.name(), params, ops);
    for (size_t i = 0; i < ops.size(); ++i)
        if (!params[i].scalar && ops[i].kind != Operand::Kind::Hbm)
            throw isa::BuildError(fmt::format(
                "kernel '{}': operand '{}' must be an HBM tensor (the kernel moves blocks of heads "
                "between HBM and its own VMEM areas)",
                k.name(), params[i].name));
    if (k.seq == 0 || k.dhead == 0 || k.heads_per_block == 0 || k.blocks == 0 || k.key_cols == 0)
        throw isa::BuildError(fmt::format("kernel '{}': empty shape", k.name()));
    const uint64_t groups = uint64_t(k.heads_per_block) * k.blocks,
                   width = uint64_t(k.heads) * k.dhead;
    if (k.heads && (groups % k.heads || k.qkv_row < width || k.out_row < width))
        throw isa::BuildError(fmt::format(
            "kernel '{}': token-major layout of {} heads x {} over {} groups with rows of {} (q, "
            "k, v) and {} (o) values: the heads must divide the groups and fit in the rows",
            k.name(), k.heads, k.dhead, groups, k.qkv_row, k.out_row));
    if (!k.heads && (k.qkv_row || k.out_row))
        throw isa::BuildError(fmt::format(
            "kernel '{}': row widths {} and {} given for the head-major layout (heads = 0)",
            k.name(), k.qkv_row, k.out_row));
    const auto scope = b.scope(k.name());
    if (k.backward)
        emit_bwd(b, k, ops);
    else
        emit_fwd(b, k, ops);
}

isa::Program generate(const AttentionKey& k) {
    isa::Builder b(k.name());
    std::vector<isa::Reg> args;
    const std::vector<Param> params = attention_params(k);
    const std::vector<Operand> ops = streaming::declare_args(b, params, args);
    emit(b, k, ops);
    b.emit(Opcode::Halt, {});
    return b.finish();
}

float AttentionShape::scale() const {
    return static_cast<float>(1.0 / std::sqrt(double(dhead)));
}

Event attention(Device& dev, ProgramCache& cache, const AttentionShape& s, const Tensor& q,
                const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& p) {
    check_shapes(s, "attention", q, {{&k, "k"}, {&v, "v"}, {&o, "o"}}, p);
    if (const auto key = plan_attention(dev.config(), s, false)) {
        // The bias is written from the host, as scaled_softmax's (softmax.h).
        Tensor bias;
        if (s.causal) {
            bias = alloc_tensor(dev, q.cores, s.seq, s.seq);
            write_tensor_all(dev, bias, causal_bias(s.seq));
        }
        try {
            const Event ev = launch(dev, cache, *key, q.cores, [&](size_t i, LaunchArgs& a) {
                a.set("q", q.bufs[i]).set("k", k.bufs[i]).set("v", v.bufs[i]);
                a.set("o", o.bufs[i]).set("p", p.bufs[i]).set_f32("scale", s.scale());
                if (s.causal)
                    a.set("bias", bias.bufs[i]);
                else
                    a.set("bias", 0u);
            });
            if (s.causal) free_tensor(dev, bias);
            return ev;
        } catch (...) {
            if (s.causal) free_tensor(dev, bias);
            throw;
        }
    }
    std::vector<Event> evs;
    // The scores go through p: Q K^T lands there and the softmax rewrites it in place, so the
    // forward pass needs no scratch beyond the matmuls' packed operands.
    per_head(dev, cache, evs, s, q, false, k, true, p);
    evs.push_back(scaled_softmax(dev, cache, p, s.scale(), s.causal, p));
    per_head(dev, cache, evs, s, p, false, v, false, o);
    return detail::merge(evs);
}

Event attention_grad(Device& dev, ProgramCache& cache, const AttentionShape& s, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& dout,
                     const Tensor& dq, const Tensor& dk, const Tensor& dv) {
    check_shapes(s, "attention_grad", q,
                 {{&k, "k"}, {&v, "v"}, {&dout, "dout"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}}, p);
    if (const auto key = plan_attention(dev.config(), s, true))
        return launch(dev, cache, *key, q.cores, [&](size_t i, LaunchArgs& a) {
            a.set("q", q.bufs[i]).set("k", k.bufs[i]).set("v", v.bufs[i]).set("p", p.bufs[i]);
            a.set("dout", dout.bufs[i]).set("dq", dq.bufs[i]).set("dk", dk.bufs[i]);
            a.set("dv", dv.bufs[i]).set_f32("scale", s.scale());
        });
    Tensor ds = alloc_tensor(dev, q.cores, s.groups() * s.seq, s.seq);
    std::vector<Event> evs;
    try {
        per_head(dev, cache, evs, s, p, true, dout, false, dv);
        per_head(dev, cache, evs, s, dout, false, v, true, ds);
        evs.push_back(scaled_softmax_grad(dev, cache, p, ds, s.scale(), ds));
        per_head(dev, cache, evs, s, ds, false, k, false, dq);
        per_head(dev, cache, evs, s, ds, true, q, false, dk);
    } catch (...) {
        free_tensor(dev, ds);
        throw;
    }
    free_tensor(dev, ds);
    return detail::merge(evs);
}

AttentionResult attention_reference(const AttentionShape& s, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    uint32_t mxu_rows) {
    const uint32_t S = s.seq, D = s.dhead;
    AttentionResult r{std::vector<float>(size_t(s.groups()) * S * D),
                      std::vector<float>(size_t(s.groups()) * S * S)};
    for (uint32_t g = 0; g < s.groups(); ++g) {
        const auto qg = block(q, g, S, D), kg = block(k, g, S, D), vg = block(v, g, S, D);
        const auto sc =
            matmul_reference(qg, S, D, false, kg, S, D, true, Precision::Bf16, mxu_rows);
        const auto pg = softmax_reference(sc, S, S, s.scale(), s.causal);
        put(r.p, g, pg);
        put(r.o, g, matmul_reference(pg, S, S, false, vg, S, D, false, Precision::Bf16, mxu_rows));
    }
    return r;
}

AttentionGradResult attention_grad_reference(const AttentionShape& s, const std::vector<float>& q,
                                             const std::vector<float>& k,
                                             const std::vector<float>& v,
                                             const std::vector<float>& p,
                                             const std::vector<float>& dout, uint32_t mxu_rows) {
    const uint32_t S = s.seq, D = s.dhead;
    const Precision bf = Precision::Bf16;
    AttentionGradResult r;
    r.dq.resize(q.size());
    r.dk.resize(q.size());
    r.dv.resize(q.size());
    for (uint32_t g = 0; g < s.groups(); ++g) {
        const auto qg = block(q, g, S, D), kg = block(k, g, S, D), vg = block(v, g, S, D);
        const auto pg = block(p, g, S, S), dog = block(dout, g, S, D);
        put(r.dv, g, matmul_reference(pg, S, S, true, dog, S, D, false, bf, mxu_rows));
        const auto dp = matmul_reference(dog, S, D, false, vg, S, D, true, bf, mxu_rows);
        const auto ds = softmax_grad_reference(pg, dp, S, S, s.scale());
        put(r.dq, g, matmul_reference(ds, S, S, false, kg, S, D, false, bf, mxu_rows));
        put(r.dk, g, matmul_reference(ds, S, S, true, qg, S, D, false, bf, mxu_rows));
    }
    return r;
}

}  // namespace tpu::driver
