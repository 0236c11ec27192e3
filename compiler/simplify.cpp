// SPDX-License-Identifier: Apache-2.0
// Stage 2: the algebraic clean-up XLA runs before fusion (compiler/README.md, "Simplification").
#include <algorithm>
#include <map>
#include <optional>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/rewriter.h"

namespace tpu::compiler {
namespace detail {

Graph remove_dead_ops(const Graph& g) {
    std::vector<char> live(g.ops().size(), 0);
    std::vector<OpId> stack;
    for (const Output& o : g.outputs()) stack.push_back(g.value(o.value).producer);
    while (!stack.empty()) {
        const OpId id = stack.back();
        stack.pop_back();
        if (live[id]) continue;
        live[id] = 1;
        for (ValueId v : g.op(id).operands) stack.push_back(g.value(v).producer);
    }
    Rewriter rw(g);
    for (OpId id = 0; id < g.ops().size(); ++id) {
        const Op& op = g.op(id);
        // Leaves stay even when unused: their numbers are the step's calling convention.
        if (live[id] || op_class(op.kind) == OpClass::Leaf) rw.copy(op);
    }
    return rw.finish();
}

}  // namespace detail

namespace {

using detail::OpScope;
using detail::Rewriter;

/// `v` is `value` everywhere: a literal or a broadcast of one.
bool is_splat(const Graph& g, ValueId v, double value) {
    const Op* op = &g.producer(v);
    if (op->kind == OpKind::Broadcast) op = &g.producer(op->operands[0]);
    return op->kind == OpKind::Literal && op->attrs.scalar == value;
}

/// Folds transposes into the dots that read them (xla/service/transpose_folding.cc): a dot of a
/// transposed operand reads the operand itself with permuted dimension numbers. Only when the
/// operand's free dims keep their order, so the dot's result dims do not move.
bool fold_transpose(const std::vector<int64_t>& perm, std::vector<int64_t>& batch,
                    std::vector<int64_t>& contracting, int64_t rank) {
    std::vector<int64_t> free_before, free_after;
    for (int64_t d = 0; d < rank; ++d)
        if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
            std::find(contracting.begin(), contracting.end(), d) == contracting.end()) {
            free_before.push_back(d);
            free_after.push_back(perm[size_t(d)]);
        }
    if (!std::is_sorted(free_after.begin(), free_after.end())) return false;
    for (int64_t& d : batch) d = perm[size_t(d)];
    for (int64_t& d : contracting) d = perm[size_t(d)];
    return true;
}

/// The source of a broadcast operand, its dims map and the broadcast's dims; false if `v` is no
/// broadcast.
struct BroadcastOf {
    ValueId source = 0;
    std::vector<int64_t> dims, out_dims;
};
bool broadcast_of(const Graph& g, ValueId v, BroadcastOf& b) {
    const Op& op = g.producer(v);
    if (op.kind != OpKind::Broadcast) return false;
    b = {op.operands[0], op.attrs.dims, op.attrs.out_dims};
    return true;
}

/// A reshape of `in` to `dims` that only inserts or deletes dims of one element.
bool degenerate_reshape(const Graph& g, ValueId in, const std::vector<int64_t>& dims) {
    return nonunit(g.shape(in).dims) == nonunit(dims);
}

/// A reshape that is skipped when it changes nothing and reads through a reshape.
ValueId reshape_to(Graph& g, ValueId v, const std::vector<int64_t>& dims) {
    if (g.shape(v).dims == dims) return v;
    if (g.producer(v).kind == OpKind::Reshape) v = g.producer(v).operands[0];
    return g.shape(v).dims == dims ? v : reshape(g, v, dims);
}

/// `v` as a permutation of the non-unit dims of `source`, through transposes and reshapes that
/// only insert or delete unit dims: `perm[j]` is the source's non-unit dim that v's j-th is.
struct Rearranged {
    ValueId source = 0;
    std::vector<int64_t> perm;
    int ops = 0, transposes = 0;
};
Rearranged rearranged(const Graph& g, ValueId v) {
    const Op& p = g.producer(v);
    if (p.kind == OpKind::Transpose ||
        (p.kind == OpKind::Reshape && degenerate_reshape(g, p.operands[0], g.shape(v).dims))) {
        Rearranged r = rearranged(g, p.operands[0]);
        ++r.ops;
        if (p.kind == OpKind::Transpose) {
            ++r.transposes;
            const auto& in = g.shape(p.operands[0]).dims;
            std::vector<int64_t> at(in.size(), -1);  // operand dim -> its non-unit index
            for (size_t i = 0, k = 0; i < in.size(); ++i)
                if (in[i] != 1) at[i] = int64_t(k++);
            std::vector<int64_t> perm;
            for (int64_t d : p.attrs.dims)
                if (in[size_t(d)] != 1) perm.push_back(r.perm[size_t(at[size_t(d)])]);
            r.perm = perm;
        }
        return r;
    }
    Rearranged r;
    r.source = v;
    for (int64_t i = 0; i < int64_t(nonunit(g.shape(v).dims).size()); ++i) r.perm.push_back(i);
    return r;
}

/// A chain of transposes and unit-dim reshapes as one transpose of the source's non-unit dims
/// between two reshapes (each skipped when it changes nothing): PyTorch's `view`/`permute`/
/// `transpose` chains around attention's heads (`[B, S, H, d]` to `[B, H, S, d]`, `[B H, S,
/// d]`, back) become the head split a dot reads through and the transpose that folds into it
/// (xla/service/algebraic_simplifier.cc: a transpose of a transpose is one transpose, a
/// transpose or reshape that moves only degenerate dims is a reshape).
ValueId rearrange(Graph& g, const Rearranged& r, const std::vector<int64_t>& dims) {
    ValueId x = reshape_to(g, r.source, nonunit(g.shape(r.source).dims));
    bool identity = true;
    for (size_t i = 0; i < r.perm.size(); ++i) identity &= r.perm[i] == int64_t(i);
    if (!identity) x = transpose(g, x, r.perm);
    return reshape_to(g, x, dims);
}

/// A dot's operands and dimension numbers with its one batch dim (dim 0 of both sides) split
/// back into the two dims both operands were reshaped from (`[B H, ..]` of `[B, H, ..]`, B and
/// H more than one): what the dot reads then is the arrays before the merge (a reshape merging
/// batch dims is a bitcast in XLA only when the layout allows it; here it need not be one).
struct Unmerged {
    DotDims dims;
    std::vector<ValueId> operands;
};
std::optional<Unmerged> unmerged_batch(const Graph& g, const DotDims& d,
                                       const std::vector<ValueId>& in) {
    if (d.lhs_batch != std::vector<int64_t>{0} || d.rhs_batch != std::vector<int64_t>{0} ||
        in.size() != 2)
        return std::nullopt;
    Unmerged u;
    std::vector<int64_t> split;
    for (ValueId v : in) {
        const Op& r = g.producer(v);
        if (r.kind != OpKind::Reshape) return std::nullopt;
        const auto& src = g.shape(r.operands[0]).dims;
        const auto& dst = g.shape(v).dims;
        if (src.size() != dst.size() + 1 || src[0] < 2 || src[1] < 2 || src[0] * src[1] != dst[0] ||
            !std::equal(dst.begin() + 1, dst.end(), src.begin() + 2))
            return std::nullopt;
        const std::vector<int64_t> bh{src[0], src[1]};
        if (!split.empty() && split != bh) return std::nullopt;
        split = bh;
        u.operands.push_back(r.operands[0]);
    }
    u.dims.lhs_batch = u.dims.rhs_batch = {0, 1};
    for (int64_t c : d.lhs_contracting) u.dims.lhs_contracting.push_back(c + 1);
    for (int64_t c : d.rhs_contracting) u.dims.rhs_contracting.push_back(c + 1);
    return u;
}

/// The scalar `v` broadcasts (a rank-0 value or a broadcast of one), or none.
std::optional<ValueId> splat_of(const Graph& g, ValueId v) {
    if (g.shape(v).rank() == 0) return v;
    const Op& p = g.producer(v);
    if (p.kind == OpKind::Broadcast && g.shape(p.operands[0]).rank() == 0) return p.operands[0];
    return std::nullopt;
}

/// An elementwise op of one rearranged array (reshapes, transposes) and scalars, computed on
/// the array before its rearrangement (xla/service/reshape_mover.cc sinks reshapes and
/// transposes below elementwise ops whose other operands are scalars): attention's `q * scale`
/// after the head split is then the projection's epilogue on `[S, H d]`, and the split stays a
/// view the attention's dot reads through. nullopt when the op is not of that form.
std::optional<ValueId> sink_rearrangement(Graph& g, const Op& op, const std::vector<ValueId>& in) {
    if (op.results.size() != 1) return std::nullopt;
    int wide = -1;
    for (size_t i = 0; i < in.size(); ++i) {
        if (splat_of(g, in[i])) continue;
        const OpKind k = g.producer(in[i]).kind;
        if (wide >= 0 || (k != OpKind::Reshape && k != OpKind::Transpose)) return std::nullopt;
        wide = int(i);
    }
    if (wide < 0) return std::nullopt;
    // The chain down to the first value that is not rearranged.
    std::vector<const Op*> chain;
    ValueId x = in[size_t(wide)];
    while (g.producer(x).kind == OpKind::Reshape || g.producer(x).kind == OpKind::Transpose) {
        chain.push_back(&g.producer(x));
        x = g.producer(x).operands[0];
    }
    if (g.shape(x).dtype != g.shape(in[size_t(wide)]).dtype) return std::nullopt;
    const std::vector<int64_t> xdims = g.shape(x).dims;
    std::vector<ValueId> ops;
    for (size_t i = 0; i < in.size(); ++i)
        ops.push_back(int(i) == wide ? x : broadcast(g, *splat_of(g, in[i]), xdims, {}));
    // The chain's attributes are copied before the graph grows (its ops live in the graph).
    std::vector<std::pair<OpKind, Attrs>> steps;
    for (const Op* c : chain) steps.emplace_back(c->kind, c->attrs);
    ValueId y = g.add1(op.kind, ops, op.attrs);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it)
        y = it->first == OpKind::Transpose ? transpose(g, y, it->second.dims)
                                           : reshape(g, y, it->second.out_dims);
    return y;
}

