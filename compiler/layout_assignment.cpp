// SPDX-License-Identifier: Apache-2.0
// Stages 5 and 6: the stationary operand of each dot (asked of the driver's planner) and the
// layout of every buffer (compiler/README.md, "Stationary operand" and "Layouts").
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/stages.h"
#include "driver/device.h"
#include "driver/kernels/gemm.h"

namespace tpu::compiler::detail {
namespace {

int64_t product(const Shape& s, const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= s.dims[size_t(d)];
    return n;
}

std::vector<int64_t> free_dims(int64_t rank, const std::vector<int64_t>& batch,
                               const std::vector<int64_t>& contracting) {
    std::vector<int64_t> f;
    for (int64_t d = 0; d < rank; ++d)
        if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
            std::find(contracting.begin(), contracting.end(), d) == contracting.end())
            f.push_back(d);
    return f;
}

/// The planner's cycles for `batch` GEMMs of rows x K x cols on one core (streaming `rows`),
/// or infinity when no tiling fits.
double gemm_cycles(const hw::BoardConfig& cfg, int64_t batch, int64_t rows, int64_t k, int64_t cols,
                   driver::Precision p) {
    constexpr int64_t kMax = std::numeric_limits<uint32_t>::max();
    if (rows > kMax || k > kMax || cols > kMax) return std::numeric_limits<double>::infinity();
    try {
        const driver::GemmTiling t =
            driver::plan_gemm(cfg, uint32_t(rows), uint32_t(k), uint32_t(cols), p);
        return double(batch) * driver::gemm_estimate_cycles(cfg, t, uint32_t(rows));
    } catch (const driver::DeviceError&) {
        return std::numeric_limits<double>::infinity();
    }
}

/// Layout of a dot operand: batch dims major; the stationary operand with its contracting dims
/// before its free dims (rows of K, the MXU's weight tile, R x C tiles), the streamed one with
/// its contracting dims minor (each streamed row is one run of K values).
Layout dot_operand_layout(const Shape& s, const std::vector<int64_t>& batch,
                          const std::vector<int64_t>& contracting, bool stationary, bool weight,
                          const hw::BoardConfig& cfg) {
    const auto free = free_dims(s.rank(), batch, contracting);
    std::vector<int64_t> order = batch;  // major to minor
    const auto& first = stationary ? contracting : free;
    const auto& second = stationary ? free : contracting;
    order.insert(order.end(), first.begin(), first.end());
    order.insert(order.end(), second.begin(), second.end());
    Layout l;
    l.minor_to_major.assign(order.rbegin(), order.rend());
    if (weight && s.rank() >= 2)
        l.tile = {int64_t(cfg.core.mxu_rows), int64_t(cfg.core.mxu_cols)};
    else
        l.tile = default_layout(s, cfg).tile;
    return l;
}

bool is_member(const Fusion& f, OpId id) {
    return std::binary_search(f.ops.begin(), f.ops.end(), id);
}

/// Whether `f` is a convolution output fusion, a pooling fusion or a sum over H and W of an
/// NHWC array (codegen_conv.cpp): its kernels read and write row-major NHWC (and HWIO).
bool conv_pool_fusion(const Graph& g, const Fusion& f) {
    if (f.hero == kNoOp) return false;
    const Op& h = g.op(f.hero);
    return (f.kind == FusionKind::Output &&
            (h.kind == OpKind::Conv2d || h.kind == OpKind::Conv2dInputGrad ||
             h.kind == OpKind::Conv2dFilterGrad)) ||
           h.kind == OpKind::Pool || h.kind == OpKind::MaxPoolGrad ||
           h.kind == OpKind::AvgPoolGrad ||
           (f.kind == FusionKind::Input && h.kind == OpKind::Reduce &&
            g.shape(h.operands[0]).rank() == 4 && h.attrs.dims == std::vector<int64_t>{1, 2});
}

/// The layout a convolution or pooling fusion reads operand `v` in: untiled row-major NHWC
/// for its activations and residuals, HWIO for a filter. The packing kernels read these and
/// write the convolution's bf16 phase planes and weight tiles into the fusion's scratch
/// (driver/kernels/conv2d.h); the pooling kernel gathers rows of C channels by strided DMAs.
std::optional<Layout> conv_pool_preference(const Graph& g, const Fusion& f, ValueId v) {
    if (!conv_pool_fusion(g, f)) return std::nullopt;
    const Shape& s = g.shape(v);
    // A leaf the fusion transposes first (PyTorch's NCHW input and OIHW filter, which
    // tpusim.torch records as transposes to NHWC and HWIO): in the order the transpose reads
    // it, so the transpose is the same bytes (the runtime relayouts a leaf as it writes it over
    // the host link, as XLA's transfers write an entry parameter in its device layout).
    if (s.rank() == 4 &&
        (g.producer(v).kind == OpKind::Parameter || g.producer(v).kind == OpKind::Input)) {
        const Op* t = nullptr;
        int users = 0;
        for (OpId id : f.ops)
            for (ValueId x : g.op(id).operands)
                if (x == v) {
                    ++users;
                    if (g.op(id).kind == OpKind::Transpose) t = &g.op(id);
                }
        if (users == 1 && t) return Layout{{t->attrs.dims.rbegin(), t->attrs.dims.rend()}, {}};
    }
    if (s.rank() == 4) return row_major(4);
    // A batch of [B, H W C] rows that the fusion views as NHWC (the zoo's stem): untiled
    // row-major, the reshape is the same bytes and the kernel reads the operand itself.
    for (OpId id : f.ops) {
        const Op& op = g.op(id);
        if (op.kind == OpKind::Reshape && op.operands[0] == v && g.shape(op.results[0]).rank() == 4)
            return row_major(s.rank());
    }
    return std::nullopt;
}

/// Whether parameter `v` may lie in the MXU's weight tiles when a dot streams it: every fusion
/// that reads it is a dot's output fusion (the dot kernel reads a streamed operand in them,
/// contracting dim minor), and no output updates it in place (its gradient would have to be
/// written in them too, which the kernel does not do for the RHS orientation).
bool streamed_weight_tiles(const CompiledStep& step, ValueId v) {
    const Graph& g = step.graph;
    for (const Fusion& f : step.fusions)
        for (const FusionValue& fv : f.operands)
            if (fv.value == v && (f.kind != FusionKind::Output || f.hero == kNoOp ||
                                  g.op(f.hero).kind != OpKind::Dot))
                return false;
    const auto params = g.leaves(OpKind::Parameter);
    for (const Output& o : g.outputs())
        if (o.updates_parameter >= 0 && params[size_t(o.updates_parameter)] == v) return false;
    return true;
}

/// Whether computed matrix `v`, which a 2-D dot holds stationary, may lie in the MXU's tiles
/// transposed ({0,1:T(R,R)} of [M, K]: each held R x R tile one contiguous run instead of 16
/// runs of 4 KiB a tile column apart): a 2-D dot's output fusion writes it (C^T in the MXU's
/// tiles, DotLayout::TransposedTiles: no residual of its shape, which the kernel does not read
/// in them), every fusion that reads it is a dot's output fusion, and its dims are whole tiles.
bool held_in_mxu_tiles(const CompiledStep& step, ValueId v, const hw::BoardConfig& cfg) {
    const Graph& g = step.graph;
    const Shape& s = g.shape(v);
    const int64_t R = int64_t(cfg.core.mxu_rows);
    if (s.rank() != 2 || cfg.core.mxu_rows != cfg.core.mxu_cols || s.dims[0] % R || s.dims[1] % R ||
        s.dtype != DType::F32)
        return false;
    const auto is_dot_fusion = [&](const Fusion& f) {
        return f.kind == FusionKind::Output && f.hero != kNoOp &&
               g.op(f.hero).kind == OpKind::Dot && g.op(f.hero).attrs.dot.lhs_batch.empty();
    };
    bool written = false;
    for (const Fusion& f : step.fusions) {
        for (const FusionValue& r : f.results) {
            if (r.value != v) continue;
            if (!is_dot_fusion(f) || f.results.size() != 1) return false;
            for (const FusionValue& fv : f.operands)
                if (g.shape(fv.value).dims == s.dims) return false;
            written = true;
        }
        for (const FusionValue& fv : f.operands)
            if (fv.value == v && !is_dot_fusion(f)) return false;
    }
    for (const Output& o : g.outputs())
        if (o.value == v) return false;
    return written;
}

/// The layout fusion `f` would like operand `v` in, if it has a preference.
std::optional<Layout> preference(const CompiledStep& step, const Fusion& f, ValueId v,
                                 const hw::BoardConfig& cfg) {
    const Graph& g = step.graph;
    if (auto l = conv_pool_preference(g, f, v)) return l;
    // A table a gather reads lies in rows (row-major, default tiles: each row a few whole lane
    // chunks), so that a gathered row is one DMA (codegen_gather.cpp); a dot that also reads it
    // (a tied lm_head) reads those tiles as it reads any matrix in them. XLA's TPU layout for a
    // tied embedding is not public.
    // Its ids (through reshapes and slices: [B, S] token ids viewed as [B S], BERT's position
    // ids sliced from a buffer) lie untiled row-major, so the sequencer reads them in order
    // from scalar memory.
    for (OpId id : f.ops) {
        if (op_class(g.op(id).kind) != OpClass::Gather) continue;
        if (g.op(id).operands[0] == v) return default_layout(g.shape(v), cfg);
        ValueId x = g.op(id).operands[1];
        while (x != v && is_member(f, g.value(x).producer) &&
               (g.producer(x).kind == OpKind::Reshape || g.producer(x).kind == OpKind::Slice))
            x = g.producer(x).operands[0];
        if (x == v) return row_major(g.shape(v).rank());
    }
    if (f.kind != FusionKind::Output || f.hero == kNoOp) return std::nullopt;
    const Op& hero = g.op(f.hero);
    const bool leaf_param = g.producer(v).kind == OpKind::Parameter;
    for (size_t side = 0; side < 2; ++side) {
        // Follow the operand back through conversions and concatenations (merged dots read
        // their parts as one operand, joined along a free dim); a reshape or transpose before
        // the MXU means the kernel maps dims itself: no preference.
        std::vector<ValueId> stack{hero.operands[side]};
        bool found = false;
        while (!stack.empty() && !found) {
            const ValueId x = stack.back();
            stack.pop_back();
            found = x == v;
            if (!is_member(f, g.value(x).producer)) continue;
            const Op& p = g.producer(x);
            if (p.kind == OpKind::Convert || p.kind == OpKind::Concatenate)
                stack.insert(stack.end(), p.operands.begin(), p.operands.end());
            // A dot reading v through a reshape that merges dims (attention's [heads, d, seq]
            // viewed as [seq, hidden]): v lies untiled row-major, so the view is the same bytes
            // (a tiled layout would make it a relayout). A head split ([R, H D] to [R, H, D])
            // is read through the tiles as they are (unit dims aside: [R, H D] to
            // [1, R, H, D] for a batch of one sequence): no preference.
            // Through a transpose first (attention's heads [1, H, S, d] merged back to
            // [S, H d]): v lies untiled in the transposed order, so the transpose is
            // row-major and the merge the same bytes.
            if (hero.kind == OpKind::Dot && p.kind == OpKind::Reshape &&
                is_member(f, g.value(p.operands[0]).producer) &&
                g.producer(p.operands[0]).kind == OpKind::Transpose &&
                g.producer(p.operands[0]).operands[0] == v) {
                const std::vector<int64_t>& perm = g.producer(p.operands[0]).attrs.dims;
                Layout l;
                l.minor_to_major.assign(perm.rbegin(), perm.rend());
                return l;
            }
            std::vector<int64_t> split;
            for (int64_t e : g.shape(x).dims)
                if (e != 1) split.push_back(e);
            // Nor does a reshape that only inserts or deletes major unit dims (PyTorch's
            // [1, S, D] viewed as [S, D] for addmm, [1, H, S, S] as [H, S, S] for bmm): the
            // default tiles of both are the same bytes, so v keeps them.
            const auto& vd = g.shape(v).dims;
            const auto& xd = g.shape(x).dims;
            // So does one that merges major dims into whole tiles' rows ([B, S, D] as [B S,
            // D] with S a multiple of the tile's rows).
            const int64_t tile_rows = default_layout(g.shape(v), cfg).tile.empty()
                                          ? 0
                                          : default_layout(g.shape(v), cfg).tile[0];
            const bool unit_view =
                vd.size() >= 2 && xd.size() >= 2 && vd.back() == xd.back() &&
                ((split == nonunit(vd) && vd[vd.size() - 2] == xd[xd.size() - 2]) ||
                 (xd.size() == 2 && vd.size() > 2 && tile_rows > 0 &&
                  vd[vd.size() - 2] % tile_rows == 0));
            // Nor one that splits [B S, H D] into [B, S, H, D] (the heads of a batch of
            // sequences, read by a dot over the batch dims {B, H} as windows of whole bands).
            const bool batch_head_split =
                vd.size() == 2 && split.size() == 4 && split[0] * split[1] == vd[0] &&
                split[2] * split[3] == vd[1] && tile_rows > 0 && split[1] % tile_rows == 0;
            if (hero.kind == OpKind::Dot && p.kind == OpKind::Reshape && p.operands[0] == v &&
                !unit_view && !batch_head_split &&
                !(g.shape(v).rank() == 2 && split.size() == 3 && split[0] == g.shape(v).dims[0]))
                return row_major(g.shape(v).rank());
        }
        if (!found) continue;
        const Shape& s = g.shape(v);
        if (hero.kind == OpKind::Dot) {
            const DotDims& d = hero.attrs.dot;
            const bool stationary =
                !f.dots.empty() && (f.dots[0].stationary == Stationary::Rhs) == (side == 1);
            // A computed matrix streamed along its major dim (a weight gradient's dY^T X
            // reads dY [batch, out] contracting the batch) is read as it lies, a tile column
            // at a time (the kernel's transposed tiles): its producer keeps the default.
            const auto& contracting = side == 0 ? d.lhs_contracting : d.rhs_contracting;
            if (!stationary && !leaf_param && s.rank() == 2 && contracting.size() == 1 &&
                contracting[0] == 0)
                return std::nullopt;
            // A computed matrix held stationary is read as it lies too (the kernel transposes
            // a held tile in VMEM when its contracting dim is minor): its producer, a loop
            // fusion or another dot, writes the default row-major tiles.
            // So is a batched dot's held matrix (attention's probabilities, written by the
            // softmax in the default tiles, each batch's matrix transposed as it is held).
            // Unless a dot writes it for a dot that holds it: then both read and write the
            // MXU's tiles (BERT's ffn: fc_1's output held by fc_2).
            if (stationary && !leaf_param && d.lhs_batch.empty() && contracting.size() == 1 &&
                held_in_mxu_tiles(step, v, cfg))
                return dot_operand_layout(s, {}, contracting, true, true, cfg);
            if (stationary && !leaf_param && (s.rank() == 2 || !d.lhs_batch.empty()))
                return std::nullopt;
            // A parameter the dot streams lies in the MXU's tiles too: each streamed panel of
            // a block is then whole contiguous tiles (an 8 x 128 tile column is 4 KiB runs KT
            // tiles apart, which the banked HBM serves at a fraction of its peak: issue #29,
            // BERT's fc_1 and fc_2 stream their weights).
            // (Whole tiles along K: a padded K stays in 8 x 128 tiles, read lane by lane.)
            const bool tiles =
                leaf_param &&
                (stationary || (s.rank() == 2 && contracting.size() == 1 &&
                                cfg.core.mxu_rows == cfg.core.mxu_cols &&
                                s.dims[size_t(contracting[0])] % int64_t(cfg.core.mxu_rows) == 0 &&
                                streamed_weight_tiles(step, v)));
            // Either way a parameter lies as the stationary side holds it (contracting dims
            // major): streamed, a panel of a block is the block's tiles of one tile row, one
            // contiguous run, each tile transposed in VMEM.
            return dot_operand_layout(s, side == 0 ? d.lhs_batch : d.rhs_batch,
                                      side == 0 ? d.lhs_contracting : d.rhs_contracting,
                                      stationary || tiles, tiles, cfg);
        }
        return std::nullopt;
    }
    return std::nullopt;
}

/// A 2-D dot's output fusion (no batch dims).
bool plain_dot_fusion(const Graph& g, const Fusion& f) {
    return f.kind == FusionKind::Output && f.hero != kNoOp && g.op(f.hero).kind == OpKind::Dot &&
           g.op(f.hero).attrs.dot.lhs_batch.empty();
}

/// A loop fusion of a concatenation (fusion.cpp): row copies, which write any layout alike.
bool concat_fusion(const Graph& g, const Fusion& f) {
    return f.kind == FusionKind::Loop && std::any_of(f.ops.begin(), f.ops.end(), [&](OpId id) {
               return g.op(id).kind == OpKind::Concatenate;
           });
}

/// [B, S, D] (rank 3 or more) f32 with several sequences of S rows, S not a multiple of the
/// tile's rows.
bool padded_sequences(const Shape& s, const hw::BoardConfig& cfg) {
    if (s.rank() < 3 || s.dtype != DType::F32) return false;
    int64_t seqs = 1;
    for (int64_t i = 0; i + 2 < s.rank(); ++i) seqs *= s.dims[size_t(i)];
    return seqs > 1 && s.dims[size_t(s.rank() - 2)] % int64_t(cfg.core.vpu_sublanes) != 0;
}

/// Whether loop fusion `f` repeats `v` over a batch of padded sequences: broadcasts it (through
/// reshapes of unit dims only) along new major dims to [B, S, D] (padded_sequences).
bool repeated_over_padded_sequences(const Graph& g, const Fusion& f, ValueId v,
                                    const hw::BoardConfig& cfg) {
    if (f.kind == FusionKind::Output || f.kind == FusionKind::Collective) return false;
    const std::vector<int64_t> rows = nonunit(g.shape(v).dims);
    std::set<ValueId> views{v};
    for (OpId id : f.ops) {
        const Op& op = g.op(id);
        if (op.operands.empty() || !views.count(op.operands[0])) continue;
        const Shape& out = g.shape(op.results[0]);
        if (op.kind == OpKind::Reshape && nonunit(out.dims) == rows) views.insert(op.results[0]);
        if (op.kind != OpKind::Broadcast || !padded_sequences(out, cfg)) continue;
        // The operand's rows become the result's minor dims, in order.
        const Shape& in = g.shape(op.operands[0]);
        std::vector<int64_t> to;
        for (size_t d = 0; d < op.attrs.dims.size(); ++d)
            if (in.dims[d] != 1) to.push_back(op.attrs.dims[d]);
        const auto od = nonunit(out.dims);
        if (od.size() > rows.size() && !to.empty() && to.back() == out.rank() - 1 &&
            std::is_sorted(to.begin(), to.end()) &&
            std::equal(rows.begin(), rows.end(), od.end() - int64_t(rows.size())))
            return true;
    }
    return false;
}

int64_t nonunit_dims(const Shape& s) {
    return std::count_if(s.dims.begin(), s.dims.end(), [](int64_t d) { return d != 1; });
}

}  // namespace

