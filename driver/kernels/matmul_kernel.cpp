// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/matmul_kernel.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/split.h"
#include "hw/core/mxu_model.h"
#include "hw/mem/hbm_timing.h"

namespace tpu::driver {

using isa::imm;
using isa::Opcode;
using streaming::Operand;

std::string_view dot_layout_name(DotLayout l) {
    switch (l) {
        case DotLayout::RowMajor:
            return "row-major";
        case DotLayout::Transposed:
            return "transposed";
        case DotLayout::Tiles:
            return "tiles";
        case DotLayout::Gemm:
            return "gemm";
        case DotLayout::VpuTiles:
            return "vpu-tiles";
        case DotLayout::TransposedVpuTiles:
            return "transposed-vpu-tiles";
        case DotLayout::TransposedTiles:
            return "transposed-tiles";
    }
    return "?";
}

size_t hash_value(const DotKey& k) {
    // DotKey::accumulate is left out (equal keys still hash alike): the hashes of every other
    // key stay what they were.
    return hash_fields(k.M, k.K, k.N, k.precision, k.a, k.w, k.c, k.stationary, k.R, k.C, k.mxus,
                       k.block_rows, k.column_sides, k.full_sides, k.store_bf16, k.c_row,
                       k.overlap_epilogue, k.group_panels, k.band_loads, k.prefetch_sides, k.parts);
}

size_t hash_value(const MatmulKey& k) {
    return hash_fields(k.M, k.K, k.N, k.ta, k.tb, k.precision, k.R, k.C, k.mxus, k.block_rows,
                       k.bias);
}

DotKey MatmulKey::dot() const {
    DotKey d;
    d.M = M;
    d.K = K;
    d.N = N;
    d.precision = precision;
    d.a = ta ? DotLayout::Transposed : DotLayout::RowMajor;
    d.w = tb ? DotLayout::Transposed : DotLayout::RowMajor;
    d.R = R;
    d.C = C;
    d.mxus = mxus;
    d.block_rows = block_rows;
    d.column_sides = bias ? 1 : 0;
    return d;
}

namespace {

uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

int parts_of(Precision p) {
    return p == Precision::Bf16 ? 1 : p == Precision::Fp32Pass3 ? 2 : 3;
}

/// The share of HBM peak one sequential stream of long contiguous runs reaches on the banked
/// HBM2 model (bench/hbm_bench; gemm.cpp's kPlannedHbmShare note): a streamed panel of MXU
/// tiles, one run a step.
constexpr double kSequentialHbmShare = 0.925;

/// Largest block the planners consider, as plan_gemm: beyond it the drain is amortised.
constexpr uint32_t kMaxBlockRows = 4096;

/// Bytes of one 8 x 128 fp32 tile of DotLayout::VpuTiles.
constexpr int64_t kBandBytes = 8 * 128 * 4;

/// An fp32 layout: the kernel stages and converts it in VMEM (else it loads bf16 parts).
bool staged(DotLayout l) {
    return l != DotLayout::Gemm;
}

/// The problem the kernel runs: `M` rows of the streamed operand (M x K, laid out as `a`) pass
/// the stationary one's tiles (K x N, laid out as `w`). Stationary::Lhs is C^T = W^T A^T: W^T
/// streams (W row-major is W^T stored transposed) and A^T is held.
struct Problem {
    uint32_t M, K, N;
    DotLayout a, w;
    bool lhs;
    uint32_t a_band_tiles = 0, w_band_tiles = 0, a_lane = 0, w_lane = 0;  ///< DotKey's windows
};
Problem problem(const DotKey& k) {
    if (k.stationary == Stationary::Rhs)
        return {k.M, k.K, k.N, k.a, k.w, false, k.a_band_tiles, k.w_band_tiles, k.a_lane, k.w_lane};
    auto flip = [](DotLayout l) {
        switch (l) {
            case DotLayout::RowMajor:
                return DotLayout::Transposed;
            case DotLayout::VpuTiles:
                return DotLayout::TransposedVpuTiles;
            case DotLayout::TransposedVpuTiles:
                return DotLayout::VpuTiles;
            case DotLayout::TransposedTiles:  // W^T streamed or A^T held, in the MXU's tiles
                return DotLayout::Tiles;
            case DotLayout::Tiles:  // a weight in its held layout, streamed: W^T's tiles
                return DotLayout::TransposedTiles;
            default:
                return DotLayout::RowMajor;
        }
    };
    return {k.N,      k.K,     k.M, flip(k.w), flip(k.a), true, k.w_band_tiles, k.a_band_tiles,
            k.w_lane, k.a_lane};
}

/// VMEM areas (byte offsets from the first; each 512-byte aligned, in this order). A's bf16
/// parts stay for the whole block (every column group reads them); everything else is per K
/// step, double-buffered where a DMA or the MXUs read one copy while the next is written.
struct Map {
    uint64_t abf, astage, att, awin, af, ar1, ar2, wstage, wtt, wf, wr1, wr2, wbf, c, col, full, tt,
        bf;
    uint64_t end;
    uint64_t apanel, wtile, cpanel;  ///< bytes of one A bf16 panel, W bf16 tile, C panel
    uint64_t col_stride;             ///< from one Column side's area to the next
    /// The areas taken, in address order: the field, its name, its bytes.
    struct Area {
        uint64_t Map::*field;
        const char* name;
        uint64_t bytes;
    };
    std::vector<Area> areas;
};
/// Column panels of a group (each MXU takes group_panels of them per step).
uint32_t group_width(const DotKey& k) {
    return k.mxus * std::max<uint32_t>(k.group_panels, 1);
}

/// The streamed operand's bf16 panels in two slots, each read in its own step only: several
/// panels per MXU in one group (the block's every column) read each staged panel once.
bool two_panel_slots(const DotKey& k) {
    const Problem p = problem(k);
    return k.group_panels > 1 && staged(p.a) && ceil_div(p.N, k.C) <= group_width(k);
}

/// DotKey::band_loads where the kernel runs it: the held operand is W^T stored in 8 x 128
/// tiles (attention's P with the LHS stationary), not a window, whole 128 x 128 tiles on a
/// 128 x 128 MXU, one block and one column group of whole panels.
bool band_loads_apply(const DotKey& k) {
    const Problem p = problem(k);
    return k.band_loads && p.w == DotLayout::TransposedVpuTiles && !p.w_band_tiles && !p.w_lane &&
           k.R == 128 && k.C == 128 && p.K % 128 == 0 && p.N % 128 == 0 && p.M <= k.block_rows &&
           ceil_div(p.N, k.C) <= group_width(k);
}

/// DotKey::band_loads where the kernel runs it as head-ahead loads (DotGen::ahead_next): the
/// streamed operand in 8 x 128 tiles and the held one W^T stored so (attention's scores, q k^T
/// and k q^T), one K step, one block and one column group a batch, on a 128 x 128 MXU: each
/// batch's operands are loaded into the staging slot the previous batch does not use, while it
/// computes, and C has three buffers.
bool ahead_apply(const DotKey& k) {
    const Problem p = problem(k);
    // Heads of a whole tile or of half one (lanes 0 and 64) only: the windows' staging assumes
    // those lane offsets; heads of 32 or 16 lanes (the zoo's GPT) gave wrong values, so they
    // keep the per-head loads.
    return k.band_loads && !band_loads_apply(k) && p.a == DotLayout::VpuTiles &&
           p.w == DotLayout::TransposedVpuTiles && k.R == 128 && k.C == 128 &&
           (p.K == k.R || 2 * p.K == k.R) && p.M <= k.block_rows &&
           ceil_div(p.N, k.C) <= group_width(k) && !k.full_sides;
}

/// Band loads (band_loads_apply) of an even number of K steps: the streamed operand is read two
/// steps ahead (DotGen::m_lead), into a staging area per K step, so each step's panel goes out
/// before the held tiles' chunk of the step before and is there when its step begins.
bool band_lead_apply(const DotKey& k) {
    const Problem p = problem(k);
    const uint32_t KT = ceil_div(p.K, k.R);
    return band_loads_apply(k) && staged(p.a) && KT >= 2 && KT % 2 == 0;
}

/// DotKey::band_loads of a batch of several K steps, one block and one column group a batch
/// (attention's values dot), KT even: the next batch's first step's operands (into slot 0, which
/// the batch's last step does not use) are loaded beside the batch's last step
/// (DotGen::step_ahead_next). Not with P's band loads (the zoo's values dot: 55 920 -> 56 181
/// cycles at BERT-base's shape, its V window queued behind P's bands).
bool step_ahead_apply(const DotKey& k) {
    const Problem p = problem(k);
    const uint32_t KT = ceil_div(p.K, k.R);
    return k.band_loads && !ahead_apply(k) && !band_loads_apply(k) && KT >= 2 && KT % 2 == 0 &&
           p.M <= k.block_rows && ceil_div(p.N, k.C) <= group_width(k) && !k.full_sides;
}

/// Head-ahead loads of a streamed window narrower than a tile (attention's Q, heads of 64
/// lanes): two batches whose windows share their tiles (DotGen::m_pair) read them once.
bool pair_windows(const DotKey& k) {
    const Problem p = problem(k);
    return ahead_apply(k) && p.K < k.R && p.a_band_tiles > 0;
}

/// DotKey::one_c_buffer where the kernel runs it: the LHS stationary storing C from the
/// transposed panels (row-major or 8 x 128 tiles), a staged held operand (its steps convert, so
/// a group's first matmuls already wait for the VPU), no batch's band loads.
bool one_c_buffer_applies(const DotKey& k) {
    const Problem p = problem(k);
    return k.one_c_buffer && p.lhs && (k.c == DotLayout::RowMajor || k.c == DotLayout::VpuTiles) &&
           staged(p.w) && !k.band_loads;
}

/// With C in one buffer and Full sides prefetched, the sides' tiles in two panel slots: panel m
/// in slot m % 2, panels 0 and 1 loaded during the group's last steps, panel m + 2 once panel
/// m's epilogue is done (DotGen::stores).
bool side_ring_applies(const DotKey& k) {
    const Problem p = problem(k);
    return one_c_buffer_applies(k) && k.full_sides && k.prefetch_sides &&
           std::min(group_width(k), ceil_div(p.N, k.C)) > 2;
}

/// With C in one buffer, a streamed operand stored transposed in the MXU's tiles (a weight) is
/// transposed and converted tile by tile through two tiles of the transposed copy instead of a
/// block's (bf16; emit_dot refuses a prologue on the streamed operand with one_c_buffer).
bool a_trans_ring_applies(const DotKey& k) {
    return one_c_buffer_applies(k) && problem(k).a == DotLayout::TransposedTiles && k.R == k.C &&
           k.precision == Precision::Bf16;
}

Map vmem_map(const DotKey& k) {
    const Problem p = problem(k);
    const uint64_t T = k.block_rows, P = parts_of(k.precision), G = group_width(k);
    const uint64_t KT = two_panel_slots(k) ? 2 : ceil_div(p.K, k.R);
    const uint64_t a32 = T * k.R * 4, w32 = uint64_t(k.R) * k.C * 4;
    Map m{};
    auto take = [&](uint64_t Map::*field, const char* name, uint64_t bytes) {
        bytes = (bytes + 511) / 512 * 512;
        m.*field = m.end;
        m.areas.push_back({field, name, bytes});
        m.end += bytes;
    };
    m.apanel = T * k.R * 2;
    m.wtile = uint64_t(k.R) * k.C * 2;
    m.cpanel = T * k.C * 4;
    take(&Map::abf, "a_bf16", P * KT * m.apanel);
    if (staged(p.a)) {
        take(&Map::astage, "a_stage", band_lead_apply(k) ? ceil_div(p.K, k.R) * a32 : 2 * a32);
        if (a_trans_ring_applies(k))
            take(&Map::att, "a_trans", 2 * uint64_t(k.R) * k.R * 4);
        else if (p.a == DotLayout::Transposed || p.a == DotLayout::TransposedVpuTiles ||
                 p.a == DotLayout::TransposedTiles)
            take(&Map::att, "a_trans", a32);
        if (pair_windows(k)) {
            // A pair's whole tiles of a window of K < R lanes (DotGen::m_pair): transposed, and
            // the window's rows transposed back to T rows of K values.
            take(&Map::att, "a_trans", a32);
            take(&Map::awin, "a_window", T * p.K * 4);
        }
        if (P > 1) take(&Map::af, "a_f", a32);
        if (P > 1) take(&Map::ar1, "a_r1", a32);
        if (P > 2) take(&Map::ar2, "a_r2", a32);
    }
    if (staged(p.w)) {
        // Band loads: two batches' every tile (one converted, one arriving).
        take(&Map::wstage, "w_stage",
             band_loads_apply(k) ? 2 * G * ceil_div(p.K, k.R) * w32 : 2 * G * w32);
        if (p.w == DotLayout::Transposed || p.w == DotLayout::TransposedTiles ||
            p.w == DotLayout::TransposedVpuTiles)
            take(&Map::wtt, "w_trans", G * w32);
        if (P > 1) take(&Map::wf, "w_f", w32);
        if (P > 1) take(&Map::wr1, "w_r1", w32);
        if (P > 2) take(&Map::wr2, "w_r2", w32);
    }
    take(&Map::wbf, "w_bf16", 2 * G * P * m.wtile);
    // Head-ahead loads: three buffers, so a batch's matmuls wait only for the stores of the
    // batch three before it.
    take(&Map::c, "c", (ahead_apply(k) ? 3 : one_c_buffer_applies(k) ? 1 : 2) * G * m.cpanel);
    // A Column side holds one value per output column; with the LHS stationary the output
    // columns are the streamed rows, read a whole block at a time from the block's first.
    m.col_stride = (uint64_t(p.lhs ? k.N + T : k.N) * 4 + 511) / 512 * 512;
    if (k.column_sides)
        take(&Map::col, "columns", (k.parts > 1 ? 2 : 1) * k.column_sides * m.col_stride);
    if (k.full_sides)
        take(&Map::full, "full_sides",
             uint64_t(k.full_sides) * (side_ring_applies(k) ? 2 : G) * m.cpanel);
    if (p.lhs || k.c == DotLayout::TransposedTiles) take(&Map::tt, "c_trans", G * m.cpanel);
    if (k.store_bf16) take(&Map::bf, "c_bf16", G * T * k.C * 2);
    return m;
}

/// A flag and the register counting the instructions issued on it, several at a time.
struct Tally {
    isa::Flag flag;
    isa::Reg count;
};

/// Most MXUs the kernel drives (one flag each, besides its six others; CoreConfig's maximum).
constexpr uint32_t kDotMaxMxus = 8;

/// Emits the kernel. The numbering of the text kernel it replaced (hints): s4 the block's first
/// row, s7 its rows; s8 a middle group's first column x 4; s9 the pending group's first column
/// (Column sides; the first row with the LHS stationary) x 4; s19 the C parity offset of the
/// current group; s26..s29 the group whose C waits to be stored (HBM address, rows, parity
/// offset, kind: 0 none, 1 a full group, 2 the last group). Flags and the registers counting
/// the work issued to them: f1/f6 (s20/s25) loads into step slot 0/1, f2 (s21) the VPU, f3/f4
/// (s22/s23) the MXUs' steps, f5 (s24) C stores, f7 the Column sides' one-time loads (s5 their
/// address). A flag counts completions, so a wait on it covers all the work issued to it except
/// the most recent `later` items only where the unit finishes in order (VPU, MXU); loads come
/// back out of order from the banked HBM and are waited per slot, in full.
class DotGen {
public:
    DotGen(isa::Builder& b, const DotKey& k, const DotOperands& ops, const Epilogue& ep,
           const Prologue& pro, const DotBatch& batch,
           std::function<void(uint32_t)> rebind = nullptr, const Operand* c_in = nullptr)
        : m_b(b),
          m_k(k),
          m_p(problem(k)),
          m_ep(ep),
          m_pro(pro),
          m_m(vmem_map(k)),
          m_P(parts_of(k.precision)),
          m_KT(ceil_div(m_p.K, k.R)),
          m_NT(ceil_div(m_p.N, k.C)),
          m_GW(group_width(k)),
          m_G(ceil_div(m_NT, m_GW)),
          m_AS(two_panel_slots(k) ? 2 : m_KT),
          m_A(m_p.lhs ? ops.w : ops.a),
          m_W(m_p.lhs ? ops.a : ops.w),
          m_C(ops.c),
          m_cin(c_in ? *c_in : ops.c),
          m_ops(ops),
          m_batch(batch),
          m_rebind(std::move(rebind)) {
        // With the LHS stationary the streamed operand is W^T: pass (A part, W part) becomes
        // (W part, A part), in the same order, so every product and sum is C = A W's.
        for (auto [pa, pw] : mxu_passes(k.precision))
            m_passes.push_back(m_p.lhs ? std::pair{pw, pa} : std::pair{pa, pw});
    }

