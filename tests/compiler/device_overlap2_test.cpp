// SPDX-License-Identifier: Apache-2.0
// The attention's batched dots read their streamed operand a band at a time (DotKey::band_loads,
// compiler/README.md "The attention's batched dots"; issue #29): each DMA one contiguous run of
// every K step's tile of 8 rows, a block ahead, staged in sub-blocks whose DMAs in flight share
// no bytes. Bit-exact with the evaluator on the device (race detector on, one launch), and the
// values dot's cycles at BERT-base's shape.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::randoms;
using test::Record;
using test::zoo_attention;

/// The zoo's attention over [seq, heads x d] projections with its out projection, on the
/// device and on the evaluator: the same bits.
void expect_attention_bit_exact(int64_t seq, int64_t heads, int64_t d) {
    const int64_t dim = heads * d;
    const Shape ps{DType::F32, {seq, dim}};
    const Record record = [heads](Graph& g, const std::vector<ValueId>& v) {
        return zoo_attention(g, v[0], v[1], v[2], v[3], v[4], heads);
    };
    const float ws = 1.0f / std::sqrt(float(dim));
    expect_bit_exact(
        {{"q", ps, {randoms(size_t(seq * dim), 401)}},
         {"k", ps, {randoms(size_t(seq * dim), 402)}},
         {"v", ps, {randoms(size_t(seq * dim), 403)}},
         {"w", Shape{DType::F32, {dim, dim}}, {randoms(size_t(dim * dim), 404, -ws, ws)}, true},
         {"b", Shape{DType::F32, {dim}}, {randoms(size_t(dim), 405, -ws, ws)}, true}},
        record);
}

TEST(CompilerOverlap2Device, TwoHeadsOfFiveTwelveRowsReadPInBandsBitExact) {
    // One pass of two members (lanes 0 and 64), P's 512 rows of 512 in sub-blocks of 64 rows:
    // the second head's bands go out beside the first head's matmuls, the last head prefetches
    // nothing.
    expect_attention_bit_exact(512, 2, 64);
}

TEST(CompilerOverlap2Device, SixHeadsOverThreePassesAndTwoBlocksReadPInBandsBitExact) {
    // Three passes of two members, two blocks a head where the planner cuts 256 rows in two:
    // the next block is the same head's next rows, then the next member's, then the next
    // pass's (guarded by the pass count).
    expect_attention_bit_exact(256, 6, 64);
}

TEST(CompilerOverlap2Device, FourHeadsOfOneTwentyEightReadPInBandsBitExact) {
    // A period of one member, four passes.
    expect_attention_bit_exact(256, 4, 128);
}

TEST(CompilerOverlap2, BertBaseValuesDotReadsPInBands) {
    // BERT-base: 12 heads, seq 512, d 64 (test::steady_zoo_attention: the third step, timing
    // only). P is 12 x 1 MiB: read one K step's tile column at a time (64 runs of 4 KiB, 16 KiB
    // apart, each opening its HBM rows for a quarter of them) the values dot took 68 362
    // cycles (61 370 with the heads overlapped, CompilerOverlap.BertBaseAttentionDotsOverlap-
    // TheHeads); a band per DMA (16 KiB, whole rows) takes it below 56 000. The HBM bound of
    // its bytes (P read, C written: 12.6 MB at 479.5 B/cycle) is 26 245.
    const auto [step, stats] = test::steady_zoo_attention(512, 12, 64);
    std::vector<uint64_t> dots;
    for (size_t i = 0; i < step->fusions.size(); ++i)
        if (step->fusions[i].hero != kNoOp &&
            step->graph.op(step->fusions[i].hero).kind == OpKind::Dot)
            dots.push_back(stats.last_fusion_cycles.at(i));
    ASSERT_EQ(dots.size(), 3u);  // the scores, the values, the out projection
    std::cout << fmt::format("[bert attention, P in bands] scores {} cycles, values {}\n", dots[0],
                             dots[1]);
    EXPECT_GT(dots[1], 26245u);
    EXPECT_LT(dots[1], 56000u);
}

}  // namespace
}  // namespace tpu::compiler
