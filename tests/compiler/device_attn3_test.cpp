// SPDX-License-Identifier: Apache-2.0
// The attention's scores dot loads each head's operands a head ahead (driver::DotKey with a
// DotBatch, `ahead_apply` in driver/kernels/matmul_kernel.cpp; compiler/README.md "The
// attention's batched dots"; issue #29): the next head's Q and K windows go into the staging
// slot the current head does not use, issued once the current head's own have arrived and
// before the previous head's scores are stored. Bit-exact with the evaluator on the device
// (race detector on, one launch) for 2, 3 and 12 heads of 64 and 4 heads of 128, and the scores
// dot's cycles at BERT-base's shape.
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
    test::expect_zoo_attention_bit_exact(seq, heads, d, 700);
}

TEST(CompilerAttn3Device, TwoHeadsLoadTheSecondHeadAheadBitExact) {
    // One pass of two members (lanes 0 and 64): the first head's operands before the loop, the
    // second head's while the first converts and computes; the second loads nothing ahead.
    expect_attention_bit_exact(512, 2, 64);
}

TEST(CompilerAttn3Device, ThreeHeadsInOnePassLoadAheadBitExact) {
    // Three heads of 64 lanes: a period of three members (lanes 0, 64, 0), one pass; each
    // head's operands land in the slot the previous head does not use (slots 0, 1, 0).
    expect_attention_bit_exact(256, 3, 64);
}

TEST(CompilerAttn3Device, TwelveHeadsOverSixPassesLoadAheadBitExact) {
    // Six passes of two members: the period's last member loads the next pass's first head
    // (lane 0 of the next tile) while passes remain, the last pass nothing.
    expect_attention_bit_exact(256, 12, 64);
}

TEST(CompilerAttn3Device, FourHeadsOfOneTwentyEightLoadAheadBitExact) {
    // A period of one member over four passes: the slots alternate from pass to pass through
    // the slot registers (whole 8 x 128 tiles of Q, one DMA a head).
    expect_attention_bit_exact(256, 4, 128);
}

TEST(CompilerAttn3Device, HeadsNarrowerThanHalfATileKeepTheirPerHeadLoadsBitExact) {
    // Heads of 32 and 16 lanes (the zoo's GPT: 4 heads of 32), four or eight to a tile: the
    // head-ahead staging takes heads of 64 or 128 lanes only (ahead_apply); these gave wrong
    // values through it (GptOnTheDevice caught it), so they keep the per-head loads.
    expect_attention_bit_exact(64, 4, 32);
    expect_attention_bit_exact(64, 8, 16);
}

TEST(CompilerAttn3Device, FourHeadsStoreTheirValuesInPairsBitExact) {
    // The values dot (P V, P read a head ahead, V^T streamed) stores each pair of 64-lane heads
    // together: the second head's MXUs write rows 64..127 of the first's C panels, one
    // transpose, rows of 512 bytes (both heads' columns of [S, 4 x 64]). Two passes of a pair at
    // four K steps: the pairs alternate between the two C parities (the 2-head test is one pass,
    // the 12-head one at seq 256 two K steps a head).
    expect_attention_bit_exact(512, 4, 64);
}

/// PyTorchSim's attention as `tpusim op attention --engine compiled` records it (tools/tpusim/
/// op_runs.cpp): q, k, v [H, S, d], `k q^T / sqrt(d)` [H, keys, queries], softmax over the keys,
/// `v^T p` [H, d, queries]; on the device (race detector on, one launch) and on the evaluator.
void expect_pytorchsim_attention_bit_exact(int64_t seq, int64_t heads, int64_t d, uint32_t seed) {
    const Shape in{DType::F32, {heads, seq, d}};
    const test::Record record = [d](Graph& g, const std::vector<ValueId>& v) {
        DotDims sd;
        sd.lhs_batch = sd.rhs_batch = {0};
        sd.lhs_contracting = sd.rhs_contracting = {2};
        const ValueId s = dot(g, v[1], v[0], sd);
        const ValueId p = softmax(g, div(g, s, full(g, std::sqrt(double(d)), g.shape(s))), 1);
        DotDims od;
        od.lhs_batch = od.rhs_batch = {0};
        od.lhs_contracting = od.rhs_contracting = {1};
        return dot(g, v[2], p, od);
    };
    const size_t n = size_t(heads * seq * d);
    test::expect_bit_exact({{"q", in, {test::randoms(n, seed + 1)}},
                            {"k", in, {test::randoms(n, seed + 2)}},
                            {"v", in, {test::randoms(n, seed + 3)}}},
                           record);
}