    void emit() {
        const auto scope = m_b.scope("dot");
        allocate_vmem();
        m_par = m_b.reg("c_parity", 19);
        m_loads[0] = {m_b.flag("loads0", 1), m_b.reg("loads0.count", 20)};
        m_vpu = {m_b.flag("vpu", 2), m_b.reg("vpu.count", 21)};
        if (!batched()) m_vpu2 = m_b.flag("vpu.odd");  // stores(): a batch keeps one wait
        if (staggered_end()) m_half = m_b.flag("mxu.first_panels");
        if (split_start()) m_half0 = m_b.flag("loads.second_half");
        // A flag per MXU. Its steps are counted per MXU up to two MXUs (the text kernel's
        // registers); with more, per class of MXUs that run the same steps: the last group's
        // panels (MXUs 0 .. panels(true) - 1) and the others, so the kernel holds two count
        // registers for any number of MXUs.
        // (One MXU still takes the text kernel's second flag and count, unused.)
        m_per_mxu = m_k.mxus <= 2;
        m_mxu_flag[0] = m_b.flag("mxu0", 3);
        m_mxu_count[0] = m_b.reg("mxu0.count", 22);
        for (uint32_t m = 1; m < std::max<uint32_t>(m_k.mxus, 2); ++m) {
            m_mxu_flag[m] = m_b.flag(fmt::format("mxu{}", m), m == 1 ? 4 : -1);
            if (m_per_mxu || cls(m) != cls(m - 1))
                m_mxu_count[cls(m)] = m_b.reg(fmt::format("mxu{}.count", m), 23);
        }
        m_stores = {m_b.flag("stores", 5), m_b.reg("stores.count", 24)};
        m_loads[1] = {m_b.flag("loads1", 6), m_b.reg("loads1.count", 25)};
        m_pending = m_b.reg("pending", 29);
        std::vector<const isa::Reg*> zero = {&m_par, &m_loads[0].count, &m_vpu.count};
        for (uint32_t m = 0; m < std::max<uint32_t>(m_k.mxus, 2); ++m)
            if (m == 0 || cls(m) != cls(m - 1)) zero.push_back(&mxu_count(m));
        for (const isa::Reg* r : {&m_stores.count, &m_loads[1].count, &m_pending})
            zero.push_back(r);
        for (const isa::Reg* r : zero) E(Opcode::Li, {*r, imm(0)});
        if (m_k.full_sides) {
            m_sides = {m_b.flag("sides"), m_b.reg("sides.count")};
            E(Opcode::Li, {m_sides.count, imm(0)});
        }
        load_columns();
        m_row = m_b.reg("row", 4);
        m_rows = m_b.reg("block_rows", 7);
        if (m_G > 2) m_col = m_b.reg("group_col", 8);
        if (m_k.column_sides) m_pcol = m_b.reg("pending_col", 9);
        if (m_ep.position) m_pos = m_b.smem("dot.position", 1);
        m_tmp = m_b.reg("tmp", 10);
        m_wb = m_b.reg("w_base", 13);
        m_t14 = m_b.reg("tmp14", 14);
        m_t15 = m_b.reg("tmp15", 15);
        m_cnt = m_b.reg("convert_count", 16);
        m_paddr = m_b.reg("pending_addr", 26);
        m_prows = m_b.reg("pending_rows", 27);
        m_ppar = m_b.reg("pending_parity", 28);
        if (m_k.accumulate) m_cat = m_b.reg("c_in");
        m_one = one_c_buffer_applies(m_k);
        m_ring = side_ring_applies(m_k);
        m_atr = a_trans_ring_applies(m_k);
        // The side ring's panels 2 and 3 of the dot's last block in the streamed operand's two
        // staging slots (each a block's R-row panel, a C panel where R = C): one dot of one
        // group a block, one Full side, loaded from step KT - 2 on (not step 0, whose panel the
        // kernel's first step may still be converting in halves).
        m_stage_ok = m_ring && !batched() && m_k.parts == 1 && m_G == 1 && m_k.full_sides == 1 &&
                     m_k.R == m_k.C && staged(m_p.a) && !band_lead_apply(m_k) && m_KT >= 3;
        if (m_stage_ok) {
            m_sides2 = {m_b.flag("sides.staged"), m_b.reg("sides.staged.count")};
            E(Opcode::Li, {m_sides2.count, imm(0)});
        }
        m_pre = m_one;

        // A batch: each member's blocks in turn, in a loop over the passes (DotBatch). A
        // batch's blocks follow the previous batch's as one dot's blocks follow each other.
        if (batched() && ahead_apply(m_k) && m_batch.period.size() % 2 && m_batch.passes % 2 == 0) {
            // Two passes as one of twice the members, so each member's batches are all even or
            // all odd ones (its stores on a flag of its own: m_three).
            const size_t q = m_batch.period.size();
            for (size_t i = 0; i < q; ++i) {
                DotBatch::Member x = m_batch.period[i];
                x.a += m_batch.a;
                x.w += m_batch.w;
                x.c += m_batch.c;
                m_batch.period.push_back(x);
            }
            m_batch.passes /= 2;
            m_batch.a *= 2;
            m_batch.w *= 2;
            m_batch.c *= 2;
        }
        const std::vector<DotBatch::Member>& members = m_batch.period;
        const bool loop = !members.empty() && m_batch.passes > 1;
        isa::Smem pass;
        isa::Arg word;  // the pass number's word
        isa::Label passes;
        if (loop) {
            pass = m_b.smem("dot.pass", 1);
            word = pass.word(0);
            E(Opcode::Sw, {imm(0), word});  // s0 reads as zero
        }
        m_pass_word = word;
        m_band = batched() && band_loads_apply(m_k);
        if (m_band) {
            m_bands = {m_b.flag("bands"), m_b.reg("bands.count")};
            m_bpar = m_b.reg("bands.parity");
            m_nxt = m_b.reg("bands.next");
            E(Opcode::Li, {m_bands.count, imm(0)});
            // The first batch's bands, into buffer 0 (band_chunk fills the other one).
            E(Opcode::Add, {m_nxt, m_W.value, imm(0)});
            E(Opcode::Li, {m_bpar, imm(int64_t(band_buffer()))});
            for (uint32_t j = 0; j < m_KT; ++j) band_chunk(j);
            E(Opcode::Li, {m_bpar, imm(0)});
        }
        m_ahead = batched() && ahead_apply(m_k);
        // Three C buffers in turn, and the stores each member's code issues (the previous
        // batch's) on a flag of the member's parity: before its matmuls a batch then waits for
        // that flag, the stores of the batch three before it, the last reader of the buffer it
        // writes, while the previous batch's stores (the other flag) stay in flight; with two
        // buffers the stores of one batch were issued only once the ones before had completed,
        // and the HBM waited between them. Batches in one group each (ahead_apply), with each
        // member's batches of one parity (an even period, or one pass).
        m_three = m_ahead && (members.size() % 2 == 0 || m_batch.passes == 1);
        if (m_three) {
            m_stores2 = {m_b.flag("stores.odd"), m_b.reg("stores.odd.count")};
            E(Opcode::Li, {m_stores2.count, imm(0)});
        }
        // Two members whose windows lie in the same tiles (heads of 64 lanes at lanes 0 and 64
        // of a [S, heads x 64] projection): the first member's code waits for the pair's
        // tiles, the second's loads the next pair's, each tile read once for both.
        m_step_ahead = batched() && step_ahead_apply(m_k);
        if (m_step_ahead) {
            // The first batch's first step (step_ahead_next loads each next one's).
            first_batch(members[0], [&] { loads(0, true, true, 0, kBoth); });
        }
        m_lead = m_band && band_lead_apply(m_k);
        if (m_lead) {
            // The first batch's first two steps' streamed panels (lead_loads issues the rest).
            first_batch(members[0], [&] {
                loads(0, true, true, 0, kA, 0);
                loads(1, true, true, 1, kA, 1);
            });
        }
        {
            auto streamed = [this](const DotBatch::Member& x) { return m_p.lhs ? x.w : x.a; };
            // (W^T in 8 x 128 tiles is read in whole tiles, whatever its window's lanes.)
            m_lead_pair = m_lead && members.size() == 2 &&
                          streamed(members[0]) == streamed(members[1]) &&
                          m_p.a == DotLayout::TransposedVpuTiles && m_p.a_band_tiles > 0;
        }
        // Such a pair's results side by side in C's rows (heads of 64 at columns h 64 and
        // h 64 + 64 of the row-major [S, heads x 64] output): the second member's MXUs write
        // below the first's in the same C panels, and the pair is stored once, as rows of both
        // (512-byte runs where each head's were 256: the HBM serves the longer runs faster).
        m_c_pair = m_lead_pair && m_p.lhs && m_k.c == DotLayout::RowMajor && !m_k.store_bf16 &&
                   !m_k.column_sides && !m_k.full_sides && !m_k.accumulate && m_k.parts <= 1 &&
                   m_G == 1 && 2 * m_p.M <= m_k.block_rows &&
                   members[1].c - members[0].c == int64_t(m_p.M) * 4;
        m_pair = m_ahead && pair_windows(m_k) && members.size() == 2 &&
                 members[0].a == members[1].a && members[0].w == members[1].w;
        if (m_ahead) {
            // The first batch's operands into slot 0 (ahead_next loads each next one).
            m_sa = m_b.reg("ahead.a");
            m_sw = m_b.reg("ahead.w");
            E(Opcode::Li, {m_sa, imm(0)});
            E(Opcode::Li, {m_sw, imm(0)});
            first_batch(members[0], [&] { loads(0, true, true, 0, kBoth); });
        }
        if (loop) {
            passes = m_b.label("dot_passes");
            m_b.bind(passes);
        }
        if (m_k.parts > 1) {
            // A merged dot's parts: each one's blocks after the previous one's, its Column
            // sides in the other slot (the previous part's last group is flushed during this
            // part's first group).
            for (uint32_t i = 0; i < m_k.parts; ++i) {
                m_part = i;
                if (i > 0) {
                    m_rebind(i);
                    m_col_slot = i % 2;
                    load_columns();
                }
                blocks();
            }
        }
        for (size_t i = 0; i < (m_k.parts > 1 ? 0 : std::max<size_t>(members.size(), 1)); ++i) {
            if (m_ahead || m_step_ahead) {
                // The batch after this one: the next member, or the next pass's first.
                const bool last = i + 1 == members.size();
                const DotBatch::Member& x = members[i];
                const DotBatch::Member& y = last ? members[0] : members[i + 1];
                m_next = y;
                m_next.a = last ? m_batch.a - x.a + y.a : y.a - x.a;
                m_next.w = last ? m_batch.w - x.w + y.w : y.w - x.w;
                m_next_last = last;
                m_next_guard = last && loop;
            }
            if (m_band) {
                // The batch after this one: the next member, or the next pass's first.
                m_next_last = i + 1 == members.size();
                // The held operand is W, or A with the LHS stationary.
                auto held = [this](const DotBatch::Member& x) { return m_p.lhs ? x.a : x.w; };
                m_next_a = !m_next_last ? held(members[i + 1]) - held(members[i])
                                        : (m_p.lhs ? m_batch.a : m_batch.w) - held(members.back()) +
                                              held(members[0]);
                m_next_guard = m_next_last && loop;
                if (m_next_last && !loop) m_next_a = 0;
                const DotBatch::Member& y = m_next_last ? members[0] : members[i + 1];
                m_next.a = !m_next_last ? y.a - members[i].a : m_batch.a - members[i].a + y.a;
                m_next.w = !m_next_last ? y.w - members[i].w : m_batch.w - members[i].w + y.w;
                m_next.a_lane = y.a_lane;
                m_next.w_lane = y.w_lane;
            }
            const bool odd = m_three && i % 2 == 1;
            m_mi = i;
            if (odd) std::swap(m_stores, m_stores2);
            if (!members.empty()) {
                const DotBatch::Member& x = members[i];
                m_p.a_lane = m_p.lhs ? x.w_lane : x.a_lane;
                m_p.w_lane = m_p.lhs ? x.a_lane : x.w_lane;
                if (i > 0)
                    advance(x.a - members[i - 1].a, x.w - members[i - 1].w, x.c - members[i - 1].c);
                m_member = [this, i, loop, word](const isa::Reg& dst) {
                    if (!loop) {
                        E(Opcode::Li, {dst, imm(int64_t(i))});
                        return;
                    }
                    E(Opcode::Lw, {dst, word});
                    E(Opcode::Mul, {dst, dst, imm(int64_t(m_batch.period.size()))});
                    E(Opcode::Add, {dst, dst, imm(int64_t(i))});
                };
            }
            blocks();
            if (odd) std::swap(m_stores, m_stores2);
        }
        if (loop) {
            advance(m_batch.a - members.back().a + members[0].a,
                    m_batch.w - members.back().w + members[0].w,
                    m_batch.c - members.back().c + members[0].c);
            E(Opcode::Lw, {m_tmp, word});
            E(Opcode::Add, {m_tmp, m_tmp, imm(1)});
            E(Opcode::Sw, {m_tmp, word});
            E(Opcode::Bltu, {m_tmp, imm(int64_t(m_batch.passes)), passes});
        }
        m_mi = 0;       // past the members: the last group (m_c_pair: the last pair) is stored
        m_pre = false;  // no group follows the last one: its flush transposes C's panels itself
        m_staged = m_stage_ok;  // ... and its panels 2 and 3's side tiles are staged
        if (staggered_end()) {
            // The last group's first panel of an MXU that runs another one after it is done a
            // matmul earlier: its epilogue and stores go out while the MXUs finish the others
            // (m_half counts those matmuls, first_piece() in each execution of the last
            // group's last step).
            const uint64_t runs = uint64_t(ceil_div(m_p.M, m_k.block_rows)) * m_k.parts;
            E(Opcode::Wait, {m_half, imm(int64_t(runs * first_piece()))});
            stores(true, 0, first_piece());
            for (uint32_t m = 0; m < m_k.mxus; ++m) wait_mxu(m, 0);
            stores(true, first_piece());
            E(Opcode::Li, {m_pending, imm(0)});
        } else {
            flush("end", 0, 0);
        }
        E(Opcode::Wait, {m_stores.flag, m_stores.count});
        if (m_three) E(Opcode::Wait, {m_stores2.flag, m_stores2.count});
    }

private:
    /// Every block of one dot (a batch's), each its column groups.
    void blocks() {
        const uint32_t T = m_k.block_rows;
        E(Opcode::Li, {m_row, imm(0)});
        const isa::Label block = m_b.label("block"), rows_ok = m_b.label("rows_ok");
        m_b.bind(block);
        E(Opcode::Sub, {m_rows, imm(m_p.M), m_row});
        E(Opcode::Bltu, {m_rows, imm(T + 1), rows_ok});
        E(Opcode::Li, {m_rows, imm(T)});
        m_b.bind(rows_ok);
        if (m_band) band_next();
        if (m_G == 1) {
            group(true, true);
        } else {
            group(true, false);
            if (m_G > 2) {
                const int64_t step = int64_t(m_GW) * m_k.C * 4;
                E(Opcode::Li, {m_col, imm(step)});
                const isa::Label mid = m_b.label("mid");
                m_b.bind(mid);
                group(false, false);
                E(Opcode::Add, {m_col, m_col, imm(step)});
                E(Opcode::Bltu, {m_col, imm((m_G - 1) * step), mid});
            }
            group(false, true);
        }
        if (m_band) E(Opcode::Xor, {m_bpar, m_bpar, imm(int64_t(band_buffer()))});
        E(Opcode::Add, {m_row, m_row, m_rows});
        E(Opcode::Bltu, {m_row, imm(m_p.M), block});
    }

    /// Moves the operands' registers on by these bytes (the next batch's matrices).
    void advance(int64_t a, int64_t w, int64_t c) {
        for (const auto& [o, by] : {std::pair{&m_ops.a, a}, {&m_ops.w, w}, {&m_ops.c, c}})
            if (by) E(Opcode::Add, {isa::s(o->value.reg), isa::s(o->value.reg), imm(by)});
    }

    // Band loads (DotKey::band_loads): a batch's held tiles (W^T in 8 x 128 tiles: P's, a band
    // of 8 of its rows one contiguous run of the K steps' tiles) are read a batch ahead, 1 / KT
    // of them after each K step's matmuls, into two buffers of a batch's tiles, [m][j][n x 128]
    // (tile (j, m) as a step's load would have staged it).
    /// Bytes of one staged tile, of a batch's buffer.
    uint64_t band_tile() const { return uint64_t(m_k.R) * m_k.C * 4; }
    uint64_t band_buffer() const { return uint64_t(m_NT) * m_KT * band_tile(); }
    /// Offset of tile (j, panel m) in a buffer.
    uint64_t band_at(uint32_t j, uint32_t m) const {
        return (uint64_t(m) * m_KT + j) * band_tile();
    }

    /// bands.next = the HBM address of the next batch's held operand, 0 for none (a batch
    /// is one block: band_loads_apply).
    void band_next() {
        const isa::Label done = m_b.label("bands_next");
        if (m_next_guard) {
            const isa::Label more = m_b.label("bands_more");
            E(Opcode::Lw, {m_tmp, m_pass_word});
            E(Opcode::Add, {m_tmp, m_tmp, imm(1)});
            E(Opcode::Bltu, {m_tmp, imm(int64_t(m_batch.passes)), more});
            E(Opcode::Li, {m_nxt, imm(0)});
            E(Opcode::Jmp, {done});
            m_b.bind(more);
        }
        if (m_next_last && !m_next_guard)
            E(Opcode::Li, {m_nxt, imm(0)});
        else
            E(Opcode::Add, {m_nxt, m_W.value, imm(m_next_a)});
        m_b.bind(done);
    }

    /// Chunk j of the next batch's held tiles (at bands.next; none when 0) into the buffer the
    /// current batch does not use: tiles [j, j + 1) x NT of the batch's KT x NT in panel-major
    /// order, each one DMA of the panel's bands (one 4 KiB run each). A panel's K steps follow
    /// each other, so every band's four tiles (one contiguous 16 KiB) are read within a few
    /// hundred cycles, while the HBM rows they share are still open; and each tile has an area
    /// of its own, so no DMA waits on another's (the engine's WAW hazard by bounding box).
    void band_chunk(uint32_t j) {
        // With the streamed panels two steps ahead (m_lead), over the first KT - 1 steps: the
        // last chunk then goes out a step before the batch's last matmuls and has arrived when
        // the next batch starts (after the last step, the next batch waited for it).
        const uint32_t tiles = m_NT * m_KT, chunks = m_lead ? m_KT - 1 : m_KT;
        const uint32_t t0 = std::min(j, chunks) * tiles / chunks;
        const uint32_t t1 = std::min(j + 1, chunks) * tiles / chunks;
        if (t0 == t1) return;
        const isa::Label skip = m_b.label("bands_none");
        E(Opcode::Beq, {m_nxt, imm(0), skip});
        E(Opcode::Xor, {m_t15, m_bpar, imm(int64_t(band_buffer()))});
        const uint64_t band = uint64_t(m_KT) * kBandBytes;  // W^T's rows: K / 128 tiles a band
        const uint32_t bands = m_k.C / 8;                   // a panel's
        for (uint32_t t = t0; t < t1; ++t) {
            const uint32_t m = t / m_KT, s = t % m_KT;
            E(Opcode::DmaHv,
              {m_t15 + int64_t(m_a.wstage + band_at(s, m)),
               m_nxt + int64_t(uint64_t(m) * bands * band + s * kBandBytes), imm(bands),
               imm(kBandBytes), imm(kBandBytes), imm(int64_t(band)), m_bands.flag});
        }
        E(Opcode::Add, {m_bands.count, m_bands.count, imm(int64_t(t1 - t0))});
        m_b.bind(skip);
    }

    /// Bytes from one staging slot to the other: of the streamed operand's, of the held one's.
    int64_t slot_a() const { return int64_t(m_k.block_rows) * m_k.R * 4; }
    int64_t slot_w() const { return int64_t(m_GW) * m_k.R * m_k.C * 4; }

    /// Emits `load` for the first batch, `first`: block row 0, the operands' lanes of `first`.
    template <class Load>
    void first_batch(const DotBatch::Member& first, Load&& load) {
        E(Opcode::Li, {m_row, imm(0)});
        E(Opcode::Li, {m_rows, imm(int64_t(std::min(m_p.M, m_k.block_rows)))});
        const Problem keep = m_p;
        m_p.a_lane = m_p.lhs ? first.w_lane : first.a_lane;
        m_p.w_lane = m_p.lhs ? first.a_lane : first.w_lane;
        load();
        m_p = keep;
    }

    /// Emits `load` for the next batch (the next member's, or the next pass's first while passes
    /// remain; nothing after the last batch): the pass guard, the operands' addresses and lanes
    /// moved to the next batch's for it and back after. With `swap_slots` the staging slots
    /// too (head-ahead loads go to the slot this batch does not use).
    template <class Load>
    void next_batch(const std::string& name, bool swap_slots, Load&& load) {
        if (m_next_last && !m_next_guard) return;  // one pass: the last member has no next
        const isa::Label skip = m_b.label(name + "_none");
        if (m_next_guard) {
            const isa::Label more = m_b.label(name + "_more");
            E(Opcode::Lw, {m_tmp, m_pass_word});
            E(Opcode::Add, {m_tmp, m_tmp, imm(1)});
            E(Opcode::Bltu, {m_tmp, imm(int64_t(m_batch.passes)), more});
            E(Opcode::Jmp, {skip});
            m_b.bind(more);
        }
        const auto swap = [&] {
            E(Opcode::Xor, {m_sa, m_sa, imm(slot_a())});
            E(Opcode::Xor, {m_sw, m_sw, imm(slot_w())});
        };
        if (swap_slots) swap();
        advance(m_next.a, m_next.w, 0);
        const Problem keep = m_p;
        m_p.a_lane = m_p.lhs ? m_next.w_lane : m_next.a_lane;
        m_p.w_lane = m_p.lhs ? m_next.a_lane : m_next.w_lane;
        load();
        m_p = keep;
        advance(-m_next.a, -m_next.w, 0);
        if (swap_slots) swap();
        m_b.bind(skip);
    }

