// SPDX-License-Identifier: Apache-2.0
// Attention over a batch of sequences as PyTorch records it (python/README.md, "Timing
// transformers models"; compiler/README.md, "Heads of a batch of sequences"): the heads
// [B, H, S, d] viewed as [B H, S, d] for bmm. Simplification moves the merge of B and H past
// the dot, which then has the batch dims {B, H} and reads head (b, h) as the window at row b S,
// lane h d of the projection's [B S, H d] tiles. Bit-exact against the evaluator, race detector
// on, one launch, no host fallback.
#include <gtest/gtest.h>

#include <cmath>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "device_test_util.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::f32;
using test::Leaf;
using test::randoms;

constexpr int64_t kB = 2, kH = 2, kS = 16, kd = 64, kD = kH * kd;

/// A linear on [B, S, D] as aten records it: a view to [B S, D], the dot with the [D, D]
/// weight and the bias, a view back to [B, S, D].
ValueId seq_linear(Graph& g, ValueId x, ValueId w, ValueId b, bool view_back = true) {
    DotDims d;
    d.lhs_contracting = {1};
    d.rhs_contracting = {0};
    ValueId y = dot(g, reshape(g, x, {kB * kS, kD}), w, d);
    y = add(g, y, broadcast(g, b, {kB * kS, kD}, {1}));
    return view_back ? reshape(g, y, {kB, kS, kD}) : y;
}

/// [B, S, D] split into heads: view [B, S, H, d], transpose(1, 2) to [B, H, S, d].
ValueId heads(Graph& g, ValueId x) {
    return transpose(g, reshape(g, x, {kB, kS, kH, kd}), {0, 2, 1, 3});
}

/// aten::_safe_softmax over the last dim of [B, H, S, S] as aten records it (the math path of
/// scaled_dot_product_attention): where(all(s == -inf, -1), 0, softmax(s)). Its select makes
/// the probabilities a loop fusion's result, which the values dot reads from memory.
ValueId safe_softmax(Graph& g, ValueId s) {
    const Shape sh = g.shape(s);
    const ValueId sm = softmax(g, s, 3);
    const ValueId masked =
        convert(g, compare(g, s, full(g, -INFINITY, sh), Comparison::Eq), DType::F32);
    const ValueId open = select(g, compare(g, masked, full(g, 0.0, sh), Comparison::Eq),
                                full(g, 1.0, sh), full(g, 0.0, sh));
    const ValueId any_open = reshape(g, reduce(g, open, {3}, Reducer::Max), {kB, kH, kS, 1});
    const ValueId none = compare(g, any_open, full(g, 0.0, g.shape(any_open)), Comparison::Eq);
    return select(g, broadcast(g, reshape(g, none, {kB, kH, kS}), sh.dims, {0, 1, 2}),
                  full(g, 0.0, sh), sm);
}

DotDims bmm() {
    DotDims d;
    d.lhs_batch = d.rhs_batch = {0};
    d.lhs_contracting = {2};
    d.rhs_contracting = {1};
    return d;
}

/// BERT's self-attention at batch B with the math path of scaled_dot_product_attention: q and
/// k scaled, the scores bmm over [B H, S, d] and [B H, d, S] views, softmax, the values bmm,
/// the heads merged back to [B, S, D] (transpose(1, 2), view) and the out projection ([B S,
/// D]).
/// `scores_only`: the scores
/// [B, H, S, S].
ValueId attention(Graph& g, const std::vector<ValueId>& v, bool scores_only) {
    const ValueId q = heads(g, seq_linear(g, v[0], v[1], v[2]));
    const ValueId k = heads(g, seq_linear(g, v[0], v[3], v[4]));
    const ValueId vv = heads(g, seq_linear(g, v[0], v[5], v[6]));
    const double c = std::sqrt(1.0 / std::sqrt(double(kd)));
    const ValueId qs = mul(g, q, full(g, c, g.shape(q)));
    const ValueId kt = transpose(g, k, {0, 1, 3, 2});
    const ValueId ks = mul(g, kt, full(g, c, g.shape(kt)));
    const ValueId s3 =
        dot(g, reshape(g, qs, {kB * kH, kS, kd}), reshape(g, ks, {kB * kH, kd, kS}), bmm());
    const ValueId s = reshape(g, s3, {kB, kH, kS, kS});
    if (scores_only) return s;
    const ValueId p = safe_softmax(g, s);
    const ValueId o3 =
        dot(g, reshape(g, p, {kB * kH, kS, kS}), reshape(g, vv, {kB * kH, kS, kd}), bmm());
    const ValueId o = transpose(g, reshape(g, o3, {kB, kH, kS, kd}), {0, 2, 1, 3});
    return seq_linear(g, reshape(g, o, {kB, kS, kD}), v[7], v[8], false);
}

std::vector<Leaf> leaves() {
    const float ws = 1.0f / std::sqrt(float(kD));
    std::vector<Leaf> l{{"x", f32({kB, kS, kD}), {randoms(size_t(kB * kS * kD), 51)}}};
    for (uint32_t i = 0; i < 4; ++i) {
        l.push_back({"w" + std::to_string(i),
                     f32({kD, kD}),
                     {randoms(size_t(kD * kD), 52 + 2 * i, -ws, ws)},
                     true});
        l.push_back(
            {"b" + std::to_string(i), f32({kD}), {randoms(size_t(kD), 53 + 2 * i, -ws, ws)}, true});
    }
    return l;
}