/// A slice of a reshape that only inserts or deletes unit dims, as the reshape of the slice of
/// its operand (algebraic_simplifier.cc, TryToReorderSliceAndReshape): transformers' GPT-2
/// splits q, k, v by slices of the Conv1D's `[1, S, 3 D]` view of its `[S, 3 D]` dot, and the
/// slices then read the dot's result itself. Also a slice of the minor dim alone through a
/// reshape that keeps it. nullopt when `x` is no such reshape.
std::optional<ValueId> slice_below_unit_reshape(Graph& g, ValueId x, const Attrs& a) {
    const Op& r = g.producer(x);
    if (r.kind != OpKind::Reshape) return std::nullopt;
    const ValueId src = r.operands[0];
    const auto& in = g.shape(src).dims;
    const auto& out = g.shape(x).dims;
    if (!degenerate_reshape(g, src, out)) {
        // A slice of the minor dim alone through a reshape that keeps that dim (GPT-2 at
        // batch B: its [B S, 3 D] Conv1D output viewed as [B, S, 3 D] and split): the same
        // columns of every row of the operand.
        if (in.empty() || out.empty() || in.back() != out.back()) return std::nullopt;
        for (size_t i = 0; i + 1 < out.size(); ++i)
            if (a.dims[i] != 0 || a.limits[i] != out[i]) return std::nullopt;
        std::vector<int64_t> start(in.size(), 0), limit = in, dims = out;
        start.back() = a.dims.back();
        limit.back() = a.limits.back();
        dims.back() = a.limits.back() - a.dims.back();
        return reshape_to(g, slice(g, src, start, limit), dims);
    }
    // The slice's bounds on the source's dims: unit dims of the view must be taken whole.
    std::vector<int64_t> start, limit;
    size_t j = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] == 1) {
            if (a.limits[i] - a.dims[i] != 1) return std::nullopt;
            continue;
        }
        while (j < in.size() && in[j] == 1) {
            start.push_back(0);
            limit.push_back(1);
            ++j;
        }
        start.push_back(a.dims[i]);
        limit.push_back(a.limits[i]);
        ++j;
    }
    while (j < in.size()) {
        start.push_back(0);
        limit.push_back(1);
        ++j;
    }
    std::vector<int64_t> dims;
    for (size_t i = 0; i < out.size(); ++i) dims.push_back(a.limits[i] - a.dims[i]);
    return reshape_to(g, slice(g, src, start, limit), dims);
}