    /// Head-ahead loads (ahead_apply): the next batch's operands (the next member's, or the next
    /// pass's first while passes remain; none after the last batch) into the staging slot this
    /// batch does not use, issued once this batch's own have arrived and before the previous
    /// batch's results are stored, so the DMA engine reads them while this batch converts and
    /// computes and the HBM never waits for a batch's loads between two batches' stores.
    void ahead_next() {
        if (m_pair && m_mi == 0) return;  // the pair's second member loads the next
        next_batch("ahead", true, [&] { loads(0, true, true, 0, kBoth); });
    }
    /// The next batch's first step's operands into slot 0 (step_ahead_apply), beside this
    /// batch's last step; none after the last batch.
    void step_ahead_next() {
        next_batch("step_ahead", false, [&] { loads(0, true, true, 0, kBoth); });
    }

    /// With head-ahead loads, the held W^T an array of its own in 8 x 128 tiles narrower than a
    /// tile (PyTorchSim's k of [heads, S, 64]): a panel's n rows are 512 bytes apart, and only
    /// their k values are read (half the tiles' bytes).
    bool narrow_held() const { return m_ahead && !m_p.w_band_tiles && !m_p.w_lane && m_p.K < 128; }

    /// m_lead: after step j's loads, the streamed panel of step j + 2 (of this
    /// batch, or the next batch's step j + 2 - KT; none after the last batch) into its area, on
    /// step j's flag (its parity).
    void lead_loads(uint32_t j, bool first, bool last) {
        const uint32_t t = j + 2;
        // A pair whose streamed windows share their tiles (m_lead_pair): the first member's
        // code loads the pair's panels, the second's the next pair's.
        if (m_lead_pair && (m_mi == 0) == (t >= m_KT)) return;
        if (t < m_KT) {
            loads(t, first, last, int(t % 2), kA, int(t));
            return;
        }
        next_batch("lead", false, [&] {
            loads(t - m_KT, true, true, int((t - m_KT) % 2), kA, int(t - m_KT));
        });
    }

    /// A staging address of the streamed (`a`) or the held operand: the slot's in a register
    /// with head-ahead loads.
    isa::Arg staged_at(bool a, uint64_t addr) const {
        if (!m_ahead) return imm(int64_t(addr));
        return (a ? m_sa : m_sw) + int64_t(addr);
    }

    void E(Opcode op, std::initializer_list<isa::Arg> args) { m_b.emit(op, args); }
    /// A VPU instruction counted on f2.
    void vpu(Opcode op, std::initializer_list<isa::Arg> args) {
        std::vector<isa::Arg> all(args);
        all.push_back(m_vpu.flag);
        m_b.emit(op, all);
        E(Opcode::Add, {m_vpu.count, m_vpu.count, imm(1)});
    }
    /// The DMA that moves operand `o` into VMEM, or C out of it.
    static Opcode load_op(const Operand& o) {
        return o.kind == Operand::Kind::Vmem ? Opcode::DmaVv : Opcode::DmaHv;
    }
    static Opcode store_op(const Operand& o) {
        return o.kind == Operand::Kind::Vmem ? Opcode::DmaVv : Opcode::DmaVh;
    }

    /// Each area of the map from b's pool, in the map's order (at the map's offsets in a
    /// program of its own).
    void allocate_vmem() {
        m_a = m_m;
        for (const Map::Area& area : m_m.areas) {
            m_vmem.push_back(m_b.vmem(area.name, area.bytes, 512));
            m_a.*area.field = m_vmem.back().addr();
        }
    }

    /// Bytes from the Column sides' area to the current part's slot (emit_dot_parts).
    uint64_t col_slot_bytes() const {
        return uint64_t(m_col_slot) * m_k.column_sides * m_m.col_stride;
    }

    /// The Column sides, loaded once into VMEM (they stay for every block; a part's into its
    /// slot at its start).
    void load_columns() {
        if (!m_k.column_sides) return;
        isa::CountedFlag once(m_b, "columns", isa::Count::AtBuild, 7);
        std::vector<isa::Reg> addrs;
        const int64_t bytes = int64_t(m_k.N) * 4;
        uint32_t i = 0;
        for (const EpilogueSide& s : m_ep.sides) {
            if (s.kind != EpilogueSide::Kind::Column) continue;
            const isa::Arg dst = imm(int64_t(m_a.col + col_slot_bytes() + i * m_m.col_stride));
            if (s.place.kind == Operand::Kind::Hbm) {
                // The address goes into a register of the kernel's first: a stand-alone caller
                // may hand the argument's register back for the kernel's row counter (s4).
                addrs.push_back(
                    m_b.reg(fmt::format("column{}.addr", i), i == 0 && !m_col_slot ? 5 : 0));
                E(Opcode::Add, {addrs.back(), s.place.value, imm(0)});
                once.issue(Opcode::DmaHv,
                           {dst, addrs.back(), imm(1), imm(bytes), imm(bytes), imm(bytes)});
            } else {
                once.issue(Opcode::DmaVv,
                           {dst, s.place.value, imm(1), imm(bytes), imm(bytes), imm(bytes)});
            }
            ++i;
        }
        once.wait_all();
    }

    /// The last group's panels stored in two pieces at the kernel's end (a 2-D dot whose last
    /// group has a second panel on some MXU): the first panel of each such MXU as soon as its
    /// last matmul is done, the rest after the others.
    bool staggered_end() const { return !batched() && panels(true) > m_k.mxus; }
    /// The kernel's first step runs in two halves of its streamed panel (first_step_in_halves):
    /// a single bf16 dot (or merged dot) streaming an fp32 operand from its MXU tiles (a weight)
    /// past staged held tiles, at least two tiles of streamed rows in the first block and a
    /// second K step, no prologue.
    bool split_start() const {
        return !batched() && m_P == 1 && m_p.a == DotLayout::TransposedTiles && staged(m_p.w) &&
               m_A.kind == Operand::Kind::Hbm && !m_pro.streamed && !m_pro.held &&
               !m_k.accumulate && m_KT >= 2 && m_p.K >= m_k.R && m_k.R == m_k.C &&
               std::min(m_p.M, m_k.block_rows) >= 2 * m_k.R;
    }
    /// The panels of the staggered end's first piece: those whose MXU runs another panel of the
    /// last group after them (0 .. min(mxus, panels - mxus) - 1).
    uint32_t first_piece() const { return std::min(m_k.mxus, panels(true) - m_k.mxus); }
    /// MXU m's count class: itself (per MXU), else 0 for the last group's MXUs, 1 for the
    /// others.
    uint32_t cls(uint32_t m) const { return m_per_mxu ? m : (m < mxus_of(panels(true)) ? 0 : 1); }
    /// MXUs that `np` panels of a group use (panel p on MXU p % mxus).
    uint32_t mxus_of(uint32_t np) const { return std::min(np, m_k.mxus); }
    const isa::Reg& mxu_count(uint32_t m) const { return m_mxu_count[cls(m)]; }

    /// Waits until MXU m has finished all its steps but the `later` most recent.
    void wait_mxu(uint32_t m, uint32_t later) {
        if (!later) {
            E(Opcode::Wait, {m_mxu_flag[m], mxu_count(m)});
            return;
        }
        const isa::Label skip = m_b.label("wm");
        E(Opcode::Sub, {m_tmp, mxu_count(m), imm(later)});
        E(Opcode::Blt, {m_tmp, imm(1), skip});
        E(Opcode::Wait, {m_mxu_flag[m], m_tmp});
        m_b.bind(skip);
    }

    /// 8 x 128 tiles in a band of `cols` values (an MXU tile of R x C spans R / 8 bands of
    /// C / 128 of them: a 256 x 256 array reads each band's two tiles of a panel piecewise).
    static uint64_t vtiles(uint64_t cols) { return (cols + 127) / 128; }
    /// Tiles per band of a held W^T in 8 x 128 tiles (ceil(K / 128), or a window's array's).
    uint64_t wbt() const { return m_p.w_band_tiles ? m_p.w_band_tiles : vtiles(m_p.K); }
    /// Moves `cols` (a multiple of 128) columns of `bands` bands of 8 x 128 tiles between HBM
    /// (`hbm`: the first band's first tile, bands `band` bytes apart, a band's tiles side by
    /// side) and rows of `row` bytes in VMEM (`vm`): a VMEM row of an array wider than 128
    /// values is pieces of several tiles. One DMA per band and tile (one 4 KiB run of HBM, 8 rows
    /// of 512 bytes in VMEM), tile column by tile column: a DMA's VMEM rows (its bounding box)
    /// overlap those of the band's other tiles, so the engine would hold each behind the one
    /// before it (its WAW hazard) if they followed each other. Counts on `t` itself; returns 0.
    uint32_t tile_columns(Opcode op, bool load, isa::Arg vm, isa::Arg hbm, isa::Arg bands,
                          uint64_t row, uint64_t band, uint32_t cols, const Tally& t) {
        const isa::Reg h = m_b.reg("columns.hbm"), v = m_b.reg("columns.vmem"),
                       end = m_b.reg("columns.end");
        for (uint32_t c = 0; c < cols / 128; ++c) {
            E(Opcode::Add, {h, hbm, imm(int64_t(c * kBandBytes))});
            E(Opcode::Add, {v, vm, imm(int64_t(c * 512))});
            E(Opcode::Mul, {end, bands, imm(int64_t(8 * row))});
            E(Opcode::Add, {end, end, v});
            const isa::Label loop = m_b.label("tile_column");
            m_b.bind(loop);
            if (load)
                E(op, {v, h, imm(8), imm(512), imm(int64_t(row)), imm(512), t.flag});
            else
                E(op, {h, v, imm(8), imm(512), imm(512), imm(int64_t(row)), t.flag});
            E(Opcode::Add, {h, h, imm(int64_t(band))});
            E(Opcode::Add, {v, v, imm(int64_t(8 * row))});
            E(Opcode::Bltu, {v, end, loop});
            E(Opcode::Add, {t.count, t.count, bands});
        }
        return 0;
    }

    uint32_t kk(uint32_t j) const { return std::min(m_k.R, m_p.K - j * m_k.R); }
    /// Columns of panel m of the group (the last panel of C may be narrow).
    uint32_t nn(bool last, uint32_t m) const {
        const uint32_t panel = (m_G - 1) * m_GW + m;
        return last && panel == m_NT - 1 ? m_p.N - panel * m_k.C : m_k.C;
    }
    uint32_t panels(bool last) const { return last ? m_NT - (m_G - 1) * m_GW : m_GW; }
    uint64_t wbf(int slot, uint32_t m, int q) const {
        return m_a.wbf + ((uint64_t(slot) * m_GW + m) * m_P + q) * m_m.wtile;
    }
    /// Bytes from one k x 128 tile column of a staged A^T in 8 x 128 tiles to the next.
    static uint64_t asub(uint32_t k) { return uint64_t(ceil_div(k, 8)) * kBandBytes; }
    /// Bytes from one n x 128 piece of a staged W^T in 8 x 128 tiles to the next.
    static uint64_t wsub(uint32_t n) { return uint64_t(ceil_div(n, 8)) * kBandBytes; }
    uint64_t wstage(int slot, uint32_t m) const {
        return m_a.wstage + (uint64_t(slot) * m_GW + m) * m_k.R * m_k.C * 4;
    }
    uint64_t abf(int q, uint32_t j) const {
        return m_a.abf + (uint64_t(q) * m_AS + j % m_AS) * m_m.apanel;
    }
    /// First column of the group (a middle group's is group_col / 4).
    uint64_t first_col(bool first) const { return first ? 0 : uint64_t(m_G - 1) * m_GW * m_k.C; }

    /// w_base = the HBM address of the stationary operand's column n0 of the group.
    void w_base(bool first, bool last) {
        uint64_t per_col = 4;  // bytes from one column to the next
        switch (m_p.w) {
            case DotLayout::RowMajor:
                break;
            case DotLayout::Transposed:
                per_col = uint64_t(m_p.K) * 4;
                break;
            case DotLayout::Tiles:
                per_col = uint64_t(m_k.R) * 4;  // n0 / C tiles of R C 4 bytes
                break;
            case DotLayout::Gemm:
                per_col = uint64_t(m_k.R) * 2;
                break;
            case DotLayout::VpuTiles:
                per_col = kBandBytes / 128;  // n0 / 128 tiles of 4 KiB
                break;
            case DotLayout::TransposedVpuTiles:
                per_col = wbt() * kBandBytes / 8;  // n0 / 8 bands of KT tiles
                break;
            case DotLayout::TransposedTiles:
                per_col = uint64_t(m_KT) * m_k.C * 4;  // n0 / C rows of KT tiles
                break;
        }
        if (first || last) {
            E(Opcode::Add, {m_wb, m_W.value, imm(int64_t(first_col(first) * per_col))});
        } else {
            E(Opcode::Mul, {m_wb, m_col, imm(int64_t(per_col / 4))});
            E(Opcode::Add, {m_wb, m_wb, m_W.value});
        }
    }

