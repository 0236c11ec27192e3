// SPDX-License-Identifier: Apache-2.0
// Convolution filter gradients whose dot over every pixel would unroll beyond the instruction
// memory run as dots over K blocks (compiler/README.md "Filter gradients over K blocks"): one
// launch, bit-exact with the evaluator, race detector on.

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "driver/device.h"

namespace tpu::compiler {
namespace {

using namespace test;

// The default board: 256 KiB of instruction memory, 8192 instructions, so a filter gradient's
// dot unrolls at most 8192 / 28 = 292 K steps times column-group variants
// (codegen_conv.cpp, max_unrolled_dot_steps); beyond, each block takes 292 / (4 variants) steps.

TEST(CompilerDwGrad, AFilterGradientOverKBlocksIsBitExact) {
    // x [10, 63, 63, 8], 3 x 3, stride 1, pad 1: K = 10 x 63 x 63 = 39 690 pixels, 311 steps of
    // one column group (Cout 8), beyond the 292; in blocks of 292 / 4 = 73 steps (9 344 pixels):
    // the first, three in the loop, and a last of 2 314 pixels whose last step is short (10 rows).
    const std::vector<Leaf> leaves = {
        {"x", f32({10, 63, 63, 8}), {randoms(10 * 63 * 63 * 8, 21)}},
        {"dy", f32({10, 63, 63, 8}), {randoms(10 * 63 * 63 * 8, 22)}}};
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return conv2d_filter_grad(g, v[0], v[1], 3, 1, 1);
    });
}

TEST(CompilerDwGrad, AFilterGradientOverKBlocksAboveTheWindowIsBitExact) {
    // ResNet-50 at 128 images per core runs wide programs (its buffers beyond 4 GiB, each
    // fusion's mapped to HBM windows): the blocks' partial sums are addressed from the scratch's
    // window address. The core's 4 GiB window is full, so every buffer of the step lies above
    // it. x [10, 63, 63, 8] as above: 5 blocks.
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    const driver::Buffer fill = dev->alloc(dev->largest_free_block(0), 0);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    const std::vector<Leaf> leaves = {
        {"x", f32({10, 63, 63, 8}), {randoms(10 * 63 * 63 * 8, 51)}},
        {"dy", f32({10, 63, 63, 8}), {randoms(10 * 63 * 63 * 8, 52)}}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return conv2d_filter_grad(g, v[0], v[1], 3, 1, 1);
    };
    const uint64_t launches = dev->metrics().launches;
    const auto got = run(device, leaves, record);
    EXPECT_EQ(dev->metrics().launches - launches, 1u);
    HostBackend host(1);
    EXPECT_TRUE(same_bits(got[0], run(host, leaves, record)[0]));
    dev->free(fill);
}

TEST(CompilerDwGrad, ColumnGroupsAndAnEpilogueOverKBlocksAreBitExact) {
    // Cout 600: 5 panels in groups of 2 MXUs, first, middle and last group (3 variants);
    // K = 4 x 64 x 64 = 16 384 pixels, 128 steps (384 with the variants) in blocks of
    // 292 / 12 = 24 steps (3 072 pixels): 6 blocks, the last 1 024 pixels. The parameter added to
    // the gradient is the last block's epilogue (a Full side); the blocks' partial sums lie in
    // the scratch.
    const std::vector<Leaf> leaves = {
        {"x", f32({4, 64, 64, 8}), {randoms(4 * 64 * 64 * 8, 31)}},
        {"dy", f32({4, 64, 64, 600}), {randoms(4 * 64 * 64 * 600, 32)}},
        {"w", f32({3, 3, 8, 600}), {randoms(3 * 3 * 8 * 600, 33, -0.1f, 0.1f)}, true}};
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return add(g, conv2d_filter_grad(g, v[0], v[1], 3, 1, 1), v[2]);
    });
}

}  // namespace
}  // namespace tpu::compiler

namespace tpu::compiler {
namespace {

using namespace test;

TEST(CompilerDwGrad, TheGlobalPoolGradientBroadcastOverItsImagesPixelsIsBitExact) {
    // ResNet's head: y = relu(conv(x)) [8, 7, 7, 256] (untiled NHWC rows) and the gradient of
    // its global average pool (a dot's [8, 256] result, in T(8,128) tiles) broadcast back over
    // each image's 49 pixels through the ReLU's mask: groups of 49 rows, across the bands of 8
    // rows, in a loop fusion (one row a unit) and beside the bias gradient's sum over the rows (row
    // bands), then the filter's gradient of dx (its sum per output channel added to the bias
    // gradient: one result).
    const std::vector<Leaf> leaves = {
        {"x", f32({8, 7, 7, 128}), {randoms(8 * 49 * 128, 41)}},
        {"w", f32({1, 1, 128, 256}), {randoms(128 * 256, 42, -0.1f, 0.1f)}, true},
        {"v", f32({8, 64}), {randoms(8 * 64, 43)}},
        {"wf", f32({64, 256}), {randoms(64 * 256, 44, -0.1f, 0.1f)}, true}};
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId y = relu(g, conv2d(g, v[0], v[1], 1, 0));
        const ValueId gp = matmul(g, v[2], v[3], false, false);  // the head's dx, [8, 256]
        const ValueId zero = broadcast(g, literal(g, 0.0), {8, 7, 7, 256}, {});
        const ValueId dx = select(g, compare(g, y, zero, Comparison::Gt),
                                  broadcast(g, gp, {8, 7, 7, 256}, {0, 3}), zero);
        const ValueId db = reduce(g, dx, {0, 1, 2}, Reducer::Sum);
        const ValueId dw = conv2d_filter_grad(g, v[0], dx, 1, 1, 0);
        return add(g, reduce(g, dw, {0, 1, 2}, Reducer::Sum), db);
    });
}

}  // namespace
}  // namespace tpu::compiler