/// A gather of broadcast ids (through a reshape) is the broadcast of the gather of the ids
/// broadcast: each row read once, not once per copy. Transformers' BERT at batch B expands
/// its [1, S] token-type ids to [B, S] before the embedding: the rows of S ids, broadcast over
/// the batch as the position embedding's are (the gather fusion then has no broadcast in it).
/// nullopt when the ids are no such broadcast.
std::optional<ValueId> gather_of_broadcast(Graph& g, ValueId table, ValueId ids,
                                           const Shape& result) {
    ValueId b = ids;
    if (g.producer(b).kind == OpKind::Reshape) b = g.producer(b).operands[0];
    const Op& bc = g.producer(b);
    if (bc.kind != OpKind::Broadcast) return std::nullopt;
    const ValueId src = bc.operands[0];
    if (g.shape(src).rank() == 0 || g.shape(src).elements() >= g.shape(b).elements())
        return std::nullopt;
    std::vector<int64_t> out = g.shape(b).dims, dims = bc.attrs.dims;
    const std::vector<int64_t> table_dims = g.shape(table).dims;
    for (size_t k = 1; k < table_dims.size(); ++k) {
        dims.push_back(int64_t(out.size()));
        out.push_back(table_dims[k]);
    }
    const ValueId rows = gather_rows(g, table, src);
    return reshape_to(g, broadcast(g, rows, out, dims), result.dims);
}