    enum Part { kA = 1, kW = 2, kBoth = 3 };
    /// Loads of step j into `slot`: in a block's first group A's panel j (`what` & kA), the
    /// group's weight tiles (`what` & kW). fp32 operands go to the staging areas; bf16 parts
    /// straight to where the MXUs read them.
    void loads(uint32_t j, bool first, bool last, int slot, int what, int area = -1) {
        const Tally& t = m_loads[slot];
        const int aslot = area >= 0 ? area : slot;  // the streamed operand's staging area
        const uint32_t k = kk(j), R = m_k.R, C = m_k.C;
        const uint64_t M = m_p.M, K = m_p.K, N = m_p.N;
        int count = 0;
        if (first && (what & kA)) {
            const Opcode op = load_op(m_A);
            if (m_p.a == DotLayout::Transposed) {
                // A^T: rows j R .. of the stored K x M, the block's columns; v.trans turns them.
                const uint64_t at = m_a.astage + uint64_t(aslot) * m_k.block_rows * R * 4;
                E(Opcode::Mul, {m_t14, m_row, imm(4)});
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                E(Opcode::Mul, {m_t15, m_rows, imm(4)});
                E(op, {imm(int64_t(at)), m_t14 + int64_t(j * R * M * 4), imm(k), m_t15, m_t15,
                       imm(int64_t(M * 4)), t.flag});
                ++count;
            } else if (m_p.a == DotLayout::TransposedVpuTiles) {
                // A^T (K x M) in tiles, blocks of whole tile columns: each of the block's columns
                // of tiles in the ceil(k / 8) bands of step j, MT tiles apart, lands as k x 128
                // row-major (a column past a short last block's rows is not read).
                const uint64_t at = m_a.astage + uint64_t(aslot) * m_k.block_rows * R * 4;
                const uint64_t MT = m_p.a_band_tiles ? m_p.a_band_tiles : ceil_div(m_p.M, 128);
                E(Opcode::Mul, {m_t14, m_row, imm(kBandBytes / 128)});
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                E(op, {imm(int64_t(at)), m_t14 + int64_t(uint64_t(j) * R / 8 * MT * kBandBytes),
                       imm(ceil_div(k, 8)), imm(kBandBytes), imm(kBandBytes),
                       imm(int64_t(MT * kBandBytes)), t.flag});
                ++count;
                for (uint32_t c = 1; c < m_k.block_rows / 128; ++c) {
                    const isa::Label skip = m_b.label("a_column");
                    E(Opcode::Bltu, {m_rows, imm(128 * c + 1), skip});
                    E(op, {imm(int64_t(at + c * asub(k))),
                           m_t14 + int64_t((uint64_t(j) * R / 8 * MT + c) * kBandBytes),
                           imm(ceil_div(k, 8)), imm(kBandBytes), imm(kBandBytes),
                           imm(int64_t(MT * kBandBytes)), t.flag});
                    E(Opcode::Add, {t.count, t.count, imm(1)});
                    m_b.bind(skip);
                }
            } else if (m_p.a == DotLayout::VpuTiles) {
                // Panel j of the block's bands: R / 128 tiles of 4 KiB per 8 rows, a band of
                // ceil(K / 128) tiles apart; in VMEM they are the block's rows of R values, as a
                // row-major panel's.
                const uint64_t at = m_a.astage + uint64_t(aslot) * m_k.block_rows * R * 4;
                const uint64_t band_tiles = m_p.a_band_tiles ? m_p.a_band_tiles : vtiles(K);
                const uint64_t tile0 = uint64_t(j) * (R / 128);  // panel j's first tile in a band
                E(Opcode::Mul, {m_t14, m_row, imm(int64_t(band_tiles * 512))});
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                if (k < R) {
                    // K padded: the last step's k lanes of each band's tiles, one DMA per band
                    // and tile, compacted to rows of k values (a short last band brings padding
                    // rows); a loop over the bands per tile (tile_columns: a band's tiles write
                    // interleaved rows).
                    if (m_pair) {
                        // A pair's windows: their bands' whole tiles, one DMA, M rows of 128
                        // values (group(): the window's lanes picked out in VMEM).
                        E(Opcode::Add, {m_t14, m_t14, imm(int64_t(tile0 * kBandBytes))});
                        E(op, {staged_at(true, at), m_t14, imm(ceil_div(m_p.M, 8)), imm(kBandBytes),
                               imm(kBandBytes), imm(int64_t(band_tiles * kBandBytes)), t.flag});
                        ++count;
                    } else if (m_ahead && band_tiles == 1 && vtiles(k) == 1) {
                        // An array of its own, one tile a band: its rows are 512 bytes apart,
                        // one DMA (the band by band loop's 8-row DMAs each take the sequencer
                        // longer to issue than the DMA engine to send).
                        E(Opcode::Add, {m_t14, m_t14, imm(int64_t(tile0 * kBandBytes))});
                        E(op, {staged_at(true, at), m_t14, imm(ceil_div(m_p.M, 8) * 8), imm(k * 4),
                               imm(k * 4), imm(512), t.flag});
                        ++count;
                    }
                    for (uint32_t s = 0;
                         s <
                         (m_pair || (m_ahead && band_tiles == 1 && vtiles(k) == 1) ? 0 : vtiles(k));
                         ++s) {
                        const isa::Label band = m_b.label("a_band");
                        if (s > 0) {
                            E(Opcode::Mul, {m_t14, m_row, imm(int64_t(band_tiles * 512))});
                            E(Opcode::Add, {m_t14, m_t14, m_A.value});
                        }
                        E(Opcode::Add,
                          {m_t14, m_t14, imm(int64_t((tile0 + s) * kBandBytes + m_p.a_lane * 4))});
                        if (m_ahead)
                            E(Opcode::Add, {m_t15, m_sa, imm(int64_t(at + s * 512))});
                        else
                            E(Opcode::Li, {m_t15, imm(int64_t(at + s * 512))});
                        E(Opcode::Mul, {m_tmp, m_rows, imm(k * 4)});
                        E(Opcode::Add, {m_tmp, m_tmp, m_t15});
                        m_b.bind(band);
                        E(op, {m_t15, m_t14, imm(8), imm(std::min(k - s * 128, 128u) * 4),
                               imm(k * 4), imm(512), t.flag});
                        E(Opcode::Add, {t.count, t.count, imm(1)});
                        E(Opcode::Add, {m_t14, m_t14, imm(int64_t(band_tiles * kBandBytes))});
                        E(Opcode::Add, {m_t15, m_t15, imm(8 * k * 4)});
                        E(Opcode::Bltu, {m_t15, m_tmp, band});
                    }
                } else {
                    // Rows not a multiple of 8: the last band's padding rows come along.
                    if (m_p.M % 8) {
                        E(Opcode::Add, {m_t15, m_rows, imm(7)});
                        E(Opcode::Shr, {m_t15, m_t15, imm(3)});
                    } else {
                        E(Opcode::Shr, {m_t15, m_rows, imm(3)});
                    }
                    // Bands are a window's array's band_tiles apart (a head of 128 lanes).
                    if (R == 128) {
                        E(op, {staged_at(true, at), m_t14 + int64_t(tile0 * kBandBytes), m_t15,
                               imm(kBandBytes), imm(kBandBytes),
                               imm(int64_t(band_tiles * kBandBytes)), t.flag});
                        ++count;
                    } else {
                        count += tile_columns(op, true, imm(int64_t(at)),
                                              m_t14 + int64_t(tile0 * kBandBytes), m_t15,
                                              uint64_t(R) * 4, band_tiles * kBandBytes, R, t);
                    }
                }
            } else if (m_p.a == DotLayout::Tiles) {
                // The streamed operand in the MXU's R x R tiles (a streamed weight lies in
                // them, issue #29): panel j of the block is one R x R tile per R rows, KT
                // tiles apart, each one contiguous run that lands as R rows of the panel.
                // Whole contiguous tiles keep the banked HBM near its streaming rate, where
                // an 8 x 128 tile column is runs of 4 KiB that open a row each.
                const uint64_t at = m_a.astage + uint64_t(aslot) * m_k.block_rows * R * 4;
                const uint64_t tile = uint64_t(R) * R * 4;
                E(Opcode::Mul, {m_t14, m_row, imm(int64_t(uint64_t(m_KT) * R * 4))});
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                // A short last block's last tile brings its padding rows along.
                E(Opcode::Add, {m_t15, m_rows, imm(R - 1)});
                E(Opcode::Shr, {m_t15, m_t15, imm(std::countr_zero(R))});
                E(op, {imm(int64_t(at)), m_t14 + int64_t(uint64_t(j) * tile), m_t15,
                       imm(int64_t(tile)), imm(int64_t(tile)), imm(int64_t(m_KT * tile)), t.flag});
                ++count;
            } else if (m_p.a == DotLayout::TransposedTiles) {
                // Stored transposed in the MXU's R x R tiles (a weight in the layout the RHS
                // stationary holds it in): panel j of the block is the block's tiles of tile
                // row j, side by side, one contiguous run; each is transposed in VMEM.
                const uint64_t at = m_a.astage + uint64_t(aslot) * m_k.block_rows * R * 4;
                const uint64_t tile = uint64_t(R) * R * 4;
                E(Opcode::Mul, {m_t14, m_row, imm(int64_t(R) * 4)});  // row / R tiles
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                E(Opcode::Add, {m_t15, m_rows, imm(R - 1)});
                E(Opcode::Shr, {m_t15, m_t15, imm(std::countr_zero(R))});
                E(op, {imm(int64_t(at)), m_t14 + int64_t(uint64_t(j) * ceil_div(m_p.M, R) * tile),
                       m_t15, imm(int64_t(tile)), imm(int64_t(tile)), imm(int64_t(tile)), t.flag});
                ++count;
            } else if (m_p.a == DotLayout::RowMajor) {
                const uint64_t at = m_a.astage + uint64_t(aslot) * m_k.block_rows * R * 4;
                E(Opcode::Mul, {m_t14, m_row, imm(int64_t(K * 4))});
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                E(op, {imm(int64_t(at)), m_t14 + int64_t(j * R * 4), m_rows, imm(k * 4), imm(k * 4),
                       imm(int64_t(K * 4)), t.flag});
                ++count;
            } else {
                // The GEMM's A panels: panel j's block rows, each part P straight into place.
                const uint64_t kp = uint64_t(m_KT) * R;
                E(Opcode::Mul, {m_t14, m_row, imm(R * 2)});
                E(Opcode::Add, {m_t14, m_t14, m_A.value});
                for (int q = 0; q < m_P; ++q) {
                    E(op, {imm(int64_t(abf(q, j))),
                           m_t14 + int64_t(q * M * kp * 2 + uint64_t(j) * M * R * 2), m_rows,
                           imm(k * 2), imm(k * 2), imm(R * 2), t.flag});
                    ++count;
                }
            }
        }
        if ((what & kW) && !m_band) {
            const Opcode op = load_op(m_W);
            w_base(first, last);
            const uint64_t NT = m_NT, np = NT * C;
            for (uint32_t m = 0; m < panels(last); ++m) {
                const uint32_t n = nn(last, m);
                const uint64_t tile = uint64_t(j) * NT + m;  // tile (j, n0 / C + m) less n0 / C
                switch (m_p.w) {
                    case DotLayout::Transposed:
                        E(op, {imm(int64_t(wstage(slot, m))),
                               m_wb + int64_t(uint64_t(m) * C * K * 4 + uint64_t(j) * R * 4),
                               imm(n), imm(k * 4), imm(k * 4), imm(int64_t(K * 4)), t.flag});
                        ++count;
                        break;
                    case DotLayout::RowMajor:
                        E(op, {imm(int64_t(wstage(slot, m))),
                               m_wb + int64_t(uint64_t(j) * R * N * 4 + uint64_t(m) * C * 4),
                               imm(k), imm(n * 4), imm(n * 4), imm(int64_t(N * 4)), t.flag});
                        ++count;
                        break;
                    case DotLayout::Tiles:
                        E(op, {imm(int64_t(wstage(slot, m))), m_wb + int64_t(tile * R * C * 4),
                               imm(k), imm(n * 4), imm(n * 4), imm(C * 4), t.flag});
                        ++count;
                        break;
                    case DotLayout::Gemm:
                        for (int q = 0; q < m_P; ++q) {
                            E(op,
                              {imm(int64_t(wbf(slot, m, q))),
                               m_wb + int64_t(q * uint64_t(m_KT) * R * np * 2 + tile * R * C * 2),
                               imm(k), imm(n * 2), imm(n * 2), imm(C * 2), t.flag});
                            ++count;
                        }
                        break;
                    case DotLayout::VpuTiles: {
                        // Tile (j, n0 / C + m): ceil(k / 8) bands of 4 KiB, a band row of NT
                        // tiles apart, landing as the k x C row-major tile; a narrow last
                        // panel (N padded) one DMA per band, compacted to rows of n values.
                        // Bands are a window's array's band_tiles apart (a head of 128 lanes).
                        // (A C-wide panel is C / 128 tiles of each band.)
                        const uint64_t bt = m_p.w_band_tiles ? m_p.w_band_tiles : vtiles(N);
                        const uint64_t tm = uint64_t(m) * (C / 128);  // the panel's first tile
                        if (n == 128) {
                            E(op, {imm(int64_t(wstage(slot, m))),
                                   m_wb + int64_t((uint64_t(j) * R / 8 * bt + tm) * kBandBytes),
                                   imm(ceil_div(k, 8)), imm(kBandBytes), imm(kBandBytes),
                                   imm(int64_t(bt * kBandBytes)), t.flag});
                            ++count;
                            break;
                        }
                        if (n % 128 == 0) {
                            count += tile_columns(
                                op, true, imm(int64_t(wstage(slot, m))),
                                m_wb + int64_t((uint64_t(j) * R / 8 * bt + tm) * kBandBytes),
                                imm(ceil_div(k, 8)), uint64_t(n) * 4, bt * kBandBytes, n, t);
                            break;
                        }
                        // Tile by tile, each over the bands (tile_columns).
                        for (uint32_t s = 0; s < vtiles(n); ++s)
                            for (uint32_t band = 0; band < ceil_div(k, 8); ++band) {
                                E(op, {imm(int64_t(wstage(slot, m) + uint64_t(band) * 8 * n * 4 +
                                                   s * 512)),
                                       m_wb + int64_t(((uint64_t(j) * R / 8 + band) * bt + tm + s) *
                                                          kBandBytes +
                                                      m_p.w_lane * 4),
                                       imm(8), imm(std::min(n - s * 128, 128u) * 4), imm(n * 4),
                                       imm(512), t.flag});
                                ++count;
                            }
                        break;
                    }
                    case DotLayout::TransposedVpuTiles:
                        if (narrow_held()) {
                            // An array of its own narrower than a tile (half_held): its n rows'
                            // k values, 512 bytes apart, land as n x k.
                            E(op, {staged_at(false, wstage(slot, m)),
                                   m_wb + int64_t(uint64_t(m) * C * 512), imm(n), imm(k * 4),
                                   imm(k * 4), imm(512), t.flag});
                            ++count;
                            break;
                        }
                        // W^T (N x K) in tiles: each of step j's R / 128 tile columns of the
                        // panel's ceil(n / 8) bands, a band of tiles apart, lands as n x 128 and
                        // is transposed in VMEM.
                        for (uint32_t s = 0; s < vtiles(k); ++s) {
                            E(op, {staged_at(false, wstage(slot, m) + s * wsub(n)),
                                   m_wb + int64_t((uint64_t(m) * C / 8 * wbt() +
                                                   uint64_t(j) * (R / 128) + s) *
                                                  kBandBytes),
                                   imm(ceil_div(n, 8)), imm(kBandBytes), imm(kBandBytes),
                                   imm(int64_t(wbt() * kBandBytes)), t.flag});
                            ++count;
                        }
                        break;
                    case DotLayout::TransposedTiles:
                        // Tile (n0 / C + m, j) of W^T: n rows of k values, transposed in VMEM.
                        E(op, {imm(int64_t(wstage(slot, m))),
                               m_wb + int64_t((uint64_t(m) * m_KT + j) * R * C * 4), imm(n),
                               imm(k * 4), imm(k * 4), imm(C * 4), t.flag});
                        ++count;
                        break;
                }
            }
        }
        if (count) E(Opcode::Add, {t.count, t.count, imm(count)});
    }

    /// A batch's (DotBatch) blocks follow one another in one kernel.
    bool batched() const { return !m_batch.period.empty(); }

    /// Bytes into a C panel where the member's MXU results go: m_c_pair's second member's
    /// below the first's (C^T's rows: a head's M rows of 128 results).
    uint64_t c_pair_rows() const { return m_c_pair && m_mi == 1 ? uint64_t(m_p.M) * m_k.C * 4 : 0; }

    /// The group whose C waits for its store, if any: once its matmuls are done (`steps` =
    /// steps of the current group already issued to MXU m < `nm`), its epilogue and its stores:
    /// of its panels [m0, m1) (piece by piece, each one step later: the first waits for the
    /// MXUs, the last one clears the pending group).
    void flush(const std::string& tag, uint32_t steps, uint32_t nm, uint32_t m0 = 0,
               uint32_t m1 = ~0u) {
        // m_c_pair: nothing is pending during the pair's second member (the first's results
        // wait for the second's, in the same panels).
        if (m_c_pair && m_mi == 1) return;
        const bool first_piece = m0 == 0, last_piece = m1 >= m_GW;
        const isa::Label done = m_b.label("fd_" + tag), fe = m_b.label("fe_" + tag);
        E(Opcode::Beq, {m_pending, imm(0), done});
        if (first_piece)
            for (uint32_t m = 0; m < m_k.mxus; ++m) wait_mxu(m, m < mxus_of(nm) ? steps : 0);
        if (m_G > 1) {
            const isa::Label fl = m_b.label("fl_" + tag);
            E(Opcode::Beq, {m_pending, imm(2), fl});
            stores(false, m0, m1);
            E(Opcode::Jmp, {fe});
            m_b.bind(fl);
        }
        stores(true, m0, m1);
        m_b.bind(fe);
        if (last_piece) E(Opcode::Li, {m_pending, imm(0)});
        m_b.bind(done);
    }

    /// HBM offset of the pending group's panel m from the pending address, in values. With the
    /// LHS stationary a panel is 128 rows of C: C N values, in tiles C rows of ceil(N / 128)
    /// tiles.
    uint64_t c_panel_off(uint32_t m) const {
        const uint32_t C = m_k.C;
        const uint64_t cn = m_k.c_row ? m_k.c_row : m_k.N, MT = ceil_div(m_k.M, C);
        const uint64_t tile_bytes = uint64_t(C) * C * 4;
        const bool lhs = m_p.lhs, tiles_out = m_k.c == DotLayout::VpuTiles;
        if (m_k.c == DotLayout::TransposedTiles)
            return uint64_t(m) * (lhs ? 1 : MT) * tile_bytes / 4;
        if (m_k.c == DotLayout::TransposedVpuTiles) return uint64_t(m) * (C / 128) * kBandBytes / 4;
        if (lhs && tiles_out) return uint64_t(m) * C * ceil_div(m_k.N, 128) * 128;
        if (lhs) return uint64_t(m) * C * cn;
        if (tiles_out) return uint64_t(m) * (C / 128) * kBandBytes / 4;
        return m_k.c == DotLayout::Gemm ? uint64_t(m) * m_k.M * C : m * C;
    }

    /// Issues the loads of the pending group's Full side tiles of its panels [m0, np) (the
    /// pending address and rows; `bands` the rows' bands where C lies in 8 x 128 tiles, else
    /// computed here when needed), counted on m_sides.
    void full_loads(bool last, uint32_t m0, uint32_t np, const isa::Reg* bands_in) {
        const uint32_t T = m_k.block_rows, C = m_k.C;
        const uint64_t e = m_k.store_bf16 ? 2 : 4, cn = m_k.c_row ? m_k.c_row : m_k.N;
        const bool lhs = m_p.lhs, panels_out = m_k.c == DotLayout::Gemm;
        const bool tiles_out = m_k.c == DotLayout::VpuTiles;
        const int64_t band_stride = int64_t(vtiles(m_p.N)) * kBandBytes;
        auto panel_off = [&](uint32_t m) { return c_panel_off(m); };
        isa::Reg own;
        const isa::Reg* bp = bands_in;
        if (tiles_out && !lhs && !bp) {
            own = m_b.reg("side_bands");
            if (m_p.M % 8) {
                E(Opcode::Add, {own, m_prows, imm(7)});
                E(Opcode::Shr, {own, own, imm(3)});
            } else {
                E(Opcode::Shr, {own, m_prows, imm(3)});
            }
            bp = &own;
        }
        const isa::Reg at = m_b.reg("side_at");
        isa::Reg row_bytes;
        if (lhs && !tiles_out) {
            row_bytes = m_b.reg("side_row_bytes");
            E(Opcode::Mul, {row_bytes, m_prows, imm(4)});
        }
        uint32_t f = 0, issued = 0;
        for (const EpilogueSide& s : m_ep.sides) {
            if (s.kind != EpilogueSide::Kind::Full) continue;
            // at = side + (pending address - C) x 4 / e: the pending tile's first element
            // in the fp32 side.
            E(Opcode::Sub, {at, m_paddr, m_C.value});
            if (e == 2) E(Opcode::Add, {at, at, at});
            E(Opcode::Add, {at, at, s.place.value});
            const Opcode op = load_op(s.place);
            for (uint32_t m = m0; m < np; ++m) {
                const uint32_t n = nn(last, m);
                const isa::Arg dst = imm(int64_t(full_tile(f, m)));
                const isa::Arg src = at + int64_t(panel_off(m) * 4);
                if (lhs && tiles_out)
                    issued +=
                        lhs_tiles(op, false, at, panel_off(m) * 4, full_tile(f, m), n, m_sides);
                else if (lhs)
                    E(op, {dst, src, imm(n), row_bytes, imm(T * 4), imm(int64_t(cn * 4)),
                           m_sides.flag});
                else if (tiles_out && n % 128)
                    issued += narrow_bands(op, false, at, panel_off(m) * 4, nullptr,
                                           full_tile(f, m), n, m_sides);
                else if (tiles_out && n > 128)
                    issued += tile_columns(op, true, dst, src, *bp, uint64_t(n) * 4,
                                           uint64_t(band_stride), n, m_sides);
                else if (tiles_out)
                    E(op, {dst, src, *bp, imm(kBandBytes), imm(kBandBytes), imm(band_stride),
                           m_sides.flag});
                else
                    E(op, {dst, src, m_prows, imm(n * 4), imm(n * 4),
                           imm(int64_t(panels_out ? C * 4 : cn * 4)), m_sides.flag});
                if (!(lhs && tiles_out) && !(tiles_out && n % 128) && !(tiles_out && n > 128))
                    ++issued;
            }
            ++f;
        }
        E(Opcode::Add, {m_sides.count, m_sides.count, imm(issued)});
    }

