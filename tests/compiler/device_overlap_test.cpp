// SPDX-License-Identifier: Apache-2.0
// The attention's batched dots as one kernel whose block pipeline runs over the heads
// (compiler/README.md, "The attention's batched dots"; driver::DotBatch; issue #29): a head's
// loads go out while the previous head's matmuls run and its results leave while the next head
// computes. Bit-exact with the evaluator on the device (race detector on, one launch), and the
// two dots' cycles at BERT-base's shape.
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

void expect_attention_bit_exact(int64_t seq, int64_t heads, int64_t d) {
    test::expect_zoo_attention_bit_exact(seq, heads, d, 300);
}

TEST(CompilerOverlapDevice, TwoHeadsOfSixtyFourAreOneKernelOfTwoMembersBitExact) {
    // Two heads share a tile (lanes 0 and 64): one pass of a period of two members, no loop;
    // the second head's loads go out beside the first head's matmuls.
    expect_attention_bit_exact(128, 2, 64);
}

TEST(CompilerOverlapDevice, EightHeadsOfSixtyFourOverTwoBlocksEachBitExact) {
    // Four passes of two members, each head of 256 rows: the pipeline crosses blocks within a
    // head and heads within a pass and passes (the operands' registers moved on).
    expect_attention_bit_exact(256, 8, 64);
}

TEST(CompilerOverlapDevice, ThreeHeadsOfOneTwentyEightLoopOverOneMemberBitExact) {
    // Heads of a whole tile column: a period of one, three passes.
    expect_attention_bit_exact(128, 3, 128);
}

TEST(CompilerOverlapDevice, ADivideByALiteralInTheEpilogueIsOneMultiplyBitExact) {
    // PyTorchSim's scores k q^T / sqrt(d), and a negative divisor: vpu_divide's factor folded
    // at compile time (x * vpu_reciprocal(y), negated where 0 > y), the same bits.
    const Shape xs{DType::F32, {128, 256}}, ws{DType::F32, {256, 128}};
    for (const double y : {8.0, -3.0, 0.7}) {
        SCOPED_TRACE(y);
        const Record record = [y](Graph& g, const std::vector<ValueId>& v) {
            const ValueId d = matmul(g, v[0], v[1], false, false);
            return div(g, d, broadcast(g, literal(g, y), {128, 128}, {}));
        };
        expect_bit_exact({{"x", xs, {randoms(128 * 256, 311)}},
                          {"w", ws, {randoms(256 * 128, 312, -0.1f, 0.1f)}, true}},
                         record);
    }
}

TEST(CompilerOverlap, BertBaseAttentionDotsOverlapTheHeads) {
    // BERT-base: 12 heads, seq 512, d 64. The HBM bound per dot is 12 x 512 x 512 f32 scores
    // written (or read), 12.6 MB at 479.5 B/cycle = 26 245 cycles; one kernel per head, each
    // loading before its first matmul and draining its stores before the next head, took
    // 66 882 (scores) and 64 274 (values) cycles. Overlapped, each dot is below that serial
    // figure (test::steady_zoo_attention: the third step, timing only).
    const auto [scores, values] = test::zoo_attention_dot_cycles(512, 12, 64);
    std::cout << fmt::format("[bert attention, heads overlapped] scores {} cycles, values {}\n",
                             scores, values);
    EXPECT_GT(scores, 26245u);
    EXPECT_GT(values, 26245u);
    EXPECT_LT(scores, 66882u);
    EXPECT_LT(values, 64274u);
}

}  // namespace
}  // namespace tpu::compiler
