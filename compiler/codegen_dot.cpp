// SPDX-License-Identifier: Apache-2.0
// Output fusions rooted at a dot: the fused dot kernel with the fusion's epilogue
// (compiler/README.md, "Output fusions of a dot"; driver/kernels/matmul_kernel.h).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"
#include "compiler/evaluator.h"
#include "compiler/stages.h"
#include "driver/kernels/epilogue.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler::gen {
namespace {

/// An elementwise op of a whole tile `x` and a literal `c` (`x op c`, or `c op x` when not
/// `x_first`: Add, Mul and Max only) in the VPU's scalar forms, into `dst`: x - c is x + (-c) in
/// IEEE arithmetic, and x / c (c finite and not 0) is vpu_divide's factor folded at compile
/// time, x * vpu_reciprocal(c), negated where 0 > c: the same fp32 products as the VPU's
/// nine-instruction sequence, in one (attention's 1 / sqrt(d)). False, and nothing emitted,
/// for any other op or divisor. The epilogue, the prologue and the reductions' steps all use it.
template <class Vpu>
bool emit_literal_op(Vpu&& vpu, OpKind kind, const isa::Arg& dst, const isa::Arg& x, float c,
                     const isa::Arg& n, bool x_first = true) {
    switch (kind) {
        case OpKind::Add:
            vpu(Opcode::VAddS, {dst, x, fimm(c), n});
            return true;
        case OpKind::Mul:
            vpu(Opcode::VMulS, {dst, x, fimm(c), n});
            return true;
        case OpKind::Max:
            vpu(Opcode::VMaxS, {dst, x, fimm(c), n});
            return true;
        case OpKind::Sub:
            if (!x_first) return false;
            vpu(Opcode::VAddS, {dst, x, fimm(-c), n});
            return true;
        case OpKind::Div:
            if (!x_first || !std::isfinite(c) || c == 0.0f) return false;
            vpu(Opcode::VMulS, {dst, x, fimm(vpu_reciprocal(c)), n});
            if (0.0f > c) vpu(Opcode::VMulS, {dst, dst, fimm(-1.0f), n});
            return true;
        default:
            return false;
    }
}

/// Whether emit_literal_op emits `x op c` (or `c op x`).
bool literal_op_lowered(OpKind kind, float c, bool x_first) {
    return emit_literal_op([](Opcode, std::initializer_list<isa::Arg>) {}, kind, imm(0), imm(0), c,
                           imm(0), x_first);
}

namespace st = driver::streaming;

/// Bytes of one epilogue area: the largest result tile of `k` (block_rows x C fp32; with the
/// LHS stationary at most C rows of block_rows).
uint64_t epilogue_area_bytes(const driver::DotKey& k) {
    return (uint64_t(k.block_rows) * k.C * 4 + 511) / 512 * 512;
}

/// The dot kernel's VMEM budget for the next try when plan `k` and its epilogue's areas need
/// `over` bytes more than VMEM has. The areas are a block of rows each (epilogue_area_bytes),
/// so when they alone exceed VMEM (GELU's erf after a [4096, 192] x [192, 768] dot: at a
/// 4096-row block each area is 2 MiB, and erf takes kScratch of them besides its results) a
/// smaller budget for the kernel is also a shorter block and smaller areas: the kernel's
/// budget is halved (shorter row blocks, each a pass over the held operand) rather than
/// giving up. 0 when nothing shorter can be tried.
uint64_t epilogue_fit_budget(const driver::DotKey& k, uint64_t over) {
    const uint64_t own = driver::dot_vmem_bytes(k);
    if (own > over) return own - over;
    return k.block_rows > 8 ? own / 2 : 0;
}

/// The dot kernel's layout of a rank-2 fusion operand or result whose dim `rows_dim` is the
/// problem's rows (A: M of M x K, W: K of K x N, C: M of M x N), or nullopt.
std::optional<driver::DotLayout> dot_layout_of(const FusionValue& fv, int64_t rows_dim, bool is_w,
                                               bool is_c, const hw::BoardConfig& b) {
    const Layout& l = fv.layout;
    if (fv.shape.rank() != 2 || l.minor_to_major.size() != 2) return std::nullopt;
    const bool rows_major = l.minor_to_major[1] == rows_dim;  // stored as (rows, cols)
    if (l.tile.empty()) {
        if (rows_major) return driver::DotLayout::RowMajor;
        if (!is_c) return driver::DotLayout::Transposed;
        return std::nullopt;
    }
    if (!rows_major) {
        // Stored transposed in VPU tiles: what the LHS stationary reads (A^T held, W^T
        // streamed) and may write (C^T, as a next dot holding it stationary reads it).
        if (l.tile == std::vector<int64_t>{8, 128}) return driver::DotLayout::TransposedVpuTiles;
        // A weight [out, in] as the forward holds it ({0,1:T(128,128)}), read by dX = dY W or
        // written by dW = dY^T X in its parameter's layout; or a [N, K] weight that the LHS
        // stationary streams ({1,0:T(128,128)}).
        // Or an activation that a dot holds, written so by the dot before it
        // ({0,1:T(128,128)}: each held tile one contiguous run).
        if (l.tile == std::vector<int64_t>{b.core.mxu_rows, b.core.mxu_cols})
            return driver::DotLayout::TransposedTiles;
        return std::nullopt;
    }
    // W held in the MXU's tiles, or A streamed in them (a streamed parameter's layout).
    if (!is_c && l.tile == std::vector<int64_t>{b.core.mxu_rows, b.core.mxu_cols})
        return driver::DotLayout::Tiles;
    if (l.tile == std::vector<int64_t>{8, 128}) return driver::DotLayout::VpuTiles;
    return std::nullopt;
}

const FusionValue* operand_of(const Fusion& f, ValueId v) {
    for (const FusionValue& fv : f.operands)
        if (fv.value == v) return &fv;
    return nullptr;
}

/// One dot of a fusion whose operand is a concatenation along its free dim (dot_merger's merged
/// Q, K, V): the part this dot reads, and the slice of the result it computes with the ops
/// downstream of it (its epilogue) and the fusion result they write.
struct Part {
    int side = 1;                   ///< the concatenated operand: 0 (lhs) or 1 (rhs)
    ValueId operand = ~ValueId(0);  ///< the part of the concatenation
    int64_t size = 0;               ///< its free dim
    ValueId root = ~ValueId(0);     ///< the slice of the dot's result it computes
    std::set<OpId> ops;             ///< the ops downstream of the slice (the epilogue)
    const FusionValue* result = nullptr;
};

/// One batch of a batched dot (attention's heads): where its operands' matrices lie.
struct Batch {
    struct Operand {
        const FusionValue* fv = nullptr;
        driver::DotLayout layout = driver::DotLayout::VpuTiles;
        uint64_t offset = 0;      ///< bytes from the array's start to the matrix's first tile
        uint32_t band_tiles = 0;  ///< a window's array's tiles per band (0: its own)
        uint32_t lane = 0;        ///< a window's first lane
        std::set<OpId> prologue;  ///< the reshape it is read through
    };
    Operand a, w;
    std::shared_ptr<const DotPrologue> prologue;  ///< an operand computed as it is loaded
    uint64_t c_offset = 0;
    driver::DotLayout c_layout = driver::DotLayout::VpuTiles;
    uint32_t c_row = 0;  ///< C's values per row when the batches' rows interleave (0: N)
    int64_t M = 0, K = 0, N = 0;
};

DotFusion plan_one(const Graph& g, const Fusion& f, const hw::BoardConfig& board, const Part* part,
                   const Batch* batch = nullptr);

/// Bytes of one [rows, cols] f32 matrix in T(8,128) tiles.
uint64_t tiled_bytes(int64_t rows, int64_t cols) {
    return uint64_t((rows + 7) / 8) * uint64_t((cols + 127) / 128) * 4096;
}

/// Dims of a rank-n array kept when `drop` (unit batch dims) are folded away: keep[i] is the
/// i-th kept dim.
std::vector<int64_t> kept_dims(size_t n, const std::vector<int64_t>& drop) {
    std::vector<int64_t> keep;
    for (int64_t d = 0; d < int64_t(n); ++d)
        if (std::find(drop.begin(), drop.end(), d) == drop.end()) keep.push_back(d);
    return keep;
}

/// Layout `l` over only the dims `keep` (renumbered 0..): the same bytes when the dropped
/// dims are unit dims and, in a tiled layout, not one of the two tiled (most minor) dims;
/// nullopt otherwise.
std::optional<Layout> fold_layout(const Layout& l, const std::vector<int64_t>& keep) {
    Layout r;
    r.tile = l.tile;
    for (size_t i = 0; i < l.minor_to_major.size(); ++i) {
        const auto it = std::find(keep.begin(), keep.end(), l.minor_to_major[i]);
        if (it == keep.end()) {
            if (!l.tile.empty() && i < l.tile.size()) return std::nullopt;
            continue;
        }
        r.minor_to_major.push_back(int64_t(it - keep.begin()));
    }
    return r;
}

/// `fv` viewed as the matrix `mn` ([rows, cols], neither 1) when its dims are those with unit
/// dims inserted (PyTorch's [1, S, D] around a linear): its layout with the unit dims folded
/// away, the same bytes; nullptr when it is not such a view or the fold changes the tiles.
/// Also a batch of matrices [.., R, N] row-major whose rows merge into [M, N] (PyTorch's [B, S,
/// D] viewed as [B S, D]): untiled, or in T(8,128) tiles with R a multiple of the tile's rows
/// (no band straddles two matrices), the same bytes.
std::shared_ptr<FusionValue> matrix_view(const FusionValue& fv, const std::vector<int64_t>& mn) {
    const auto& d = fv.shape.dims;
    if (mn.size() == 2 && d.size() > 2 && d.back() == mn[1] &&
        fv.shape.elements() == mn[0] * mn[1] &&
        fv.layout == Layout{row_major(fv.shape.rank()).minor_to_major, fv.layout.tile} &&
        (fv.layout.tile.empty() ||
         (fv.layout.tile.size() == 2 && d[d.size() - 2] % fv.layout.tile[0] == 0))) {
        auto view = std::make_shared<FusionValue>(fv);
        view->shape.dims = mn;
        view->layout = Layout{{1, 0}, fv.layout.tile};
        return view;
    }
    if (mn.size() != 2 || nonunit(mn) != mn || nonunit(fv.shape.dims) != mn) return nullptr;
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < fv.shape.rank(); ++i)
        if (fv.shape.dims[size_t(i)] != 1) keep.push_back(i);
    const std::optional<Layout> l = fold_layout(fv.layout, keep);
    if (!l) return nullptr;
    auto view = std::make_shared<FusionValue>(fv);
    view->shape.dims = mn;
    view->layout = *l;
    return view;
}

}  // namespace

/// Ops a dot fusion computes on one of its dot's operands as the kernel loads it
/// (compiler/README.md, "The attention's softmax in the values dot"): a chain of elementwise
/// steps on the operand's fp32 tile, in place, from one array the fusion reads (the source);
/// a binary step's other operand is a scalar or a vector with one value per row of the operand's
/// free dim (a softmax's max and sum, broadcast along the contracting dim). Vectors are [B, Q]
/// (B batches, Q the free extent), loaded whole into VMEM once per fusion.
struct DotPrologue {
    /// One step: `x = x op other` (or `op(x)`).
    struct Step {
        OpKind kind = OpKind::Exp;
        enum class Other : uint8_t { None, Vector, Scalar } other = Other::None;
        size_t vector = 0;
        float scalar = 0;
    };
    int side = 0;  ///< the dot operand computed (0 lhs, 1 rhs)
    std::vector<Step> steps;
    std::vector<const FusionValue*> vectors;
    std::vector<char> tiled;    ///< per vector: in T(8,128) tiles (else row-major)
    std::vector<char> negated;  ///< per vector: -v is needed
    std::vector<char> divisor;  ///< per vector: the divide's factor of v is needed
    int64_t B = 0, Q = 0;
    bool by_rows = true;      ///< the tile's rows are the free dim (streamed), else its columns
    bool needs_tile = false;  ///< a broadcast tile (Mul or Div by a vector across columns)
    /// VMEM bytes of one [B, Q] vector area.
    uint64_t vector_bytes() const { return (uint64_t(B * Q * 4) + 511) / 512 * 512; }
    /// VMEM it takes: each vector, its derived forms, two scratch vectors, the tile.
    uint64_t vmem_bytes(const hw::BoardConfig& board) const {
        uint64_t n = 2;
        for (size_t i = 0; i < vectors.size(); ++i) n += 1 + negated[i] + divisor[i];
        return n * vector_bytes() +
               (needs_tile ? uint64_t(board.core.mxu_rows) * board.core.mxu_cols * 4 : 0);
    }
};

