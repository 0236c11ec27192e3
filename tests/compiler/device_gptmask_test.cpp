// SPDX-License-Identifier: Apache-2.0
// A causal mask in the attention's loop fusions (compiler/README.md, "Loop and input fusions"):
// the [S, S] mask broadcast over the heads to [1, H, S, S] (the same rows read again for each
// head, View::Repeat), added to the scores and softmaxed, bit-exact with the evaluator on the
// device (race detector on, one launch, no host fallback).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "compiler/builder.h"
#include "device_test_util.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::f32;
using test::Leaf;
using test::randoms;

/// 0 on and below the diagonal, -inf above (trainer/module.cpp's causal mask).
std::vector<float> causal_mask(int64_t S) {
    std::vector<float> m(size_t(S * S), 0.0f);
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = i + 1; j < S; ++j)
            m[size_t(i * S + j)] = -std::numeric_limits<float>::infinity();
    return m;
}

/// softmax(scores * scale + broadcast(mask)) over [1, H, S, S], as the zoo's GPT records it.
void masked_softmax(int64_t H, int64_t S, std::vector<float> mask) {
    const std::vector<Leaf> leaves = {
        {"scores", f32({1, H, S, S}), {randoms(size_t(H * S * S), 3, -4.0f, 4.0f)}},
        {"mask", f32({S, S}), {std::move(mask)}, true},
    };
    const auto stats = expect_bit_exact(leaves, [&](Graph& g, const std::vector<ValueId>& v) {
        const Shape& s = g.shape(v[0]);
        ValueId x = mul(g, v[0], full(g, double(0.125f), s));
        x = add(g, x, broadcast(g, v[1], s.dims, {2, 3}));
        return softmax(g, x, 3);
    });
    EXPECT_EQ(stats.fallback_fusions, 0u);
    for (const auto& [why, n] : stats.fallbacks) ADD_FAILURE() << n << " x " << why;
}

TEST(CompilerGptMaskDevice, CausalMaskOverHeadsBitExact) {
    masked_softmax(4, 64, causal_mask(64));
}

// Random mask values (every band of it differs), 3 heads of a 4-band mask: band k reads k mod 4.
TEST(CompilerGptMaskDevice, RandomMaskOverHeadsBitExact) {
    masked_softmax(3, 32, randoms(32 * 32, 7));
}

// GPT's first block: the attention's out projection with the residual in its epilogue, the
// residual being the embedding plus the positional table broadcast to [1, S, D] (unit dims the
// epilogue reads through).
TEST(CompilerGptMaskDevice, PositionalResidualInTheDotEpilogueBitExact) {
    const int64_t S = 64, D = 128;
    const std::vector<Leaf> leaves = {
        {"h", f32({S, D}), {randoms(size_t(S * D), 11)}},
        {"emb", f32({S, D}), {randoms(size_t(S * D), 12)}},
        {"wpe", f32({S, D}), {randoms(size_t(S * D), 13)}, true},
        {"w", f32({D, D}), {randoms(size_t(D * D), 14, -0.1f, 0.1f)}, true},
        {"b", f32({D}), {randoms(size_t(D), 15)}, true},
    };
    const auto stats = expect_bit_exact(leaves, [&](Graph& g, const std::vector<ValueId>& v) {
        const ValueId table = broadcast(g, v[2], {1, S, D}, {1, 2});
        const ValueId res = reshape(g, add(g, reshape(g, v[1], {1, S, D}), table), {S, D});
        return add(g, res, linear(g, v[0], v[3], v[4]));
    });
    EXPECT_EQ(stats.fallback_fusions, 0u);
    for (const auto& [why, n] : stats.fallbacks) ADD_FAILURE() << n << " x " << why;
}

}  // namespace
}  // namespace tpu::compiler
