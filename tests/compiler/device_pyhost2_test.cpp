// SPDX-License-Identifier: Apache-2.0
// Transformers models as tpusim.torch records them, past BERT at batch 1 (python/README.md,
// "Timing transformers models"; compiler/README.md, "PyTorch's attention views"): GPT-2's q, k
// and v as slices of one Conv1D output. Each fusion that used to run on the host is reproduced
// and run bit-exact on the device against the evaluator, race detector on, one launch.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::f32;
using test::Leaf;
using test::probe;
using test::randoms;

/// GPT-2's Conv1D on [1, S, in] as aten records it: a view to [S, in], addmm with the [in, out]
/// weight (no transpose), a view back to [1, S, out].
ValueId conv1d(Graph& g, ValueId x, ValueId w, ValueId b) {
    const auto& xs = g.shape(x).dims;
    const int64_t out = g.shape(w).dims[1];
    DotDims d;
    d.lhs_contracting = {1};
    d.rhs_contracting = {0};
    ValueId y = dot(g, reshape(g, x, {xs[0] * xs[1], xs[2]}), w, d);
    y = add(g, y, broadcast(g, b, {xs[0] * xs[1], out}, {1}));
    return reshape(g, y, {xs[0], xs[1], out});
}

constexpr ValueId kNoMask = ~ValueId(0);

/// aten::_safe_softmax over the last dim of [B, H, S, S]: where(all(s == -inf, -1), 0,
/// softmax(s)), as aten records it.
ValueId safe_softmax(Graph& g, ValueId s) {
    const Shape sh = g.shape(s);
    const int64_t B = sh.dims[0], H = sh.dims[1], S = sh.dims[2];
    const ValueId sm = softmax(g, s, 3);
    const ValueId masked =
        convert(g, compare(g, s, full(g, -INFINITY, sh), Comparison::Eq), DType::F32);
    const ValueId open = select(g, compare(g, masked, full(g, 0.0, sh), Comparison::Eq),
                                full(g, 1.0, sh), full(g, 0.0, sh));
    const ValueId any_open = reshape(g, reduce(g, open, {3}, Reducer::Max), {B, H, S, 1});
    const ValueId none = compare(g, any_open, full(g, 0.0, g.shape(any_open)), Comparison::Eq);
    return select(g, broadcast(g, reshape(g, none, {B, H, S}), sh.dims, {0, 1, 2}),
                  full(g, 0.0, sh), sm);
}

/// GPT2Attention with scaled_dot_product_attention's math path on [1, S, H d]: c_attn's
/// [1, S, 3 H d] output split into q, k, v by slices (`split(D, dim=2)`), each head split by
/// view [1, S, H, d] and transpose(1, 2); q * sqrt(scale) and k^T * sqrt(scale); bmm over
/// [H, S, d] views; the causal mask added; softmax with its guard; bmm with v. `upto`: 1 the
/// scores, 0 the context [H, S, d].
ValueId gpt2_attention(Graph& g, ValueId x, ValueId w, ValueId b, ValueId mask, int64_t heads,
                       int upto = 0) {
    const int64_t S = g.shape(x).dims[1], D = g.shape(x).dims[2], d = D / heads;
    const ValueId qkv = conv1d(g, x, w, b);
    const auto part = [&](int64_t i) {
        const ValueId p = slice(g, qkv, {0, 0, i * D}, {1, S, (i + 1) * D});
        return transpose(g, reshape(g, p, {1, S, heads, d}), {0, 2, 1, 3});
    };
    const ValueId k = part(1), v = part(2), q = part(0);
    const double c = std::sqrt(1.0 / std::sqrt(double(d)));
    const ValueId qs = mul(g, q, full(g, c, g.shape(q)));
    const ValueId kt = transpose(g, k, {0, 1, 3, 2});
    const ValueId ks = mul(g, kt, full(g, c, g.shape(kt)));
    DotDims bmm;
    bmm.lhs_batch = bmm.rhs_batch = {0};
    bmm.lhs_contracting = {2};
    bmm.rhs_contracting = {1};
    const ValueId s3 = dot(g, reshape(g, qs, {heads, S, d}), reshape(g, ks, {heads, d, S}), bmm);
    if (upto == 1) return s3;
    ValueId s = reshape(g, s3, {1, heads, S, S});
    if (mask != kNoMask) s = add(g, s, broadcast(g, mask, {1, heads, S, S}, {2, 3}));
    const ValueId pr = safe_softmax(g, s);
    return dot(g, reshape(g, pr, {heads, S, S}), reshape(g, v, {heads, S, d}), bmm);
}