namespace {

/// The prologue that computes dot operand `v` (side `side`) of output fusion `f`, its ops
/// added to `ops`; nullptr when `v` is read from memory or through a reshape.
std::shared_ptr<DotPrologue> plan_prologue(const Graph& g, const Fusion& f, ValueId v, int side,
                                           int64_t B, std::set<OpId>& ops) {
    if (!inside_fusion(f, g, v) || g.producer(v).kind == OpKind::Reshape) return nullptr;
    const Op& dot = g.op(f.hero);
    const DotDims& d = dot.attrs.dot;
    const int64_t cd = side == 0 ? d.lhs_contracting[0] : d.rhs_contracting[0];
    const auto& bd = side == 0 ? d.lhs_batch : d.rhs_batch;
    const Shape& vs = g.shape(v);
    std::vector<int64_t> want;
    int64_t fd = -1;
    for (int64_t i = 0; i < vs.rank(); ++i) {
        if (i == cd) continue;
        want.push_back(i);
        if (std::find(bd.begin(), bd.end(), i) == bd.end()) fd = i;
    }
    auto pro = std::make_shared<DotPrologue>();
    pro->side = side;
    pro->B = B;
    pro->Q = fd < 0 ? 0 : vs.dims[size_t(fd)];
    std::vector<DotPrologue::Step> rev;
    ValueId cur = v;
    while (inside_fusion(f, g, cur)) {
        const Op& op = g.producer(cur);
        ops.insert(g.value(cur).producer);
        DotPrologue::Step st;
        st.kind = op.kind;
        if (op.operands.size() == 1 && std::any_of(std::begin(kUnary), std::end(kUnary),
                                                   [&](auto u) { return u.first == op.kind; })) {
            rev.push_back(st);
            cur = op.operands[0];
            continue;
        }
        if (op.operands.size() != 2 || !(op.kind == OpKind::Add || op.kind == OpKind::Sub ||
                                         op.kind == OpKind::Mul || op.kind == OpKind::Div))
            not_generated(f, fmt::format("{} computing a dot operand", op_name(op.kind)));
        int bi = -1;
        for (int i = 1; i >= 0; --i) {
            const ValueId o = op.operands[size_t(i)];
            if (inside_fusion(f, g, o) && g.producer(o).kind == OpKind::Broadcast) bi = i;
        }
        if (bi < 0 || (bi == 0 && (op.kind == OpKind::Sub || op.kind == OpKind::Div)))
            not_generated(
                f, fmt::format("{} of two arrays computing a dot operand", op_name(op.kind)));
        const Op& bc = g.producer(op.operands[size_t(bi)]);
        ops.insert(g.value(op.operands[size_t(bi)]).producer);
        const ValueId x = bc.operands[0];
        const Shape& xs = g.shape(x);
        if (xs.elements() == 1 && inside_fusion(f, g, x) && g.producer(x).kind == OpKind::Literal &&
            op.kind != OpKind::Div) {
            ops.insert(g.value(x).producer);
            st.other = DotPrologue::Step::Other::Scalar;
            st.scalar = float(g.producer(x).attrs.scalar);
        } else {
            // A [.., B, .., Q] vector broadcast along the contracting dim, lying as [B, Q].
            std::vector<int64_t> keep;
            for (int64_t i = 0; i < xs.rank(); ++i)
                if (xs.dims[size_t(i)] != 1) keep.push_back(i);
            const FusionValue* fv = inside_fusion(f, g, x) ? nullptr : operand_of(f, x);
            std::optional<Layout> l;
            if (fv && keep.size() == 2) l = fold_layout(fv->layout, keep);
            if (!fv || bc.attrs.dims != want || fd < 0 || keep.size() != 2 ||
                xs.dims[size_t(keep[0])] != B || xs.dims[size_t(keep[1])] != pro->Q ||
                bc.attrs.dims[size_t(keep[1])] != fd || xs.dtype != DType::F32 || !l ||
                !(*l == Layout{{1, 0}, {}} || *l == Layout{{1, 0}, {8, 128}}))
                not_generated(f, fmt::format("a broadcast {} -> {} computing a dot operand",
                                             xs.to_string(), vs.to_string()));
            const auto it = std::find(pro->vectors.begin(), pro->vectors.end(), fv);
            st.other = DotPrologue::Step::Other::Vector;
            st.vector = size_t(it - pro->vectors.begin());
            if (it == pro->vectors.end()) {
                pro->vectors.push_back(fv);
                pro->tiled.push_back(!l->tile.empty());
                pro->negated.push_back(0);
                pro->divisor.push_back(0);
            }
        }
        rev.push_back(st);
        cur = op.operands[size_t(1 - bi)];
    }
    pro->steps.assign(rev.rbegin(), rev.rend());
    // The source: what the kernel loads, in the operand's shape.
    if (g.shape(cur).dims != vs.dims || g.shape(cur).dtype != DType::F32)
        not_generated(f, "a dot operand computed from an array of another shape");
    return pro;
}

/// The batches of a dot with one batch dim of more than one (unit batch dims, a batch of one
/// sequence of [1, H, S, d], are folded away: they hold one matrix per remaining batch as they
/// lie) whose operands are either [B, P, Q] arrays in T(8,128) tiles (one matrix per batch) or
/// a reshape of a [R, H x D] array in T(8,128) tiles to [R, H, D] with the batch dim H
/// (attention's head split: head h is the window of D lanes at column h D, read through with
/// the array's strides, never copied).
std::vector<Batch> plan_head_batches(const Graph& g, const Fusion& f);

std::vector<Batch> plan_batches(const Graph& g, const Fusion& f) {
    const Op& dot = g.op(f.hero);
    const DotDims& d = dot.attrs.dot;
    if (d.lhs_batch.size() == 2 && d.rhs_batch.size() == 2 &&
        g.shape(dot.operands[0]).dims[size_t(d.lhs_batch[0])] > 1 &&
        g.shape(dot.operands[0]).dims[size_t(d.lhs_batch[1])] > 1)
        return plan_head_batches(g, f);
    // The batch dims of extent one, per side and in the result (batch dims come first there).
    std::vector<int64_t> unit[2], res_unit;
    int64_t bdim[2] = {-1, -1};
    for (size_t i = 0; i < d.lhs_batch.size() && i < d.rhs_batch.size(); ++i) {
        if (g.shape(dot.operands[0]).dims[size_t(d.lhs_batch[i])] == 1) {
            unit[0].push_back(d.lhs_batch[i]);
            unit[1].push_back(d.rhs_batch[i]);
            res_unit.push_back(int64_t(i));
        } else if (bdim[0] < 0) {
            bdim[0] = d.lhs_batch[i];
            bdim[1] = d.rhs_batch[i];
        } else {
            bdim[0] = -2;
        }
    }
    if (bdim[0] < 0 || d.lhs_contracting.size() != 1 || d.rhs_contracting.size() != 1 ||
        g.shape(dot.operands[0]).rank() - int64_t(unit[0].size()) != 3 ||
        g.shape(dot.operands[1]).rank() - int64_t(unit[1].size()) != 3)
        not_generated(f, "a dot with batch dims other than one batch of matrices");
    const Layout tiled3{{2, 1, 0}, {8, 128}};
    const int64_t B = g.shape(dot.operands[0]).dims[size_t(bdim[0])];
    std::vector<Batch> out(static_cast<size_t>(B));
    int64_t dims[2][2];  // per side: free, contracting extent
    std::shared_ptr<DotPrologue> pro;
    std::set<OpId> pro_ops;
    for (int side = 0; side < 2; ++side) {
        ValueId v = dot.operands[size_t(side)];
        if (auto p = plan_prologue(g, f, v, side, B, pro_ops)) {
            if (pro) not_generated(f, "a batched dot with both operands computed");
            pro = p;
            // The kernel loads the source (the operand's shape) in its place.
            while (inside_fusion(f, g, v)) {
                const Op& op = g.producer(v);
                ValueId next = op.operands[0];
                if (op.operands.size() == 2 && inside_fusion(f, g, next) &&
                    g.producer(next).kind == OpKind::Broadcast)
                    next = op.operands[1];
                v = next;
            }
        }
        const Shape& full_vs = g.shape(v);
        const std::vector<int64_t> keep = kept_dims(full_vs.dims.size(), unit[side]);
        const auto at = [&](int64_t dim) {
            return int64_t(std::find(keep.begin(), keep.end(), dim) - keep.begin());
        };
        const int64_t bd = at(bdim[side]);
        const int64_t cd = at(side == 0 ? d.lhs_contracting[0] : d.rhs_contracting[0]);
        Shape vs = full_vs;
        vs.dims.clear();
        for (int64_t k : keep) vs.dims.push_back(full_vs.dims[size_t(k)]);
        const int64_t fd = 3 - bd - cd;
        dims[side][0] = vs.dims[size_t(fd)];
        dims[side][1] = vs.dims[size_t(cd)];
        for (int64_t b = 0; b < B; ++b) {
            Batch::Operand o;
            bool contracting_minor;  // the matrix's minor (lane) dim is the contracting one
            const bool unit_view =
                inside_fusion(f, g, v) && g.producer(v).kind == OpKind::Reshape &&
                !inside_fusion(f, g, g.producer(v).operands[0]) &&
                nonunit(g.shape(g.producer(v).operands[0]).dims) == nonunit(vs.dims) &&
                nonunit(vs.dims) == vs.dims;
            if (inside_fusion(f, g, v) && !unit_view) {
                const Op& r = g.producer(v);
                ValueId x = r.operands.empty() ? v : r.operands[0];
                const Shape& xs = g.shape(x);
                // A slice of whole rows of a [R, W] array (GPT-2's q, k, v of one projection):
                // the heads' windows start at its first column.
                int64_t first = 0;
                const Op* sl = inside_fusion(f, g, x) ? &g.producer(x) : nullptr;
                if (sl && sl->kind == OpKind::Slice && !inside_fusion(f, g, sl->operands[0]) &&
                    g.shape(sl->operands[0]).rank() == 2 && sl->attrs.dims[0] == 0 &&
                    sl->attrs.limits[0] == g.shape(sl->operands[0]).dims[0]) {
                    first = sl->attrs.dims[1];
                    x = sl->operands[0];
                }
                if (r.kind != OpKind::Reshape || inside_fusion(f, g, x) || xs.rank() != 2 ||
                    xs.dims[0] != vs.dims[0] || xs.dims[1] != vs.dims[1] * vs.dims[2] || bd != 1)
                    not_generated(f, fmt::format("{} before a batched dot", op_name(r.kind)));
                o.fv = operand_of(f, x);
                if (!(o.fv->layout == Layout{{1, 0}, {8, 128}}))
                    not_generated(f, fmt::format("a head split of an array in layout {}",
                                                 o.fv->layout.to_string()));
                const int64_t col = first + b * vs.dims[2];
                o.offset = uint64_t(col / 128) * 4096;
                o.lane = uint32_t(col % 128);
                o.band_tiles = uint32_t((g.shape(x).dims[1] + 127) / 128);
                o.prologue.insert(g.value(v).producer);
                if (first || x != r.operands[0]) o.prologue.insert(g.value(r.operands[0]).producer);
                contracting_minor = cd == 2;
            } else {
                // One matrix per batch: the batch dim most major, the other two in T(8,128)
                // tiles (either order: the lanes' dim contracting or free). Also through a
                // reshape that only inserts or deletes unit dims (PyTorch's [1, H, S, S]
                // viewed as [H, S, S] for bmm): the same tiles.
                ValueId src = v;
                std::vector<int64_t> src_keep = keep;
                if (unit_view) {
                    src = g.producer(v).operands[0];
                    src_keep.clear();
                    for (int64_t i = 0; i < g.shape(src).rank(); ++i)
                        if (g.shape(src).dims[size_t(i)] != 1) src_keep.push_back(i);
                    o.prologue.insert(g.value(v).producer);
                }
                o.fv = operand_of(f, src);
                if (!o.fv) not_generated(f, fmt::format("a batched dot operand %{} computed", v));
                const std::optional<Layout> l = fold_layout(o.fv->layout, src_keep);
                if (!l || l->minor_to_major.size() != 3 || l->minor_to_major[2] != bd ||
                    l->tile != std::vector<int64_t>{8, 128})
                    not_generated(f, fmt::format("a batched dot operand in layout {}",
                                                 o.fv->layout.to_string()));
                const auto& mtm = l->minor_to_major;
                o.offset =
                    uint64_t(b) * tiled_bytes(vs.dims[size_t(mtm[1])], vs.dims[size_t(mtm[0])]);
                contracting_minor = cd == mtm[0];
            }
            // A (M x K) is row-major when K is minor; W (K x N) when N is.
            const bool row_major = side == 0 ? contracting_minor : !contracting_minor;
            o.layout =
                row_major ? driver::DotLayout::VpuTiles : driver::DotLayout::TransposedVpuTiles;
            if (pro && pro->side == side) o.prologue.insert(pro_ops.begin(), pro_ops.end());
            (side == 0 ? out[size_t(b)].a : out[size_t(b)].w) = o;
        }
    }
    for (Batch& x : out) x.prologue = pro;
    // The result: [B, M, N] (unit batch dims folded away), each batch's matrix in T(8,128)
    // tiles or row-major (untiled: what a dot reading it through a merging reshape asked for).
    const size_t res_rank = g.shape(dot.results[0]).dims.size();
    std::optional<Layout> cl;
    if (f.results.size() == 1 && res_rank == 3 + res_unit.size())
        cl = fold_layout(f.results[0].layout, kept_dims(res_rank, res_unit));
    // Or untiled as [M, B, N] (attention's heads, each [S, d], merged back to [S, H d] by a
    // transpose and reshape that are then the same bytes): batch b's rows are B N values
    // apart, its first N values b N in.
    const bool c_tiled = cl && *cl == tiled3;
    const bool c_interleaved = cl && *cl == Layout{{2, 0, 1}, {}};
    if (!cl || !(c_tiled || c_interleaved || *cl == row_major(3)))
        not_generated(f, "a batched dot's result not one [B, M, N] array, tiled or row-major");
    for (int64_t b = 0; b < B; ++b) {
        Batch& x = out[size_t(b)];
        x.M = dims[0][0];
        x.K = dims[0][1];
        x.N = dims[1][0];
        x.c_layout = c_tiled ? driver::DotLayout::VpuTiles : driver::DotLayout::RowMajor;
        x.c_offset = uint64_t(b) * (c_tiled         ? tiled_bytes(x.M, x.N)
                                    : c_interleaved ? uint64_t(x.N * 4)
                                                    : uint64_t(x.M * x.N * 4));
        if (c_interleaved) x.c_row = uint32_t(B * x.N);
    }
    return out;
}

/// The batches of a dot with two batch dims {B, H} of more than one (transformers' attention
/// at batch B: `[B, H, S, d]` heads that PyTorch views as `[B H, S, d]` for `bmm`, the merge
/// moved past the dot by simplification), batch (b, h) the b H + h-th. An operand is either
/// a reshape of a `[B S, W]` array in T(8,128) tiles (a projection, or a slice of its columns)
/// to `[B, S, H, d]` with batch dims {0, 2}: head (b, h) is the window of rows b S .. (S a
/// multiple of the tile's 8 rows) and d lanes at column c0 + h d, read with the array's
/// strides; or a `[B, H, P, Q]` array whose two batch dims are most major and whose matrices
/// are T(8,128) tiles (the probabilities). The result `[B, H, M, N]` is one tiled or
/// row-major matrix per head, or untiled as `[B, M, H, N]` (the values, merged back to
/// `[B S, H d]` by a transpose and a reshape that are then the same bytes): head (b, h)'s
/// rows H N values apart from value b M H N + h N.
std::vector<Batch> plan_head_batches(const Graph& g, const Fusion& f) {
    const Op& dot = g.op(f.hero);
    const DotDims& d = dot.attrs.dot;
    if (d.lhs_contracting.size() != 1 || d.rhs_contracting.size() != 1 ||
        g.shape(dot.operands[0]).rank() != 4 || g.shape(dot.operands[1]).rank() != 4)
        not_generated(f, "a dot with two batch dims other than a batch of heads' matrices");
    const int64_t B = g.shape(dot.operands[0]).dims[size_t(d.lhs_batch[0])];
    const int64_t H = g.shape(dot.operands[0]).dims[size_t(d.lhs_batch[1])];
    std::vector<Batch> out(size_t(B * H));
    int64_t dims[2][2];  // per side: free, contracting extent
    for (int side = 0; side < 2; ++side) {
        const ValueId v = dot.operands[size_t(side)];
        const auto& bd = side == 0 ? d.lhs_batch : d.rhs_batch;
        const int64_t cd = side == 0 ? d.lhs_contracting[0] : d.rhs_contracting[0];
        const Shape& vs = g.shape(v);
        int64_t fd = -1;
        for (int64_t i = 0; i < 4; ++i)
            if (i != cd && i != bd[0] && i != bd[1]) fd = i;
        dims[side][0] = vs.dims[size_t(fd)];
        dims[side][1] = vs.dims[size_t(cd)];
        for (int64_t i = 0; i < B * H; ++i) {
            const int64_t b = i / H, h = i % H;
            Batch::Operand o;
            bool contracting_minor;  // the matrix's minor (lane) dim is the contracting one
            if (inside_fusion(f, g, v)) {
                const Op& r = g.producer(v);
                ValueId x = r.operands.empty() ? v : r.operands[0];
                int64_t first = 0;
                const Op* sl = inside_fusion(f, g, x) ? &g.producer(x) : nullptr;
                if (sl && sl->kind == OpKind::Slice && !inside_fusion(f, g, sl->operands[0]) &&
                    g.shape(sl->operands[0]).rank() == 2 && sl->attrs.dims[0] == 0 &&
                    sl->attrs.limits[0] == g.shape(sl->operands[0]).dims[0]) {
                    first = sl->attrs.dims[1];
                    x = sl->operands[0];
                }
                const Shape& rs = r.operands.empty() ? vs : g.shape(r.operands[0]);
                const int64_t S = vs.dims[1], D = vs.dims[3];
                if (r.kind != OpKind::Reshape || inside_fusion(f, g, x) || rs.rank() != 2 ||
                    bd != std::vector<int64_t>{0, 2} || rs.dims[0] != B * S ||
                    rs.dims[1] != H * D || S % 8 != 0)
                    not_generated(
                        f, fmt::format("{} before a dot over two batch dims", op_name(r.kind)));
                o.fv = operand_of(f, x);
                if (!o.fv || !(o.fv->layout == Layout{{1, 0}, {8, 128}}))
                    not_generated(f, fmt::format("a head split of an array in layout {}",
                                                 o.fv ? o.fv->layout.to_string() : "?"));
                const int64_t col = first + h * D;
                o.band_tiles = uint32_t((g.shape(x).dims[1] + 127) / 128);
                o.offset = uint64_t(b * S / 8) * o.band_tiles * 4096 + uint64_t(col / 128) * 4096;
                o.lane = uint32_t(col % 128);
                o.prologue.insert(g.value(v).producer);
                if (x != r.operands[0]) o.prologue.insert(g.value(r.operands[0]).producer);
                contracting_minor = cd == 3;
            } else {
                o.fv = operand_of(f, v);
                const Layout& l = o.fv->layout;
                if (bd != std::vector<int64_t>{0, 1} || l.tile != std::vector<int64_t>{8, 128} ||
                    l.minor_to_major.size() != 4 || l.minor_to_major[2] != 1 ||
                    l.minor_to_major[3] != 0)
                    not_generated(f, fmt::format("a dot operand over two batch dims in layout {}",
                                                 l.to_string()));
                const auto& mtm = l.minor_to_major;
                o.offset =
                    uint64_t(i) * tiled_bytes(vs.dims[size_t(mtm[1])], vs.dims[size_t(mtm[0])]);
                contracting_minor = cd == mtm[0];
            }
            // A (M x K) is row-major when K is minor; W (K x N) when N is.
            const bool row_major = side == 0 ? contracting_minor : !contracting_minor;
            o.layout =
                row_major ? driver::DotLayout::VpuTiles : driver::DotLayout::TransposedVpuTiles;
            (side == 0 ? out[size_t(i)].a : out[size_t(i)].w) = o;
        }
    }
    if (f.results.size() != 1)
        not_generated(f, "a dot over two batch dims with more than one result");
    const Layout& cl = f.results[0].layout;
    const bool c_tiled = cl == Layout{{3, 2, 1, 0}, {8, 128}};
    const bool c_interleaved = cl == Layout{{3, 1, 2, 0}, {}};
    if (!(c_tiled || c_interleaved || cl == row_major(4)))
        not_generated(
            f, fmt::format("a dot's result over two batch dims in layout {}", cl.to_string()));
    for (int64_t i = 0; i < B * H; ++i) {
        Batch& x = out[size_t(i)];
        x.M = dims[0][0];
        x.K = dims[0][1];
        x.N = dims[1][0];
        x.c_layout = c_tiled ? driver::DotLayout::VpuTiles : driver::DotLayout::RowMajor;
        const int64_t b = i / H, h = i % H;
        x.c_offset = c_tiled         ? uint64_t(i) * tiled_bytes(x.M, x.N)
                     : c_interleaved ? uint64_t(b * x.M * H * x.N + h * x.N) * 4
                                     : uint64_t(i * x.M * x.N * 4);
        if (c_interleaved) x.c_row = uint32_t(H * x.N);
    }
    return out;
}

}  // namespace

