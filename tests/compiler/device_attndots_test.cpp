// SPDX-License-Identifier: Apache-2.0
// The attention's batched dots (compiler/README.md, "Code generation", "The attention's
// batched dots"; issue #29): the scores Q K^T and the values P V of a BERT block, per head,
// bit-exact with the evaluator on the device (race detector on, one launch), and their cycles
// at BERT-base's shape (12 heads, seq 512, d 64).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "driver/device.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::zoo_attention;

void expect_attention_bit_exact(int64_t seq, int64_t heads, int64_t d) {
    test::expect_zoo_attention_bit_exact(seq, heads, d, 200);
}

TEST(CompilerAttnDotsDevice, SixHeadsOfSixtyFourLoopOverPairsOfHeadsBitExact) {
    // 6 heads of 64 lanes, two per tile: the batched dots' kernels alternate between the
    // windows at lane 0 and lane 64, so one pair of kernels runs unrolled and a loop runs the
    // other two pairs, each pass a tile (4 KiB) further on in Q, K and V.
    expect_attention_bit_exact(128, 6, 64);
}

TEST(CompilerAttnDotsDevice, FourHeadsOfOneTwentyEightLoopOverTheHeadsBitExact) {
    // Heads of a whole tile column: one kernel, unrolled once, then a loop of three passes.
    expect_attention_bit_exact(128, 4, 128);
}

TEST(CompilerAttnDots, ThirtyTwoHeadsFitTheInstructionMemory) {
    // BERT 2048 / 32 heads, seq 512: one kernel per head made the values dot 394 KB of code,
    // beyond the core's 256 KiB instruction memory (the fusion ran on the host). A loop over
    // 16 periods of two kernels: every fusion is generated, each device program fits.
    const int64_t seq = 512, dim = 2048;
    const Shape ps{DType::F32, {seq, dim}};
    Graph g;
    g.add_output(zoo_attention(g, g.input(ps, "q"), g.input(ps, "k"), g.input(ps, "v"),
                               g.parameter(Shape{DType::F32, {dim, dim}}, "w"),
                               g.parameter(Shape{DType::F32, {dim}}, "b"), 32),
                 "y");
    CodegenOptions cg;
    cg.board = hw::BoardConfig::load("", {});
    cg.host_fallback = true;
    const StepProgram p = generate_step(compile(g), cg);
    for (const ProgramSegment& s : p.segments) {
        EXPECT_EQ(s.fallback, "");
        EXPECT_LE(s.program.code.size() * uint64_t(isa::kInstrBytes), cg.board.core.imem_bytes);
    }
}

TEST(CompilerAttnDots, BertBaseAttentionDotCycles) {
    // BERT-base: 12 heads, seq 512, d 64. Bounds per dot: the MXUs' MACs, 12 x 512 x 512 x 64
    // over 2 x 128 x 128 per cycle = 6 144 cycles (12 288 with d = 64 filling half the
    // array's depth or width); the HBM, the f32 [12, 512, 512] scores written (or the
    // probabilities read), 12.6 MB at 479.5 B/cycle = 26 245 cycles.
    const auto [scores, values] = test::zoo_attention_dot_cycles(512, 12, 64);
    std::cout << fmt::format("[bert attention] scores {} cycles, values {}\n", scores, values);
    EXPECT_GT(scores, 26245u);
    EXPECT_GT(values, 26245u);
}

}  // namespace
}  // namespace tpu::compiler
