// SPDX-License-Identifier: Apache-2.0
// Gather fusions on the device (compiler/README.md, "Gather fusions"): the ids read into scalar
// memory (dma.hs), each row one DMA from the table and one to the result, exact rows, ids outside
// the table clamped as XLA's gather clamps them; race detector on, one launch, bit-exact.
#include <bit>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "tests/compiler/device_test_util.h"

namespace tpu::compiler::test {
namespace {

Shape s32(std::vector<int64_t> dims) {
    return Shape{DType::S32, std::move(dims)};
}

std::vector<float> ids(size_t n, int64_t rows, uint32_t seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((i * 7919 + seed) % uint64_t(rows));
    return v;
}

TEST(CompilerDeviceGather, PaddedRowsAreExactAndIdsOutsideTheTableClamp) {
    // 200 values a row: two lane chunks, the second padded, in T(8,128) on both sides; 37 rows:
    // a padded last band. Ids -3 and 50 of a 50-row table read rows 0 and 49 (XLA's clamp).
    std::vector<float> tokens = ids(37, 50, 3);
    tokens[2] = -3;
    tokens[5] = 50;
    tokens[36] = 1000;
    const std::vector<Leaf> leaves{{"wte", f32({50, 200}), {randoms(50 * 200, 1)}, true},
                                   {"tokens", s32({37}), {tokens}}};
    const auto st = expect_bit_exact(
        leaves, [](Graph& g, const std::vector<ValueId>& v) { return gather_rows(g, v[0], v[1]); });
    EXPECT_EQ(st.host_fusions, 0u);
    // And the rows are the table's, bit for bit (the evaluator could be wrong too).
    HostBackend host(1);
    const auto got = run(host, leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return gather_rows(g, v[0], v[1]);
    });
    const std::vector<float>& table = leaves[0].values[0];
    for (size_t i = 0; i < tokens.size(); ++i) {
        const int64_t t = std::clamp<int64_t>(int64_t(tokens[i]), 0, 49);
        for (size_t d = 0; d < 200; ++d)
            ASSERT_EQ(std::bit_cast<uint32_t>(got[0][i * 200 + d]),
                      std::bit_cast<uint32_t>(table[size_t(t) * 200 + d]))
                << "row " << i << " value " << d;
    }
}

TEST(CompilerDeviceGather, BatchedIdsGiveBatchedRowsThroughReshapes) {
    // aten::embedding of [3, 13] ids: the ids viewed as [39], the rows viewed back as
    // [3, 13, 200], whose T(8,128) tiles start each sequence on a new band (13 rows: 3 padded).
    const std::vector<Leaf> leaves{{"wte", f32({300, 200}), {randoms(300 * 200, 14)}, true},
                                   {"tokens", s32({3, 13}), {ids(39, 300, 15)}}};
    const auto st = expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return reshape(g, gather_rows(g, v[0], reshape(g, v[1], {39})), {3, 13, 200});
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerDeviceGather, ManyChunksOfIdsFeedAPositionalAddAndALayerNorm) {
    // 2600 ids: chunks of 1024 ids in scalar memory (two in the loop, a tail of 552); the rows
    // go to their own fusion's result, which the positional add and the layer norm read.
    const int64_t n = 2600, d = 128, vocab = 1000;
    const std::vector<Leaf> leaves{{"wte", f32({vocab, d}), {randoms(vocab * d, 2)}, true},
                                   {"tokens", s32({n}), {ids(n, vocab, 5)}},
                                   {"wpe", f32({n, d}), {randoms(n * d, 4)}, true},
                                   {"ln.w", f32({d}), {randoms(d, 6)}, true},
                                   {"ln.b", f32({d}), {randoms(d, 7)}, true}};
    const auto st = expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId e = add(g, gather_rows(g, v[0], v[1]), v[2]);
        return layer_norm(g, e, v[3], v[4], 1e-5).y;
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerDeviceGather, ThreeEmbeddingsSummedAsBertsAreEachTheirOwnFusion) {
    // BERT's word, token-type and position embeddings: three gathers (ids [2, 16] viewed as
    // [32]), each its own fusion, summed by a loop fusion.
    const int64_t b = 2, s = 16, d = 192;
    const std::vector<Leaf> leaves{{"word", f32({300, d}), {randoms(300 * d, 8)}, true},
                                   {"type", f32({2, d}), {randoms(2 * d, 9)}, true},
                                   {"pos", f32({64, d}), {randoms(64 * d, 10)}, true},
                                   {"input_ids", s32({b, s}), {ids(b * s, 300, 11)}},
                                   {"token_type_ids", s32({b, s}), {ids(b * s, 2, 12)}},
                                   {"position_ids", s32({b * s}), {ids(b * s, 64, 13)}}};
    const auto st = expect_bit_exact(leaves, [&](Graph& g, const std::vector<ValueId>& v) {
        const ValueId w = gather_rows(g, v[0], reshape(g, v[3], {b * s}));
        const ValueId t = gather_rows(g, v[1], reshape(g, v[4], {b * s}));
        const ValueId p = gather_rows(g, v[2], v[5]);
        return add(g, add(g, w, t), p);
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

}  // namespace
}  // namespace tpu::compiler::test