namespace {

/// Whether a merged dot's part plans differ only in their buffers (key, epilogue, sides' kinds),
/// with nothing a part of one kernel cannot have (Full sides, a prologue, views, offsets).
bool same_parts(const std::vector<DotFusion>& plans) {
    const DotFusion& x = plans[0];
    const auto same_value = [](const EpValue& u, const EpValue& v) {
        return u.kind == v.kind && u.area == v.area && u.side == v.side &&
               (u.kind != EpKind::Scalar ||
                std::bit_cast<uint32_t>(u.scalar) == std::bit_cast<uint32_t>(v.scalar));
    };
    for (const DotFusion& y : plans) {
        if (y.key != x.key || y.key.full_sides || y.key.store_bf16 || y.prologue ||
            !y.views.empty() || y.a_off || y.w_off || y.c_off || y.batch ||
            y.sides.size() != x.sides.size() || y.areas != x.areas ||
            y.steps.size() != x.steps.size())
            return false;
        for (size_t i = 0; i < y.steps.size(); ++i) {
            const EpStep &s = x.steps[i], &t = y.steps[i];
            if (s.kind != t.kind || s.comparison != t.comparison || s.exponent != t.exponent ||
                s.in.size() != t.in.size() || !same_value(s.out, t.out))
                return false;
            for (size_t j = 0; j < s.in.size(); ++j)
                if (!same_value(s.in[j], t.in[j])) return false;
        }
    }
    return true;
}

}  // namespace

std::vector<DotFusion> plan_dot_fusion(const Graph& g, const Fusion& f,
                                       const hw::BoardConfig& board) {
    const Op& dot = g.op(f.hero);
    if (dot.kind != OpKind::Dot)
        not_generated(f, fmt::format("an output fusion of {}", op_name(dot.kind)));
    if (!dot.attrs.dot.lhs_batch.empty()) {
        // One dot per batch (attention's heads), each reading its matrices where they lie.
        std::vector<DotFusion> plans;
        for (const Batch& b : plan_batches(g, f)) {
            plans.push_back(plan_one(g, f, board, nullptr, &b));
            plans.back().batch = int64_t(plans.size() - 1);
        }
        return plans;
    }
    // A concatenated operand (through conversions) along its free dim: each part is a dot of
    // its own over the slice of the result it makes, so the parts' buffers are read as they
    // lie (no concatenation is materialised) and each slice's epilogue runs on its tiles.
    const DotDims& d = dot.attrs.dot;
    for (int side = 0; side < 2; ++side) {
        ValueId v = dot.operands[size_t(side)];
        if (!inside_fusion(f, g, v) || g.producer(v).kind != OpKind::Concatenate) continue;
        const Op& cat = g.producer(v);
        const auto& contracting = side == 0 ? d.lhs_contracting : d.rhs_contracting;
        if (g.shape(v).rank() != 2 || contracting.size() != 1 || cat.attrs.axis == contracting[0])
            not_generated(f, "a concatenation along a contracting dim before the dot");
        const int64_t out_dim = side == 0 ? 0 : 1;  // the free dim's place in the result
        // Every op of the fusion but the dot and the concatenation is downstream of one slice
        // of the result that matches one part exactly.
        std::vector<Part> parts;
        int64_t at = 0;
        for (ValueId x : cat.operands) {
            Part pt;
            pt.side = side;
            pt.operand = x;
            pt.size = g.shape(x).dims[size_t(cat.attrs.axis)];
            for (OpId id : f.ops) {
                const Op& op = g.op(id);
                if (op.kind != OpKind::Slice || op.operands[0] != dot.results[0]) continue;
                const Shape& rs = g.shape(dot.results[0]);
                std::vector<int64_t> start(2, 0), limit = rs.dims;
                start[size_t(out_dim)] = at;
                limit[size_t(out_dim)] = at + pt.size;
                if (op.attrs.dims == start && op.attrs.limits == limit) pt.root = op.results[0];
            }
            if (pt.root == ~ValueId(0))
                not_generated(f, "a concatenated dot operand whose parts' results are not sliced");
            at += pt.size;
            parts.push_back(std::move(pt));
        }
        std::set<OpId> claimed{f.hero, g.value(v).producer};
        for (Part& pt : parts) {
            claimed.insert(g.value(pt.root).producer);
            std::set<ValueId> reach{pt.root};
            for (OpId id : f.ops) {
                const Op& op = g.op(id);
                if (std::none_of(op.operands.begin(), op.operands.end(),
                                 [&](ValueId o) { return reach.count(o) > 0; }))
                    continue;
                pt.ops.insert(id);
                for (ValueId r : op.results) reach.insert(r);
            }
            for (const FusionValue& r : f.results)
                if (reach.count(r.value)) {
                    if (pt.result) not_generated(f, "a part of a merged dot with two results");
                    pt.result = &r;
                }
            if (!pt.result) not_generated(f, "a part of a merged dot without a result");
            for (OpId id : pt.ops)
                if (!claimed.insert(id).second)
                    not_generated(f, "an epilogue op that reads two parts of a merged dot");
        }
        // Each part's epilogue also takes what its ops read that does not come from the dot
        // (a bias's broadcast, a literal): cheap ops a part may share with another.
        std::set<ValueId> from_dot{dot.results[0]};
        for (OpId id : f.ops) {
            const Op& op = g.op(id);
            if (std::any_of(op.operands.begin(), op.operands.end(),
                            [&](ValueId o) { return from_dot.count(o) > 0; }))
                for (ValueId r : op.results) from_dot.insert(r);
        }
        for (Part& pt : parts) {
            std::vector<OpId> todo(pt.ops.begin(), pt.ops.end());
            while (!todo.empty()) {
                const Op& op = g.op(todo.back());
                todo.pop_back();
                for (ValueId o : op.operands)
                    if (inside_fusion(f, g, o) && !from_dot.count(o) &&
                        pt.ops.insert(g.value(o).producer).second)
                        todo.push_back(g.value(o).producer);
            }
        }
        if (f.results.size() != parts.size())
            not_generated(f, "a merged dot whose results are not one per part");
        // Nothing that reads the dot's result may be left out of every part.
        for (OpId id : f.ops)
            if (!claimed.count(id) && std::any_of(g.op(id).results.begin(), g.op(id).results.end(),
                                                  [&](ValueId r) { return from_dot.count(r) > 0; }))
                not_generated(f, "an op of a merged dot that reads the whole result");
        std::vector<DotFusion> plans;
        for (const Part& pt : parts) plans.push_back(plan_one(g, f, board, &pt));
        // Parts alike in all but their buffers run in one kernel (driver::emit_dot_parts), a
        // part's blocks after the previous one's in its pipeline: its first loads and matmuls
        // beside the previous part's last stores, not after them. As a batch's (below), every
        // column of a part in one group where it fits: the streamed fp32 panel then spreads
        // over all of a block's steps instead of making its first group's HBM-bound, and the
        // group's whole C, stored after its last step, overlaps the next part's first steps.
        if (plans.size() > 1 && same_parts(plans)) {
            driver::DotKey k = plans[0].key;
            k.parts = uint32_t(plans.size());
            driver::DotKey wide = k;
            const uint32_t cols = wide.stationary == driver::Stationary::Rhs ? wide.N : wide.M;
            wide.group_panels = ((cols + wide.C - 1) / wide.C + wide.mxus - 1) / wide.mxus;
            const auto fits = [&](const driver::DotKey& x) {
                return driver::dot_unsupported(x).empty() &&
                       driver::dot_vmem_bytes(x) +
                               uint64_t(plans[0].areas) * epilogue_area_bytes(x) + 4096 <=
                           board.core.vmem_bytes;
            };
            const driver::DotKey* pick = fits(wide) ? &wide : fits(k) ? &k : nullptr;
            if (pick)
                for (DotFusion& p : plans) p.key = *pick;
        }
        return plans;
    }
    return {plan_one(g, f, board, nullptr)};
}