    /// The pending group's epilogue and stores (`last`: the last group's panels) of its panels
    /// [m0, m1).
    void stores(bool last, uint32_t m0 = 0, uint32_t m1 = ~0u) {
        const uint32_t np = std::min(panels(last), m1), T = m_k.block_rows, C = m_k.C;
        // C's bytes a value, row length.
        const uint64_t e = m_k.store_bf16 ? 2 : 4, cn = m_k.c_row ? m_k.c_row : m_k.N;
        const bool lhs = m_p.lhs, panels_out = m_k.c == DotLayout::Gemm;
        const bool tiles_out = m_k.c == DotLayout::VpuTiles;
        // C^T in tiles (LHS stationary): the epilogue's tile is transposed back to the
        // problem's orientation and stored as the RHS stationary stores C in tiles.
        const bool ttiles_out = m_k.c == DotLayout::TransposedVpuTiles;
        // C^T in the MXU's tiles (a weight gradient in its parameter's layout): each result
        // tile transposed after its epilogue, stored a 128-column piece (one tile) at a time.
        const bool mxu_tiles_out = m_k.c == DotLayout::TransposedTiles;
        auto panel_off = [&](uint32_t m) { return c_panel_off(m); };
        // VpuTiles: the pending rows in bands of 8, each band's tile of a panel one 4 KiB run
        // (C / 128 of them side by side).
        isa::Reg bands;
        const int64_t band_stride = int64_t(vtiles(m_p.N)) * kBandBytes;
        if ((tiles_out && !lhs) || ttiles_out) {
            bands = m_b.reg("bands");
            if (m_p.M % 8) {  // the last band's padding rows too
                E(Opcode::Add, {bands, m_prows, imm(7)});
                E(Opcode::Shr, {bands, bands, imm(3)});
            } else {
                E(Opcode::Shr, {bands, m_prows, imm(3)});
            }
        }
        // In a batch, C's 8 x 128 tiles go band by band across the group's panels: a band's
        // tiles lie side by side in HBM, one run of (panels x 4 KiB) per DMA that the HBM
        // serves in whole open rows (panel by panel, a 4 KiB run of each band opens its rows
        // for a quarter of them). The 2-D dots keep their panel-by-panel stores.
        bool band_major =
            batched() && tiles_out && !lhs && !m_k.store_bf16 && C == 128 && np > m0 + 1;
        for (uint32_t m = m0; m < np; ++m) band_major = band_major && nn(last, m) == 128;
        // (1) Full sides: each panel's tile of each, the same elements as the result's (on
        // their way since the group's previous flush with DotKey::prefetch_sides).
        if (m_k.full_sides) {
            if (!m_k.prefetch_sides) full_loads(last, m0, np, tiles_out && !lhs ? &bands : nullptr);
            E(Opcode::Wait, {m_sides.flag, m_sides.count});
            if (m_staged && np > 2 && m0 < 4) E(Opcode::Wait, {m_sides2.flag, m_sides2.count});
        }
        // (2) The epilogue of each panel's tile.
        // Each panel's stores follow its own epilogue (`pipelined`, below) on 2-D dots whose
        // panels need VPU work of their own.
        const bool pipelined =
            !batched() && (lhs || ttiles_out || mxu_tiles_out || m_k.overlap_epilogue);
        isa::Reg columns, count;
        if (m_k.column_sides) {
            columns = m_b.reg("columns", 12);
            E(Opcode::Add, {columns, m_pcol, imm(int64_t(m_a.col))});
        }
        // The transposed tiles have one area: the previous group's stores from it must be
        // done (the last group's flush follows the one inside it with no group between).
        // A later piece of a split flush uses its own panels' area, whose last stores (the
        // previous group's) were done when this group began.
        if ((lhs || mxu_tiles_out) && m0 == 0) E(Opcode::Wait, {m_stores.flag, m_stores.count});
        if (m_k.store_bf16 && !lhs) count = m_b.reg("tile_values");
        // Pipelined stores run between the epilogues, where `columns` is held: when the stores'
        // registers (row_bytes, and the loops of lhs_tiles, five, or of the other tile stores,
        // three) would not be free beside it, each epilogue sets it anew (an add per panel).
        const uint32_t store_regs =
            (lhs && !tiles_out && !ttiles_out && !mxu_tiles_out ? 1 : 0) +
            (lhs && tiles_out ? 5 : 3);
        const bool columns_per_panel =
            pipelined && m_k.column_sides && m_b.free_regs() < store_regs;
        if (columns_per_panel) columns.release();
        // Panel m's VPU work, counted on m_vpu or (`odd`) on m_vpu2; returns how many
        // instructions it issued.
        const auto epilogue_of = [&](uint32_t m, bool odd) {
            int ops = 0;
            auto counted = [&](Opcode op, std::initializer_list<isa::Arg> args) {
                std::vector<isa::Arg> all(args);
                all.push_back(odd ? m_vpu2 : m_vpu.flag);
                m_b.emit(op, all);
                if (!odd) E(Opcode::Add, {m_vpu.count, m_vpu.count, imm(1)});
                ++ops;
            };
            const uint32_t n = nn(last, m);
            const isa::Arg result = m_ppar + int64_t(m_a.c + m * m_m.cpanel);
            isa::Arg tile = result;
            uint32_t cols = n;
            const isa::Reg* rows = &m_prows;
            // Held only for the epilogue (the stores of the panel before loop over registers).
            isa::Reg tile_rows;
            if (lhs) {
                tile_rows = m_b.reg("tile_rows");
                // C^T's tile (rows x n) back to C's orientation: n rows of T values (the
                // columns past the block's rows are not stored); with C in one buffer done
                // already, before the next group's first matmuls (early_transposes).
                tile = imm(int64_t(m_a.tt + m * m_m.cpanel));
                if (!m_pre) counted(Opcode::VTrans, {tile, result, imm(T), imm(n)});
                E(Opcode::Li, {tile_rows, imm(n)});
                rows = &tile_rows;
                cols = T;
            }
            if (m_ep.body) {
                isa::Reg panel_columns;
                if (columns_per_panel) {
                    panel_columns = m_b.reg("columns");
                    E(Opcode::Add, {panel_columns, m_pcol, imm(int64_t(m_a.col))});
                }
                const isa::Reg& col_base = columns_per_panel ? panel_columns : columns;
                std::vector<isa::Arg> sides;
                uint32_t ci = 0, fi = 0;
                for (const EpilogueSide& s : m_ep.sides) {
                    if (s.kind == EpilogueSide::Kind::Column)
                        sides.push_back(col_base + int64_t(ci++ * m_m.col_stride +
                                                           (lhs ? 0 : uint64_t(m) * C * 4)));
                    else
                        sides.push_back(imm(int64_t(full_tile(fi++, m))));
                }
                // Where the tile lies in C: with the LHS stationary its rows are panel m of the
                // problem's columns, its columns the block's rows.
                std::function<void(const isa::Reg&)> row4;
                if (m_ep.position) {
                    const int64_t panel4 = int64_t(m) * C * 4;
                    row4 = [this, panel4, lhs](const isa::Reg& dst) {
                        E(Opcode::Lw, {dst, m_pos.word(0)});
                        if (lhs) E(Opcode::Add, {dst, dst, imm(panel4)});
                    };
                }
                EpilogueTile et(m_b, tile, std::move(sides), *rows, cols, counted, m, row4);
                m_ep.body(et);
            }
            if (ttiles_out) counted(Opcode::VTrans, {result, tile, imm(n), imm(T)});
            if (mxu_tiles_out && !lhs)
                counted(Opcode::VTrans,
                        {imm(int64_t(m_a.tt + m * m_m.cpanel)), result, imm(T), imm(n)});
            if (mxu_tiles_out && lhs)  // back to C^T's orientation, the problem's
                counted(Opcode::VTrans, {result, tile, imm(n), imm(T)});
            if (m_k.store_bf16) {
                isa::Arg values = imm(int64_t(n) * T);
                if (!lhs) {
                    E(Opcode::Mul, {count, m_prows, imm(n)});
                    values = count;
                }
                counted(Opcode::VF2Bf,
                        {imm(int64_t(m_a.bf + uint64_t(m) * T * C * 2)), tile, values});
            }
            return ops;
        };
        // (3) The stores.
        isa::Reg row_bytes;
        const auto row_bytes_reg = [&] {
            if (lhs && !tiles_out && !ttiles_out && !mxu_tiles_out) {
                row_bytes = m_b.reg("row_bytes");
                E(Opcode::Mul, {row_bytes, m_prows, imm(int64_t(e))});
            }
        };
        const Opcode op = store_op(m_C);
        const auto store_of = [&](uint32_t m) {
            const uint32_t n = nn(last, m);
            isa::Arg src = m_ppar + int64_t(m_a.c + m * m_m.cpanel);
            if (lhs && !ttiles_out) src = imm(int64_t(m_a.tt + m * m_m.cpanel));
            if (m_k.store_bf16) src = imm(int64_t(m_a.bf + uint64_t(m) * T * C * 2));
            const isa::Arg dst = m_paddr + int64_t(panel_off(m) * e);
            if (lhs && tiles_out) {
                lhs_tiles(op, true, m_paddr, panel_off(m) * e, m_a.tt + m * m_m.cpanel, n,
                          m_stores);
                return;
            }
            if (mxu_tiles_out && lhs) {
                lhs_mxu_tiles(op, m_paddr, panel_off(m) * e, m_a.c + m * m_m.cpanel, n);
                return;
            }
            if (mxu_tiles_out) {
                mxu_tiles(op, m_paddr, panel_off(m) * e, m_a.tt + m * m_m.cpanel, n);
                return;
            }
            if (tiles_out && n % 128) {
                narrow_bands(op, true, m_paddr, panel_off(m) * e, &m_ppar, m_a.c + m * m_m.cpanel,
                             n, m_stores);
                return;
            }
            if ((tiles_out || ttiles_out) && n > 128) {
                // A panel wider than a tile (a 256-column MXU): its rows are pieces of n / 128
                // tiles of each band.
                tile_columns(op, false, src, dst, bands, uint64_t(n) * 4, uint64_t(band_stride), n,
                             m_stores);
                return;
            }
            if (lhs && !ttiles_out)
                E(op, {dst, src, imm(n), row_bytes, imm(int64_t(cn * e)), imm(int64_t(T * e)),
                       m_stores.flag});
            else if (tiles_out || ttiles_out)
                E(op, {dst, src, bands, imm(kBandBytes), imm(band_stride), imm(kBandBytes),
                       m_stores.flag});
            else
                E(op,
                  {dst, src, m_prows, imm(int64_t(n * e)),
                   imm(int64_t(panels_out ? C * e : cn * e)), imm(int64_t(n * e)), m_stores.flag});
            E(Opcode::Add, {m_stores.count, m_stores.count, imm(1)});
        };
        // Each panel's stores go out as soon as its own epilogue is done, while the VPU works on
        // the next panel's, instead of all of them after the last panel's: the group's stores
        // then start one panel's VPU work after its last matmul rather than the whole group's
        // (BERT-base's fc_1: the four panels' transposes and epilogues, 1.5 k cycles, in front
        // of 3 MiB of stores). Consecutive panels count on two VPU flags (m_vpu, m_vpu2), so a
        // full wait on one covers a panel's work and none of the next one's, whatever order
        // the VPU finishes them in. Where a panel's VPU work is a transpose or a fused
        // epilogue (the compiler's 2-D dots); the stand-alone matmul's bias add is shorter than
        // the waits it would add (+2 to +13 cycles on BERT's shapes), so it keeps one wait, and
        // a batch (attention's heads) keeps its own order of stores.
        if (pipelined) {
            row_bytes_reg();
            if (np > m0 + 1) E(Opcode::Fset, {m_vpu2, imm(0)});
            int pending_ops = 0, odd_ops = 0;
            for (uint32_t m = m0; m <= np; ++m) {
                const bool odd = (m - m0) % 2;
                // m_ring: panel m's side tiles, loaded once panel m - 2's epilogue was done.
                if (m_ring && m < np && m >= m0 + 2) E(Opcode::Wait, {m_sides.flag, m_sides.count});
                const int ops = m < np ? epilogue_of(m, odd) : 0;
                if (odd) odd_ops += ops;
                if (m > m0) {
                    if (pending_ops && odd)  // panel m - 1 counted on m_vpu
                        E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
                    else if (pending_ops)
                        E(Opcode::Wait, {m_vpu2, imm(odd_ops)});
                    // m_ring: panel m - 1's slot is free for panel m + 1's side tiles.
                    if (m_ring && m + 1 < panels(last) && !(m_staged && m + 1 < 4)) {
                        if (!pending_ops) E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
                        full_loads(last, m + 1, m + 2, nullptr);
                    }
                    store_of(m - 1);
                }
                pending_ops = ops;
            }
            return;
        }
        int vpu_ops = 0;
        for (uint32_t m = m0; m < np; ++m) vpu_ops += epilogue_of(m, false);
        if (vpu_ops) E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
        // The epilogue's registers go back: the stores of C's tiles loop over bands and tiles.
        if (m_k.column_sides) columns.release();
        row_bytes_reg();
        if (!band_major) {
            for (uint32_t m = m0; m < np; ++m) store_of(m);
            return;
        }
        {
            const isa::Reg h = m_b.reg("band.hbm"), v = m_b.reg("band.vmem"),
                           end = m_b.reg("band.end");
            E(Opcode::Add, {h, m_paddr, imm(int64_t(panel_off(m0) * e))});
            E(Opcode::Add, {v, m_ppar, imm(int64_t(m_a.c + m0 * m_m.cpanel))});
            E(Opcode::Mul, {end, bands, imm(kBandBytes)});
            E(Opcode::Add, {end, end, v});
            const isa::Label loop = m_b.label("band_stores");
            m_b.bind(loop);
            E(op, {h, v, imm(np - m0), imm(kBandBytes), imm(kBandBytes), imm(int64_t(m_m.cpanel)),
                   m_stores.flag});
            E(Opcode::Add, {m_stores.count, m_stores.count, imm(1)});
            E(Opcode::Add, {h, h, imm(band_stride)});
            E(Opcode::Add, {v, v, imm(kBandBytes)});
            E(Opcode::Bltu, {v, end, loop});
        }
    }
    /// With the LHS stationary and C in 8 x 128 tiles: moves the pending columns of an n x T
    /// tile in VMEM at `vm` (n rows of C, T values a row) to (`store`) or from C's tiles at
    /// `hbm` + `off` bytes, one 8-row DMA of 512-byte rows per band and column tile (a column
    /// tile is contiguous in HBM but strided in VMEM), counted on `t`. Stores go band by band,
    /// the column tiles in order: a band's tiles are one contiguous run of HBM, which its
    /// pseudo-channels serve in open rows (tile by tile across the bands, each 4 KiB opened
    /// rows of its own).
    /// Returns the DMAs counted (the loop adds them to t.count itself, so 0).
    uint32_t lhs_tiles(Opcode op, bool store, const isa::Reg& hbm, uint64_t off, uint64_t vm,
                       uint32_t n, const Tally& t) {
        const uint32_t T = m_k.block_rows;
        const int64_t band = int64_t(ceil_div(m_k.N, 128)) * kBandBytes;  // a band of C's tiles
        if (!store) {
            // Loads tile by tile across the bands: a load's VMEM rows (its bounding box) overlap
            // the next tile's of the same band, so band by band each would wait for the one
            // before it (the DMA engine's WAW hazard).
            const isa::Reg h = m_b.reg("tiles.hbm"), v = m_b.reg("tiles.vmem"),
                           end = m_b.reg("tiles.end");
            E(Opcode::Add, {h, hbm, imm(int64_t(off))});
            E(Opcode::Li, {v, imm(int64_t(vm))});
            E(Opcode::Mul, {end, m_prows, imm(4)});  // prows / 128 column tiles of 512 bytes
            E(Opcode::Add, {end, end, imm(int64_t(vm))});
            const isa::Label loop = m_b.label("tiles");
            m_b.bind(loop);
            for (uint32_t b = 0; b < ceil_div(n, 8); ++b)
                E(op, {v + int64_t(b) * 8 * T * 4, h + int64_t(b) * band, imm(8), imm(512),
                       imm(int64_t(T) * 4), imm(512), t.flag});
            E(Opcode::Add, {t.count, t.count, imm(ceil_div(n, 8))});
            E(Opcode::Add, {h, h, imm(kBandBytes)});
            E(Opcode::Add, {v, v, imm(512)});
            E(Opcode::Bltu, {v, end, loop});
            return 0;
        }
        const isa::Reg hb = m_b.reg("tiles.band_hbm"), vb = m_b.reg("tiles.band_vmem"),
                       h = m_b.reg("tiles.hbm"), v = m_b.reg("tiles.vmem"),
                       end = m_b.reg("tiles.end");
        E(Opcode::Add, {hb, hbm, imm(int64_t(off))});
        E(Opcode::Li, {vb, imm(int64_t(vm))});
        const isa::Label bands = m_b.label("tile_bands"), tiles = m_b.label("tiles");
        m_b.bind(bands);
        E(Opcode::Add, {h, hb, imm(0)});
        E(Opcode::Add, {v, vb, imm(0)});
        E(Opcode::Mul, {end, m_prows, imm(4)});  // prows / 128 column tiles of 512 bytes
        E(Opcode::Add, {end, end, vb});
        m_b.bind(tiles);
        E(op, {h, v, imm(8), imm(512), imm(512), imm(int64_t(T) * 4), t.flag});
        E(Opcode::Add, {t.count, t.count, imm(1)});
        E(Opcode::Add, {h, h, imm(kBandBytes)});
        E(Opcode::Add, {v, v, imm(512)});
        E(Opcode::Bltu, {v, end, tiles});
        E(Opcode::Add, {hb, hb, imm(band)});
        E(Opcode::Add, {vb, vb, imm(int64_t(8) * T * 4)});
        E(Opcode::Bltu, {vb, imm(int64_t(vm + uint64_t(ceil_div(n, 8)) * 8 * T * 4)), bands});
        return 0;
    }

    /// C^T in the MXU's tiles: the n x T transposed result tile at `vm` (n rows of C^T, the
    /// pending rows of C as its columns) stored one tile (128 columns) at a time: n rows of
    /// 512 bytes each; a short last block's last piece writes the tile's padding too (don't-care).
    void mxu_tiles(Opcode op, const isa::Reg& hbm, uint64_t off, uint64_t vm, uint32_t n) {
        const uint32_t T = m_k.block_rows, C = m_k.C;
        const isa::Reg h = m_b.reg("tiles.hbm"), v = m_b.reg("tiles.vmem"),
                       end = m_b.reg("tiles.end");
        E(Opcode::Add, {h, hbm, imm(int64_t(off))});
        E(Opcode::Li, {v, imm(int64_t(vm))});
        E(Opcode::Mul, {end, m_prows, imm(4)});  // ceil(prows / C) pieces of C values
        E(Opcode::Add, {end, end, imm(int64_t(vm))});
        const isa::Label loop = m_b.label("mxu_tiles");
        m_b.bind(loop);
        E(op, {h, v, imm(n), imm(int64_t(C) * 4), imm(int64_t(C) * 4), imm(int64_t(T) * 4),
               m_stores.flag});
        E(Opcode::Add, {m_stores.count, m_stores.count, imm(1)});
        E(Opcode::Add, {h, h, imm(int64_t(C) * C * 4)});
        E(Opcode::Add, {v, v, imm(int64_t(C) * 4)});
        E(Opcode::Bltu, {v, end, loop});
    }

    /// C in 8 x 128 tiles, a narrow last panel (N padded): the pending rows of an n-column
    /// panel (compact rows of n values in VMEM at `vbase` + `voff`) to (`store`) or from the
    /// panel's tiles at `hbm` + `off`, one 8-row DMA per band and tile of up to 128 values a
    /// row (a short last band moves padding rows too). Counts on `t` itself; returns 0.
    uint32_t narrow_bands(Opcode op, bool store, const isa::Reg& hbm, uint64_t off,
                          const isa::Reg* vbase, uint64_t voff, uint32_t n, const Tally& t) {
        const isa::Reg h = m_b.reg("bands.hbm"), v = m_b.reg("bands.vmem"),
                       end = m_b.reg("bands.end");
        // A loop over the bands per tile (tile_columns: a band's tiles write interleaved rows).
        for (uint32_t s = 0; s < vtiles(n); ++s) {
            const int64_t w = int64_t(std::min(n - s * 128, 128u)) * 4;
            E(Opcode::Add, {h, hbm, imm(int64_t(off + s * kBandBytes))});
            if (vbase)
                E(Opcode::Add, {v, *vbase, imm(int64_t(voff + s * 512))});
            else
                E(Opcode::Li, {v, imm(int64_t(voff + s * 512))});
            E(Opcode::Mul, {end, m_prows, imm(int64_t(n) * 4)});
            E(Opcode::Add, {end, end, v});
            const isa::Label loop = m_b.label("narrow");
            m_b.bind(loop);
            if (store)
                E(op, {h, v, imm(8), imm(w), imm(512), imm(int64_t(n) * 4), t.flag});
            else
                E(op, {v, h, imm(8), imm(w), imm(int64_t(n) * 4), imm(512), t.flag});
            E(Opcode::Add, {t.count, t.count, imm(1)});
            E(Opcode::Add, {h, h, imm(int64_t(vtiles(m_p.N)) * kBandBytes)});
            E(Opcode::Add, {v, v, imm(int64_t(n) * 8 * 4)});
            E(Opcode::Bltu, {v, end, loop});
        }
        return 0;
    }

    /// C^T in the MXU's tiles with the LHS stationary: the problem's T x n result tile (rows of
    /// C^T, at c_parity + `voff`) stored one tile (128 rows) at a time; a short last block's
    /// last piece writes padding rows (don't-care).
    void lhs_mxu_tiles(Opcode op, const isa::Reg& hbm, uint64_t off, uint64_t voff, uint32_t n) {
        const uint32_t C = m_k.C;
        const uint64_t MT = ceil_div(m_k.M, C);
        const isa::Reg h = m_b.reg("tiles.hbm"), v = m_b.reg("tiles.vmem"),
                       end = m_b.reg("tiles.end");
        E(Opcode::Add, {h, hbm, imm(int64_t(off))});
        E(Opcode::Add, {v, m_ppar, imm(int64_t(voff))});
        E(Opcode::Mul, {end, m_prows, imm(int64_t(n) * 4)});
        E(Opcode::Add, {end, end, v});
        const isa::Label loop = m_b.label("lhs_mxu_tiles");
        m_b.bind(loop);
        E(op, {h, v, imm(C), imm(int64_t(n) * 4), imm(int64_t(C) * 4), imm(int64_t(n) * 4),
               m_stores.flag});
        E(Opcode::Add, {m_stores.count, m_stores.count, imm(1)});
        E(Opcode::Add, {h, h, imm(int64_t(MT * C * C * 4))});
        E(Opcode::Add, {v, v, imm(int64_t(C) * n * 4)});
        E(Opcode::Bltu, {v, end, loop});
    }

