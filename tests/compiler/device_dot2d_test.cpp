// SPDX-License-Identifier: Apache-2.0
// The compiled 2-D dots as a compiler engineer schedules them (compiler/README.md, "Dot fusions
// as fast as the library GEMM"): Full sides (a residual) loaded during the group's own last
// steps (DotKey::prefetch_sides) and a merged dot's parts in one kernel (DotKey::parts,
// driver::emit_dot_parts), bit-exact with the evaluator on the device (race detector on, one
// launch) across groups, blocks, parts and both stationary sides.
#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "compiler_test_util.h"
#include "device_test_util.h"
#include "driver/device.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::expect_linears_of_one_input_bit_exact;
using test::randoms;
using test::Record;

/// y = x W^T + b + r, the attention's output projection and fc_2's form (`sets`: more config
/// overrides).
void expect_linear_residual_bit_exact(int64_t M, int64_t K, int64_t N, uint32_t seed,
                                      std::vector<std::string> sets = {}) {
    const Shape xs{DType::F32, {M, K}}, ws{DType::F32, {N, K}}, bs{DType::F32, {N}},
        rs{DType::F32, {M, N}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return add(g, linear(g, v[0], v[1], v[2]), v[3]);
    };
    expect_bit_exact({{"x", xs, {randoms(size_t(M * K), seed)}},
                      {"w", ws, {randoms(size_t(N * K), seed + 1)}, true},
                      {"b", bs, {randoms(size_t(N), seed + 2)}, true},
                      {"r", rs, {randoms(size_t(M * N), seed + 3)}}},
                     record, {0}, std::move(sets));
}

TEST(CompilerDot2dDevice, TheOutProjectionsResidualLoadedDuringItsGroupBitExact) {
    // BERT-base's output projection, 512 x 768 x 768 + bias + residual: the planner holds x^T
    // (4 panels, one per MXU a group: 2 groups of 6 K steps) and streams W's 768 rows in one
    // block; each group's residual tiles go out a panel at a time after its last two steps'
    // matmuls, while the previous group's split flush (steps 1 and 2) has read the area.
    expect_linear_residual_bit_exact(512, 768, 768, 31);
}

TEST(CompilerDot2dDevice, AResidualPrefetchedAcrossBlocksBitExact) {
    // 256 x 256 x 2048 + bias + residual: 2 K steps a group (the previous group's flush at
    // step 1, the prefetch after it in the same step), several blocks of streamed rows, each
    // block's first group prefetching while the previous block's last group is flushed.
    expect_linear_residual_bit_exact(256, 256, 2048, 41);
}

TEST(CompilerDot2dDevice, AResidualPrefetchedWithTheRhsStationaryBitExact) {
    // 2048 x 128 x 256 + bias + residual: the activation's 2048 rows stream past the held
    // weight (the RHS stationary, C in 8 x 128 tiles, one K step a group).
    expect_linear_residual_bit_exact(2048, 128, 256, 51);
}

TEST(CompilerDot2dDevice, AResidualPrefetchedInTheMiddleGroupsLoopBitExact) {
    // 2048 x 128 x 1024 + bias + residual: the RHS stationary with 8 column panels on 2 MXUs,
    // so a block has a first, a last and a loop of middle groups (emitted once, their columns
    // in a register), each prefetching its residual tiles at its pending address.
    expect_linear_residual_bit_exact(2048, 128, 1024, 81);
}

TEST(CompilerDot2dDevice, BertsMergedQkvPartsRunInOneKernelBitExact) {
    // BERT-base's Q, K, V projections (512 x 768 x 768 each, bias): one kernel of three parts,
    // each one block of 768 streamed weight rows in one group (two panels per MXU), the Column
    // sides' slots alternating (part 2 reuses part 0's slot once part 1 flushed part 0).
    expect_linears_of_one_input_bit_exact(512, 768, 768, 3, 61, 62, 72);
}

TEST(CompilerDot2dDevice, TwoPartsOfSeveralBlocksBitExact) {
    // 256 x 256 x 1536 twice: each part several blocks and groups, part 1's first block's
    // loads beside part 0's last stores.
    expect_linears_of_one_input_bit_exact(256, 256, 1536, 2, 71, 72, 82);
}

// C in one buffer (DotKey::one_c_buffer, compiler/README.md "C in one buffer"): K = 2048 with
// 8 MiB of VMEM, as BERT 2048's dots with 16: two buffers of C (or the block's K bf16 panels of
// the streamed weight kept for a second group) leave room for blocks of half the streamed rows
// only, one buffer for all of them, so the planner takes one.

TEST(CompilerDot2dDevice, MergedPartsWithCInOneBufferBitExact) {
    // 3 parts of 512 x 2048 x 1024 + bias: one block of 1 024 streamed rows a part (two of 512
    // with two buffers), each part's panels transposed out of C before the next part's first
    // matmuls.
    expect_linears_of_one_input_bit_exact(512, 2048, 1024, 3, 111, 112, 122,
                                          {"core.vmem_bytes=8388608"});
}

TEST(CompilerDot2dDevice, AResidualWithCInOneBufferBitExact) {
    // 512 x 2048 x 768 + bias + residual: one block of 768 streamed rows (two of 384 with two
    // buffers), the residual's panels 0 and 1 prefetched into its two slots, 2 and 3 into the
    // streamed weight's staging slots after the last steps' conversions.
    expect_linear_residual_bit_exact(512, 2048, 768, 131, {"core.vmem_bytes=8388608"});
}

}  // namespace
}  // namespace tpu::compiler