TEST(CompilerAttn3Device, PyTorchSimsValuesDotStoresAfterItsLastStepsLoadsBitExact) {
    // `v^T p` at seq 512: four K steps a head, the next head's first step loaded beside the
    // last (step_ahead_apply), and the previous head's results stored after step 3's loads
    // are queued (flush_step 2, was 1). Three heads of 64 (one pass, the last head loads
    // nothing ahead) and four of 32 lanes (each head an array of its own, padded to a tile).
    expect_pytorchsim_attention_bit_exact(512, 3, 64, 710);
    expect_pytorchsim_attention_bit_exact(512, 4, 32, 720);
}

TEST(CompilerAttn3, BertBaseValuesDotStoresPairsOfHeadsTogether) {
    // BERT-base's values dot (test::steady_zoo_attention, 12 heads, seq 512, d 64): a head's
    // results are 512 rows of 64 values of the [512, 768] output. Stored head by head they were
    // 256-byte runs, 3 KiB apart (a head's 4 panels, 4 DMAs of 128 rows each, written between
    // P's 4 KiB band reads): 49 264 cycles. Now a pair's second head writes below the first's in
    // the same C panels and the pair is stored once, runs of 512 bytes (2 DMAs a head instead
    // of 4, which the HBM serves closer to its peak): 46 076. The HBM bound of its bytes (P
    // read, C written: 12.6 MB at 479.5 B/cycle) is 26 245; its MXU steps (2.5 k cycles a head,
    // compiler/README.md) keep it above about 30 k.
    const uint64_t values = test::zoo_attention_dot_cycles(512, 12, 64).second;
    std::cout << fmt::format("[bert attention, pairs stored together] values {} cycles\n", values);
    EXPECT_GT(values, 26245u);
    EXPECT_LT(values, 47000u);
}

TEST(CompilerAttn3, BertBaseScoresDotLoadsTheNextHeadAhead) {
    // BERT-base: 12 heads, seq 512, d 64 (test::steady_zoo_attention: the third step, timing
    // only). A head's scores are 1 MiB written (64 band stores of 16 KiB), its Q window 128 KiB
    // (64 DMAs of 8 rows x 256 B) and its K^T window's tiles 256 KiB read. Loaded at each head's
    // start, behind the previous head's stores in the in-order DMA engine, and converted once
    // they had all arrived, the loads left the HBM idle about 1.5 k cycles a head: 50 263 cycles
    // when the heads were first overlapped. Now each pair of heads (lanes 0 and 64) reads its Q
    // and K tiles once (2 x 256 KiB, 4 KiB runs), a head ahead, while the previous head's scores
    // are stored, and C's three buffers let a head's matmuls wait only for the stores of the head
    // three before: 12 x (1 MiB + 256 KiB) = 15.73 MB, the least traffic, whose HBM bound at
    // 479.5 B/cycle is 32 802; measured 39 623 (83% of it; 40 099 before the values dot stored
    // pairs of heads together, 39 841 before its earlier changes: the values dot moves the HBM's
    // state at this fusion, compiler/README.md).
    const auto [scores, values] = test::zoo_attention_dot_cycles(512, 12, 64);
    std::cout << fmt::format(
        "[bert attention, operands a head ahead] scores {} cycles, values {}\n", scores, values);
    EXPECT_GT(scores, 32802u);
    EXPECT_LT(scores, 41000u);
}

}  // namespace
}  // namespace tpu::compiler
