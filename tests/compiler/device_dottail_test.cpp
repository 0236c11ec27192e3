// SPDX-License-Identifier: Apache-2.0
// The ends of a compiled 2-D dot (compiler/README.md, "The end of a dot"): each panel's stores
// follow its own epilogue, and the last group's first panel on each MXU is stored while the
// MXUs finish its second. BERT-base's ffn (what `tpusim validate`'s bert-block rows run, ReLU)
// within a few percent of its schedule's floor, and the merged parts with a last group of an
// odd count of panels bit-exact with the evaluator (race detector on, one launch).
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

using test::expect_linears_of_one_input_bit_exact;

/// The steady-state cycles of BERT's ffn with ReLU compiled as one step on one core, per dot
/// fusion: h = relu(x W1^T + b1), y = h W2^T + b2 + x with x [M, H] an input, W1 [F, H], W2
/// [H, F] parameters; the third step's (the parameters then carry their kernels' layouts).
/// Timing only (sim.functional=false). Returns {fc_1, fc_2}.
std::pair<uint64_t, uint64_t> steady_relu_ffn_cycles(int64_t M, int64_t H, int64_t F) {
    const auto cfg = hw::BoardConfig::load("", {"sim.functional=false"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    device.time_fusions(true);
    CompileOptions co;
    co.board = cfg;
    LazyContext ctx(device, co);
    const Shape xs{DType::F32, {M, H}}, w1s{DType::F32, {F, H}}, b1s{DType::F32, {F}},
        w2s{DType::F32, {H, F}}, b2s{DType::F32, {H}};
    const LazyTensor w1 = ctx.parameter("w1", w1s, {std::vector<float>(size_t(F * H), 0.01f)});
    const LazyTensor b1 = ctx.parameter("b1", b1s, {std::vector<float>(size_t(F), 0.0f)});
    const LazyTensor w2 = ctx.parameter("w2", w2s, {std::vector<float>(size_t(F * H), 0.01f)});
    const LazyTensor b2 = ctx.parameter("b2", b2s, {std::vector<float>(size_t(H), 0.0f)});
    for (int step = 0; step < 3; ++step) {
        const LazyTensor x = ctx.input("x", xs, {std::vector<float>(size_t(M * H), 1.0f)});
        Graph& g = ctx.graph();
        const ValueId h = relu(g, linear(g, ctx.value(x), ctx.value(w1), ctx.value(b1)));
        const ValueId y = add(g, linear(g, h, ctx.value(w2), ctx.value(b2)), ctx.value(x));
        const LazyTensor out = ctx.wrap(y, "y");
        ctx.mark_step();
        (void)out;
    }
    EXPECT_EQ(device.stats().launches, 3u);
    const CompiledStep& s = *ctx.last_step();
    std::vector<uint64_t> dots;
    for (size_t i = 0; i < s.fusions.size(); ++i)
        if (s.fusions[i].hero != kNoOp && s.graph.op(s.fusions[i].hero).kind == OpKind::Dot)
            dots.push_back(device.stats().last_fusion_cycles.at(i));
    EXPECT_EQ(dots.size(), 2u) << s.to_string();
    return {dots.at(0), dots.at(1)};
}

TEST(CompilerDotTail, TheBertBaseFfnRunsWithinAFewPercentOfItsScheduleFloor) {
    // BERT-base's ffn, M = 512, H = 768, F = 3072, ReLU. Both dots hold x^T or h^T (4 panels of
    // 128 activation rows, two per MXU in one group) and stream the fp32 weight from its MXU
    // tiles; a step of T streamed rows on a new weight tile costs T + 128 + 128 - 2 cycles
    // (core.mxu_swap_drains). The floor of each schedule, every MXU busy from its first
    // operands to its last matmul, then the last matmul's results out at the HBM's peak
    // (479.5 B a cycle), plus the fusion boundary (core.fusion_setup_cycles, 200):
    // - fc_2 (512 x 3072 x 768 + bias + residual): one block of T = 768 weight rows, 24 K
    //   steps x 2 panels per MXU x 1 022 = 49 056 MXU cycles; before the first matmul the 4
    //   held fp32 tiles and the first panel, (4 x 65 536 + 768 x 512) / 479.5 = 1 367; after
    //   the last one the two panels it wrote (768 x 128 x 4 B each) and their residual tiles
    //   already loaded, 786 432 / 479.5 = 1 640. Floor 52 263.
    // - fc_1 (512 x 768 x 3072 + bias + ReLU): blocks of T = 1 536 weight rows, 2 x 6 K steps x
    //   2 panels per MXU x 1 790 = 42 960; before: (4 x 65 536 + 1 536 x 512) / 479.5 = 2 187;
    //   after: two panels of 1 536 x 128 x 4 B, 3 280. Floor 48 627.
    // Was fc_1 55 445 (1.14 x), fc_2 55 263 (1.057 x) in the block: every panel's epilogue
    // before the first store, and the whole last group stored after the last matmul.
    const auto [fc1, fc2] = steady_relu_ffn_cycles(512, 768, 3072);
    std::cout << fmt::format("[bert ffn relu] fc_1 {} cycles ({:.3f} x floor), fc_2 {} ({:.3f} x)\n",
                             fc1, double(fc1) / 48627, fc2, double(fc2) / 52263);
    EXPECT_GE(fc1, 48627u);
    EXPECT_GE(fc2, 52263u);
    EXPECT_LE(double(fc1), 1.10 * 48627);
    EXPECT_LE(double(fc2), 1.05 * 52263);
}

TEST(CompilerDotTailDevice, MergedPartsWithAnOddLastGroupBitExact) {
    // Two linears of one input, 640 x 256 x 1536 each: x^T held as 5 panels of 128 rows (three
    // on MXU 0, two on MXU 1, one group), each part several blocks of streamed weight rows; the
    // kernel's end stores panels 0 and 1 once their last matmuls are done, then 2, 3 and 4.
    expect_linears_of_one_input_bit_exact(640, 256, 1536, 2, 91, 92, 102);
}

}  // namespace
}  // namespace tpu::compiler