Layout default_layout(const Shape& s, const hw::BoardConfig& board) {
    Layout l = row_major(s.rank());
    // An array with one non-unit dim (a [1, N] row at batch 1) lies as the vector it is, as
    // rank 1 does (T(8,128) would pad it to 8 rows, which no vector reader expects), when its N
    // values are whole lane chunks or fewer than one: a row of padded chunks (1000 classes)
    // streams only in tiles, whose padding lanes the streaming engine masks.
    const int64_t lanes = board.core.vpu_lanes;
    const bool vector = nonunit_dims(s) <= 1 && (s.elements() % lanes == 0 || s.elements() < lanes);
    if (s.rank() >= 2 && !vector) {
        const int64_t pack = 4 / int64_t(dtype_bytes(s.dtype));
        l.tile = {int64_t(board.core.vpu_sublanes) * pack, int64_t(board.core.vpu_lanes)};
    }
    return l;
}

void plan_dots(CompiledStep& step, const CompileOptions& options) {
    const Graph& g = step.graph;
    for (Fusion& f : step.fusions) {
        if (f.hero == kNoOp || g.op(f.hero).kind != OpKind::Dot) continue;
        const Op& op = g.op(f.hero);
        const DotDims& d = op.attrs.dot;
        const Shape &ls = g.shape(op.operands[0]), &rs = g.shape(op.operands[1]);
        DotPlan p;
        p.op = f.hero;
        p.batch = product(ls, d.lhs_batch);
        p.k = product(ls, d.lhs_contracting);
        p.m = product(ls, free_dims(ls.rank(), d.lhs_batch, d.lhs_contracting));
        p.n = product(rs, free_dims(rs.rank(), d.rhs_batch, d.rhs_contracting));
        const driver::Precision prec =
            mxu_precision(op.attrs.precision, g.shape(op.operands[0]).dtype);
        // C = A W streams A's m rows past W; the transposed problem streams W's n columns.
        p.rhs_cycles = gemm_cycles(options.board, p.batch, p.m, p.k, p.n, prec);
        p.lhs_cycles = gemm_cycles(options.board, p.batch, p.n, p.k, p.m, prec);
        p.stationary = p.lhs_cycles < p.rhs_cycles ? Stationary::Lhs : Stationary::Rhs;
        f.dots = {p};
    }
}