namespace {

DotFusion plan_one(const Graph& g, const Fusion& f, const hw::BoardConfig& board, const Part* part,
                   const Batch* batch) {
    DotFusion p;
    const Op& dot = g.op(f.hero);
    if (dot.kind != OpKind::Dot)
        not_generated(f, fmt::format("an output fusion of {}", op_name(dot.kind)));
    const DotDims& d = dot.attrs.dot;
    if (!batch &&
        (!d.lhs_batch.empty() || d.lhs_contracting.size() != 1 || d.rhs_contracting.size() != 1 ||
         g.shape(dot.operands[0]).rank() != 2 || g.shape(dot.operands[1]).rank() != 2))
        not_generated(f, "a dot with batch dims or operands of rank other than 2");
    if (f.dots.empty()) not_generated(f, "a dot without a plan");
    const driver::Precision prec =
        detail::mxu_precision(dot.attrs.precision, g.shape(dot.operands[0]).dtype);
    std::set<OpId> prologue;
    // Each operand back through conversions to the array the fusion reads.
    const auto source = [&](ValueId v) -> const FusionValue* {
        while (inside_fusion(f, g, v)) {
            const Op& op = g.producer(v);
            // Through a transpose of the array: its dims in the transposed order.
            const Op* tr = nullptr;
            if (op.kind == OpKind::Reshape && inside_fusion(f, g, op.operands[0]) &&
                g.producer(op.operands[0]).kind == OpKind::Transpose &&
                !inside_fusion(f, g, g.producer(op.operands[0]).operands[0]))
                tr = &g.producer(op.operands[0]);
            // A view that only inserts or deletes unit dims of a tiled array: its tiles.
            if (op.kind == OpKind::Reshape && !inside_fusion(f, g, op.operands[0]) &&
                g.shape(v).rank() == 2) {
                const FusionValue* x = operand_of(f, op.operands[0]);
                if (auto view =
                        x && !x->layout.tile.empty() ? matrix_view(*x, g.shape(v).dims) : nullptr) {
                    if (x->shape.dtype != DType::F32)
                        not_generated(f, "a reshaped dot operand that is not f32");
                    p.views.push_back(view);
                    prologue.insert(g.value(v).producer);
                    return view.get();
                }
            }
            if (op.kind == OpKind::Reshape && (tr || !inside_fusion(f, g, op.operands[0])) &&
                g.shape(v).rank() == 2) {
                // A view of an untiled row-major array (or of an untiled array whose
                // transpose is row-major: the heads' [1, H, S, d] stored as [S, H, d]): the
                // same bytes as the [rows, cols] row-major matrix the dot reads.
                const FusionValue* x = operand_of(f, tr ? tr->operands[0] : op.operands[0]);
                Layout seen = x->layout;
                if (tr && x->layout.tile.empty()) {
                    // Transposed dim i is the array's dim perm[i].
                    const std::vector<int64_t>& perm = tr->attrs.dims;
                    for (int64_t& d : seen.minor_to_major)
                        d = int64_t(std::find(perm.begin(), perm.end(), d) - perm.begin());
                }
                if (!(seen == row_major(x->shape.rank())))
                    not_generated(f, fmt::format("a reshape before the dot of an array in {}",
                                                 x->layout.to_string()));
                if (tr) prologue.insert(g.value(op.operands[0]).producer);
                if (x->shape.dtype != DType::F32)
                    not_generated(f, "a reshaped dot operand that is not f32");
                auto view = std::make_shared<FusionValue>(*x);
                view->shape = g.shape(v);
                view->layout = row_major(2);
                p.views.push_back(view);
                prologue.insert(g.value(v).producer);
                return view.get();
            }
            if (op.kind != OpKind::Convert)
                not_generated(f, fmt::format("{} before the dot", op_name(op.kind)));
            // The kernel rounds to bf16 itself in one pass; a rounding before more passes
            // would change the parts it splits.
            if (op.attrs.dtype == DType::BF16 && prec != driver::Precision::Bf16)
                not_generated(f, "an operand rounded to bf16 before a multi-pass dot");
            prologue.insert(g.value(v).producer);
            v = op.operands[0];
        }
        const FusionValue* fv = operand_of(f, v);
        if (!fv) not_generated(f, fmt::format("dot operand %{} not read from memory", v));
        if (fv->shape.dtype != DType::F32)
            not_generated(
                f, fmt::format("a {} dot operand (the kernel reads f32)", fv->shape.to_string()));
        return fv;
    };
    std::optional<driver::DotLayout> la, lw, lcv;
    int64_t M = 0, K = 0, N = 0;
    if (batch) {
        p.a = batch->a.fv;
        p.w = batch->w.fv;
        for (const FusionValue* fv : {p.a, p.w})
            if (fv->shape.dtype != DType::F32)
                not_generated(f, fmt::format("a {} dot operand (the kernel reads f32)",
                                             fv->shape.to_string()));
        prologue.insert(batch->a.prologue.begin(), batch->a.prologue.end());
        prologue.insert(batch->w.prologue.begin(), batch->w.prologue.end());
        la = batch->a.layout;
        lw = batch->w.layout;
        lcv = batch->c_layout;
        M = batch->M;
        K = batch->K;
        N = batch->N;
        p.a_off = batch->a.offset;
        p.w_off = batch->w.offset;
        p.c_off = batch->c_offset;
        p.prologue = batch->prologue;
    } else {
        p.a = source(part && part->side == 0 ? part->operand : dot.operands[0]);
        p.w = source(part && part->side == 1 ? part->operand : dot.operands[1]);
        const int64_t lc = d.lhs_contracting[0], rc = d.rhs_contracting[0];
        la = dot_layout_of(*p.a, 1 - lc, false, false, board);
        lw = dot_layout_of(*p.w, rc, true, false, board);
        const Shape& ls = g.shape(dot.operands[0]);
        M = part && part->side == 0 ? part->size : ls.dims[size_t(1 - lc)];
        K = ls.dims[size_t(lc)];
        N = part && part->side == 1 ? part->size : g.shape(dot.operands[1]).dims[size_t(1 - rc)];
    }
    if (!la || !lw)
        not_generated(f, fmt::format("dot operands in layouts {} and {}", p.a->layout.to_string(),
                                     p.w->layout.to_string()));
    if (!part && f.results.size() != 1)
        not_generated(f, fmt::format("an output fusion with {} results", f.results.size()));
    p.c = part ? part->result : &f.results[0];
    // A result with unit dims (the linear's [1, S, out]) as the [M, N] it is.
    if (!batch && !part && p.c->shape.dims != std::vector<int64_t>{M, N})
        if (auto view = matrix_view(*p.c, {M, N})) {
            p.views.push_back(view);
            p.c = view.get();
        }
    if (p.c->shape.dtype != DType::F32)
        not_generated(f, fmt::format("a {} result (f32 only)", p.c->shape.to_string()));
    if (!batch) lcv = dot_layout_of(*p.c, 0, false, true, board);
    if (!lcv) not_generated(f, fmt::format("a dot result in layout {}", p.c->layout.to_string()));
    // The epilogue's arrays have the result's shape ([B, M, N] for a batched dot: each
    // batch's tiles are its own, so only literals and the result itself take part).
    const std::vector<int64_t> mn = batch ? p.c->shape.dims : std::vector<int64_t>{M, N};
    if (!batch && p.c->shape.dims != mn)
        not_generated(f, fmt::format("a result {} that is not the dot's [{}, {}]",
                                     p.c->shape.to_string(), M, N));
    if (M > UINT32_MAX || K > UINT32_MAX || N > UINT32_MAX)
        not_generated(f, "a dot beyond 32-bit dims");

    // The epilogue: every other op, placed against the result tile.
    std::map<ValueId, EpValue> val;
    val[part ? part->root : dot.results[0]] = {EpKind::Full, -1};
    std::vector<const FusionValue*> columns, fulls;
    int results = 0;
    const auto full_operand = [&](ValueId v) -> EpValue {
        const FusionValue* fv = operand_of(f, v);
        if (batch) not_generated(f, "a side array in a batched dot's epilogue");
        if (fv->shape.dims != mn)  // a residual with unit dims, as the result
            if (auto view = matrix_view(*fv, mn)) {
                p.views.push_back(view);
                fv = view.get();
            }
        if (fv->shape.dims != mn || !(fv->layout == p.c->layout) || fv->shape.dtype != DType::F32)
            not_generated(
                f, fmt::format("a side {} in layout {} (the result's is {})", fv->shape.to_string(),
                               fv->layout.to_string(), p.c->layout.to_string()));
        fulls.push_back(fv);
        return {EpKind::Full, -1 - int(fulls.size())};
    };
    // Dims whose row-major order is the [M, N] tile's (unit dims inserted, or batches of rows
    // of N merged: PyTorch's [B, S, N] around a linear).
    const auto same_matrix = [&](const std::vector<int64_t>& dims) {
        if (nonunit(dims) == nonunit(mn)) return true;
        int64_t n = 1;
        for (int64_t e : dims) n *= e;
        return !batch && !dims.empty() && dims.back() == mn[1] && n == mn[0] * mn[1];
    };
    for (OpId id : f.ops) {
        if (id == f.hero || prologue.count(id)) continue;
        if (part && !part->ops.count(id)) continue;
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        int exponent = 0;
        const auto in = [&](size_t i) -> EpValue {
            const ValueId v = op.operands[i];
            if (auto it = val.find(v); it != val.end()) return it->second;
            if (!inside_fusion(f, g, v)) return val[v] = full_operand(v);
            not_generated(f, fmt::format("%{} in the epilogue", v));
        };
        switch (op.kind) {
            case OpKind::Literal:
                val[res] = {EpKind::Scalar, 0, 0, float(op.attrs.scalar)};
                continue;
            case OpKind::Broadcast: {
                const ValueId x = op.operands[0];
                const Shape& xs = g.shape(x);
                // Unit dims aside (GPT's positional table [S, D] -> [1, S, D] in the first
                // block's residual): the result's [M, N], as the operand's values lie.
                if (!same_matrix(g.shape(res).dims))
                    not_generated(f, fmt::format("a broadcast to {}", g.shape(res).to_string()));
                if (xs.elements() == 1 && val.count(x) && val[x].kind == EpKind::Scalar) {
                    val[res] = val[x];
                } else if (nonunit(xs.dims) == nonunit(mn) && g.shape(res).dims != mn &&
                           std::is_sorted(op.attrs.dims.begin(), op.attrs.dims.end())) {
                    val[res] = in(0);
                } else if (xs.rank() == 1 && xs.dims[0] == N &&
                           op.attrs.dims == std::vector<int64_t>{1} && !inside_fusion(f, g, x) &&
                           xs.dtype == DType::F32) {
                    columns.push_back(operand_of(f, x));
                    val[res] = {EpKind::Column, 0, columns.size() - 1};
                } else {
                    not_generated(f, fmt::format("a broadcast {} -> {} in the epilogue",
                                                 xs.to_string(), g.shape(res).to_string()));
                }
                continue;
            }
            case OpKind::Reshape:
            case OpKind::Transpose:
                if (g.shape(res).dims != g.shape(op.operands[0]).dims &&
                    (op.kind == OpKind::Transpose ||
                     (nonunit(g.shape(res).dims) != nonunit(g.shape(op.operands[0]).dims) &&
                      (batch || !same_matrix(g.shape(res).dims) ||
                       !same_matrix(g.shape(op.operands[0]).dims)))))
                    not_generated(f, fmt::format("{} in the epilogue", op_name(op.kind)));
                val[res] = in(0);
                continue;
            case OpKind::Convert:
                if (op.attrs.dtype == g.shape(op.operands[0]).dtype) {
                    val[res] = in(0);
                    continue;
                }
                // f32 -> bf16 -> f32 rounds: the pair is one step, the second an alias.
                if (op.attrs.dtype == DType::F32 && val.count(op.operands[0])) {
                    val[res] = in(0);
                    continue;
                }
                if (op.attrs.dtype != DType::BF16)
                    not_generated(f, fmt::format("a convert to {}", dtype_name(op.attrs.dtype)));
                break;
            case OpKind::Div:
            case OpKind::Erf:  // the erf GELU of PyTorch's nn.GELU() (vpu_erf, in scratch)
                break;
            case OpKind::Pow:
                // A literal integer exponent multiplied out, as the loop emitter (vpu_pow):
                // x^0 is 1, x^1 is x, GELU's x^3 two products.
                exponent = literal_exponent(g, op.operands[1]);
                if (exponent < 0)
                    not_generated(f, fmt::format("a power whose exponent is not a literal "
                                                 "integer in [0, {}]",
                                                 kVpuPowMax));
                if (exponent == 0) {
                    val[res] = {EpKind::Scalar, 0, 0, 1.0f};
                    continue;
                }
                if (exponent == 1) {
                    val[res] = in(0);
                    continue;
                }
                break;
            case OpKind::Compare:
                if (op.attrs.comparison != Comparison::Gt && op.attrs.comparison != Comparison::Lt)
                    not_generated(f, "a comparison other than > and <");
                break;
            default:
                if (!has_vpu_lowering(op.kind))
                    not_generated(f, fmt::format("op {} in the epilogue", op_name(op.kind)));
        }
        EpStep step{op.kind, op.attrs.comparison, exponent, {}, {}};
        bool any_full = false;
        for (size_t i = 0; i < op.operands.size(); ++i) {
            step.in.push_back(in(i));
            any_full |= step.in.back().kind == EpKind::Full;
        }
        if (!any_full)
            not_generated(f,
                          fmt::format("{} of broadcast values in the epilogue", op_name(op.kind)));
        step.out = res == p.c->value ? EpValue{EpKind::Full, -1} : EpValue{EpKind::Full, results++};
        val[res] = step.out;
        p.steps.push_back(std::move(step));
    }
    if (!val.count(p.c->value) || val[p.c->value].kind != EpKind::Full ||
        val[p.c->value].area != -1)
        not_generated(f, "a result the epilogue does not leave in the result tile");
    // The result tile is written last: no later step may read the dot's own result from it.
    for (size_t i = 0; i + 1 < p.steps.size(); ++i)
        if (p.steps[i].out.area == -1)
            not_generated(f, "an epilogue that writes its result before its last op");
    for (const FusionValue* fv : columns) p.sides.push_back(fv);
    for (const FusionValue* fv : fulls) p.sides.push_back(fv);
    // Scratch areas after the results: only those the body below takes (each one a tile of
    // VMEM the kernel's blocks would otherwise have; a bias + ReLU takes none).
    int scratch = 0;
    for (const EpStep& s : p.steps) {
        const bool bin = s.in.size() == 2;
        const size_t fi = bin && s.in[0].kind != EpKind::Full ? 1 : 0;
        const EpKind o = bin ? s.in[1 - fi].kind : EpKind::Full;
        const bool fast =
            bin && ((s.kind == OpKind::Add && o != EpKind::Full) ||
                    (s.kind == OpKind::Sub && o == EpKind::Scalar && fi == 0) ||
                    ((s.kind == OpKind::Mul || s.kind == OpKind::Max) && o == EpKind::Scalar));
        if (fast) continue;
        for (size_t i = 0; i < s.in.size(); ++i)  // a broadcast operand materialised (tile_of)
            if (s.in[i].kind != EpKind::Full) scratch = std::max(scratch, int(i) + 1);
        if (s.kind == OpKind::Convert) scratch = std::max(scratch, 4);
        if (s.kind == OpKind::Pow) scratch = std::max(scratch, 3);
        if (s.kind == OpKind::Div || s.kind == OpKind::Erf) scratch = kScratch;
    }
    p.areas = p.steps.empty() ? 0 : results + scratch;

    driver::DotKey shape;
    shape.M = uint32_t(M);
    shape.K = uint32_t(K);
    shape.N = uint32_t(N);
    shape.precision = prec;
    shape.a = *la;
    shape.w = *lw;
    shape.c = *lcv;
    shape.stationary = f.dots[0].stationary;
    shape.overlap_epilogue = !p.steps.empty();
    if (batch) {
        shape.a_band_tiles = batch->a.band_tiles;
        shape.a_lane = batch->a.lane;
        shape.w_band_tiles = batch->w.band_tiles;
        shape.w_lane = batch->w.lane;
        shape.c_row = batch->c_row;
    }
    shape.column_sides = uint32_t(columns.size());
    shape.full_sides = uint32_t(fulls.size());
    shape.prefetch_sides = shape.full_sides > 0;
    driver::DotKey probe = shape;
    probe.R = board.core.mxu_rows;
    probe.C = board.core.mxu_cols;
    probe.mxus = std::min<uint32_t>(board.core.mxus, 2);
    // A block of whole tiles (of the MXU's and the VPU's): the layouts alone are probed here.
    probe.block_rows = std::max({128u, probe.R, probe.C});
    probe.a_band_tiles = shape.a_band_tiles;
    probe.w_band_tiles = shape.w_band_tiles;
    probe.a_lane = shape.a_lane;
    probe.w_lane = shape.w_lane;
    probe.c_row = shape.c_row;
    if (const std::string why = driver::dot_unsupported(probe); !why.empty())
        not_generated(f, "the dot kernel: " + why);
    // The prologue's operand in the kernel's terms: the streamed one has the free dim along
    // the tile's rows, the held one along its columns.
    uint64_t pro_bytes = 0;
    if (p.prologue) {
        auto pro = std::make_shared<DotPrologue>(*p.prologue);
        pro->by_rows = (pro->side == 0) == (shape.stationary == driver::Stationary::Rhs);
        for (const DotPrologue::Step& st : pro->steps) {
            if (st.other != DotPrologue::Step::Other::Vector) continue;
            if (st.kind == OpKind::Div) pro->divisor[st.vector] = 1;
            if (st.kind == OpKind::Add && pro->by_rows) pro->negated[st.vector] = 1;
            if (st.kind == OpKind::Sub && !pro->by_rows) pro->negated[st.vector] = 1;
            if ((st.kind == OpKind::Mul || st.kind == OpKind::Div) && !pro->by_rows)
                pro->needs_tile = true;
        }
        pro_bytes = pro->vmem_bytes(board);
        p.prologue = pro;
    }
    // The kernel's tiling in what the epilogue's areas leave of VMEM.
    uint64_t budget = board.core.vmem_bytes - std::min(pro_bytes, board.core.vmem_bytes);
    // C in one buffer where it buys longer blocks (plan_dot decides; a batch or a prologue keeps
    // two).
    shape.one_c_buffer = !batch && !p.prologue;
    for (int tries = 0; tries < 32; ++tries) {
        const auto k = driver::plan_dot(board, shape, budget);
        if (!k) break;
        const uint64_t need = driver::dot_vmem_bytes(*k) +
                              uint64_t(p.areas) * epilogue_area_bytes(*k) + pro_bytes + 4096;
        if (need <= board.core.vmem_bytes) {
            p.key = *k;
            // A batch's every column in one group (DotKey::group_panels), where it fits: a
            // group's stores then cover whole bands of C's tiles (driver::DotBatch), and the
            // streamed panel is converted once per block.
            if (batch) {
                driver::DotKey wide = *k;
                const uint32_t cols = wide.stationary == driver::Stationary::Rhs ? wide.N : wide.M;
                const uint32_t nt = (cols + wide.C - 1) / wide.C;
                wide.group_panels = (nt + wide.mxus - 1) / wide.mxus;
                if (wide.group_panels > k->group_panels &&
                    driver::dot_vmem_bytes(wide) + uint64_t(p.areas) * epilogue_area_bytes(wide) +
                            pro_bytes + 4096 <=
                        board.core.vmem_bytes &&
                    driver::dot_unsupported(wide).empty())
                    p.key = wide;
                // Its streamed operand read a band (every K step of 8 rows) per DMA, a block
                // ahead (DotKey::band_loads), where two blocks' staging fit.
                driver::DotKey band = p.key;
                band.band_loads = true;
                if (driver::dot_vmem_bytes(band) + uint64_t(p.areas) * epilogue_area_bytes(band) +
                        pro_bytes + 4096 <=
                    board.core.vmem_bytes)
                    p.key = band;
            }
            return p;
        }
        budget = epilogue_fit_budget(*k, need - board.core.vmem_bytes);
    }
    not_generated(f, "a dot whose epilogue does not fit in VMEM beside it");
}

}  // namespace

