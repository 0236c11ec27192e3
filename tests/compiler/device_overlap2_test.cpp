// SPDX-License-Identifier: Apache-2.0
// The attention's values dot reads its held P a head ahead (DotKey::band_loads, compiler/README.md
// "The attention's batched dots"; issue #29): each panel's K steps' tiles one after the other,
// so every band's four tiles (one contiguous 16 KiB) are read while their HBM rows are open,
// each tile into a staging area of its own. Bit-exact with the evaluator on the device (race
// detector on, one launch), and the values dot's cycles at BERT-base's shape.
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

void expect_attention_bit_exact(int64_t seq, int64_t heads, int64_t d) {
    test::expect_zoo_attention_bit_exact(seq, heads, d, 400);
}

TEST(CompilerOverlap2Device, TwoHeadsOfFiveTwelveRowsReadPAHeadAheadBitExact) {
    // One pass of two members (lanes 0 and 64), P 512 x 512 a head (4 x 4 held tiles): the
    // second head's tiles go out beside the first head's matmuls, the last head reads ahead
    // nothing.
    expect_attention_bit_exact(512, 2, 64);
}

TEST(CompilerOverlap2Device, SixHeadsOverThreePassesReadPAHeadAheadBitExact) {
    // Three passes of two members (P 256 x 256 a head): a head's tiles are read while the
    // previous head computes; the period's last member reads the next pass's first head's,
    // the last pass's nothing (guarded by the pass count).
    expect_attention_bit_exact(256, 6, 64);
}

TEST(CompilerOverlap2Device, FourHeadsOfOneTwentyEightReadPAHeadAheadBitExact) {
    // A period of one member, four passes.
    expect_attention_bit_exact(256, 4, 128);
}

TEST(CompilerOverlap2, BertBaseValuesDotReadsPAHeadAhead) {
    // BERT-base: 12 heads, seq 512, d 64 (test::steady_zoo_attention: the third step, timing
    // only). P is 12 x 1 MiB, held in 4 x 4 tiles a head. Read a K step's tiles at a time (each
    // 16 runs of 4 KiB, 16 KiB apart: a quarter of the HBM rows they open), the K steps of a
    // band apart by a step's matmuls, the values dot took 61 370 cycles with the heads
    // overlapped; read a head ahead, each panel's K steps one after the other (a band's four
    // tiles while its rows are open), 55 920; with the V window's panels two steps ahead and P's
    // band chunks over the first three steps (compiler/README.md "Each head's operands a head
    // ahead"), 52 351; 49 264 with a pair's V tiles read once, 46 076 with a pair's results
    // stored together (CompilerAttn3.BertBaseValuesDotStoresPairsOfHeadsTogether). The HBM bound of
    // its bytes (P read, C written: 12.6 MB at 479.5 B/cycle) is 26 245.
    const auto [scores, values] = test::zoo_attention_dot_cycles(512, 12, 64);
    std::cout << fmt::format("[bert attention, P a head ahead] scores {} cycles, values {}\n",
                             scores, values);
    EXPECT_GT(values, 26245u);
    EXPECT_LT(values, 56000u);
}

}  // namespace
}  // namespace tpu::compiler