void assign_layouts(CompiledStep& step, const CompileOptions& options) {
    Graph& g = step.graph;
    const hw::BoardConfig& cfg = options.board;
    // Who reads each value, in execution order.
    std::vector<std::vector<size_t>> readers(g.values().size());
    for (size_t i = 0; i < step.fusions.size(); ++i)
        for (ValueId v : [&] {
                 std::vector<ValueId> vs;
                 for (const FusionValue& fv : step.fusions[i].operands) vs.push_back(fv.value);
                 return vs;
             }())
            readers[v].push_back(i);
    std::map<ValueId, size_t> writer;
    for (size_t i = 0; i < step.fusions.size(); ++i)
        for (const FusionValue& r : step.fusions[i].results) writer[r.value] = i;
    const auto choose = [&](ValueId v) {
        Value& val = g.value_mut(v);
        if (val.layout.assigned()) return;
        // Each producer writes the layout its first consumer with a preference reads.
        for (size_t i : readers[v])
            if (auto l = preference(step, step.fusions[i], v, cfg)) {
                val.layout = *l;
                return;
            }
        // A batch of sequences whose length is not whole tiles (ViT's [B, 17, D]: 16 patches
        // and the class token), which 2-D dots write and read as their [B S, D] matrices: in
        // T(8,128) tiles each sequence's rows are padded to whole tiles, so the merge would
        // be a relayout; untiled row-major it is the same bytes, and the streaming fusions
        // between the dots (layer norms, residuals) read it as rows; so does what such a
        // fusion writes from an operand of its shape laid out so (the last layer norm's
        // output: one layout in the fusion), and a concatenation's copies write it so.
        if (padded_sequences(val.shape, cfg)) {
            bool by_dot = false;
            if (auto w = writer.find(v); w != writer.end()) {
                const Fusion& wf = step.fusions[w->second];
                // A concatenation's copies write untiled rows as well as tiles, and the
                // sequences' padding would more than double their bytes (ViT's class token
                // joined to the patches: 17 rows of 192 padded to 24 of 256).
                by_dot |= plain_dot_fusion(g, wf) || concat_fusion(g, wf);
                for (const FusionValue& o : wf.operands)
                    by_dot |= o.shape.dims == val.shape.dims &&
                              g.value(o.value).layout == row_major(val.shape.rank());
            }
            for (size_t i : readers[v]) by_dot |= plain_dot_fusion(g, step.fusions[i]);
            if (by_dot) {
                val.layout = row_major(val.shape.rank());
                return;
            }
        }
        // A table added to each of them (ViT's [1, 17, D] position embeddings) lies untiled
        // too: the streaming fusion reads its rows as it reads theirs (codegen_stream.cpp).
        for (size_t i : readers[v])
            if (repeated_over_padded_sequences(g, step.fusions[i], v, cfg)) {
                val.layout = row_major(val.shape.rank());
                return;
            }
        // A convolution or pooling fusion writes row-major NHWC (conv_pool_preference).
        if (auto w = writer.find(v); w != writer.end() && val.shape.rank() == 4 &&
                                     conv_pool_fusion(g, step.fusions[w->second])) {
            val.layout = row_major(4);
            return;
        }
        val.layout = default_layout(val.shape, cfg);
    };
    // Parameters a dot reads first (they keep their layout across steps); a parameter no dot
    // reads (optimizer state) waits for the parameter it is updated alongside (below).
    const auto preferred = [&](ValueId v) {
        for (size_t i : readers[v])
            if (preference(step, step.fusions[i], v, cfg)) return true;
        return false;
    };
    for (ValueId v : g.leaves(OpKind::Parameter))
        if (preferred(v)) choose(v);
    // An optimizer update writes a parameter in place: its gradient (through the all-reduce and
    // the elementwise fusions between) and its state (momentum) take the parameter's layout,
    // so the update reads them all in one layout and the weight gradient's dot writes it
    // directly (XLA's layout assignment propagates an operand constraint from the aliased
    // output the same way).
    std::vector<int64_t> producer_fusion(g.values().size(), -1);
    for (size_t i = 0; i < step.fusions.size(); ++i)
        for (const FusionValue& r : step.fusions[i].results) producer_fusion[r.value] = int64_t(i);
    const auto params_in_order = g.leaves(OpKind::Parameter);
    for (const Output& o : g.outputs()) {
        if (o.updates_parameter < 0) continue;
        const ValueId p = params_in_order[size_t(o.updates_parameter)];
        if (!g.value(p).layout.assigned()) continue;
        const Layout& l = g.value(p).layout;
        const Shape& s = g.value(p).shape;
        std::vector<ValueId> todo{o.value};
        while (!todo.empty()) {
            const ValueId v = todo.back();
            todo.pop_back();
            const int64_t fi = producer_fusion[v];
            if (fi < 0) continue;
            const Fusion& f = step.fusions[size_t(fi)];
            if (f.kind != FusionKind::Loop && f.kind != FusionKind::Collective) continue;
            for (const FusionValue& fv : f.operands) {
                Value& val = g.value_mut(fv.value);
                if (val.layout.assigned() || !(val.shape.dims == s.dims)) continue;
                const OpKind k = g.producer(fv.value).kind;
                if (k == OpKind::Input || k == OpKind::Constant) continue;
                val.layout = l;
                todo.push_back(fv.value);
            }
        }
    }
    for (OpKind k : {OpKind::Parameter, OpKind::Input, OpKind::Constant})
        for (ValueId v : g.leaves(k)) choose(v);
    // An output that replaces a parameter is written in the parameter's layout (in place).
    const auto params = g.leaves(OpKind::Parameter);
    for (const Output& o : g.outputs()) {
        if (o.updates_parameter < 0 || g.producer(o.value).kind == OpKind::Parameter) continue;
        Value& val = g.value_mut(o.value);
        if (!val.layout.assigned() || op_class(g.producer(o.value).kind) != OpClass::Leaf)
            val.layout = g.value(params[size_t(o.updates_parameter)]).layout;
    }
    for (const Fusion& f : step.fusions)
        for (const FusionValue& r : f.results) choose(r.value);
    for (const Output& o : g.outputs()) choose(o.value);
    for (Fusion& f : step.fusions) {
        for (FusionValue& fv : f.operands) fv.layout = g.value(fv.value).layout;
        for (FusionValue& fv : f.results) fv.layout = g.value(fv.value).layout;
    }
    for (const Value& v : g.values())
        if (v.layout.assigned()) check_layout(v.shape, v.layout, "layout assignment");
}

}  // namespace tpu::compiler::detail