    uint64_t full_tile(uint32_t f, uint32_t m) const {
        if (m_staged && m >= 2 && m < 4)
            return m_a.astage + uint64_t((m_KT + m) % 2) * m_k.block_rows * m_k.R * 4;
        if (m_ring) return m_a.full + (uint64_t(f) * 2 + m % 2) * m_m.cpanel;
        return m_a.full + (uint64_t(f) * m_GW + m) * m_m.cpanel;
    }

    /// VPU: fp32 at `x` (`n` values) into the bf16 parts `part(q)`.
    void convert(const std::function<isa::Arg(int)>& part, isa::Arg x, isa::Arg n, uint64_t f,
                 uint64_t r1, uint64_t r2) {
        emit_split([&](Opcode op, std::initializer_list<isa::Arg> args) { vpu(op, args); }, m_P,
                   part, x, imm(int64_t(f)), imm(int64_t(r1)), imm(int64_t(r2)), n);
    }

    /// One column group: every K step, unrolled so that each step's slot and flag are fixed.
    void group(bool first, bool last) {
        const uint32_t nm = panels(last), R = m_k.R;
        const std::string tag = first ? (last ? "fl" : "f") : (last ? "l" : "m");
        const bool a_staged = staged(m_p.a), w_staged = staged(m_p.w);
        // Weight tiles in bf16 go straight to where the MXUs read them, so a slot is refilled
        // only after the step that last read it (the one before, issued just before the refill).
        const bool w_direct = !w_staged;
        // The stores of the group before the previous one read the C parity this group writes
        // (a batch waits just before its first matmul, so its loads overlap those stores).
        if (!batched()) E(Opcode::Wait, {m_stores.flag, m_stores.count});
        // A's bf16 panels loaded as they are replace the ones every matmul so far has read.
        if (first && !a_staged)
            for (uint32_t m = 0; m < m_k.mxus; ++m) wait_mxu(m, 0);
        // Slot 0 of the weight tiles was last read by the previous group's last step (KT odd)
        // or the one before.
        if (w_direct)
            for (uint32_t m = 0; m < mxus_of(nm); ++m) wait_mxu(m, m_KT % 2 ? 0 : 1);
        // With the next batch's first step loaded beside the last (m_step_ahead, KT >= 4), the
        // previous batch's stores go after step KT - 1's loads, not in front of them, so the
        // last batch's last step does not wait behind them.
        const uint32_t flush_step =
            m_step_ahead ? std::max<uint32_t>(1, m_KT - 2) : std::min<uint32_t>(1, m_KT - 1);
        // The previous group's epilogue is the VPU's, which also converts each step's operands:
        // all at once it would leave the MXUs idle once the one step issued before it is done
        // (a GELU on two 128-column panels outlasts a step). With a step per panel to spare,
        // each panel's epilogue goes after a step of its own.
        const bool split =
            m_k.overlap_epilogue && !w_direct && m_GW > 1 && flush_step + m_GW <= m_KT;
        // With DotKey::prefetch_sides this group's Full side tiles are loaded during its own
        // last steps, a panel's after a step's matmuls (the previous group's epilogue has read
        // their area by then), so they are not loaded between the group's last matmuls and its
        // epilogue, nor all at once: a scalar core that issues a few hundred DMAs in a row
        // (8-row tiles) waits for the DMA queue and the MXUs run dry.
        const uint32_t free_at = split ? flush_step + m_GW - 1 : flush_step;
        const auto prefetch_step = [&](uint32_t m) {
            const uint32_t np = panels(last);
            return std::max(free_at, m_KT >= np - m ? m_KT - (np - m) : 0u);
        };
        const auto prefetch = [&](uint32_t j) {
            if (!m_k.full_sides || !m_k.prefetch_sides) return;
            // (m_ring: panels 2 on in their flush, after panel m - 2's epilogue.)
            for (uint32_t m = 0; m < (m_ring ? std::min(2u, panels(last)) : panels(last)); ++m) {
                if (prefetch_step(m) != j) continue;
                if (m == 0) set_pending(first, last);
                full_loads(last, m, m + 1, nullptr);
            }
            // The dot's last block: panels 2 and 3 into the streamed operand's staging slots,
            // which no step reads after this one's conversion, so the end's flush does not wait
            // for them behind panels 0 and 1's epilogues (m_stage_ok). Panel m into the slot of
            // step KT - 4 + m, free once that step's panel is converted, and not before panel 0's
            // prefetch has set the pending address (the previous group's flush is done); counted
            // on a flag of their own, so panels 0 and 1's epilogues do not wait for them.
            if (!m_stage_ok || !last) return;
            for (uint32_t m = 2; m < std::min(4u, panels(last)); ++m) {
                if (std::max(prefetch_step(0), m_KT + m - 4) != j) continue;
                const isa::Label skip = m_b.label("sides_not_last");
                E(Opcode::Add, {m_tmp, m_row, m_rows});
                E(Opcode::Bltu, {m_tmp, imm(m_p.M), skip});
                m_staged = true;
                std::swap(m_sides, m_sides2);
                full_loads(last, m, m + 1, nullptr);
                std::swap(m_sides, m_sides2);
                m_staged = false;
                m_b.bind(skip);
            }
        };
        // The held tiles of step j (staged in `slot`): transposed where they lie so, converted
        // into the bf16 slot the MXUs load.
        const auto held_converts = [&](uint32_t j, int slot) {
            const uint32_t k = kk(j);
            for (uint32_t m = 0; m < nm; ++m) {
                const uint32_t n = nn(last, m);
                uint64_t x = wstage(slot, m);
                if (m_p.w == DotLayout::Transposed || m_p.w == DotLayout::TransposedTiles) {
                    const uint64_t tt = m_a.wtt + uint64_t(m) * R * m_k.C * 4;
                    vpu(Opcode::VTrans, {imm(int64_t(tt)), imm(int64_t(x)), imm(n), imm(k)});
                    x = tt;
                } else if (m_p.w == DotLayout::TransposedVpuTiles && narrow_held()) {
                    const uint64_t tt = m_a.wtt + uint64_t(m) * R * m_k.C * 4;
                    vpu(Opcode::VTrans, {imm(int64_t(tt)), staged_at(false, x), imm(n), imm(k)});
                    x = tt;
                } else if (m_p.w == DotLayout::TransposedVpuTiles) {
                    // Each n x 128 piece to 128 rows of n, one below the other: the first k
                    // rows of the transposes are the tile's.
                    const uint64_t tt = m_a.wtt + uint64_t(m) * R * m_k.C * 4;
                    for (uint32_t s = 0; s < vtiles(k); ++s)
                        vpu(Opcode::VTrans, {imm(int64_t(tt + uint64_t(s) * 128 * n * 4)),
                                             staged_at(false, x + s * wsub(n)), imm(n), imm(128)});
                    x = tt + uint64_t(m_p.w_lane) * n * 4;
                }
                if (m_pro.held) {
                    // The panel's first column: a middle group's is in group_col (x 4).
                    const int64_t col = int64_t(m) * m_k.C +
                                        (last && !first ? int64_t(m_G - 1) * m_k.mxus * m_k.C : 0);
                    const bool mid = !first && !last;
                    m_pro.held(
                        {m_b, imm(int64_t(x)), imm(k), n,
                         [&, col, mid](const isa::Reg& d) {
                             if (mid)
                                 E(Opcode::Add, {d, m_col, imm(col * 4)});
                             else
                                 E(Opcode::Li, {d, imm(col * 4)});
                         },
                         [&](Opcode op, std::initializer_list<isa::Arg> args) { vpu(op, args); },
                         m_member});
                }
                convert([&](int q) { return imm(int64_t(wbf(slot, m, q))); }, imm(int64_t(x)),
                        imm(int64_t(k) * n), m_a.wf, m_a.wr1, m_a.wr2);
            }
        };
        // The kernel's first step in two halves (split_start): only block 0 of part 0 runs it.
        const bool halves = first && m_part == 0 && split_start();
        std::optional<isa::Label> later_block, first_step_done;
        if (halves) {
            later_block = m_b.label("later_block");
            first_step_done = m_b.label("first_step_done");
            E(Opcode::Bne, {m_row, imm(0), *later_block});
            first_step_in_halves(last, held_converts);
            prefetch(0);
            E(Opcode::Jmp, {*first_step_done});
            m_b.bind(*later_block);
        }
        if (!m_ahead && !m_step_ahead && !m_lead) loads(0, first, last, 0, kBoth);
        if (m_k.accumulate) c_loads(first, last);
        for (uint32_t j = 0; j < m_KT; ++j) {
            const int slot = int(j % 2);
            const uint32_t k = kk(j);
            // Step j + 1's transfers go first: their slot was last read by step j - 1's
            // conversions, which are done.
            if (j + 1 < m_KT && !m_lead) loads(j + 1, first, last, 1 - slot, w_direct ? kA : kBoth);
            if (j + 1 == m_KT && m_step_ahead) step_ahead_next();
            E(Opcode::Wait, {m_loads[slot].flag, m_loads[slot].count});
            if (m_ahead) ahead_next();
            if (m_lead && m_KT > 2) lead_loads(j, first, last);
            const bool converts = w_staged || (first && a_staged);
            // The weight slot is free once the step before the previous one is done on each
            // MXU; at a group's start with KT odd the previous group's last step read it too.
            // A block's first group also overwrites A's panel j, which the previous block's
            // steps read (all but this group's j).
            if (converts)
                for (uint32_t m = 0; m < m_k.mxus; ++m) {
                    const bool used = m < mxus_of(nm);
                    uint32_t later = used ? (j == 0 && m_KT % 2 ? 0 : 1) : m_k.mxus;
                    // A's panels in two slots follow the weight slots' rule.
                    if (first && m_AS == m_KT) later = std::min(later, used ? j : 0);
                    if (used || first) wait_mxu(m, later);
                }
            if (first && a_staged) {
                bool converted = false;  // m_atr: tile by tile already
                const uint64_t src =
                    m_a.astage + uint64_t(m_lead ? j : slot) * m_k.block_rows * R * 4;
                uint64_t x = src;
                if (m_p.a == DotLayout::Transposed) {
                    vpu(Opcode::VTrans, {imm(int64_t(m_a.att)), imm(int64_t(src)), imm(k), m_rows});
                    x = m_a.att;
                } else if (m_p.a == DotLayout::TransposedVpuTiles) {
                    // k x 128 per tile column, to 128 rows of k each, one below the other (a
                    // short last block's columns past its rows are padding; a window's rows
                    // start at its lane).
                    vpu(Opcode::VTrans,
                        {imm(int64_t(m_a.att)), imm(int64_t(src)), imm(k), imm(128)});
                    for (uint32_t c = 1; c < m_k.block_rows / 128; ++c) {
                        const isa::Label skip = m_b.label("a_column_t");
                        E(Opcode::Bltu, {m_rows, imm(128 * c + 1), skip});
                        vpu(Opcode::VTrans, {imm(int64_t(m_a.att + uint64_t(c) * 128 * k * 4)),
                                             imm(int64_t(src + c * asub(k))), imm(k), imm(128)});
                        m_b.bind(skip);
                    }
                    x = m_a.att + uint64_t(m_p.a_lane) * k * 4;
                } else if (m_pair) {
                    // The pair's M x 128 tiles: transposed, the window's k rows (from its lane)
                    // transposed back to M rows of k values.
                    vpu(Opcode::VTrans,
                        {imm(int64_t(m_a.att)), staged_at(true, src), imm(m_p.M), imm(128)});
                    vpu(Opcode::VTrans, {imm(int64_t(m_a.awin)),
                                         imm(int64_t(m_a.att + uint64_t(m_p.a_lane) * m_p.M * 4)),
                                         imm(k), imm(m_p.M)});
                    x = m_a.awin;
                } else if (m_p.a == DotLayout::TransposedTiles) {
                    // Each R x R tile (k rows of K, R rows of the block) to R rows of k values:
                    // the block's whole tiles (a short last block's past its rows: padding).
                    const uint64_t tile = uint64_t(R) * R * 4;
                    if (m_atr) {
                        trans_tiles(src, 0, ceil_div(m_k.block_rows, R), j);
                        converted = true;
                    } else {
                        for (uint32_t t = 0; t < ceil_div(m_k.block_rows, R); ++t)
                            vpu(Opcode::VTrans, {imm(int64_t(m_a.att + t * tile)),
                                                 imm(int64_t(src + t * tile)), imm(R), imm(R)});
                    }
                    x = m_a.att;
                }
                if (m_pro.streamed)
                    m_pro.streamed(
                        {m_b, x == src ? staged_at(true, x) : imm(int64_t(x)), m_rows, k,
                         [&](const isa::Reg& d) {
                             E(Opcode::Mul, {d, m_row, imm(4)});
                         },
                         [&](Opcode op, std::initializer_list<isa::Arg> args) { vpu(op, args); },
                         m_member});
                if (!converted) {
                    E(Opcode::Mul, {m_cnt, m_rows, imm(k)});
                    convert([&](int q) { return imm(int64_t(abf(q, j))); },
                            x == src ? staged_at(true, x) : imm(int64_t(x)), m_cnt, m_a.af, m_a.ar1,
                            m_a.ar2);
                }
            }
            if (m_band && j == 0) E(Opcode::Wait, {m_bands.flag, m_bands.count});
            if (w_staged && m_band)
                for (uint32_t m = 0; m < nm; ++m) {
                    // Tile (j, m) of the batch's buffer, transposed as a loaded one (below).
                    const uint64_t tt = m_a.wtt + uint64_t(m) * R * m_k.C * 4;
                    vpu(Opcode::VTrans,
                        {imm(int64_t(tt)), m_bpar + int64_t(m_a.wstage + band_at(j, m)), imm(m_k.C),
                         imm(128)});
                    if (m_pro.held) {
                        const int64_t col = int64_t(m) * m_k.C;
                        m_pro.held({m_b, imm(int64_t(tt)), imm(k), m_k.C,
                                    [&, col](const isa::Reg& d) {
                                        E(Opcode::Li, {d, imm(col * 4)});
                                    },
                                    [&](Opcode op, std::initializer_list<isa::Arg> args) {
                                        vpu(op, args);
                                    },
                                    m_member});
                    }
                    convert([&](int q) { return imm(int64_t(wbf(slot, m, q))); }, imm(int64_t(tt)),
                            imm(int64_t(k) * m_k.C), m_a.wf, m_a.wr1, m_a.wr2);
                }
            else if (w_staged)
                held_converts(j, slot);
            if (m_one && j == 0) early_transposes();
            // The previous group's results leave after this step's transfers are queued, so
            // the in-order DMA engine does not hold the next tiles behind them. In a batch of
            // one K step a group, after its matmuls: the VPU's epilogue then runs beside them.
            const bool flush_after = batched() && m_KT == 1;
            if (!w_direct && !split && !flush_after && j == flush_step) {
                flush(fmt::format("{}{}", tag, j), j, nm);
            }
            if (converts) E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
            // With two steps, step j + 2 is the next batch's step j, in the same area: once step
            // j's panel is converted (with more, as soon as step j's loads have arrived).
            if (m_lead && m_KT == 2) lead_loads(j, first, last);
            // (m_c_pair: the second member writes the parity its first member waited for.)
            if (batched() && j == 0 && !(m_c_pair && m_mi == 1))
                E(Opcode::Wait, {m_stores.flag, m_stores.count});
            for (uint32_t p = 0; p < nm; ++p) {
                // Panel p on MXU m; the MXU's last panel of the step carries its flag.
                const uint32_t m = p % m_k.mxus;
                const bool flagged = p + m_k.mxus >= nm;
                for (size_t i = 0; i < m_passes.size(); ++i) {
                    const auto [pa, pw] = m_passes[i];
                    const bool fresh = j == 0 && i == 0 && !m_k.accumulate;
                    const bool end = i + 1 == m_passes.size();
                    E(Opcode::MxuLw,
                      {imm(m), imm(int64_t(wbf(slot, p, pw))), imm(k), imm(nn(last, p))});
                    const isa::Arg dst = m_par + int64_t(m_a.c + p * m_m.cpanel + c_pair_rows());
                    if (end && flagged)
                        E(Opcode::MxuMm, {imm(m), dst, imm(int64_t(abf(pa, j))), m_rows,
                                          imm(fresh ? 0 : 1), m_mxu_flag[m]});
                    else if (end && last && j + 1 == m_KT && staggered_end() && p < first_piece())
                        E(Opcode::MxuMm, {imm(m), dst, imm(int64_t(abf(pa, j))), m_rows,
                                          imm(fresh ? 0 : 1), m_half});
                    else
                        E(Opcode::MxuMm,
                          {imm(m), dst, imm(int64_t(abf(pa, j))), m_rows, imm(fresh ? 0 : 1)});
                }
                if (flagged && (m == 0 || cls(m) != cls(m - 1)))
                    E(Opcode::Add, {mxu_count(m), mxu_count(m), imm(1)});
            }
            if (!w_direct && !split && flush_after && j == flush_step) {
                flush(fmt::format("{}{}", tag, j), j + 1, nm);
            }
            // A quarter of the next block's bands beside this step's matmuls.
            if (m_band && first) band_chunk(j);
            // Split: panel p's epilogue and stores after step flush_step + p is issued, so the
            // MXUs run that step while the VPU works on one panel.
            if (split && j >= flush_step && j < flush_step + m_GW) {
                flush(fmt::format("{}{}", tag, j), j + 1, nm, j - flush_step, j - flush_step + 1);
            }
            if (w_direct) {
                // Step j + 1's tiles go into the slot step j - 1 read; step j keeps the MXUs
                // busy meanwhile. The previous group's results leave after them.
                if (j + 1 < m_KT) {
                    for (uint32_t m = 0; m < mxus_of(nm); ++m) wait_mxu(m, 1);
                    loads(j + 1, first, last, 1 - slot, kW);
                }
                if (j == flush_step) {
                    flush(fmt::format("{}{}", tag, j), j + 1, nm);
                }
            }
            prefetch(j);
            if (j == 0 && halves) m_b.bind(*first_step_done);
        }
        // m_c_pair: the pair's first member's results wait in the C parity for the second's.
        if (m_c_pair && m_mi == 0) return;
        // This group's C is pending until the next group's step 1 (or the end).
        set_pending(first, last);
        E(Opcode::Li, {m_pending, imm(last ? 2 : 1)});
        if (m_c_pair) {
            // The pair's rows, from its first member's columns.
            E(Opcode::Sub, {m_paddr, m_paddr, imm(int64_t(m_p.M) * 4)});
            E(Opcode::Add, {m_prows, m_prows, imm(int64_t(m_p.M))});
        }
        if (m_three) {
            const isa::Label wrap = m_b.label("c_wrap");
            E(Opcode::Add, {m_par, m_par, imm(int64_t(m_GW) * m_m.cpanel)});
            E(Opcode::Bltu, {m_par, imm(3 * int64_t(m_GW) * m_m.cpanel), wrap});
            E(Opcode::Li, {m_par, imm(0)});
            m_b.bind(wrap);
        } else if (!m_one) {
            E(Opcode::Xor, {m_par, m_par, imm(int64_t(m_GW) * m_m.cpanel)});
        }
        if (m_ahead && (!m_pair || m_mi == 1)) {  // the next batch's operands: the other slot
            E(Opcode::Xor, {m_sa, m_sa, imm(slot_a())});
            E(Opcode::Xor, {m_sw, m_sw, imm(slot_w())});
        }
    }