/// Reductions of a dot's result that the kernel computes as it stores each tile (compiler/
/// README.md, "Reductions in a dot's fusion"; plan_dot_reduction), in the evaluator's order (the
/// stream kernel's): over the rows, row i into partial i mod 8, each from the identity in row
/// order, then the 8 partials in order; over the columns, each 128-lane chunk from the identity
/// (`v.rsum` / `v.rmax`), then the chunks' results in order.
/// A batched dot runs each batch's matrix as one block and one column group (a scalar word counts
/// the batches); a 2-D dot reduces over its columns, each tile's results added at its rows.
struct DotReduction {
    /// An elementwise op on the tile: `a`, `b` are values (0 the fusion's result tile, k > 0 step
    /// k - 1's); a literal `scalar` in `b`'s place when `literal`, no `b` when `unary`.
    struct Step {
        OpKind kind = OpKind::Mul;
        Comparison comparison = Comparison::Gt;  ///< Compare: > or <
        int a = 0, b = 0;
        bool unary = false, literal = false;
        float scalar = 0;
    };
    std::vector<Step> steps;  ///< in order
    /// One reduction: of which value, into which result.
    struct Out {
        bool max = true;  ///< the reducer: max, else sum
        int value = 0;
        const FusionValue* result = nullptr;
        bool tiled = false;  ///< its last two dims in T(8,128) tiles (batched), else row-major
        int64_t H = 1;       ///< the result's second-minor extent (tiled)
    };
    std::vector<Out> outs;
    bool over_rows = true;  ///< over each matrix's M rows (a value per column), else its N columns
    bool batched = true;    ///< a batched dot (the batch counter), else a 2-D one (tile positions)
    bool lhs = false;       ///< 2-D: the LHS stationary (each tile a panel of rows, one block)
    int64_t B = 1;          ///< batches (matrices)
    int64_t M = 0, N = 0, Q = 0;  ///< a matrix's dims; Q results a batch
    /// A step's area: a tile, or with the LHS stationary a slab of at most 128 KiB of it (the
    /// tile is taken as rows of 128 values, a slab at a time).
    uint64_t step_bytes(uint64_t tile_bytes) const {
        return lhs ? std::min<uint64_t>(tile_bytes, 128 << 10) : tile_bytes;
    }
    /// A row of chunk results: a matrix's rows or columns, or a tile's chunks (its bytes / 128).
    uint64_t chunk_bytes(uint64_t tile_bytes) const {
        return std::max<uint64_t>(uint64_t(std::max(M, N)) * 4, tile_bytes / 128);
    }
    /// VMEM beside the kernel: each out's B Q results, the 8 x 128 partials, two rows of chunk
    /// results, a tile a step.
    uint64_t vmem_bytes(uint64_t tile_bytes) const {
        const auto up = [](uint64_t x) { return (x + 511) / 512 * 512; };
        return outs.size() * up(uint64_t(B * Q * 4)) + up(8 * 128 * 4) +
               2 * up(chunk_bytes(tile_bytes)) + steps.size() * up(step_bytes(tile_bytes));
    }
};

