// SPDX-License-Identifier: Apache-2.0
// A Hugging Face transformers BERT layer as tpusim.torch records it (issue #29 items 3-4;
// python/README.md, "Timing transformers models"): activations [1, S, D] (a batch of one
// sequence), PyTorch's `view`/`permute`/`transpose(-1, -2)` chains around the attention's
// batched dots over [B H, S, d], the scale applied to q and to k^T (the math path of
// scaled_dot_product_attention), the safe softmax's guard for rows of -inf, the heads merged
// back by two permutes and views. Each kind of fusion that used to run on the host (the unit
// batch dim before a 2-D dot and in its result, the head split after a permute and a scale,
// the head merge) is reproduced on its own and bit-exact on the device with the evaluator,
// race detector on, one launch (compiler/README.md, "Layout changes of PyTorch's attention").
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

using test::aten_linear;
using test::expect_bit_exact;
using test::f32;
using test::Leaf;
using test::probe;
using test::randoms;

/// BertSelfAttention with scaled_dot_product_attention's math path on [1, S, H d]: each head
/// split by view [1, S, H, d] and permute (0, 2, 1, 3); q * sqrt(scale) and k^T * sqrt(scale);
/// bmm over [H, S, d] views; softmax with its guard (a row all -inf gives zeros); bmm with v;
/// the heads merged by permutes and views back to [1, S, H d]. `upto`: 1 the scores, 2 the
/// context before the merge, 0 everything.
ValueId hf_attention(Graph& g, ValueId x, const std::vector<ValueId>& p, int64_t heads,
                     int upto = 0) {
    const int64_t S = g.shape(x).dims[1], D = g.shape(x).dims[2], d = D / heads;
    const auto split = [&](ValueId t) {
        return transpose(g, reshape(g, t, {1, S, heads, d}), {0, 2, 1, 3});
    };
    const ValueId q = split(aten_linear(g, x, p[0], p[1]));
    const ValueId k = split(aten_linear(g, x, p[2], p[3]));
    const ValueId v = split(aten_linear(g, x, p[4], p[5]));
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
    const ValueId s = reshape(g, s3, {1, heads, S, S});
    const ValueId sm = softmax(g, s, 3);
    // aten::_safe_softmax: where(all(s == -inf, -1), 0, softmax(s)).
    const Shape sh = g.shape(s);
    const ValueId masked =
        convert(g, compare(g, s, full(g, -INFINITY, sh), Comparison::Eq), DType::F32);
    const ValueId open = select(g, compare(g, masked, full(g, 0.0, sh), Comparison::Eq),
                                full(g, 1.0, sh), full(g, 0.0, sh));
    const ValueId any_open = reshape(g, reduce(g, open, {3}, Reducer::Max), {1, heads, S, 1});
    const ValueId none = compare(g, any_open, full(g, 0.0, g.shape(any_open)), Comparison::Eq);
    const ValueId pr = select(g, broadcast(g, reshape(g, none, {1, heads, S}), sh.dims, {0, 1, 2}),
                              full(g, 0.0, sh), sm);
    const ValueId o3 = dot(g, reshape(g, pr, {heads, S, S}), reshape(g, v, {heads, S, d}), bmm);
    if (upto == 2) return o3;
    // The context's permutes and views back to [1, S, H d], as aten records them.
    ValueId o = reshape(g, o3, {1, heads, S, d});
    o = transpose(g, o, {2, 0, 1, 3});
    o = transpose(g, o, {1, 2, 0, 3});
    o = reshape(g, o, {1, heads, S, d});
    o = transpose(g, o, {0, 2, 1, 3});
    o = reshape(g, o, {1, S, D});
    const ValueId a = aten_linear(g, o, p[6], p[7]);
    return add(g, a, x);
}

/// The layer: attention, residual and layer norm, the erf GELU ffn, residual and layer norm.
ValueId hf_layer(Graph& g, ValueId x, const std::vector<ValueId>& p, int64_t heads) {
    const ValueId h = layer_norm(g, hf_attention(g, x, p, heads), p[8], p[9], 1e-12).y;
    const ValueId f = gelu(g, aten_linear(g, h, p[10], p[11]), false);
    return layer_norm(g, add(g, aten_linear(g, f, p[12], p[13]), h), p[14], p[15], 1e-12).y;
}