std::vector<Leaf> gpt2_leaves(int64_t S, int64_t D) {
    const float ws = 1.0f / std::sqrt(float(D));
    std::vector<float> mask(size_t(S * S));
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) mask[size_t(i * S + j)] = j <= i ? 0.0f : -INFINITY;
    return {{"x", f32({1, S, D}), {randoms(size_t(S * D), 31)}},
            {"c_attn.weight", f32({D, 3 * D}), {randoms(size_t(3 * D * D), 32, -ws, ws)}, true},
            {"c_attn.bias", f32({3 * D}), {randoms(size_t(3 * D), 33, -ws, ws)}, true},
            {"mask", f32({S, S}), {mask}}};
}

constexpr int64_t kS = 32, kD = 192, kH = 3;

TEST(CompilerPyHost2, SlicesOfOneProjectionScaledAreItsEpilogue) {
    // q and k, slices of c_attn's output, each times sqrt(scale): the factors become one
    // [3 D] constant (sqrt(scale) over q's and k's columns, 1 over v's) the projection's
    // epilogue multiplies by after its bias, and the slices read the scaled result.
    const auto leaves = gpt2_leaves(kS, kD);
    Graph g;
    std::vector<ValueId> v;
    for (const Leaf& l : leaves)
        v.push_back(l.parameter ? g.parameter(l.shape, l.name) : g.input(l.shape, l.name));
    g.add_output(gpt2_attention(g, v[0], v[1], v[2], v[3], kH));
    const Graph s = simplify(decompose(g));
    int constants = 0, slices_of_product = 0;
    for (const Op& op : s.ops()) {
        constants += op.kind == OpKind::Constant;
        if (op.kind == OpKind::Slice && s.producer(op.operands[0]).kind == OpKind::Mul)
            ++slices_of_product;
        EXPECT_FALSE(op.kind == OpKind::Mul && s.producer(op.operands[0]).kind == OpKind::Slice)
            << "a slice still scaled after it";
    }
    EXPECT_EQ(constants, 1);
    EXPECT_EQ(slices_of_product, 3);
}

TEST(CompilerPyHost2, OverlappingSlicesKeepTheirFactorsApart) {
    // Columns 0..7 scaled, 4..11 and 12..15 not: one factor per column cannot serve the first
    // two, so no factor moves into the array (whichever slice comes after the overlap).
    Graph g;
    const ValueId y = exp(g, g.input(f32({8, 16}), "x"));
    const ValueId a = mul(g, slice(g, y, {0, 0}, {8, 8}), full(g, 0.5, f32({8, 8})));
    const ValueId b = slice(g, y, {0, 4}, {8, 12});
    const ValueId c = slice(g, y, {0, 12}, {8, 16});
    g.add_output(concatenate(g, {a, b, c}, 1));
    const Graph s = simplify(g);
    for (const Op& op : s.ops()) EXPECT_NE(op.kind, OpKind::Constant);
}

TEST(CompilerPyHost2, TheScoresOfHeadsOfSlicesReadTheProjectionBitExact) {
    // The scores dot reads each head of q and k as a window of c_attn's [S, 3 D] tiles: q's
    // head h at column h d, k's at D + h d (before: "reshape before a batched dot", the slice
    // and the scale computed in the dot's fusion).
    const auto leaves = gpt2_leaves(kS, kD);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return gpt2_attention(g, v[0], v[1], v[2], v[3], kH, 1);
    });
}

TEST(CompilerPyHost2, TheContextOfHeadsOfSlicesBitExact) {
    // The causal mask, the safe softmax and the values dot reading v's heads at 2 D + h d.
    const auto leaves = gpt2_leaves(kS, kD);
    const auto st = expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return gpt2_attention(g, v[0], v[1], v[2], v[3], kH);
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

/// ViT's attention (python/README.md: 16 patches and the class token, 17 rows and keys per
/// head) on the device against the evaluator; returns the backend's statistics.
DeviceBackendStats expect_padded_attention_bit_exact(int64_t S) {
    auto leaves = gpt2_leaves(S, kD);
    leaves.pop_back();  // no mask
    return expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return gpt2_attention(g, v[0], v[1], v[2], kNoMask, kH);
    });
}

