// SPDX-License-Identifier: Apache-2.0
// The backward fusions of the zoo's training steps on the device (compiler/README.md, "Training
// steps on the device"): a convolution's input gradient with its consumers, sums over untiled
// NHWC rows, a pooling gradient reading a flattened gradient, a CNN step like the zoo's, and a
// timing-only step that holds no values.
#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::probe;
using test::f32;
using test::Leaf;
using test::randoms;
using test::Record;
using test::run;

/// ResNet's backward through a basic block's first convolution: dx of a 3 x 3 convolution, the
/// residual's gradient added, ReLU's mask (the forward's output > 0): one output fusion whose
/// consumers run as a pass after col2im.
ValueId input_grad_tail(Graph& g, const std::vector<ValueId>& v) {
    const ValueId dy = v[0], w = v[1], res = v[2], h = v[3];
    const ValueId dx = conv2d_input_grad(g, dy, w, g.shape(h).dims, 1, 1);
    const ValueId zero = full(g, 0.0, g.shape(h));
    return select(g, compare(g, h, zero, Comparison::Gt), add(g, dx, res), zero);
}

std::vector<Leaf> input_grad_leaves(int64_t c) {
    return {{"dy", f32({2, 8, 8, c}), {randoms(size_t(2 * 64 * c), 301)}},
            {"w", f32({3, 3, c, c}), {randoms(size_t(9 * c * c), 302, -0.1f, 0.1f)}, true},
            {"res", f32({2, 8, 8, c}), {randoms(size_t(2 * 64 * c), 303)}},
            {"h", f32({2, 8, 8, c}), {randoms(size_t(2 * 64 * c), 304)}}};
}

TEST(CompilerDeviceTrainStep, AnInputGradientWithItsConsumersIsOneLaunchBitExact) {
    // Before: "convolution-input-grad with other ops in its fusion (col2im writes dx last)".
    EXPECT_EQ(probe(input_grad_leaves(128), input_grad_tail).fallback_fusions, 0u);
    expect_bit_exact(input_grad_leaves(128), input_grad_tail);
}

/// A convolution's bias gradient: ReLU's mask on dy (an untiled NHWC array a convolution
/// wrote), summed over N, H and W.
ValueId bias_grad(Graph& g, const std::vector<ValueId>& v) {
    const ValueId x = v[0], w = v[1];
    const ValueId y = conv2d(g, x, w, 1, 1);
    const ValueId zero = full(g, 0.0, g.shape(y));
    const ValueId dy = select(g, compare(g, y, zero, Comparison::Gt), y, zero);
    return reduce(g, dy, {0, 1, 2}, Reducer::Sum);
}

std::vector<Leaf> bias_grad_leaves(int64_t c) {
    return {{"x", f32({2, 8, 8, 64}), {randoms(size_t(2 * 64 * 64), 311)}},
            {"w", f32({3, 3, 64, c}), {randoms(size_t(9 * 64 * c), 312, -0.1f, 0.1f)}, true}};
}

TEST(CompilerDeviceTrainStep, SumsOverUntiledNhwcRowsAreBitExact) {
    // Before: "a reduction over major dims of untiled rows". One lane chunk (64 channels: the
    // band of 8 rows is a T(8, 64) tile) and two (256: in row order, transposed whole).
    for (const int64_t c : {64, 256}) {
        SCOPED_TRACE(c);
        EXPECT_EQ(probe(bias_grad_leaves(c), bias_grad).fallback_fusions, 0u);
        expect_bit_exact(bias_grad_leaves(c), bias_grad);
    }
}

/// The zoo CNN's pool gradient: dy of the flattened features ([B, H W C], a dot's result) viewed
/// as NHWC by a reshape in the max pool gradient's fusion, with the ReLU recomputed.
ValueId pool_grad_of_flat(Graph& g, const std::vector<ValueId>& v) {
    const ValueId x = v[0], b = v[1], dflat = v[2];
    const auto& d = g.shape(x).dims;
    const ValueId h = relu(g, add(g, x, broadcast(g, b, d, {3})));
    const ValueId dp = reshape(g, dflat, {d[0], d[1] / 2, d[2] / 2, d[3]});
    return max_pool_grad(g, h, dp, 2, 2, 0);
}

TEST(CompilerDeviceTrainStep, APoolGradientReadsAFlatGradientThroughItsReshape) {
    // Before: "reshape in the epilogue". The flat gradient lies untiled row-major (its reader
    // views it as NHWC), so the reshape is the same bytes.
    const std::vector<Leaf> leaves{{"x", f32({8, 8, 8, 64}), {randoms(8 * 64 * 64, 321)}},
                                   {"b", f32({64}), {randoms(64, 322)}, true},
                                   {"dflat", f32({8, 16 * 64}), {randoms(8 * 16 * 64, 323)}}};
    EXPECT_EQ(probe(leaves, pool_grad_of_flat).fallback_fusions, 0u);
    expect_bit_exact(leaves, pool_grad_of_flat);
}

/// A chain of `layers` linears of width 256 on a batch of `batch` rows (each a dot fusion).
Graph linear_chain(int64_t batch, int layers) {
    Graph g;
    ValueId x = g.input(f32({batch, 256}), "x");
    for (int i = 0; i < layers; ++i)
        x = linear(g, x, g.parameter(f32({256, 256}), "w" + std::to_string(i)), kNoValue);
    g.add_output(x, "y");
    return g;
}

TEST(CompilerDeviceTrainStep, ABatchChainNeedsTwoActivationsWhateverItsLength) {
    // Buffer assignment by liveness: each layer's result lives from its dot to the next dot, so
    // two of them at a time (4 KiB x batch / 4 each: 256 fp32 per row, T(8,128) tiles whole at
    // batch 1024), whatever the depth; without reuse, one per layer but the last (an output).
    for (const int layers : {4, 12}) {
        const CompiledStep step = compile(linear_chain(1024, layers));
        const uint64_t act = 1024 * 256 * 4;
        EXPECT_EQ(step.memory.temp_bytes, 2 * act) << layers;
        EXPECT_EQ(step.memory.temp_unshared_bytes, uint64_t(layers - 1) * act) << layers;
        EXPECT_EQ(step.memory.peak_bytes(), step.memory.parameter_bytes + act + act + 2 * act);
    }
}

TEST(CompilerDeviceTrainStep, ATimingOnlyStepHoldsNoValuesAndTakesTheSameCycles) {
    // The input-gradient step above, uploaded without values on a timing-only board: the
    // backend keeps none, the launch takes the functional run's cycles, the result reads zeros.
    const auto cycles = [](bool functional) {
        const auto cfg = hw::BoardConfig::load(
            "", {functional ? "sim.functional=true" : "sim.functional=false"});
        auto dev = driver::Device::open(cfg);
        CodegenOptions cg;
        cg.board = cfg;
        DeviceBackend device(*dev, {0}, cg);
        std::vector<Leaf> leaves = input_grad_leaves(128);
        if (!functional)
            for (Leaf& l : leaves) l.values = {{}};  // shapes only
        const auto out = run(device, leaves, input_grad_tail);
        if (!functional) {
            for (float v : out[0]) EXPECT_EQ(v, 0.0f);
        }
        EXPECT_EQ(device.stats().launches, 1u);
        return device.stats().last_launch.core_cycles.at(0);
    };
    EXPECT_EQ(cycles(false), cycles(true));
}

}  // namespace
}  // namespace tpu::compiler