void simplify_op(Rewriter& rw, const Op& op) {
    Graph& g = rw.out();
    auto in = rw.operands(op);
    const Attrs& a = op.attrs;
    const OpScope scope(g, op.name);
    switch (op_class(op.kind)) {
        case OpClass::Elementwise: {
            // x * 1 and x + 0 (algebraic_simplifier.cc HandleMultiply, HandleAdd).
            if (op.kind == OpKind::Mul || op.kind == OpKind::Add) {
                const double unit = op.kind == OpKind::Mul ? 1.0 : 0.0;
                if (is_splat(g, in[1], unit)) return rw.set(op.results[0], in[0]);
                if (is_splat(g, in[0], unit)) return rw.set(op.results[0], in[1]);
            }
            if (auto y = sink_rearrangement(g, op, in)) return rw.set(op.results[0], *y);
            // An elementwise op of broadcasts is the broadcast of the op on the smaller arrays
            // (algebraic_simplifier.cc, TryToSinkBroadcastAfterOpWithUniqueNonScalarOperand):
            // rsqrt(broadcast(var) + eps) runs once per row, not once per element.
            std::vector<BroadcastOf> b(in.size());
            const BroadcastOf* wide = nullptr;
            bool ok = true;
            for (size_t i = 0; ok && i < in.size(); ++i) {
                ok = broadcast_of(g, in[i], b[i]);
                if (!ok || g.shape(b[i].source).rank() == 0) continue;
                if (!wide)
                    wide = &b[i];
                else
                    ok = wide->dims == b[i].dims && g.shape(wide->source) == g.shape(b[i].source);
            }
            if (ok && wide) {
                std::vector<ValueId> narrow;
                const std::vector<int64_t> small = g.shape(wide->source).dims;
                for (size_t i = 0; i < in.size(); ++i)
                    narrow.push_back(g.shape(b[i].source).rank() == 0
                                         ? broadcast(g, b[i].source, small, {})
                                         : b[i].source);
                const ValueId r = g.add1(op.kind, narrow, a);
                return rw.set(op.results[0], broadcast(g, r, wide->out_dims, wide->dims));
            }
            break;
        }
        case OpClass::Movement:
            if (op.kind == OpKind::Broadcast) {
                BroadcastOf inner;
                if (broadcast_of(g, in[0], inner)) {
                    std::vector<int64_t> dims;
                    for (int64_t d : inner.dims) dims.push_back(a.dims[size_t(d)]);
                    return rw.set(op.results[0], broadcast(g, inner.source, a.out_dims, dims));
                }
                if (g.shape(in[0]).dims == a.out_dims) return rw.set(op.results[0], in[0]);
            }
            // A transpose or a unit-dim reshape of a chain that holds a transpose: one transpose
            // between reshapes (rearrange).
            if (op.kind == OpKind::Transpose ||
                (op.kind == OpKind::Reshape && degenerate_reshape(g, in[0], a.out_dims))) {
                const Rearranged r = rearranged(g, in[0]);
                if (r.ops >= 1 && r.transposes + (op.kind == OpKind::Transpose) >= 1) {
                    const ValueId t = op.kind == OpKind::Transpose ? transpose(g, in[0], a.dims)
                                                                   : reshape(g, in[0], a.out_dims);
                    return rw.set(op.results[0], rearrange(g, rearranged(g, t),
                                                           rw.in().shape(op.results[0]).dims));
                }
            }
            if (op.kind == OpKind::Slice) {
                if (auto y = slice_below_unit_reshape(g, in[0], a))
                    return rw.set(op.results[0], *y);
            }
            if (op.kind == OpKind::Reshape) {
                if (g.shape(in[0]).dims == a.out_dims) return rw.set(op.results[0], in[0]);
                if (g.producer(in[0]).kind == OpKind::Reshape)
                    return rw.set(op.results[0], reshape_to(g, in[0], a.out_dims));
            }
            if (op.kind == OpKind::Transpose) {
                bool identity = true;
                for (size_t i = 0; i < a.dims.size(); ++i) identity &= a.dims[i] == int64_t(i);
                if (identity) return rw.set(op.results[0], in[0]);
            }
            break;
        case OpClass::Contraction:
            if (op.kind == OpKind::Dot) {
                Attrs na = a;
                bool changed = false;
                // A batch dim that merges two (PyTorch's [B, H, S, d] viewed as [B H, S, d] for
                // bmm) is two batch dims of the arrays before the merge: the dot reads them as
                // they lie and its result is merged instead (the reshape then moves to where
                // the result is viewed back as [B, H, ..], and vanishes there), so the transposes
                // under the merge can fold into the dot.
                if (auto x = unmerged_batch(g, a.dot, in)) {
                    na.dot = x->dims;
                    in = x->operands;
                    changed = true;
                }
                for (int side = 0; side < 2; ++side) {
                    const Op& p = g.producer(in[size_t(side)]);
                    if (p.kind != OpKind::Transpose) continue;
                    auto batch = side == 0 ? na.dot.lhs_batch : na.dot.rhs_batch;
                    auto contracting = side == 0 ? na.dot.lhs_contracting : na.dot.rhs_contracting;
                    if (!fold_transpose(p.attrs.dims, batch, contracting,
                                        g.shape(in[size_t(side)]).rank()))
                        continue;
                    (side == 0 ? na.dot.lhs_batch : na.dot.rhs_batch) = batch;
                    (side == 0 ? na.dot.lhs_contracting : na.dot.rhs_contracting) = contracting;
                    in[size_t(side)] = p.operands[0];
                    changed = true;
                }
                if (changed) {
                    const ValueId y = g.add1(OpKind::Dot, in, na);
                    return rw.set(op.results[0],
                                  reshape_to(g, y, rw.in().shape(op.results[0]).dims));
                }
            }
            break;
        case OpClass::Gather:
            if (op.kind == OpKind::Gather) {
                if (auto y = gather_of_broadcast(g, in[0], in[1], rw.in().shape(op.results[0])))
                    return rw.set(op.results[0], *y);
            }
            break;
        default:
            break;
    }
    const auto res = g.add(op.kind, in, a);
    for (size_t i = 0; i < res.size(); ++i) rw.set(op.results[i], res[i]);
}