/// x [1, S, D] and the layer's parameters (nn.Linear's [out, in] weights).
std::vector<Leaf> hf_leaves(int64_t S, int64_t D, int64_t ffn) {
    std::vector<Leaf> l;
    uint32_t seed = 900;
    const float ws = 1.0f / std::sqrt(float(D)), fs = 1.0f / std::sqrt(float(ffn));
    l.push_back({"x", f32({1, S, D}), {randoms(size_t(S * D), seed++)}});
    for (const char* n : {"q", "k", "v", "out"}) {
        l.push_back({fmt::format("{}.weight", n),
                     f32({D, D}),
                     {randoms(size_t(D * D), seed++, -ws, ws)},
                     true});
        l.push_back(
            {fmt::format("{}.bias", n), f32({D}), {randoms(size_t(D), seed++, -ws, ws)}, true});
    }
    l.push_back({"ln_1.weight", f32({D}), {randoms(size_t(D), seed++, 0.5f, 1.5f)}, true});
    l.push_back({"ln_1.bias", f32({D}), {randoms(size_t(D), seed++)}, true});
    l.push_back({"fc_1.weight", f32({ffn, D}), {randoms(size_t(ffn * D), seed++, -ws, ws)}, true});
    l.push_back({"fc_1.bias", f32({ffn}), {randoms(size_t(ffn), seed++, -ws, ws)}, true});
    l.push_back({"fc_2.weight", f32({D, ffn}), {randoms(size_t(ffn * D), seed++, -fs, fs)}, true});
    l.push_back({"fc_2.bias", f32({D}), {randoms(size_t(D), seed++, -fs, fs)}, true});
    l.push_back({"ln_2.weight", f32({D}), {randoms(size_t(D), seed++, 0.5f, 1.5f)}, true});
    l.push_back({"ln_2.bias", f32({D}), {randoms(size_t(D), seed++)}, true});
    return l;
}

std::vector<ValueId> params_of(const std::vector<ValueId>& v) {
    return {v.begin() + 1, v.end()};
}

// The python/ BERT's shape: 32 tokens, 192 wide, 3 heads of 64, ffn 768.
constexpr int64_t kS = 32, kD = 192, kH = 3, kF = 768;

TEST(CompilerPyHost, AUnitBatchDimBeforeAndAfterALinearIsTheSameTiles) {
    // [1, S, D] -> view [S, D] -> addmm -> view [1, S, D] (+ a residual in [1, S, D]): the
    // unit dim is no relayout, so the array lies in T(8,128) tiles and the dot reads and
    // writes them as [S, D] (before: untiled, and the layer norm's fusion that wrote it mixed
    // tiled and untiled arrays).
    const auto leaves = hf_leaves(kS, kD, kF);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId ln = layer_norm(g, v[0], v[9], v[10], 1e-12).y;
        return add(g, aten_linear(g, ln, v[1], v[2]), ln);
    });
}

TEST(CompilerPyHost, ABatchOfSequencesBeforeAndAfterALinearIsTheSameTiles) {
    // [B, S, D] -> view [B S, D] -> addmm -> view [B, S, D]: S a multiple of the tiles' 8 rows,
    // so the view merges whole bands and both lie in the same T(8,128) tiles.
    auto leaves = hf_leaves(kS, kD, kF);
    leaves[0] = {"x", f32({3, kS, kD}), {randoms(size_t(3 * kS * kD), 77)}};
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId ln = layer_norm(g, v[0], v[9], v[10], 1e-12).y;
        const ValueId h = gelu(g, aten_linear(g, ln, v[11], v[12]), false);
        return add(g, aten_linear(g, h, v[13], v[14]), ln);
    });
}

TEST(CompilerPyHost, TheScoresOfHeadsSplitByPermuteAndScaledReadTheProjections) {
    // q and k^T each scaled after their permutes: the scale moves into the projections'
    // epilogues and the permutes fold into the scores dot, which reads each head as a window
    // of the [S, H d] projections (before: the projections wrote [1, H, S, d] untiled, and
    // the dot refused the views of them).
    const auto leaves = hf_leaves(kS, kD, kF);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return hf_attention(g, v[0], params_of(v), kH, 1);
    });
}

TEST(CompilerPyHost, TheContextOfHeadsSplitByPermuteBitExact) {
    // The safe softmax and the values dot reading v's heads through view, permute, view.
    const auto leaves = hf_leaves(kS, kD, kF);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return hf_attention(g, v[0], params_of(v), kH, 2);
    });
}

TEST(CompilerPyHost, TheHeadsMergedByTwoPermutesAndViewsBitExact) {
    // The context's permute (2, 0, 1, 3), permute (1, 2, 0, 3), view, permute (0, 2, 1, 3),
    // view [1, S, D]: one transpose the out projection reads through (the values dot writes
    // its heads interleaved as [S, H, d]).
    const auto leaves = hf_leaves(kS, kD, kF);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return hf_attention(g, v[0], params_of(v), kH);
    });
}

TEST(CompilerPyHost, ATransformersBertLayerRunsWhollyOnTheDevice) {
    // The whole layer (python/tests/test_pyhost.py runs the transformers model itself): every
    // fusion generated, bit-exact, one launch.
    const auto leaves = hf_leaves(kS, kD, kF);
    const auto st = expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return hf_layer(g, v[0], params_of(v), kH);
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerPyHost, ProbeOfTheLayer) {
    // What falls back, and why (none since the layout changes above).
    const auto leaves = hf_leaves(kS, kD, kF);
    const auto st = probe(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return hf_layer(g, v[0], params_of(v), kH);
    });
    EXPECT_EQ(st.fallback_fusions, 0u);
}

}  // namespace
}  // namespace tpu::compiler