TEST(CompilerPyHost2, TheSoftmaxOverScoresInPaddedTilesBitExact) {
    // [3, 17, 17] scores in T(8,128) tiles: each head's 17 rows padded to 24 (3 bands), its
    // 17 keys to 128 lanes. The softmax's fusions stream the 72 padded rows (the padding
    // computed on, never data) and its [1, 3, 17] statistics map row r to [r / 24][r % 24]
    // (before: "(padded tiles)", three fusions on the host).
    const auto st = expect_padded_attention_bit_exact(17);
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerPyHost2, TheSoftmaxOverAViTBasesKeysBitExact) {
    // ViT-Base's 197 tokens (196 patches and the class token): rows padded to 200, keys to
    // two lane chunks of which the second holds 69.
    const auto st = expect_padded_attention_bit_exact(197);
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerPyHost2, TheSoftmaxOfABatchOfSequencesHeadsBitExact) {
    // [B, H, S, S] scores (transformers' BERT at batch B > 1): the softmax's [B, H, S]
    // statistics lie in T(8,128) tiles as B matrices of H rows padded to 8, which the
    // softmax's fusions read and write in place (before: "a vector f32[B,3,32] in layout
    // {2,1,0:T(8,128)}", three fusions on the host per layer).
    constexpr int64_t B = 2;
    std::vector<float> x = randoms(size_t(B * kH * kS * kS), 41);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = -INFINITY;  // masked keys
    const std::vector<Leaf> leaves{{"s", f32({B, kH, kS, kS}), {x}}};
    expect_bit_exact(leaves,
                     [](Graph& g, const std::vector<ValueId>& v) { return safe_softmax(g, v[0]); });
}

TEST(CompilerPyHost2, TheSoftmaxOfABatchOfSequencesInPaddedTilesBitExact) {
    // ViT at batch B: [B, H, 17, 17] scores, each head's rows padded to 24, and [B, H, 17]
    // statistics (B matrices of H rows): padded row r is row r / 24 of the B H heads.
    constexpr int64_t B = 2, S = 17;
    const std::vector<Leaf> leaves{
        {"s", f32({B, kH, S, S}), {randoms(size_t(B * kH * S * S), 43)}}};
    expect_bit_exact(leaves,
                     [](Graph& g, const std::vector<ValueId>& v) { return safe_softmax(g, v[0]); });
}

TEST(CompilerPyHost2, AGatherOfIdsBroadcastOverTheBatchIsTheBroadcastOfItsRows) {
    // BertEmbeddings at batch 2: the [1, S] token-type ids expanded to [2, S] and flattened
    // for the lookup: the gather reads S rows once and its result is broadcast over the batch
    // (before: "a gather fused with a broadcast", on the host).
    constexpr int64_t B = 2, V = 16;
    std::vector<float> types(static_cast<size_t>(kS));
    for (int64_t i = 0; i < kS; ++i) types[size_t(i)] = float((i * 7) % V);
    const std::vector<Leaf> leaves{
        {"x", f32({B, kS, kD}), {randoms(size_t(B * kS * kD), 51)}},
        {"table", f32({V, kD}), {randoms(size_t(V * kD), 52)}, true},
        {"ids", Shape{DType::S32, {1, kS}}, {types}},
        {"gamma", f32({kD}), {randoms(size_t(kD), 53, 0.5f, 1.5f)}, true},
        {"beta", f32({kD}), {randoms(size_t(kD), 54)}, true}};
    const auto record = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId wide = broadcast(g, reshape(g, v[2], {kS}), {B, kS}, {1});
        const ValueId rows = gather_rows(g, v[1], reshape(g, wide, {B * kS}));
        return layer_norm(g, add(g, v[0], reshape(g, rows, {B, kS, kD})), v[3], v[4], 1e-12).y;
    };
    Graph g;
    std::vector<ValueId> vs;
    for (const Leaf& l : leaves)
        vs.push_back(l.parameter ? g.parameter(l.shape, l.name) : g.input(l.shape, l.name));
    g.add_output(record(g, vs));
    const Graph simple = simplify(decompose(g));
    for (const Op& op : simple.ops()) {
        if (op.kind == OpKind::Gather) {
            EXPECT_EQ(simple.shape(op.operands[1]).elements(), kS);
        }
    }
    const auto st = expect_bit_exact(leaves, record);
    EXPECT_EQ(st.host_fusions, 0u);
}

}  // namespace
}  // namespace tpu::compiler