/// The literal scalar `v` is everywhere (a rank-0 literal or a broadcast of one), or none.
std::optional<double> literal_splat(const Graph& g, ValueId v) {
    const auto s = splat_of(g, v);
    if (!s || g.producer(*s).kind != OpKind::Literal) return std::nullopt;
    return g.producer(*s).attrs.scalar;
}

/// Scalar factors of slices of one array, taken into the array: when every user of `y` is a
/// slice along its minor dim and some of those slices are only multiplied by a literal, `y` is
/// multiplied by a constant vector of those factors along that dim (1 elsewhere: x * 1 is x,
/// bit for bit) and the slices read the product. The slices then read the array as it lies
/// (slice_sinker.cc sinks slices below elementwise ops applied to all of them; here a factor of
/// 1 stands for a slice without one). Transformers' GPT-2 scales q and k, slices of c_attn's
/// output: the factors join the projection's epilogue beside its bias, and the attention's dots
/// read each head of each slice as a window of the projection's tiles.
Graph scale_before_slices(const Graph& g) {
    std::vector<std::vector<OpId>> users(g.values().size());
    for (OpId id = 0; id < g.ops().size(); ++id)
        for (ValueId v : g.op(id).operands) users[v].push_back(id);
    std::vector<char> output(g.values().size(), 0);
    for (const Output& o : g.outputs()) output[o.value] = 1;
    std::map<ValueId, std::vector<float>> factors;  // y -> per-column factor
    std::map<OpId, ValueId> folded;                 // a multiply -> the slice it scales
    for (ValueId y = 0; y < g.values().size(); ++y) {
        const Shape& ys = g.shape(y);
        if (users[y].size() < 2 || output[y] || ys.dtype != DType::F32 || ys.rank() == 0) continue;
        const size_t minor = size_t(ys.rank() - 1);
        std::vector<float> f(size_t(ys.dims[minor]), 1.0f);
        std::vector<char> taken(f.size(), 0);
        std::map<OpId, ValueId> muls;
        bool ok = true;
        for (OpId u : users[y]) {
            const Op& sl = g.op(u);
            ok = sl.kind == OpKind::Slice;
            for (size_t d = 0; ok && d < minor; ++d)
                ok = sl.attrs.dims[d] == 0 && sl.attrs.limits[d] == ys.dims[d];
            if (!ok) break;
            const ValueId s = sl.results[0];
            for (int64_t c = sl.attrs.dims[minor]; ok && c < sl.attrs.limits[minor]; ++c)
                ok = !taken[size_t(c)]++;  // overlapping slices would share a factor
            if (!ok) break;
            if (users[s].size() != 1 || output[s]) continue;
            const Op& m = g.op(users[s][0]);
            if (m.kind != OpKind::Mul) continue;
            const auto c = literal_splat(g, m.operands[m.operands[0] == s ? 1 : 0]);
            if (!c || m.operands[0] == m.operands[1]) continue;
            for (int64_t k = sl.attrs.dims[minor]; k < sl.attrs.limits[minor]; ++k)
                f[size_t(k)] = float(*c);
            muls[users[s][0]] = s;
        }
        if (!ok || muls.empty()) continue;
        factors[y] = std::move(f);
        folded.insert(muls.begin(), muls.end());
    }
    if (factors.empty()) return g;
    Rewriter rw(g);
    std::map<std::vector<float>, ValueId> constants;  // one per distinct vector
    for (OpId id = 0; id < g.ops().size(); ++id) {
        const Op& op = g.op(id);
        if (const auto m = folded.find(id); m != folded.end()) {
            rw.set(op.results[0], rw[m->second]);  // the slice of the scaled array
            continue;
        }
        rw.copy(op);
        for (ValueId y : op.results) {
            const auto it = factors.find(y);
            if (it == factors.end()) continue;
            Graph& out = rw.out();
            const OpScope scope(out, op.name);
            auto [c, fresh] = constants.try_emplace(it->second, 0);
            if (fresh)
                c->second = out.constant(Shape{DType::F32, {int64_t(it->second.size())}},
                                         it->second, "slice factors");
            // Through a reshape that keeps the minor dim (GPT-2's [B S, 3 D] viewed as [B, S,
            // 3 D]), on the reshape's operand: the factors are then the dot's epilogue's, a
            // broadcast along its result's columns as its bias's.
            ValueId x = rw[y];
            std::vector<int64_t> dims = g.shape(y).dims;
            if (op.kind == OpKind::Reshape && g.shape(op.operands[0]).rank() > 0 &&
                g.shape(op.operands[0]).dims.back() == dims.back()) {
                x = rw[op.operands[0]];
                dims = g.shape(op.operands[0]).dims;
            }
            const ValueId scaled =
                mul(out, x, broadcast(out, c->second, dims, {int64_t(dims.size()) - 1}));
            rw.set(y, reshape_to(out, scaled, g.shape(y).dims));
        }
    }
    return detail::remove_dead_ops(rw.finish());
}

}  // namespace

Graph simplify(const Graph& graph) {
    Rewriter rw(graph);
    for (const Op& op : graph.ops()) {
        if (op_class(op.kind) == OpClass::Leaf)
            rw.copy(op);
        else
            simplify_op(rw, op);
    }
    return scale_before_slices(detail::remove_dead_ops(rw.finish()));
}

}  // namespace tpu::compiler
