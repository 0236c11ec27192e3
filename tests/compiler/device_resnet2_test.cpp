// SPDX-License-Identifier: Apache-2.0
// ResNet convolutions that run as one dot kernel (compiler/README.md, "ResNet's convolutions as
// dots"): a pointwise convolution reads its NHWC rows, a convolution of fewer pixels than the
// MXU has rows holds its pixels and streams the filter. Each generated program is bit-exact
// with the host evaluator (whose conv2d_reference is the implicit GEMM's order), race detector
// on, one launch.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::f32;
using test::conv_bn;
using test::Leaf;
using test::randoms;

/// Input x, then per layer its filter and its four batch-norm vectors.
std::vector<Leaf> layers(const std::vector<int64_t>& x, const std::vector<std::vector<int64_t>>& ws,
                         uint32_t seed) {
    std::vector<Leaf> leaves = {{"x", f32(x), {randoms(size_t(f32(x).elements()), seed++)}}};
    for (size_t i = 0; i < ws.size(); ++i) {
        const Shape s = f32(ws[i]);
        leaves.push_back({fmt::format("c{}.w", i),
                          s,
                          {randoms(size_t(s.elements()), seed++, -0.1f, 0.1f)},
                          true});
        const Shape cs = f32({ws[i][3]});
        const auto c = size_t(ws[i][3]);
        leaves.push_back({fmt::format("c{}.scale", i), cs, {randoms(c, seed++, 0.5f, 1.5f)}, true});
        leaves.push_back({fmt::format("c{}.shift", i), cs, {randoms(c, seed++)}, true});
        leaves.push_back({fmt::format("c{}.mean", i), cs, {randoms(c, seed++, -0.5f, 0.5f)}, true});
        leaves.push_back({fmt::format("c{}.var", i), cs, {randoms(c, seed++, 0.5f, 2.0f)}, true});
    }
    return leaves;
}

const ValueId* layer(const std::vector<ValueId>& v, size_t i) {
    return &v[1 + 5 * i];
}

TEST(CompilerDeviceResNet2, PointwiseConvolutionsAreDotsOfTheirRowsBitExact) {
    // ResNet-50's layer3 bottleneck ends, one 14 x 14 image: 1 x 1 512 -> 256 (+ BN + ReLU), then
    // 1 x 1 256 -> 512 with BN, the block's input as the residual and ReLU: two dots of 196
    // rows (four and two K tiles), the rows read as the previous fusion wrote them.
    const auto leaves = layers({1, 14, 14, 512}, {{1, 1, 512, 256}, {1, 1, 256, 512}}, 301);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId h = conv_bn(g, v[0], layer(v, 0)[0], layer(v, 0) + 1, 1, 0, kNoValue, true);
        return conv_bn(g, h, layer(v, 1)[0], layer(v, 1) + 1, 1, 0, v[0], true);
    });
}

TEST(CompilerDeviceResNet2, PointwiseExpansionHoldsThePixelsBitExact) {
    // ResNet-50's layer3 conv3 as the zoo records it (batch norm folded into the filter and a
    // bias), one 14 x 14 image: 1 x 1 256 -> 512 + bias + the block's input + ReLU. 196 pixels
    // against 512 output channels: the pixels are held (two column tiles, the second partial)
    // and the filter streamed, the bias a Column side per streamed row.
    const auto leaves = layers({1, 14, 14, 512}, {{1, 1, 512, 256}, {1, 1, 256, 512}}, 341);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId h = relu(g, conv2d(g, v[0], layer(v, 0)[0], 1, 0));
        const ValueId y = conv2d(g, h, layer(v, 1)[0], 1, 0);
        const ValueId b = broadcast(g, layer(v, 1)[2], {1, 14, 14, 512}, {3});
        return relu(g, add(g, add(g, y, b), v[0]));
    });
}

TEST(CompilerDeviceResNet2, PointwiseConvolutionOfAPartialTileBitExact) {
    // ResNet-50's layer1 widths on 2 images of 12 x 12: 1 x 1 64 -> 256 (K of half a tile,
    // padded with zeros in VMEM), then 256 -> 64 (N of half a tile).
    const auto leaves = layers({2, 12, 12, 64}, {{1, 1, 64, 256}, {1, 1, 256, 64}}, 311);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId h = conv_bn(g, v[0], layer(v, 0)[0], layer(v, 0) + 1, 1, 0, kNoValue, true);
        return conv_bn(g, h, layer(v, 1)[0], layer(v, 1) + 1, 1, 0, kNoValue, false);
    });
}

TEST(CompilerDeviceResNet2, LayerFourConvolutionsAreDotsOfTheirIm2colRowsBitExact) {
    // ResNet's layer4 entry at batch 1 on narrower channels: 3 x 3 stride 2 256 -> 256 of a
    // 14 x 14 image (49 output pixels, fewer than the MXU's 128 rows: one dot of 49 im2col
    // rows; the unfolded batch norm's [Cout] ops keep the filter stationary), the 1 x 1
    // stride-2 downsample (im2col of one tap), then 3 x 3 stride 1 256 -> 256 with BN, the
    // downsample as the residual and ReLU. Cin is
    // a multiple of 128, so each K tile of the folded dot is one tap's Cin tile in the implicit
    // GEMM's order: the evaluator's conv2d_reference gives the same bits.
    const auto leaves =
        layers({1, 14, 14, 256}, {{3, 3, 256, 256}, {1, 1, 256, 256}, {3, 3, 256, 256}}, 321);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId h = conv_bn(g, v[0], layer(v, 0)[0], layer(v, 0) + 1, 2, 1, kNoValue, true);
        const ValueId down =
            conv_bn(g, v[0], layer(v, 1)[0], layer(v, 1) + 1, 2, 0, kNoValue, false);
        return conv_bn(g, h, layer(v, 2)[0], layer(v, 2) + 1, 1, 1, down, true);
    });
}

TEST(CompilerDeviceResNet2, FewPixelsOfAPartialCinTileStayTheImplicitGemmBitExact) {
    // 49 output pixels but Cin = 64: folded, K tiles would mix taps and change the order of
    // the sums, so the convolution stays the implicit GEMM (with its packed filter).
    const auto leaves = layers({1, 7, 7, 64}, {{3, 3, 64, 128}}, 331);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return conv_bn(g, v[0], layer(v, 0)[0], layer(v, 0) + 1, 1, 1, kNoValue, true);
    });
}

TEST(CompilerDeviceResNet2, FoldedBatchNormTailHoldsThePixelsBitExact) {
    // As the zoo records ResNet's layer4 (batch norm folded into the filter and a bias): 3 x 3
    // 256 -> 256 on a 7 x 7 image + bias (a Column side, per streamed row of the held-pixels
    // dot) + the block's input (a Full side) + ReLU, the pixels held stationary.
    const auto leaves = layers({1, 7, 7, 256}, {{3, 3, 256, 256}}, 321);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId y = conv2d(g, v[0], layer(v, 0)[0], 1, 1);
        const ValueId b = broadcast(g, layer(v, 0)[2], {1, 7, 7, 256}, {3});
        return relu(g, add(g, add(g, y, b), v[0]));
    });
}

}  // namespace
}  // namespace tpu::compiler