    /// a_trans_ring_applies: the streamed panel's R x R tiles [t0, t1) of step j, staged at `src`,
    /// each transposed into one of two tiles of the transposed copy and converted from there into
    /// its rows of the step's bf16 panel (the VPU runs in order, so tile t + 2's transpose follows
    /// tile t's conversion).
    void trans_tiles(uint64_t src, uint32_t t0, uint32_t t1, uint32_t j) {
        const uint32_t R = m_k.R;
        const uint64_t tile = uint64_t(R) * R * 4;
        for (uint32_t t = t0; t < t1; ++t) {
            const uint64_t tt = m_a.att + (t % 2) * tile;
            vpu(Opcode::VTrans, {imm(int64_t(tt)), imm(int64_t(src + t * tile)), imm(R), imm(R)});
            convert([&](int q) { return imm(int64_t(abf(q, j) + uint64_t(t) * R * R * 2)); },
                    imm(int64_t(tt)), imm(int64_t(R) * R), m_a.af, m_a.ar1, m_a.ar2);
        }
    }

    /// DotKey::one_c_buffer: the pending group's C panels, transposed into the c_trans area its
    /// flush reads, before this group's first matmuls overwrite them. The area is free: its
    /// last stores (the group before the pending one) were waited for at this group's start.
    void early_transposes() {
        const uint32_t T = m_k.block_rows;
        const isa::Label skip = m_b.label("early_t"), done = m_b.label("early_t_done");
        E(Opcode::Beq, {m_pending, imm(0), skip});
        for (uint32_t m = 0; m < m_k.mxus; ++m) wait_mxu(m, 0);
        const auto transposes = [&](bool last) {
            for (uint32_t m = 0; m < panels(last); ++m)
                vpu(Opcode::VTrans,
                    {imm(int64_t(m_a.tt + m * m_m.cpanel)),
                     m_ppar + int64_t(m_a.c + m * m_m.cpanel), imm(T), imm(nn(last, m))});
        };
        if (m_G > 1) {
            const isa::Label last = m_b.label("early_t_last");
            E(Opcode::Beq, {m_pending, imm(2), last});
            transposes(false);
            E(Opcode::Jmp, {done});
            m_b.bind(last);
        }
        transposes(true);
        m_b.bind(done);
        // The flush may store a panel with no epilogue before the step's wait for the VPU.
        E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
        m_b.bind(skip);
    }

    /// The kernel's first step (block 0 of part 0) with its streamed panel in two halves
    /// (split_start): step 0's held tiles, then the panel's first half and its second half on a
    /// flag of its own, then step 1's loads; the first panel of each MXU starts on the first
    /// half's rows as soon as they and the held tiles are in, and goes on with the second half's
    /// rows on the same weights (an mm after an mm keeps the array's tile: no drain between
    /// them); the other panels follow on the whole panel. Nothing runs before it, so no MXU or
    /// store waits; the same products in the same order as one step of the whole panel.
    template <class HeldConverts>
    void first_step_in_halves(bool last, const HeldConverts& held_converts) {
        const uint32_t R = m_k.R, k = kk(0), nm = panels(last);
        const uint32_t rows0 = std::min(m_p.M, m_k.block_rows), h = ceil_div(rows0, R) / 2 * R;
        const uint64_t tile = uint64_t(R) * R * 4, at = m_a.astage;
        const Opcode op = load_op(m_A);
        loads(0, true, last, 0, kW);
        E(op, {imm(int64_t(at)), m_A.value, imm(h / R), imm(int64_t(tile)), imm(int64_t(tile)),
               imm(int64_t(tile)), m_loads[0].flag});
        E(Opcode::Add, {m_loads[0].count, m_loads[0].count, imm(1)});
        E(op, {imm(int64_t(at + h / R * tile)), m_A.value + int64_t(h / R * tile),
               imm(ceil_div(rows0 - h, R)), imm(int64_t(tile)), imm(int64_t(tile)),
               imm(int64_t(tile)), m_half0});
        loads(1, true, last, 1, kBoth);
        // Rows [r0, r1) of the panel: each R x R tile to R rows of k values, then bf16.
        const auto convert_rows = [&](uint32_t r0, uint32_t r1) {
            if (m_atr) {
                trans_tiles(at, r0 / R, ceil_div(r1, R), 0);
                return;
            }
            for (uint32_t t = r0 / R; t < ceil_div(r1, R); ++t)
                vpu(Opcode::VTrans, {imm(int64_t(m_a.att + t * tile)), imm(int64_t(at + t * tile)),
                                     imm(R), imm(R)});
            convert([&](int q) { return imm(int64_t(abf(q, 0) + uint64_t(r0) * k * 2)); },
                    imm(int64_t(m_a.att + uint64_t(r0) * k * 4)), imm(int64_t(r1 - r0) * k), m_a.af,
                    m_a.ar1, m_a.ar2);
        };
        const uint32_t firsts = std::min(m_k.mxus, nm);
        const auto mm = [&](uint32_t p, uint32_t r0, isa::Arg rows) {
            const uint32_t m = p % m_k.mxus;
            const bool flagged = p + m_k.mxus >= nm && (r0 > 0 || p >= firsts);
            const isa::Arg dst =
                m_par + int64_t(m_a.c + p * m_m.cpanel + uint64_t(r0) * nn(last, p) * 4);
            const isa::Arg src = imm(int64_t(abf(0, 0) + uint64_t(r0) * k * 2));
            if (flagged) {
                E(Opcode::MxuMm, {imm(m), dst, src, rows, imm(0), m_mxu_flag[m]});
                if (m == 0 || cls(m) != cls(m - 1))
                    E(Opcode::Add, {mxu_count(m), mxu_count(m), imm(1)});
            } else {
                E(Opcode::MxuMm, {imm(m), dst, src, rows, imm(0)});
            }
        };
        const auto lw = [&](uint32_t p) {
            E(Opcode::MxuLw,
              {imm(p % m_k.mxus), imm(int64_t(wbf(0, p, 0))), imm(k), imm(nn(last, p))});
        };
        E(Opcode::Wait, {m_loads[0].flag, m_loads[0].count});
        convert_rows(0, h);
        held_converts(0, 0);
        E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
        for (uint32_t p = 0; p < firsts; ++p) {
            lw(p);
            mm(p, 0, imm(h));
        }
        E(Opcode::Wait, {m_half0, imm(1)});
        convert_rows(h, rows0);
        E(Opcode::Wait, {m_vpu.flag, m_vpu.count});
        for (uint32_t p = 0; p < firsts; ++p) mm(p, h, imm(rows0 - h));
        for (uint32_t p = firsts; p < nm; ++p) {
            lw(p);
            mm(p, 0, m_rows);
        }
    }

    /// DotKey::accumulate: the group's C panels from where their values start (C fp32 row-major,
    /// the RHS stationary) into the C parity the group's matmuls write, counted with step 0's
    /// loads, so step 0 waits for them (the group's start waited for the stores that last read
    /// that parity).
    void c_loads(bool first, bool last) {
        const uint64_t cn = m_k.N;
        E(Opcode::Mul, {m_cat, m_row, imm(int64_t(cn * 4))});
        E(Opcode::Add, {m_cat, m_cat, m_cin.value});
        if (first || last)
            E(Opcode::Add, {m_cat, m_cat, imm(int64_t(first_col(first) * 4))});
        else
            E(Opcode::Add, {m_cat, m_cat, m_col});
        const uint32_t nm = panels(last);
        for (uint32_t p = 0; p < nm; ++p) {
            const uint32_t n = nn(last, p);
            E(load_op(m_cin),
              {m_par + int64_t(m_a.c + p * m_m.cpanel), m_cat + int64_t(uint64_t(p) * m_k.C * 4),
               m_rows, imm(n * 4), imm(n * 4), imm(int64_t(cn * 4)), m_loads[0].flag});
        }
        E(Opcode::Add, {m_loads[0].count, m_loads[0].count, imm(nm)});
    }

    /// pending_addr = C's address of the group's first result, pending_rows, pending_parity
    /// and, for Column sides, pending_col = the side's first value x 4.
    void set_pending(bool first, bool last) {
        const uint64_t e = m_k.store_bf16 ? 2 : 4, cn = m_k.c_row ? m_k.c_row : m_k.N;
        const bool lhs = m_p.lhs, panels_out = m_k.c == DotLayout::Gemm;
        // Bytes from one streamed row, and from one column of the problem, to the next (in
        // VpuTiles the rows and columns of whole bands and panels: 8 rows are a band of NT
        // tiles, 128 columns one tile).
        uint64_t per_row = lhs ? e : panels_out ? uint64_t(m_k.C) * e : cn * e;
        uint64_t per_col = lhs ? cn * e : panels_out ? uint64_t(m_k.M) * e : e;
        if (m_k.c == DotLayout::TransposedTiles && lhs) {            // streamed rows: C^T's rows
            per_row = uint64_t(ceil_div(m_k.M, m_k.C)) * m_k.C * 4;  // row / C rows of MT tiles
            per_col = uint64_t(m_k.C) * 4;                           // m0 / C tiles
        } else if (m_k.c == DotLayout::TransposedTiles) {            // C^T in R x C tiles, rows = N
            per_row = uint64_t(m_k.C) * 4;                           // row / C tiles
            per_col = uint64_t(ceil_div(m_k.M, m_k.C)) * m_k.C * 4;  // n0 / C rows of MT tiles
        } else if (m_k.c == DotLayout::TransposedVpuTiles) {         // the problem's C in tiles
            per_row = vtiles(m_p.N) * kBandBytes / 8;
            per_col = kBandBytes / 128;
        } else if (m_k.c == DotLayout::VpuTiles && lhs) {
            // A streamed row is a column of C (blocks of whole tiles), a column of the problem
            // a row of C: a band of ceil(N / 128) tiles per 8 rows.
            per_row = kBandBytes / 128;
            per_col = uint64_t(ceil_div(m_k.N, 128)) * kBandBytes / 8;
        } else if (m_k.c == DotLayout::VpuTiles) {
            per_row = vtiles(m_p.N) * kBandBytes / 8;
            per_col = kBandBytes / 128;
        }
        E(Opcode::Mul, {m_paddr, m_row, imm(int64_t(per_row))});
        E(Opcode::Add, {m_paddr, m_paddr, m_C.value});
        if (first || last) {
            E(Opcode::Add, {m_paddr, m_paddr, imm(int64_t(first_col(first) * per_col))});
        } else if (per_col == 4) {
            E(Opcode::Add, {m_paddr, m_paddr, m_col});
        } else {
            E(Opcode::Shr, {m_tmp, m_col, imm(2)});
            E(Opcode::Mul, {m_tmp, m_tmp, imm(int64_t(per_col))});
            E(Opcode::Add, {m_paddr, m_paddr, m_tmp});
        }
        E(Opcode::Add, {m_prows, m_rows, imm(0)});
        E(Opcode::Add, {m_ppar, m_par, imm(0)});
        // dst = 4 x the group's first column of the problem, or of the block's first row.
        const auto group_col4 = [&](const isa::Reg& dst) {
            if (first || last)
                E(Opcode::Li, {dst, imm(int64_t(first_col(first) * 4))});
            else
                E(Opcode::Add, {dst, m_col, imm(0)});
        };
        const auto block_row4 = [&](const isa::Reg& dst) { E(Opcode::Mul, {dst, m_row, imm(4)}); };
        if (m_ep.position) {
            // C's first row of the group x 4: the block's row, or with the LHS stationary the
            // group's column of the problem.
            if (lhs)
                group_col4(m_tmp);
            else
                block_row4(m_tmp);
            E(Opcode::Sw, {m_tmp, m_pos.word(0)});
        }
        if (m_k.column_sides) {
            // C's first column: the other one.
            if (lhs)
                block_row4(m_pcol);
            else
                group_col4(m_pcol);
            if (m_col_slot) E(Opcode::Add, {m_pcol, m_pcol, imm(int64_t(col_slot_bytes()))});
        }
    }

    isa::Builder& m_b;
    const DotKey& m_k;
    Problem m_p;
    const Epilogue& m_ep;
    const Prologue& m_pro;
    Map m_m;  ///< offsets and sizes
    Map m_a;  ///< absolute addresses of the areas
    int m_P;
    uint32_t m_KT, m_NT, m_GW, m_G;
    uint32_t m_AS;          ///< slots of the streamed operand's bf16 panels (KT kept, or 2)
    Operand m_A, m_W, m_C;  ///< the streamed and the stationary operand, C
    Operand m_cin;          ///< where C's starting values are (DotKey::accumulate)
    DotOperands m_ops;      ///< A, W, C as the caller named them
    DotBatch m_batch;       ///< the caller's, its period doubled for m_three
    std::function<void(uint32_t)> m_rebind;  ///< part i's addresses (emit_dot_parts)
    uint32_t m_col_slot = 0;                 ///< the Column sides' slot of the part being emitted
    std::function<void(const isa::Reg&)> m_member;  ///< dst = the batch (PrologueTile::batch)
    bool m_band = false;                            ///< band loads (band_loads_apply, in a batch)
    Tally m_bands;                                  ///< the loads of the held tiles
    isa::Reg m_bpar, m_nxt;     ///< the current block's buffer offset; the next block's A
    isa::Arg m_pass_word;       ///< the pass number (a batch's loop)
    int64_t m_next_a = 0;       ///< bytes from this batch's A to the next batch's
    bool m_next_last = false;   ///< the period's last member: the next batch is a pass on
    bool m_next_guard = false;  ///< ... and only while passes remain
    bool m_ahead = false;       ///< head-ahead loads (ahead_apply, in a batch)
    isa::Reg m_sa, m_sw;        ///< their staging slots' offsets (streamed, held)
    DotBatch::Member m_next;    ///< bytes to the next batch's A and W, and its lanes
    bool m_three = false;       ///< three C buffers, odd members' stores on m_stores2
    Tally m_stores2;            ///< the stores odd members issue (m_three)
    bool m_pair = false;        ///< two members' windows in the same tiles, loaded once
    bool m_lead = false;        ///< band loads with the streamed panels two steps ahead
    bool m_lead_pair = false;   ///< ... a pair's windows in the same tiles, loaded once
    bool m_c_pair = false;      ///< ... and its results in one C panel, stored together
    bool m_step_ahead = false;  ///< the next batch's first step loaded beside the last
    bool m_one = false;         ///< C in one buffer (one_c_buffer_applies)
    bool m_pre = false;         ///< ... and the pending group's panels transposed already
    bool m_ring = false;        ///< the Full sides in two panel slots (side_ring_applies)
    bool m_atr = false;         ///< the streamed tiles' transposed copy in two tiles
    bool m_stage_ok = false;    ///< ... the last block's panels 2, 3 in the staging slots
    bool m_staged = false;      ///< full_tile: panels 2 and 3 in the staging slots
    size_t m_mi = 0;            ///< the member being emitted
    std::vector<std::pair<int, int>> m_passes;