namespace {

/// A dot reduction's VMEM and the scalar word counting the batches it has finished.
struct ReductionVmem {
    std::vector<isa::Vmem> rows;  ///< per out: its B Q results
    isa::Vmem partials, chunk, chunk_t;
    std::vector<isa::Vmem> steps;  ///< a tile per step
    isa::Smem batch;
};

/// A prologue's vectors in VMEM, [B][Q] row-major each, with their derived forms.
struct PrologueVmem {
    std::vector<isa::Vmem> held;
    std::vector<uint64_t> base, negated, divisor;
    uint64_t tile = 0;
};

/// Moves B rows of Q fp32 values between VMEM (`[B][Q]` row-major at `vmem`) and an array in HBM
/// at `hbm` (`load`: into VMEM, else out of it): row-major in one DMA, or (`tiled`) [H, Q]
/// matrices in T(8,128) tiles one after another, one DMA per tile of 8 rows.
void move_vectors(isa::CountedFlag& flag, bool load, uint64_t vmem, const isa::Reg& hbm, int64_t B,
                  int64_t Q, bool tiled, int64_t H) {
    if (!tiled) {
        const isa::Arg n = imm(B * Q * 4);
        if (load)
            flag.issue(Opcode::DmaHv, {imm(int64_t(vmem)), hbm + 0, imm(1), n, n, n});
        else
            flag.issue(Opcode::DmaVh, {hbm + 0, imm(int64_t(vmem)), imm(1), n, n, n});
        return;
    }
    const int64_t QT = (Q + 127) / 128;
    for (int64_t outer = 0; outer * H < B; ++outer)
        for (int64_t band = 0; band * 8 < H; ++band)
            for (int64_t t = 0; t < QT; ++t) {
                const int64_t rows = std::min<int64_t>(8, H - band * 8),
                              vals = std::min<int64_t>(128, Q - t * 128);
                const isa::Arg h =
                    hbm + (int64_t(outer * tiled_bytes(H, Q)) + (band * QT + t) * 4096);
                const isa::Arg v = imm(int64_t(vmem) + ((outer * H + band * 8) * Q + t * 128) * 4);
                if (load)
                    flag.issue(Opcode::DmaHv,
                               {v, h, imm(rows), imm(vals * 4), imm(Q * 4), imm(512)});
                else
                    flag.issue(Opcode::DmaVh,
                               {h, v, imm(rows), imm(vals * 4), imm(512), imm(Q * 4)});
            }
}

/// Loads the prologue's vectors whole into VMEM (a T(8,128) [B, Q] array one DMA per tile of
/// 8 rows, its rows placed Q values apart) and computes what its steps need besides: `-v`
/// (exact) and the divide's factor `r = rsqrt(max(v, -v))^2`, negated where `0 > v`, so that
/// `x * r` is vpu_divide(x, v) (x * -r = -(x * r) in IEEE arithmetic).
PrologueVmem load_prologue(isa::Builder& b, const DotPrologue& pro,
                           const std::function<void(const isa::Reg&, const BufferRef&)>& load,
                           uint64_t tile_bytes) {
    PrologueVmem m;
    const uint64_t vb = pro.vector_bytes();
    const auto take = [&](const std::string& name) {
        m.held.push_back(b.vmem(name, vb, 512));
        return m.held.back().addr();
    };
    for (size_t i = 0; i < pro.vectors.size(); ++i) {
        m.base.push_back(take(fmt::format("prologue.v{}", i)));
        m.negated.push_back(pro.negated[i] ? take(fmt::format("prologue.neg{}", i)) : 0);
        m.divisor.push_back(pro.divisor[i] ? take(fmt::format("prologue.div{}", i)) : 0);
    }
    const uint64_t s0 = take("prologue.s0"), s1 = take("prologue.s1");
    if (pro.needs_tile) {
        m.held.push_back(b.vmem("prologue.tile", tile_bytes, 512));
        m.tile = m.held.back().addr();
    }
    const int64_t B = pro.B, Q = pro.Q;
    {
        isa::CountedFlag loads(b, "prologue.loads");
        for (size_t i = 0; i < pro.vectors.size(); ++i) {
            const isa::Reg r = b.reg("prologue.vector");
            load(r, pro.vectors[i]->buffer);
            move_vectors(loads, true, m.base[i], r, B, Q, pro.tiled[i], B);
        }
        loads.wait_all();
    }
    isa::CountedFlag vpu(b, "prologue.vpu");
    const isa::Arg n = imm(B * Q);
    for (size_t i = 0; i < pro.vectors.size(); ++i) {
        const isa::Arg v = imm(int64_t(m.base[i]));
        if (pro.negated[i])
            vpu.issue(Opcode::VMulS, {imm(int64_t(m.negated[i])), v, fimm(-1.0f), n});
        if (!pro.divisor[i]) continue;
        const isa::Arg r = imm(int64_t(s0)), z = imm(int64_t(s1)), f = imm(int64_t(m.divisor[i]));
        vpu.issue(Opcode::VMulS, {r, v, fimm(-1.0f), n});
        vpu.issue(Opcode::VMax, {r, v, r, n});
        vpu.issue(Opcode::VRsqrt, {r, r, n});
        vpu.issue(Opcode::VMul, {r, r, r, n});
        vpu.issue(Opcode::VCmpGt, {z, v, v, n});  // +0.0 (also for NaN)
        vpu.issue(Opcode::VCmpGt, {z, z, v, n});  // 0 > v
        vpu.issue(Opcode::VMulS, {f, r, fimm(-1.0f), n});
        vpu.issue(Opcode::VSel, {f, z, f, r, n});
    }
    vpu.wait_all();
    return m;
}

/// The prologue's steps on one operand tile of batch `batch` (or of the batch the kernel's
/// tile names, PrologueTile::batch, in a batched kernel).
void emit_prologue_tile(const driver::PrologueTile& t, const DotPrologue& pro,
                        const PrologueVmem& m, int64_t batch) {
    isa::Builder& b = t.b;
    const int64_t Q4 = pro.Q * 4;
    // at = 4 x the tile's first index along the free dim, plus the batch's row of vectors.
    const isa::Reg at = b.reg("prologue.at");
    t.first_x4(at);
    int64_t row = batch * Q4;
    if (t.batch) {
        const isa::Reg u = b.reg("prologue.batch");
        t.batch(u);
        b.emit(Opcode::Mul, {u, u, imm(Q4)});
        b.emit(Opcode::Add, {at, at, u});
        row = 0;
    }
    std::optional<isa::Reg> count;
    isa::Arg n = imm(0);
    if (t.rows.reg) {
        count.emplace(b.reg("prologue.values"));
        b.emit(Opcode::Mul, {*count, t.rows, imm(t.cols)});
        n = *count;
    } else {
        n = imm((t.rows.imm + 0) * int64_t(t.cols));
    }
    const isa::Arg x = t.x, rows = t.rows, cols = imm(t.cols);
    using Other = DotPrologue::Step::Other;
    for (const DotPrologue::Step& st : pro.steps) {
        if (st.other == Other::None) {
            const bool ok = emit_elementwise(
                t.vpu, st.kind, Comparison::Gt, x, [&](size_t) { return x; }, n);
            if (!ok) throw CompileError(fmt::format("prologue op {}", op_name(st.kind)));
            continue;
        }
        if (st.other == Other::Scalar) {
            if (!emit_literal_op(t.vpu, st.kind, x, x, st.scalar, n))
                throw CompileError(fmt::format("prologue op {} of a literal", op_name(st.kind)));
            continue;
        }
        const size_t i = st.vector;
        const auto vec = [&](uint64_t area) { return at + (int64_t(area) + row); };
        if (pro.by_rows) {
            // One value per tile row: x[r][j] op v[r].
            switch (st.kind) {
                case OpKind::Sub:
                    t.vpu(Opcode::VSubCol, {x, x, vec(m.base[i]), rows, cols});
                    break;
                case OpKind::Add:
                    t.vpu(Opcode::VSubCol, {x, x, vec(m.negated[i]), rows, cols});
                    break;
                case OpKind::Mul:
                    t.vpu(Opcode::VMulCol, {x, x, vec(m.base[i]), rows, cols});
                    break;
                default:
                    t.vpu(Opcode::VMulCol, {x, x, vec(m.divisor[i]), rows, cols});
                    break;
            }
            continue;
        }
        // One value per tile column: x[r][j] op v[j].
        if (st.kind == OpKind::Add || st.kind == OpKind::Sub) {
            t.vpu(Opcode::VAddRow,
                  {x, x, vec(st.kind == OpKind::Add ? m.base[i] : m.negated[i]), rows, cols});
            continue;
        }
        // A tile of the values (-0.0 plus each: exact), then the product.
        const isa::Arg tile = imm(int64_t(m.tile));
        t.vpu(Opcode::VCmpGt, {tile, x, x, n});
        t.vpu(Opcode::VMulS, {tile, tile, fimm(-1.0f), n});
        t.vpu(Opcode::VAddRow,
              {tile, tile, vec(st.kind == OpKind::Mul ? m.base[i] : m.divisor[i]), rows, cols});
        t.vpu(Opcode::VMul, {x, x, tile, n});
    }
}

/// The reduction's steps on a tile of `count` values: value 0 at `tile`, step k's result in
/// VMEM area k (DotReduction::Step). Returns where each value lies.
std::vector<isa::Arg> emit_reduction_steps(
    const std::function<void(Opcode, std::initializer_list<isa::Arg>)>& vpu, const DotReduction& r,
    const ReductionVmem& v, const isa::Arg& tile, const isa::Arg& count) {
    std::vector<isa::Arg> at{tile};
    for (size_t i = 0; i < r.steps.size(); ++i) {
        const DotReduction::Step& st = r.steps[i];
        const isa::Arg dst = v.steps[i].at(0), x = at[size_t(st.a)];
        at.push_back(dst);
        if (st.unary) {
            emit_elementwise(
                vpu, st.kind, st.comparison, dst, [&](size_t) { return x; }, count);
            continue;
        }
        if (!st.literal) {
            const isa::Arg y = at[size_t(st.b)];
            emit_elementwise(
                vpu, st.kind, st.comparison, dst, [&](size_t k) { return k ? y : x; }, count);
            continue;
        }
        emit_literal_op(vpu, st.kind, dst, x, st.scalar, count);
    }
    return at;
}

/// `count` values at `dst` set to a reduction's identity: 0 (x > x is false, NaN included), or
/// -inf for a max.
void emit_identity(const std::function<void(Opcode, std::initializer_list<isa::Arg>)>& vpu,
                   bool max, const isa::Arg& dst, const isa::Arg& count) {
    vpu(Opcode::VCmpGt, {dst, dst, dst, count});
    if (max) vpu(Opcode::VAddS, {dst, dst, fimm(-std::numeric_limits<float>::infinity()), count});
}

/// The reductions' work on one result tile (row-major in C's orientation), in the evaluator's
/// order (DotReduction). A batch (one block and one group): over the rows, the tile's bands
/// into the 8 partials from the identity, then the partials into the panel's results; over the
/// columns, the tile's chunk results into the batch's results from the identity, panel by
/// panel; the scalar word counts the batch after its last panel. A 2-D dot over its columns:
/// the tile's chunk results added to the results at its rows (set to the identity before the
/// kernel; with one chunk in all, the chunk results are the results).
void emit_reduction_tile(driver::EpilogueTile& t, const DotReduction& r, const ReductionVmem& v) {
    isa::Builder& b = t.builder();
    const int64_t n = t.cols();
    const auto vpu = [&](Opcode op, std::initializer_list<isa::Arg> args) { t.vpu(op, args); };
    const auto fold = [](bool max) { return max ? Opcode::VMax : Opcode::VAdd; };
    const auto chunks = [](bool max) { return max ? Opcode::VRMax : Opcode::VRSum; };
    if (!r.batched) {
        const int64_t chunk_count = (r.N + 127) / 128;
        if (r.lhs) {
            // The tile is a panel of 128 rows x the block's T columns (every column of C, or
            // blocks of whole chunks that divide them: plan_dot_reduction). Taken as 128 T / 128
            // rows of 128 values, `v.rsum` gives every chunk result, row r's chunk k at
            // r T / 128 + k (the steps a slab of those rows at a time); transposed, chunk k's
            // results are a row of 128, added in column order to the results (from the
            // identity; one chunk in all: they are the results).
            const int64_t T = t.cols(), pr = 128, NC = T / 128, view = pr * NC;
            const int64_t tile_chunks = std::min<int64_t>(T, r.N) / 128;
            const int64_t slab = v.steps.empty() ? view : int64_t(v.steps[0].bytes() / 512);
            const isa::Arg chunk = v.chunk.at(0), chunk_t = v.chunk_t.at(0);
            const isa::Reg row4 = b.reg("reduce.row4");
            t.row4(row4);
            for (size_t i = 0; i < r.outs.size(); ++i) {
                const DotReduction::Out& o = r.outs[i];
                const isa::Arg res = row4 + int64_t(v.rows[i].addr());
                for (int64_t s0 = 0; s0 < view; s0 += o.value ? slab : view) {
                    const int64_t rows = std::min(view - s0, o.value ? slab : view);
                    const auto at = o.value ? emit_reduction_steps(vpu, r, v, t.out() + s0 * 512,
                                                                   imm(rows * 128))
                                            : std::vector<isa::Arg>{t.out()};
                    vpu(chunks(o.max), {chunk + s0 * 4, at[size_t(o.value)], imm(rows), imm(128)});
                }
                vpu(Opcode::VTrans, {chunk_t, chunk, imm(pr), imm(NC)});
                if (chunk_count == 1) {  // x + -0.0 is x, signed zeros included
                    vpu(Opcode::VAddS, {res, chunk_t, fimm(-0.0f), imm(pr)});
                    continue;
                }
                for (int64_t k = 0; k < tile_chunks; ++k)
                    vpu(fold(o.max), {res, res, chunk_t + k * pr * 4, imm(pr)});
            }
            return;
        }
        // The RHS stationary: the tile is the block's rows x one panel, one chunk.
        std::vector<isa::Arg> at;
        {
            const isa::Reg values = b.reg("reduce.values");
            b.emit(Opcode::Mul, {values, t.rows(), imm(n)});
            at = emit_reduction_steps(vpu, r, v, t.out(), values);
        }
        const isa::Reg row4 = b.reg("reduce.row4");
        t.row4(row4);
        for (size_t i = 0; i < r.outs.size(); ++i) {
            const DotReduction::Out& o = r.outs[i];
            const isa::Arg res = row4 + int64_t(v.rows[i].addr()), chunk = v.chunk.at(0);
            if (chunk_count == 1) {
                vpu(chunks(o.max), {res, at[size_t(o.value)], t.rows(), imm(n)});
                continue;
            }
            vpu(chunks(o.max), {chunk, at[size_t(o.value)], t.rows(), imm(n)});
            vpu(fold(o.max), {res, res, chunk, t.rows()});
        }
        return;
    }
    const int64_t M = r.M, panels = (r.N + 127) / 128;
    const isa::Reg at_reg = b.reg("reduce.at");
    b.emit(Opcode::Lw, {at_reg, v.batch.word(0)});
    b.emit(Opcode::Mul, {at_reg, at_reg, imm(r.Q * 4)});
    const auto at = emit_reduction_steps(vpu, r, v, t.out(), imm(M * n));
    for (size_t i = 0; i < r.outs.size(); ++i) {
        const DotReduction::Out& o = r.outs[i];
        const isa::Arg src = at[size_t(o.value)], row = at_reg + int64_t(v.rows[i].addr());
        if (r.over_rows) {
            const isa::Arg part = v.partials.at(0);
            emit_identity(vpu, o.max, part, imm(8 * n));
            for (int64_t band = 0; band < M / 8; ++band)
                vpu(fold(o.max), {part, part, src + band * 8 * n * 4, imm(8 * n)});
            const isa::Arg dst = row + int64_t(t.panel()) * 128 * 4;
            emit_identity(vpu, o.max, dst, imm(n));
            for (int64_t sl = 0; sl < 8; ++sl)
                vpu(fold(o.max), {dst, dst, part + sl * n * 4, imm(n)});
        } else if (panels == 1) {
            vpu(chunks(o.max), {row, src, imm(M), imm(n)});
        } else {
            const isa::Arg chunk = v.chunk.at(0);
            vpu(chunks(o.max), {chunk, src, imm(M), imm(n)});
            if (t.panel() == 0) emit_identity(vpu, o.max, row, imm(M));
            vpu(fold(o.max), {row, row, chunk, imm(M)});
        }
    }
    if (int64_t(t.panel()) + 1 == panels) {
        b.emit(Opcode::Lw, {at_reg, v.batch.word(0)});
        b.emit(Opcode::Add, {at_reg, at_reg, imm(1)});
        b.emit(Opcode::Sw, {at_reg, v.batch.word(0)});
    }
}

/// The reductions' VMEM and batch word, before the fusion's kernels; a 2-D dot's results over
/// several chunks start from the identity.
ReductionVmem reduction_vmem(isa::Builder& b, const DotReduction& r, uint64_t tile_bytes) {
    ReductionVmem v;
    for (size_t i = 0; i < r.outs.size(); ++i)
        v.rows.push_back(b.vmem(fmt::format("reduce.rows{}", i), uint64_t(r.B * r.Q * 4), 512));
    v.partials = b.vmem("reduce.partials", 8 * 128 * 4, 512);
    v.chunk = b.vmem("reduce.chunk", r.chunk_bytes(tile_bytes), 512);
    v.chunk_t = b.vmem("reduce.chunk_t", r.chunk_bytes(tile_bytes), 512);
    for (size_t i = 0; i < r.steps.size(); ++i)
        v.steps.push_back(b.vmem(fmt::format("reduce.step{}", i), r.step_bytes(tile_bytes), 512));
    v.batch = b.smem("reduce.batch", 1);
    const isa::Reg zero = b.reg("reduce.zero");
    b.emit(Opcode::Li, {zero, imm(0)});
    b.emit(Opcode::Sw, {zero, v.batch.word(0)});
    if (!r.batched && r.N > 128) {
        isa::CountedFlag vpu(b, "reduce.identity");
        const auto issue = [&](Opcode op, std::initializer_list<isa::Arg> args) {
            vpu.issue(op, args);
        };
        for (size_t i = 0; i < r.outs.size(); ++i)
            emit_identity(issue, r.outs[i].max, v.rows[i].at(0), imm(r.B * r.Q));
        vpu.wait_all();
    }
    return v;
}

/// Stores each out's results (in VMEM, [B][Q]) to its result, after the kernels (move_vectors).
void store_reduction(isa::Builder& b, const DotReduction& r, const ReductionVmem& v,
                     const std::function<void(const isa::Reg&, const BufferRef&)>& load) {
    isa::CountedFlag stores(b, "reduce.stores");
    for (size_t i = 0; i < r.outs.size(); ++i) {
        const DotReduction::Out& o = r.outs[i];
        const isa::Reg dst = b.reg("reduce.result");
        load(dst, o.result->buffer);
        move_vectors(stores, false, v.rows[i].addr(), dst, r.B, r.Q, o.tiled, o.H);
    }
    stores.wait_all();
}

void emit_one(isa::Builder& b, const DotFusion& p,
              const std::function<void(const isa::Reg&, const BufferRef&)>& load,
              const driver::DotBatch& batch, const PrologueVmem* pv = nullptr,
              const std::vector<DotFusion>* parts = nullptr, const ReductionVmem* rv = nullptr) {
    // Each address in a register of its own, straight from the argument table (the kernel
    // needs most registers for itself).
    const auto addr = [&](const FusionValue& fv, const std::string& name) {
        isa::Reg r = b.reg(name);
        load(r, fv.buffer);
        return r;
    };
    const isa::Reg ra = addr(*p.a, "dot.a"), rw = addr(*p.w, "dot.w"), rc = addr(*p.c, "dot.c");
    // A batch's matrices within their arrays.
    for (const auto& [r, off] : {std::pair{&ra, p.a_off}, {&rw, p.w_off}, {&rc, p.c_off}})
        if (off) b.emit(Opcode::Add, {*r, *r, imm(int64_t(off))});
    std::vector<isa::Reg> side_regs;
    driver::Epilogue ep;
    for (size_t i = 0; i < p.sides.size(); ++i) {
        side_regs.push_back(addr(*p.sides[i], fmt::format("side{}", i)));
        ep.sides.push_back({i < p.key.column_sides ? driver::EpilogueSide::Kind::Column
                                                   : driver::EpilogueSide::Kind::Full,
                            st::Operand::hbm(side_regs.back())});
    }
    std::vector<isa::Vmem> areas;
    for (int i = 0; i < p.areas; ++i)
        areas.push_back(b.vmem(fmt::format("epilogue{}", i), epilogue_area_bytes(p.key), 512));
    // The scratch areas follow the results (plan_one takes only those the steps use).
    int scratch = 0;
    for (const EpStep& s : p.steps) scratch = std::max(scratch, s.out.area + 1);
    std::function<void(driver::EpilogueTile&)> steps_body;
    if (!p.steps.empty())
        steps_body = [&](driver::EpilogueTile& t) {
            isa::Builder& bb = t.builder();
            const isa::Reg n = bb.reg("epilogue.values");
            bb.emit(Opcode::Mul, {n, t.rows(), imm(t.cols())});
            const isa::Arg cols = imm(t.cols());
            const auto area = [&](int i) { return areas[size_t(i)].at(0); };
            const auto at = [&](const EpValue& v) -> isa::Arg {
                if (v.area == -1) return t.out();
                if (v.area <= -2) return t.side(p.key.column_sides + size_t(-2 - v.area));
                return area(v.area);
            };
            // A broadcast into scratch area `s`: -0.0 everywhere, plus the value (x + -0.0 is x
            // for every x, signed zeros included).
            const auto tile_of = [&](const EpValue& v, int s) -> isa::Arg {
                if (v.kind == EpKind::Full) return at(v);
                const isa::Arg dst = area(scratch + s);
                t.vpu(Opcode::VCmpGt, {dst, t.out(), t.out(), n});
                t.vpu(Opcode::VMulS, {dst, dst, fimm(-1.0f), n});
                if (v.kind == EpKind::Scalar)
                    t.vpu(Opcode::VAddS, {dst, dst, fimm(v.scalar), n});
                else
                    t.vpu(Opcode::VAddRow, {dst, dst, t.side(v.side), t.rows(), cols});
                return dst;
            };
            for (const EpStep& s : p.steps) {
                const std::vector<EpValue>& x = s.in;
                const isa::Arg out = at(s.out);
                const auto F = [&](size_t i) { return tile_of(x[i], int(i)); };
                // A binary op with one Full operand and a scalar or column: the VPU's
                // scalar and row forms (commutative ops only, so the bits are the same).
                const bool bin = x.size() == 2;
                const size_t fi = bin && x[0].kind != EpKind::Full ? 1 : 0;
                const EpValue& o = bin ? x[1 - fi] : x[0];
                // The scalar and row forms first.
                const auto vpu = [&](Opcode op, std::initializer_list<isa::Arg> args) {
                    t.vpu(op, args);
                };
                if (bin && o.kind == EpKind::Scalar &&
                    emit_literal_op(vpu, s.kind, out, at(x[fi]), o.scalar, n, fi == 0))
                    continue;
                if (bin && s.kind == OpKind::Add && o.kind == EpKind::Column) {
                    t.vpu(Opcode::VAddRow, {out, at(x[fi]), t.side(o.side), t.rows(), cols});
                    continue;
                }
                switch (s.kind) {
                    case OpKind::Convert: {  // f32 -> bf16 -> f32: round, keep as f32
                        const isa::Arg h = area(scratch + 3);
                        t.vpu(Opcode::VF2Bf, {h, F(0), n});
                        t.vpu(Opcode::VBf2F, {out, h, n});
                        break;
                    }
                    case OpKind::Pow: {
                        // vpu_pow: x * x * ... left to right, the products in scratch 2 and the
                        // last one into `out` (which may be x's own tile).
                        const isa::Arg xa = F(0), acc = area(scratch + 2);
                        for (int i = 1; i < s.exponent; ++i)
                            t.vpu(Opcode::VMul,
                                  {i + 1 == s.exponent ? out : acc, i == 1 ? xa : acc, xa, n});
                        break;
                    }
                    case OpKind::Div: {
                        // vpu_divide (evaluator.h), as the loop emitter: q = x rsqrt(|y|)^2,
                        // negated where 0 > y.
                        const isa::Arg xa = F(0), ya = F(1);
                        const isa::Arg r = area(scratch + 2), m = area(scratch + 3),
                                       zero = area(scratch + 4);
                        t.vpu(Opcode::VCmpGt, {zero, t.out(), t.out(), n});
                        t.vpu(Opcode::VMulS, {r, ya, fimm(-1.0f), n});
                        t.vpu(Opcode::VMax, {r, ya, r, n});
                        t.vpu(Opcode::VRsqrt, {r, r, n});
                        t.vpu(Opcode::VMul, {r, r, r, n});
                        t.vpu(Opcode::VCmpGt, {m, zero, ya, n});
                        t.vpu(Opcode::VMul, {r, xa, r, n});
                        t.vpu(Opcode::VMulS, {zero, r, fimm(-1.0f), n});
                        t.vpu(Opcode::VSel, {out, m, zero, r, n});
                        break;
                    }
                    case OpKind::Erf: {
                        // vpu_erf (evaluator.h), the loop emitter's instructions; the sign mask
                        // first, since `out` may be x's own tile.
                        const isa::Arg xa = F(0);
                        const isa::Arg ax = area(scratch + 1), r = area(scratch + 2),
                                       e = area(scratch + 3), m = area(scratch + 4);
                        t.vpu(Opcode::VCmpGt, {m, t.out(), t.out(), n});
                        t.vpu(Opcode::VCmpGt, {m, m, xa, n});
                        t.vpu(Opcode::VMulS, {ax, xa, fimm(-1.0f), n});
                        t.vpu(Opcode::VMax, {ax, xa, ax, n});
                        t.vpu(Opcode::VMulS, {r, ax, fimm(kErfP), n});
                        t.vpu(Opcode::VAddS, {r, r, fimm(1.0f), n});
                        t.vpu(Opcode::VRsqrt, {r, r, n});
                        t.vpu(Opcode::VMul, {r, r, r, n});
                        t.vpu(Opcode::VMulS, {out, r, fimm(kErfA[4]), n});
                        for (int i = 3; i >= 0; --i) {
                            t.vpu(Opcode::VAddS, {out, out, fimm(kErfA[i]), n});
                            t.vpu(Opcode::VMul, {out, out, r, n});
                        }
                        t.vpu(Opcode::VMul, {e, ax, ax, n});
                        t.vpu(Opcode::VMulS, {e, e, fimm(-1.0f), n});
                        t.vpu(Opcode::VExp, {e, e, n});
                        t.vpu(Opcode::VMul, {out, out, e, n});
                        t.vpu(Opcode::VMulS, {out, out, fimm(-1.0f), n});
                        t.vpu(Opcode::VAddS, {out, out, fimm(1.0f), n});
                        t.vpu(Opcode::VMulS, {r, out, fimm(-1.0f), n});
                        t.vpu(Opcode::VSel, {out, m, r, out, n});
                        break;
                    }
                    default: {
                        if (!emit_elementwise(vpu, s.kind, s.comparison, out, F, n))
                            throw CompileError(
                                fmt::format("epilogue op {} not generated", op_name(s.kind)));
                    }
                }
            }
        };
    ep.body = steps_body;
    ep.position = p.reduction && !p.reduction->batched;
    if (p.reduction && rv)
        ep.body = [&](driver::EpilogueTile& t) {
            if (steps_body) steps_body(t);
            emit_reduction_tile(t, *p.reduction, *rv);
        };
    driver::Prologue pro;
    if (p.prologue) {
        if (!pv) throw CompileError("a dot prologue without its vectors in VMEM");
        auto body = [&p, pv](const driver::PrologueTile& t) {
            emit_prologue_tile(t, *p.prologue, *pv, p.batch);
        };
        (p.prologue->by_rows ? pro.streamed : pro.held) = body;
    }
    const driver::DotOperands ops{st::Operand::hbm(ra), st::Operand::hbm(rw), st::Operand::hbm(rc)};
    if (parts) {
        // A merged dot's part i: its buffers into the same registers (same_parts: no offsets).
        driver::emit_dot_parts(b, p.key, ops, ep, [&](uint32_t i) {
            const DotFusion& q = (*parts)[i];
            load(ra, q.a->buffer);
            load(rw, q.w->buffer);
            load(rc, q.c->buffer);
            for (size_t s = 0; s < q.sides.size(); ++s) load(side_regs[s], q.sides[s]->buffer);
        });
        return;
    }
    driver::emit_dot(b, p.key, ops, ep, pro, batch);
}

}  // namespace

