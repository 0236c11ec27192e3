// SPDX-License-Identifier: Apache-2.0
// The start and the end of a compiled 2-D dot (compiler/README.md, "The start and the end of a
// 2-D dot"): the first step in two halves of its streamed panel, each panel's stores after its
// own epilogue, the last group's first panel on an MXU stored while the MXUs finish the rest.
// BERT-base's ffn (what `tpusim validate`'s bert-block rows run, ReLU) within a few percent of
// its schedule's floor, and the merged parts with a last group of an odd count of panels
// bit-exact with the evaluator (race detector on, one launch).
#include <iostream>

#include <fmt/format.h>
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

TEST(CompilerDotTail, TheBertBaseFfnRunsWithinAFewPercentOfItsScheduleFloor) {
    // BERT-base's ffn, M = 512, H = 768, F = 3072, ReLU. Both dots hold x^T or h^T (4 panels of
    // 128 activation rows, two per MXU in one group) and stream the fp32 weight from its MXU
    // tiles; a step of T streamed rows on a new weight tile costs T + 128 + 128 - 2 cycles
    // (core.mxu_swap_drains). The floor of each schedule: the fusion boundary
    // (core.fusion_setup_cycles, 200); before the first matmul, the 4 held fp32 tiles and the
    // first half of the first streamed panel at the HBM's peak (479.5 B a cycle); every MXU busy
    // from then to its last matmul; after it, the two panels that matmul wrote, stored at peak.
    // - fc_2 (512 x 3072 x 768 + bias + residual): one block of T = 768 weight rows, 24 K
    //   steps x 2 panels per MXU x 1 022 = 49 056 MXU cycles; before: (4 x 65 536 + 384 x 512)
    //   / 479.5 = 957; after: 2 x 768 x 128 x 4 B / 479.5 = 1 640. Floor 51 853.
    // - fc_1 (512 x 768 x 3072 + bias + ReLU): two blocks of T = 1 536 weight rows, 2 x 6 K
    //   steps x 2 panels per MXU x 1 790 = 42 960; before: (4 x 65 536 + 768 x 512) / 479.5 =
    //   1 367; after: 2 x 1 536 x 128 x 4 B / 479.5 = 3 280. Floor 47 807.
    // Measured 52 265 (1.093 x) and 54 219 (1.046 x); before each panel's stores followed its
    // own epilogue, the last group's first panels were stored while the MXUs finished and the
    // first step ran in halves: 56 265 (1.177 x) and 55 982 (1.080 x).
    const auto [fc1, fc2] = test::steady_ffn_cycles(512, 768, 3072, true);
    std::cout << fmt::format(
        "[bert ffn relu] fc_1 {} cycles ({:.3f} x floor), fc_2 {} ({:.3f} x)\n", fc1,
        double(fc1) / 47807, fc2, double(fc2) / 51853);
    EXPECT_GE(fc1, 47807u);
    EXPECT_GE(fc2, 51853u);
    EXPECT_LE(double(fc1), 1.12 * 47807);
    EXPECT_LE(double(fc2), 1.06 * 51853);
}

TEST(CompilerDotTailDevice, MergedPartsWithAnOddLastGroupBitExact) {
    // Two linears of one input, 640 x 256 x 1536 each: x^T held as 5 panels of 128 rows (three
    // on MXU 0, two on MXU 1, one group), each part several blocks of streamed weight rows; part
    // 0's first step in halves, the kernel's end stores panels 0 and 1 once their last matmuls
    // are done, then 2, 3 and 4.
    expect_linears_of_one_input_bit_exact(640, 256, 1536, 2, 91, 92, 102);
}

TEST(CompilerDotTailDevice, AnLhsStationaryDotWithBiasAndResidualKeepsRegistersForItsStores) {
    // BERT's out-projection at batch 128 (x [4096, 192] @ W^T [192, 192] + b + x): x^T held,
    // its 8 x 128 result tiles stored between the panels' epilogues through lhs_tiles' five
    // loop registers, beside the pipeline's and the two sides'. With the bias's column base
    // held across the panels the program ran out of scalar registers ("out of scalar
    // registers for '...tiles.end'"); each epilogue now sets it anew where they are short.
    const int64_t M = 4096, H = 192;
    expect_bit_exact({{"x", test::f32({M, H}), {test::randoms(size_t(M * H), 5)}},
                      {"w", test::f32({H, H}), {test::randoms(size_t(H * H), 6)}, true},
                      {"b", test::f32({H}), {test::randoms(size_t(H), 7)}, true}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return add(g, linear(g, v[0], v[1], v[2]), v[0]);
                     });
}

}  // namespace
}  // namespace tpu::compiler