TEST(CompilerBdims, TheMergeOfBatchAndHeadsMovesPastTheDot) {
    // Each bmm becomes a dot with the batch dims {B, H} reading the projections' [B, S, H, d]
    // views (the transposes folded into its dimension numbers); no dot keeps a batch of B H.
    const auto l = leaves();
    Graph g;
    std::vector<ValueId> v;
    for (const Leaf& x : l)
        v.push_back(x.parameter ? g.parameter(x.shape, x.name) : g.input(x.shape, x.name));
    g.add_output(attention(g, v, false));
    const Graph s = simplify(decompose(g));
    int batched = 0;
    for (const Op& op : s.ops()) {
        if (op.kind != OpKind::Dot || op.attrs.dot.lhs_batch.empty()) continue;
        ++batched;
        EXPECT_EQ(op.attrs.dot.lhs_batch.size(), 2u);
        EXPECT_EQ(s.shape(op.results[0]).dims[0], kB);
        EXPECT_EQ(s.shape(op.results[0]).dims[1], kH);
    }
    EXPECT_EQ(batched, 2);
}

TEST(CompilerBdims, TheScoresOfABatchOfSequencesHeadsBitExact) {
    // Head (b, h) of q and k is the window at row b S, lane h d of their projections' tiles;
    // the scores one tiled [S, S] matrix per head (before: "reshape before a batched dot").
    const auto st = expect_bit_exact(
        leaves(), [](Graph& g, const std::vector<ValueId>& v) { return attention(g, v, true); });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerBdims, TheValuesOfABatchOfSequencesHeadsBitExact) {
    // The probabilities one tiled matrix per head, v's heads windows of its projection, the
    // context written as [B, S, H, d] row-major (head (b, h)'s rows H d values apart from
    // b S H d + h d), which the merge back to [B, S, D] reads as it lies.
    const auto st = expect_bit_exact(
        leaves(), [](Graph& g, const std::vector<ValueId>& v) { return attention(g, v, false); });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerBdims, TheScoresOfSlicesOfOneProjectionAtBatch2BitExact) {
    // GPT-2 at batch B: c_attn's [B S, 3 D] output viewed as [B, S, 3 D] and split by slices
    // along its minor dim. Each slice is the slice of the [B S, 3 D] columns, viewed, so head
    // (b, h) of q is the window at row b S, column h d and of k at D + h d (before: "reshape
    // before a dot over two batch dims", the slice computed in the dot's fusion).
    const float ws = 1.0f / std::sqrt(float(kD));
    const std::vector<Leaf> l{
        {"x", f32({kB, kS, kD}), {randoms(size_t(kB * kS * kD), 71)}},
        {"c_attn.weight", f32({kD, 3 * kD}), {randoms(size_t(3 * kD * kD), 72, -ws, ws)}, true},
        {"c_attn.bias", f32({3 * kD}), {randoms(size_t(3 * kD), 73, -ws, ws)}, true}};
    const auto st = expect_bit_exact(l, [](Graph& g, const std::vector<ValueId>& v) {
        DotDims d;
        d.lhs_contracting = {1};
        d.rhs_contracting = {0};
        ValueId y = dot(g, reshape(g, v[0], {kB * kS, kD}), v[1], d);
        y = add(g, y, broadcast(g, v[2], {kB * kS, 3 * kD}, {1}));
        const ValueId qkv = reshape(g, y, {kB, kS, 3 * kD});
        const auto part = [&](int64_t i) {
            return heads(g, slice(g, qkv, {0, 0, i * kD}, {kB, kS, (i + 1) * kD}));
        };
        const ValueId q = part(0), kt = transpose(g, part(1), {0, 1, 3, 2});
        return reshape(
            g, dot(g, reshape(g, q, {kB * kH, kS, kd}), reshape(g, kt, {kB * kH, kd, kS}), bmm()),
            {kB, kH, kS, kS});
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerBdims, ADotOverTwoBatchDimsOfTiledMatricesBitExact) {
    // [2, 2, 8, 128] x [2, 2, 8, 128] contracting the lanes: each of the 4 batches one tiled
    // matrix of each operand (the batch dims most major), the result [2, 2, 8, 8] one per batch.
    const Shape s = f32({2, 2, 8, 128});
    const auto st = expect_bit_exact({{"a", s, {randoms(4096, 61)}}, {"b", s, {randoms(4096, 62)}}},
                                     [](Graph& g, const std::vector<ValueId>& v) {
                                         return dot(g, v[0], v[1],
                                                    DotDims{.lhs_batch = {0, 1},
                                                            .rhs_batch = {0, 1},
                                                            .lhs_contracting = {3},
                                                            .rhs_contracting = {3}});
                                     });
    EXPECT_EQ(st.host_fusions, 0u);
}

}  // namespace
}  // namespace tpu::compiler