    std::vector<isa::Vmem> m_vmem;
    isa::Reg m_par, m_pending, m_row, m_rows, m_col, m_pcol, m_tmp, m_wb, m_t14, m_t15, m_cnt;
    isa::Reg m_paddr, m_prows, m_ppar;
    isa::Smem m_pos;  ///< Epilogue::position: the pending group's first row of C x 4
    isa::Reg m_cat;  ///< the group's C panels' starting values in HBM (DotKey::accumulate)
    Tally m_loads[2], m_vpu, m_stores, m_sides;
    Tally m_sides2;  ///< the Full side tiles loaded into the staging slots (m_stage_ok)
    /// The VPU work of every other panel of a flush (stores()): reset at each flush's start,
    /// when nothing counted on it is in flight, so its count is the emitted code's.
    isa::Flag m_vpu2;
    isa::Flag m_half;     ///< the last group's first panel of each MXU done (staggered_end)
    isa::Flag m_half0;    ///< the second half of the kernel's first streamed panel (split_start)
    uint32_t m_part = 0;  ///< the part being emitted (emit_dot_parts)
    isa::Flag m_mxu_flag[kDotMaxMxus];  ///< per MXU: its flagged matmul of each step
    isa::Reg m_mxu_count[kDotMaxMxus];  ///< steps issued, per class (cls)
    bool m_per_mxu = true;              ///< a count per MXU, else per class
};

}  // namespace

namespace {

/// dot_unsupported's reasons that do not depend on the block rows.
std::string layout_unsupported(const DotKey& k) {
    if (k.M == 0 || k.K == 0 || k.N == 0)
        return fmt::format("empty shape {} x {} x {}", k.M, k.K, k.N);
    if (k.group_panels == 0) return "no column panels per MXU (group_panels)";
    if (k.parts == 0) return "no parts";
    if (k.R == 0 || k.C == 0 || k.mxus == 0 || k.mxus > kDotMaxMxus)
        return fmt::format("MXU {} x {}, {} of them: the kernel uses 1 to {}", k.R, k.C, k.mxus,
                           kDotMaxMxus);
    const bool lhs = k.stationary == Stationary::Lhs;
    // A in MXU tiles is streamed (contracting dim minor) or, stored transposed, held.
    if (k.a == DotLayout::Tiles && lhs)
        return "A in MXU tiles (not transposed) is streamed by the RHS stationary";
    if ((k.a == DotLayout::Tiles || k.a == DotLayout::TransposedTiles ||
         k.w == DotLayout::TransposedTiles || k.c == DotLayout::TransposedTiles ||
         (lhs && k.w == DotLayout::Tiles)) &&
        (k.R != k.C || !std::has_single_bit(k.R)))
        return fmt::format(
            "A in MXU tiles, W or C transposed in them need a square MXU of a power of two "
            "(R = {}, C = {})",
            k.R, k.C);
    // A streamed operand in MXU tiles (A, or with the LHS stationary W stored transposed) is
    // read a whole tile per R rows: K a whole number of tiles.
    const Problem pk = problem(k);
    if ((pk.a == DotLayout::Tiles || pk.a == DotLayout::TransposedTiles) && k.K % k.R)
        return fmt::format("a streamed operand in MXU tiles needs K a multiple of {} (K = {})", k.R,
                           k.K);
    if (k.c == DotLayout::TransposedTiles && (k.store_bf16 || k.full_sides))
        return "C transposed in MXU tiles needs an fp32 store and no Full sides";
    if (k.c != DotLayout::RowMajor && k.c != DotLayout::Gemm && k.c != DotLayout::VpuTiles &&
        k.c != DotLayout::TransposedTiles && !(lhs && k.c == DotLayout::TransposedVpuTiles))
        return fmt::format(
            "C is written row-major, in the GEMM's panels or in 8 x 128 tiles (transposed "
            "with the LHS stationary), not {}",
            dot_layout_name(k.c));
    // The problem the kernel runs reads its streamed and its held operand in row-major tiles:
    // with the RHS stationary A and W as they are, with the LHS stationary W^T and A^T.
    // The streamed operand may be stored transposed too (read a tile column at a time and
    // transposed in VMEM); the held one only as it is. Tiles pad their dims (XLA's tiled
    // layout): the kernel reads the padding of a last tile only where it lands outside the
    // values it uses, and may write garbage into C's padding (its meaning is unspecified).
    const bool vpu_tiles = k.a == DotLayout::VpuTiles || k.w == DotLayout::VpuTiles ||
                           k.c == DotLayout::VpuTiles || k.a == DotLayout::TransposedVpuTiles ||
                           k.w == DotLayout::TransposedVpuTiles ||
                           k.c == DotLayout::TransposedVpuTiles;
    if (vpu_tiles && (k.R % 128 || k.C % 128))
        return fmt::format(
            "8 x 128 tiles need an MXU of a multiple of 128 rows and columns (R = {}, C = {})", k.R,
            k.C);
    {
        // Windows: only where the kernel reads a tile's lanes piecewise.
        const Problem p = problem(k);
        const bool a_win = p.a_band_tiles || p.a_lane, w_win = p.w_band_tiles || p.w_lane;
        const uint32_t a_width = p.a == DotLayout::VpuTiles ? p.K : p.M;
        const uint32_t w_width = p.w == DotLayout::VpuTiles ? p.N : p.K;
        if (a_win && !((p.a == DotLayout::VpuTiles && (p.K < 128 || p.a_lane == 0)) ||
                       p.a == DotLayout::TransposedVpuTiles))
            return "a window of a wider array needs the streamed operand in 8 x 128 tiles with K "
                   "below 128, or transposed";
        if (w_win && !((p.w == DotLayout::VpuTiles && (p.N < 128 || p.w_lane == 0)) ||
                       p.w == DotLayout::TransposedVpuTiles))
            return "a window of a wider array needs the held operand in 8 x 128 tiles with N "
                   "below 128, or transposed";
        if ((p.a_lane && p.a_lane + a_width > 128) || (p.w_lane && p.w_lane + w_width > 128))
            return "a window that starts inside a tile must end in it";
    }
    if (k.c_row && (k.c != DotLayout::RowMajor || k.c_row < k.N))
        return "a row stride of C needs C row-major with rows of at least N values";
    if ((k.c == DotLayout::VpuTiles || k.c == DotLayout::TransposedVpuTiles) && k.store_bf16)
        return "C in 8 x 128 tiles needs an fp32 store";
    if (k.w == DotLayout::Gemm && k.R % 2)
        return fmt::format("the GEMM's W tiles need an even MXU height (R = {})", k.R);
    if (lhs) {
        auto fp32 = [](DotLayout l) {
            return l == DotLayout::RowMajor || l == DotLayout::Transposed ||
                   l == DotLayout::TransposedVpuTiles || l == DotLayout::VpuTiles;
        };
        if (!(fp32(k.a) || k.a == DotLayout::TransposedTiles) ||
            !(fp32(k.w) || k.w == DotLayout::TransposedTiles || k.w == DotLayout::Tiles) ||
            k.c == DotLayout::Gemm)
            return fmt::format(
                "with the LHS stationary the kernel reads A and W fp32 (row-major, "
                "transposed or in 8 x 128 tiles; also transposed in MXU tiles) and writes C "
                "row-major or in 8 x 128 tiles; A is {}, W {}, C {}",
                dot_layout_name(k.a), dot_layout_name(k.w), dot_layout_name(k.c));
        if (k.c == DotLayout::TransposedVpuTiles && (k.M % 128 || k.full_sides))
            return fmt::format(
                "C in transposed 8 x 128 tiles needs M a multiple of 128 and no Full sides "
                "(M = {}, {} Full sides)",
                k.M, k.full_sides);
    }
    return "";
}

/// dot_unsupported's reasons about the block rows.
std::string blocks_unsupported(const DotKey& k) {
    if (k.block_rows == 0) return "no block rows (plan it with plan_dot)";
    // C^T in MXU tiles: every block starts a tile.
    if (k.c == DotLayout::TransposedTiles && k.block_rows % k.C)
        return fmt::format(
            "C transposed in MXU tiles needs blocks of a multiple of {} rows, not {}", k.C,
            k.block_rows);
    // A streamed operand in MXU tiles is read whole tiles of R rows per block.
    if ((problem(k).a == DotLayout::Tiles || problem(k).a == DotLayout::TransposedTiles) &&
        k.block_rows % k.R)
        return fmt::format(
            "a streamed operand in MXU tiles needs blocks of a multiple of {} rows, not {}", k.R,
            k.block_rows);
    // A streamed operand stored transposed in tiles is read whole tile columns per block.
    if (problem(k).a == DotLayout::TransposedVpuTiles && k.block_rows % 128)
        return fmt::format(
            "a streamed operand in transposed 8 x 128 tiles needs blocks of a multiple of 128 "
            "rows, not {}",
            k.block_rows);
    // Each block's rows are C's columns there: whole 8 x 128 tiles of C per block.
    if (k.stationary == Stationary::Lhs && k.c == DotLayout::VpuTiles && k.block_rows % 128)
        return fmt::format(
            "C in 8 x 128 tiles with the LHS stationary needs blocks of a multiple of 128 rows, "
            "not {}",
            k.block_rows);
    return "";
}

}  // namespace

std::string dot_unsupported(const DotKey& k) {
    std::string why = layout_unsupported(k);
    return why.empty() ? blocks_unsupported(k) : why;
}

uint64_t dot_vmem_bytes(const DotKey& key) {
    return vmem_map(key).end;
}

namespace {

/// gemm_estimate_cycles of the same schedule with the dot's own traffic.
double gemm_like_estimate(const hw::BoardConfig& cfg, const DotKey& key) {
    const Problem p = problem(key);
    GemmTiling t;
    t.R = key.R;
    t.C = key.C;
    t.Kp = ceil_div(p.K, key.R) * key.R;
    t.Np = ceil_div(p.N, key.C) * key.C;
    t.block_rows = key.block_rows;
    t.mxus = key.mxus;
    t.precision = key.precision;
    const GemmTraffic x{.a_fp32 = staged(p.a),
                        .w_fp32 = staged(p.w),
                        .full_sides = key.full_sides,
                        .column_sides = key.column_sides,
                        .c_bf16 = key.store_bf16};
    return gemm_estimate_cycles(cfg, t, p.M, x);
}

/// A streamed operand in the MXU's tiles: each block's panel one contiguous run (a streamed
/// fp32 parameter), the case where the kernel may take several panels per MXU.
bool streams_mxu_tiles(const DotKey& key) {
    const Problem p = problem(key);
    return (p.a == DotLayout::Tiles || p.a == DotLayout::TransposedTiles) && staged(p.w);
}

}  // namespace

double dot_estimate_cycles(const hw::BoardConfig& cfg, const DotKey& key) {
    // Other dots keep the library GEMM's estimate (group by group, it moved ResNet-50's
    // pointwise convolutions to blocks that ran slower).
    if (!streams_mxu_tiles(key)) return gemm_like_estimate(cfg, key);
    // gemm_estimate_cycles's terms group by group: a block's first group brings the streamed
    // operand's panels (fp32: twice the library's bf16 bytes) besides its tiles, the later
    // groups only their tiles, so the first group can be bound by the HBM while the others
    // wait on the MXUs; one total of bytes against one of MXU cycles would hide it.
    const Problem p = problem(key);
    const uint64_t R = key.R, C = key.C, KT = ceil_div(p.K, key.R), NT = ceil_div(p.N, key.C);
    const uint64_t GW = group_width(key), G = ceil_div(NT, GW), T = key.block_rows;
    const uint64_t blocks = ceil_div(p.M, key.block_rows), last_rows = p.M - (blocks - 1) * T;
    const uint64_t P = parts_of(key.precision), npass = mxu_passes(key.precision).size();
    const uint64_t va = staged(p.a) ? 4 : 2 * P, vw = staged(p.w) ? 4 : 2 * P;
    const uint64_t vout = (key.store_bf16 ? 2 : 4) + 4 * uint64_t(key.full_sides);
    const double bw = hw::hbm_peak_bytes_per_cycle(cfg);
    const double share = bw * kGemmPlannedHbmShare;
    // A streamed panel in the MXU's tiles is one contiguous run per step, which the HBM
    // serves as one sequential stream; other panels and tiles are runs of their own.
    const double panel_share = bw * kSequentialHbmShare;
    double busy = 0;
    uint64_t pending = 0;  // bytes of the previous group's C (and side tiles), moved beside
    for (uint64_t b = 0; b < blocks; ++b) {
        const uint64_t rows = b + 1 < blocks ? T : last_rows;
        const uint64_t step = hw::MxuTimer::swap_step_cycles(uint32_t(R), uint32_t(C),
                                                             cfg.core.mxu_swap_drains, rows);
        for (uint64_t g = 0; g < G; ++g) {
            const uint64_t np = g + 1 < G ? GW : NT - (G - 1) * GW;
            const double mxu = double(KT * ceil_div(uint32_t(np), key.mxus) * step * npass);
            const uint64_t bytes = KT * np * R * C * vw + pending;
            const double panels = g == 0 ? double(KT * rows * R * va) / panel_share : 0;
            busy += std::max(mxu, double(bytes) / share + panels);
            pending = rows * np * C * vout;
        }
    }
    // Exposed: the first panel and tiles before the first matmul, a kept block's first panel
    // after the previous block's matmuls, the last group's C after the last matmul, the
    // Column sides.
    const uint64_t first = std::min<uint64_t>(p.M, T) * R * va;
    const uint64_t exposed = first + std::min(NT, GW) * R * C * vw + pending +
                             (blocks - 1) * first + uint64_t(key.column_sides) * NT * C * 4;
    return double(exposed) / bw + busy;
}

std::optional<DotKey> plan_dot(const hw::BoardConfig& cfg, DotKey shape, uint64_t vmem_bytes) {
    DotKey k = shape;
    k.R = cfg.core.mxu_rows;
    k.C = cfg.core.mxu_cols;
    k.mxus = cfg.core.mxus;
    k.block_rows = 8;
    if (const std::string why = layout_unsupported(k); !why.empty())
        throw DeviceError(ErrorKind::Usage, "dot: " + why);
    const uint32_t rows = problem(k).M;
    // Even cuts of the rows, longest first; below R rows a block only adds steps bound by the
    // weight load (as plan_gemm).
    // Blocks of whole tiles where C's tiles or a streamed operand's need them
    // (blocks_unsupported): a streamed operand in transposed tiles in blocks of the array's
    // rows (one tile column on a 128-row array), or of C's tiles if they are longer.
    const bool column_blocks = problem(k).a == DotLayout::TransposedVpuTiles;
    const uint32_t unit = k.c == DotLayout::TransposedTiles || problem(k).a == DotLayout::Tiles ||
                                  problem(k).a == DotLayout::TransposedTiles
                              ? k.C
                          : k.stationary == Stationary::Lhs && k.c == DotLayout::VpuTiles ? 128
                                                                                          : 8;
    // Several panels per MXU in a group where an fp32 parameter streams from the MXU's tiles
    // (a block's panel one contiguous run of twice the library's bf16 bytes) past a staged
    // held operand: fewer groups, each panel read once and spread over every step
    // (DotKey::group_panels).
    const uint32_t per_mxu = ceil_div(ceil_div(problem(k).N, k.C), k.mxus);
    const uint32_t widest = streams_mxu_tiles(k) ? per_mxu : 1;
    const auto search = [&](bool one) {
        k.one_c_buffer = one;
        std::optional<DotKey> best;
        double best_est = 0;
        for (uint32_t gp = 1; gp <= widest; ++gp) {
            k.group_panels = gp;
            // Only widths that take a group fewer.
            if (gp > 1 && ceil_div(per_mxu, gp) == ceil_div(per_mxu, gp - 1)) continue;
            for (uint32_t nb = 1; nb <= ceil_div(rows, 8); ++nb) {
                k.block_rows = ceil_div(ceil_div(rows, nb), unit) * unit;
                if (column_blocks) {
                    if (nb > 1) break;
                    k.block_rows = std::max({128u, unit, k.R});
                }
                if (k.block_rows > kMaxBlockRows || !blocks_unsupported(k).empty()) continue;
                if (best && k.block_rows < std::min(rows, k.R)) break;
                if (dot_vmem_bytes(k) > vmem_bytes) continue;
                const double est = dot_estimate_cycles(cfg, k);
                if (!best || est < best_est) {
                    best = k;
                    best_est = est;
                }
            }
        }
        return best;
    };
    const std::optional<DotKey> two = search(false);
    if (!shape.one_c_buffer || !one_c_buffer_applies(shape)) return two;
    // C in one buffer where the VMEM it frees takes fewer blocks: each block costs every held
    // tile a drain (T + 254 cycles a step), while one buffer costs each group a wait for its
    // transposes before its first matmuls (a few hundred cycles).
    const std::optional<DotKey> one = search(true);
    const auto blocks = [&](const std::optional<DotKey>& x) {
        return x ? ceil_div(rows, x->block_rows) : ~0u;
    };
    return blocks(one) < blocks(two) ? one : two;
}

namespace {

/// emit_dot's checks of its arguments (throws isa::BuildError naming the problem).
void check_dot(isa::Builder& b, const DotKey& key, const DotOperands& ops, const Epilogue& epilogue,
               const DotBatch& batch) {
    if (const std::string why = dot_unsupported(key); !why.empty()) throw b.error("dot: " + why);
    if (key.parts > 1) throw b.error("dot: a key of several parts runs through emit_dot_parts");
    const uint32_t cols = epilogue.count(EpilogueSide::Kind::Column);
    const uint32_t fulls = epilogue.count(EpilogueSide::Kind::Full);
    if (cols != key.column_sides || fulls != key.full_sides ||
        epilogue.store_bf16 != key.store_bf16)
        throw b.error(fmt::format(
            "dot: the epilogue has {} Column and {} Full sides and {} bf16 store; the key says "
            "{}, {} and {}",
            cols, fulls, epilogue.store_bf16 ? "a" : "no", key.column_sides, key.full_sides,
            key.store_bf16 ? "a" : "no"));
    auto check = [&](const Operand& o, const std::string& what) {
        if (o.kind == Operand::Kind::Scalar)
            throw b.error(
                fmt::format("dot: {} is a scalar; a tensor in HBM or VMEM expected", what));
    };
    check(ops.a, "A");
    check(ops.w, "W");
    check(ops.c, "C");
    for (size_t i = 0; i < epilogue.sides.size(); ++i)
        check(epilogue.sides[i].place, fmt::format("epilogue side {}", i));
    if (!batch.period.empty()) {
        if (key.full_sides)
            throw b.error("dot: a batch of dots with Full epilogue sides (one per batch)");
        if (!batch.passes) throw b.error("dot: a batch of no passes");
        for (const Operand* o : {&ops.a, &ops.w, &ops.c})
            if (o->kind != Operand::Kind::Hbm || !o->value.reg)
                throw b.error("dot: a batch of dots reads and writes HBM through registers");
        for (const DotBatch::Member& x : batch.period) {
            DotKey k = key;
            k.a_lane = x.a_lane;
            k.w_lane = x.w_lane;
            if (const std::string why = dot_unsupported(k); !why.empty())
                throw b.error("dot: a batch's member: " + why);
        }
    }
    if (key.one_c_buffer && !batch.period.empty())
        throw b.error("dot: a batch of dots keeps C in two buffers (one_c_buffer)");
    if (key.accumulate && (!batch.period.empty() || key.stationary != Stationary::Rhs ||
                           key.c != DotLayout::RowMajor || key.store_bf16 || key.c_row ||
                           ops.c.kind != Operand::Kind::Hbm))
        throw b.error(
            "dot: C accumulated from its values needs one dot with the RHS stationary and C "
            "fp32 row-major in HBM");
}

}  // namespace

void emit_dot(isa::Builder& b, const DotKey& key, const DotOperands& ops, const Epilogue& epilogue,
              const Prologue& prologue, const DotBatch& batch) {
    check_dot(b, key, ops, epilogue, batch);
    if (key.one_c_buffer && prologue.streamed)
        throw b.error("dot: C in one buffer with a prologue on the streamed operand's blocks");
    DotGen(b, key, ops, epilogue, prologue, batch).emit();
}

void emit_dot_accumulate(isa::Builder& b, const DotKey& key, const DotOperands& ops,
                         const streaming::Operand& c_in, const Epilogue& epilogue) {
    if (!key.accumulate) throw b.error("dot: C's starting values for a key without accumulate");
    if (c_in.kind != Operand::Kind::Hbm) throw b.error("dot: C's starting values not in HBM");
    check_dot(b, key, ops, epilogue, {});
    DotGen(b, key, ops, epilogue, {}, {}, nullptr, &c_in).emit();
}

void emit_dot_parts(isa::Builder& b, const DotKey& key, const DotOperands& ops,
                    const Epilogue& epilogue, const std::function<void(uint32_t part)>& rebind) {
    if (key.parts < 2) {
        emit_dot(b, key, ops, epilogue);
        return;
    }
    if (key.full_sides) throw b.error("dot: parts of a merged dot with Full epilogue sides");
    if (key.accumulate) throw b.error("dot: parts of a merged dot that accumulate into C");
    if (!rebind) throw b.error("dot: parts of a merged dot without their addresses");
    for (const Operand* o : {&ops.a, &ops.w, &ops.c})
        if (o->kind != Operand::Kind::Hbm || !o->value.reg)
            throw b.error("dot: parts of a merged dot read and write HBM through registers");
    DotKey one = key;
    one.parts = 1;
    if (const std::string why = dot_unsupported(one); !why.empty()) throw b.error("dot: " + why);
    if (epilogue.count(EpilogueSide::Kind::Column) != key.column_sides || epilogue.store_bf16 ||
        key.store_bf16 || epilogue.count(EpilogueSide::Kind::Full))
        throw b.error("dot: the parts' epilogue does not match the key");
    DotGen(b, key, ops, epilogue, {}, {}, rebind).emit();
}

isa::Program generate(const DotKey& key) {
    if (key.column_sides || key.full_sides)
        throw isa::BuildError(
            "kernel 'dot': a dot with epilogue sides is emitted with its epilogue (emit_dot)");
    isa::Builder b(key.name());
    const isa::Reg a = b.arg("a"), w = b.arg("w"), c = b.arg("c");
    Epilogue ep;
    ep.store_bf16 = key.store_bf16;
    emit_dot(b, key, {Operand::hbm(a), Operand::hbm(w), Operand::hbm(c)}, ep);
    b.emit(Opcode::Halt, {});
    return b.finish();
}

std::optional<MatmulKey> plan_matmul(const hw::BoardConfig& cfg, uint32_t M, uint32_t K, uint32_t N,
                                     bool ta, bool tb, Precision precision, bool bias) {
    MatmulKey t{.M = M,
                .K = K,
                .N = N,
                .ta = ta,
                .tb = tb,
                .precision = precision,
                .R = cfg.core.mxu_rows,
                .C = cfg.core.mxu_cols,
                .mxus = cfg.core.mxus,
                .bias = bias};
    // The longest blocks first: each weight tile costs a drain (core.mxu_swap_drains), so rows
    // per tile are worth more than anything a shorter block would save.
    for (uint32_t nb = 1; nb <= ceil_div(M, 8); ++nb) {
        t.block_rows = ceil_div(ceil_div(M, nb), 8) * 8;
        if (t.block_rows > kMaxBlockRows) continue;
        if (dot_vmem_bytes(t.dot()) <= cfg.core.vmem_bytes) break;
        t.block_rows = 0;
    }
    if (!t.block_rows) return std::nullopt;
    return t;
}

isa::Program generate(const MatmulKey& key) {
    isa::Builder b(key.name());
    const isa::Reg a = b.arg("a"), w = b.arg("b"), c = b.arg("c");
    Epilogue ep;
    if (key.bias) {
        // The bias row, added to each C panel after the last pass (bias_add's arithmetic).
        const isa::Reg bias = b.arg("bias");
        ep.sides.push_back({EpilogueSide::Kind::Column, Operand::hbm(isa::s(bias.index()))});
        ep.body = [](EpilogueTile& t) {
            t.vpu(Opcode::VAddRow, {t.out(), t.out(), t.side(0), t.rows(), imm(t.cols())});
        };
        // emit_dot copies the address into a register of its own before it takes s4 for its
        // row counter (the text kernel's numbering), so the argument's register goes back.
    }
    emit_dot(b, key.dot(), {Operand::hbm(a), Operand::hbm(w), Operand::hbm(c)}, ep);
    b.emit(Opcode::Halt, {});
    return b.finish();
}

}  // namespace tpu::driver