void emit_dot_fusion(isa::Builder& b, const DotFusion& p,
                     const std::function<void(const isa::Reg&, const BufferRef&)>& load) {
    emit_one(b, p, load, {});
}

void emit_dot_fusions(isa::Builder& b, const std::vector<DotFusion>& plans,
                      const std::function<void(const isa::Reg&, const BufferRef&)>& load) {
    // A batched dot's batches repeat with a period (heads of 64 lanes alternate between the
    // window at lane 0 and at lane 64 of a tile; wider heads have one) and their matrices lie a
    // constant stride apart per period: one kernel runs them all (driver::DotBatch), its block
    // pipeline going from one batch's blocks to the next's, each member of the period emitted
    // once and a loop over the periods (32 heads' unrolled kernels outgrow the instruction
    // memory).
    const size_t n = plans.size();
    if (n > 1 && plans[0].key.parts == n) {  // a merged dot's parts (plan_dot_fusion)
        emit_one(b, plans[0], load, {}, nullptr, &plans);
        return;
    }
    const auto same = [&](const DotFusion& x, const DotFusion& y, bool lanes) {
        driver::DotKey kx = x.key, ky = y.key;
        if (!lanes) kx.a_lane = ky.a_lane = kx.w_lane = ky.w_lane = 0;
        return kx == ky && x.a == y.a && x.w == y.w && x.c == y.c && x.sides == y.sides &&
               x.steps.size() == y.steps.size() && x.areas == y.areas && x.views.empty() &&
               y.views.empty() && !x.key.full_sides;
    };
    const auto diff = [](uint64_t x, uint64_t y) { return int64_t(x) - int64_t(y); };
    size_t period = 0;
    for (size_t q = 1; q <= n && !period; ++q) {
        if (n % q) continue;
        bool ok = true;
        for (size_t i = 0; ok && i < n; ++i)
            ok = same(plans[i], plans[0], false) &&
                 (i + q >= n || (same(plans[i], plans[i + q], true) &&
                                 diff(plans[i + q].a_off, plans[i].a_off) ==
                                     diff(plans[q].a_off, plans[0].a_off) &&
                                 diff(plans[i + q].w_off, plans[i].w_off) ==
                                     diff(plans[q].w_off, plans[0].w_off) &&
                                 diff(plans[i + q].c_off, plans[i].c_off) ==
                                     diff(plans[q].c_off, plans[0].c_off)));
        if (ok) period = q;
    }
    // A prologue's vectors (attention's softmax max and sum) once for every batch.
    std::optional<PrologueVmem> pv;
    if (n && plans[0].prologue)
        pv = load_prologue(b, *plans[0].prologue, load,
                           uint64_t(plans[0].key.R) * plans[0].key.C * 4);
    const PrologueVmem* pvp = pv ? &*pv : nullptr;
    std::optional<ReductionVmem> rv;
    if (n && plans[0].reduction)
        rv = reduction_vmem(b, *plans[0].reduction, epilogue_area_bytes(plans[0].key));
    const ReductionVmem* rvp = rv ? &*rv : nullptr;
    if (n < 2 || !period) {
        for (const DotFusion& p : plans) emit_one(b, p, load, {}, pvp, nullptr, rvp);
        if (rv) store_reduction(b, *plans[0].reduction, *rv, load);
        return;
    }
    driver::DotBatch batch;
    for (size_t j = 0; j < period; ++j)
        batch.period.push_back(
            {diff(plans[j].a_off, plans[0].a_off), diff(plans[j].w_off, plans[0].w_off),
             diff(plans[j].c_off, plans[0].c_off), plans[j].key.a_lane, plans[j].key.w_lane});
    batch.passes = uint32_t(n / period);
    if (batch.passes > 1) {
        batch.a = diff(plans[period].a_off, plans[0].a_off);
        batch.w = diff(plans[period].w_off, plans[0].w_off);
        batch.c = diff(plans[period].c_off, plans[0].c_off);
    }
    emit_one(b, plans[0], load, batch, pvp, nullptr, rvp);
    if (rv) store_reduction(b, *plans[0].reduction, *rv, load);
}

std::shared_ptr<const DotReductionSplit> split_dot_reduction(const Graph& g, const Fusion& f) {
    if (f.kind != FusionKind::Output) return nullptr;
    std::set<ValueId> reduced;  // the reductions' results
    OpId first = kNoOp;
    for (OpId id : f.ops)
        if (g.op(id).kind == OpKind::Reduce) {
            reduced.insert(g.op(id).results[0]);
            if (first == kNoOp) first = id;
        }
    if (reduced.empty()) return nullptr;
    auto s = std::make_shared<DotReductionSplit>();
    // The ops each part needs: back from its results within the fusion; the reductions' walk
    // stops at the dot's results they read (their stream pass reads those from memory).
    const auto needs = [&](const std::vector<ValueId>& from, const std::set<ValueId>& stop) {
        std::set<OpId> ops;
        std::vector<ValueId> todo(from.begin(), from.end());
        while (!todo.empty()) {
            const ValueId v = todo.back();
            todo.pop_back();
            if (stop.count(v) || !inside_fusion(f, g, v)) continue;
            if (!ops.insert(g.value(v).producer).second) continue;
            for (ValueId o : g.producer(v).operands) todo.push_back(o);
        }
        return ops;
    };
    std::vector<ValueId> core_results;
    std::set<ValueId> stop;
    for (const FusionValue& r : f.results)
        if (!reduced.count(r.value)) {
            core_results.push_back(r.value);
            stop.insert(r.value);
        }
    const std::set<OpId> core_ops = needs(core_results, {}),
                         pass_ops = needs({reduced.begin(), reduced.end()}, stop);
    const auto reads = [&](const std::set<OpId>& ops, ValueId v) {
        for (OpId id : ops)
            for (ValueId o : g.op(id).operands)
                if (o == v) return true;
        return false;
    };
    Fusion& c = s->core;
    c.name = f.name;
    c.kind = f.kind;
    c.hero = f.hero;
    c.dots = f.dots;
    c.layers = f.layers;
    c.scratch = f.scratch;
    Fusion& p = s->pass;
    p.name = f.name;
    p.kind = FusionKind::Input;
    p.hero = first;
    p.layers = f.layers;
    for (OpId id : f.ops) {
        if (core_ops.count(id)) c.ops.push_back(id);
        if (pass_ops.count(id)) p.ops.push_back(id);
    }
    for (const FusionValue& fv : f.operands) {
        if (reads(core_ops, fv.value)) c.operands.push_back(fv);
        if (reads(pass_ops, fv.value)) p.operands.push_back(fv);
    }
    for (const FusionValue& fv : f.results) {
        if (reduced.count(fv.value)) {
            p.results.push_back(fv);
            continue;
        }
        c.results.push_back(fv);
        if (reads(pass_ops, fv.value)) p.operands.push_back(fv);
    }
    return s;
}

bool plan_dot_reduction(const Graph& g, const DotReductionSplit& split,
                        std::vector<DotFusion>& plans, const hw::BoardConfig& board) {
    const Fusion& pf = split.pass;
    if (plans.empty() || pf.operands.size() != 1 || pf.results.empty()) return false;
    const ValueId v = pf.operands[0].value;
    const std::vector<int64_t> vd = nonunit(g.shape(v).dims);
    if (vd.size() < 2) return false;
    auto r = std::make_shared<DotReduction>();
    r->batched = !g.op(split.core.hero).attrs.dot.lhs_batch.empty();
    r->M = vd[vd.size() - 2];
    r->N = vd.back();
    r->B = g.shape(v).elements() / (r->M * r->N);
    // The steps: every op of the pass but the reductions, on values of v's shape (unit dims
    // aside): unary, of two such values, or of one and a literal (through broadcasts), the value
    // first where the op is not commutative; reshapes of unit dims are the same values.
    const auto literal = [&](ValueId x) -> std::optional<float> {
        while (g.producer(x).kind == OpKind::Broadcast) x = g.producer(x).operands[0];
        const Op& op = g.producer(x);
        if (op.kind != OpKind::Literal || g.shape(x).elements() != 1) return std::nullopt;
        return float(op.attrs.scalar);
    };
    std::map<ValueId, int> val{{v, 0}};
    const auto index = [&](ValueId x) {
        auto it = val.find(x);
        return it == val.end() ? -1 : it->second;
    };
    int over = -1;  // the reduced dim: 1 rows, 0 columns
    for (OpId id : pf.ops) {
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        if (op.kind == OpKind::Literal || (op.kind == OpKind::Broadcast && literal(res))) continue;
        if (op.kind == OpKind::Reshape) {
            if (index(op.operands[0]) < 0 || nonunit(g.shape(res).dims) != vd) return false;
            val[res] = index(op.operands[0]);
            continue;
        }
        if (op.kind == OpKind::Reduce) {
            if (index(op.operands[0]) < 0) return false;
            const int64_t reduced =
                reduced_nonunit_position(g.shape(op.operands[0]).dims, op.attrs.dims);
            if (reduced != 0 && reduced != 1) return false;
            if (over >= 0 && over != reduced) return false;
            over = int(reduced);
            DotReduction::Out o;
            o.max = op.attrs.reducer == Reducer::Max;
            o.value = index(op.operands[0]);
            for (const FusionValue& fv : pf.results)
                if (fv.value == res) o.result = &fv;
            if (!o.result) return false;
            r->outs.push_back(o);
            continue;
        }
        if (op_class(op.kind) != OpClass::Elementwise || nonunit(g.shape(res).dims) != vd)
            return false;
        DotReduction::Step st{op.kind, op.attrs.comparison};
        // A whole-tile op the VPU has (a comparison: > or <, as the epilogue's).
        const bool lowered = op.kind == OpKind::Compare ? st.comparison == Comparison::Gt ||
                                                              st.comparison == Comparison::Lt
                                                        : has_vpu_lowering(op.kind);
        const int i0 = index(op.operands[0]);
        if (op.operands.size() == 1) {
            if (i0 < 0 || !lowered) return false;
            st.unary = true;
            st.a = i0;
        } else if (op.operands.size() == 2) {
            const int i1 = index(op.operands[1]);
            const auto c0 = literal(op.operands[0]), c1 = literal(op.operands[1]);
            if (i0 >= 0 && i1 >= 0 && lowered) {
                st.a = i0;
                st.b = i1;
            } else if (i0 >= 0 && c1 && literal_op_lowered(op.kind, *c1, true)) {
                st.a = i0;
                st.literal = true;
                st.scalar = *c1;
            } else if (i1 >= 0 && c0 && literal_op_lowered(op.kind, *c0, false)) {
                st.a = i1;
                st.literal = true;
                st.scalar = *c0;
            } else {
                return false;
            }
        } else {
            return false;
        }
        r->steps.push_back(st);
        val[res] = int(r->steps.size());
    }
    if (r->outs.empty() || over < 0) return false;
    r->over_rows = over == 1;
    r->Q = r->over_rows ? r->N : r->M;
    // The results: row-major, or (batched) T(8,128) tiles over their last two dims (the second-
    // minor one the last batch dim, H), each [H, Q] matrix's tiles after the one before.
    for (DotReduction::Out& o : r->outs) {
        const FusionValue& res = *o.result;
        const int64_t rr = res.shape.rank();
        if (res.layout == row_major(rr)) continue;
        if (!r->batched || rr < 2 || res.layout.tile != std::vector<int64_t>{8, 128} ||
            res.layout.minor_to_major != row_major(rr).minor_to_major ||
            res.shape.dims[size_t(rr - 1)] != r->Q)
            return false;
        o.tiled = true;
        o.H = res.shape.dims[size_t(rr - 2)];
    }
    if (int64_t(plans.size()) != r->B || board.core.vpu_lanes != 128 ||
        board.core.vpu_sublanes != 8)
        return false;
    for (const DotFusion& p : plans) {
        const driver::DotKey& k = p.key;
        const bool lhs = k.stationary == driver::Stationary::Lhs;
        if (k.C != 128 || k.store_bf16 || k.parts != 1) return false;
        if (r->batched) {
            // Each batch one block and one column group, the RHS stationary.
            const uint64_t group = uint64_t(k.group_panels) * k.mxus * k.C;
            if (lhs || k.block_rows < r->M || group < uint64_t(r->N) || (r->over_rows && r->M % 8))
                return false;
        } else {
            // Over the columns; with the LHS stationary panels of 128 whole rows, whole chunks,
            // and one block of every column or blocks that divide them.
            if (r->over_rows) return false;
            if (lhs && (r->M % 128 || r->N % 128 || k.block_rows % 128 ||
                        (k.block_rows < r->N && r->N % k.block_rows)))
                return false;
            r->lhs = lhs;
        }
        const uint64_t pro = p.prologue ? p.prologue->vmem_bytes(board) : 0;
        if (driver::dot_vmem_bytes(k) + uint64_t(p.areas) * epilogue_area_bytes(k) + pro +
                r->vmem_bytes(epilogue_area_bytes(k)) + 4096 >
            board.core.vmem_bytes)
            return false;
    }
    for (DotFusion& p : plans) p.reduction = r;
    return true;
}

}  // namespace tpu::compiler::gen
