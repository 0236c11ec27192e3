// SPDX-License-Identifier: Apache-2.0
// Convolution and pooling fusions (compiler/README.md, "Convolution and pooling fusions"):
// generated into the step's one program, bit-exact with the host evaluator, race detector on.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "hw/board_config.h"
#include "hw/core/mxu_model.h"

namespace tpu::compiler {
namespace {

using test::conv_bn;
using test::expect_bit_exact;
using test::f32;
using test::Leaf;
using test::probe;
using test::randoms;
using test::Record;
using test::run;
using test::same_bits;
using test::TimingOnlyLazy;

std::vector<Leaf> bn_leaves(const std::string& name, int64_t c, uint32_t seed) {
    const Shape cs = f32({c});
    return {{name + ".scale", cs, {randoms(size_t(c), seed, 0.5f, 1.5f)}, true},
            {name + ".shift", cs, {randoms(size_t(c), seed + 1)}, true},
            {name + ".mean", cs, {randoms(size_t(c), seed + 2, -0.5f, 0.5f)}, true},
            {name + ".var", cs, {randoms(size_t(c), seed + 3, 0.5f, 2.0f)}, true}};
}

TEST(CompilerDeviceConv, ConvBiasReluIsOneConvKernelBitExact) {
    // 2 images of 8 x 8 x 128, 3 x 3, pad 1, 128 -> 128: one Cin and one Cout tile.
    expect_bit_exact({{"x", f32({2, 8, 8, 128}), {randoms(2 * 64 * 128, 1)}},
                      {"w", f32({3, 3, 128, 128}), {randoms(9 * 128 * 128, 2, -0.1f, 0.1f)}, true},
                      {"b", f32({128}), {randoms(128, 3)}, true}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         const ValueId y = conv2d(g, v[0], v[1], 1, 1);
                         return relu(g, add(g, y, broadcast(g, v[2], {2, 8, 8, 128}, {3})));
                     });
}

TEST(CompilerDeviceConv, ResNetBasicBlockConvBnResidualReluBitExact) {
    // ResNet's basic block tail on 2 images of 8 x 8 x 128: conv 3 x 3 + the inference
    // batch-norm affine (two Column sides: its per-channel scale and shift, computed by tiny
    // [128] fusions) + the block's input as a Full side + ReLU, all in the conv kernel's epilogue.
    std::vector<Leaf> leaves = {
        {"x", f32({2, 8, 8, 128}), {randoms(2 * 64 * 128, 11)}},
        {"w", f32({3, 3, 128, 128}), {randoms(9 * 128 * 128, 12, -0.1f, 0.1f)}, true}};
    for (Leaf& l : bn_leaves("bn", 128, 13)) leaves.push_back(l);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return conv_bn(g, v[0], v[1], &v[2], 1, 1, v[0], true);
    });
}

TEST(CompilerDeviceConv, BasicBlockOnTwoReplicasBitExact) {
    // The same program on cores 0 and 1, each replica its own images: every address (operands,
    // scratch, the derived arena of the packed filter) is a launch argument per core.
    std::vector<Leaf> leaves = {
        {"x", f32({2, 8, 8, 128}), {randoms(2 * 64 * 128, 14), randoms(2 * 64 * 128, 15)}},
        {"w", f32({3, 3, 128, 128}), {randoms(9 * 128 * 128, 16, -0.1f, 0.1f)}, true}};
    for (Leaf& l : bn_leaves("bn", 128, 17)) leaves.push_back(l);
    expect_bit_exact(leaves,
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return conv_bn(g, v[0], v[1], &v[2], 1, 1, v[0], true);
                     },
                     {0, 1});
}

TEST(CompilerDeviceConv, StridedConvWithTwoCoutTilesBitExact) {
    // 2 x 10 x 10 x 160 -> 5 x 5 x 256, 3 x 3, stride 2, pad 1: two Cin tiles (the second
    // padded), two Cout tiles, four stride phases; BN affine and ReLU in the epilogue.
    std::vector<Leaf> leaves = {
        {"x", f32({2, 10, 10, 160}), {randoms(2 * 100 * 160, 21)}},
        {"w", f32({3, 3, 160, 256}), {randoms(9 * 160 * 256, 22, -0.1f, 0.1f)}, true}};
    for (Leaf& l : bn_leaves("bn", 256, 23)) leaves.push_back(l);
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return conv_bn(g, v[0], v[1], &v[2], 2, 1, kNoValue, true);
    });
}

TEST(CompilerDeviceConv, ResNet50BottleneckWithDownsampleBitExact) {
    // ResNet-50's first bottleneck on one 28 x 28 image of 64 channels: 1 x 1 64 -> 64, 3 x 3
    // 64 -> 64 (a Cout of half a tile), 1 x 1 64 -> 256 (two Cout tiles) and the 1 x 1
    // downsample 64 -> 256, each with its batch norm; the sum and ReLU.
    std::vector<Leaf> leaves = {{"x", f32({1, 28, 28, 64}), {randoms(28 * 28 * 64, 81)}}};
    const std::vector<std::vector<int64_t>> ws = {
        {1, 1, 64, 64}, {3, 3, 64, 64}, {1, 1, 64, 256}, {1, 1, 64, 256}};
    uint32_t seed = 82;
    for (size_t i = 0; i < ws.size(); ++i) {
        const Shape s = f32(ws[i]);
        leaves.push_back({fmt::format("c{}.w", i),
                          s,
                          {randoms(size_t(s.elements()), seed++, -0.1f, 0.1f)},
                          true});
        for (Leaf& l : bn_leaves(fmt::format("c{}.bn", i), ws[i][3], seed)) leaves.push_back(l);
        seed += 4;
    }
    expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        const auto layer = [&](size_t i) { return &v[1 + 5 * i]; };
        ValueId h = conv_bn(g, v[0], layer(0)[0], layer(0) + 1, 1, 0, kNoValue, true);
        h = conv_bn(g, h, layer(1)[0], layer(1) + 1, 1, 1, kNoValue, true);
        const ValueId down = conv_bn(g, v[0], layer(3)[0], layer(3) + 1, 1, 0, kNoValue, false);
        return conv_bn(g, h, layer(2)[0], layer(2) + 1, 1, 0, down, true);
    });
}

TEST(CompilerDeviceConv, StemConvBnReluMaxPoolIsAPassPerTapBitExact) {
    // ResNet's stem on 2 x 32 x 32 x 3: 7 x 7, stride 2, pad 3, 3 -> 64, as XLA's emitter runs
    // it (stages.h, conv_folds_taps): one MXU pass per tap over the 2 x 16 x 16 output pixels,
    // each using 3 of the array's rows, the batch norm and ReLU in the kernel's epilogue; then
    // the 3 x 3 max pool.
    std::vector<Leaf> leaves = {
        {"x", f32({2, 32, 32, 3}), {randoms(2 * 1024 * 3, 61)}},
        {"w", f32({7, 7, 3, 64}), {randoms(49 * 3 * 64, 62, -0.2f, 0.2f)}, true}};
    for (Leaf& l : bn_leaves("bn", 64, 63)) leaves.push_back(l);
    const DeviceBackendStats st = expect_bit_exact(leaves, [](Graph& g,
                                                              const std::vector<ValueId>& v) {
        return pool(g, conv_bn(g, v[0], v[1], &v[2], 2, 3, kNoValue, true), PoolKind::Max, 3, 2, 1);
    });
    // 49 passes of 512 rows on the two MXUs take 12 544 cycles at least; folded into K
    // (im2col, 2 passes of 147 rows) the MXUs would need 512.
    const hw::BoardConfig board;
    const uint64_t passes = 49ull * 2 * 16 * 16 / board.core.mxus;
    EXPECT_GE(st.last_launch.core_cycles.at(0), passes);
}

/// Timing-only inference steps of `record` over `leaves` (the input first, then parameters) in
/// one LazyContext: steps 0 and 1 compile (the first gives the parameters their layouts) and pack
/// the filters into the program's derived arena; later steps run with them packed.
struct InferenceLoop {
    std::vector<uint64_t> cycles;  ///< core 0's cycles of each step's launch
    uint64_t launches = 0;
};
InferenceLoop inference_loop(const std::vector<Leaf>& leaves, const Record& record, int steps) {
    TimingOnlyLazy t;
    LazyContext& ctx = t.ctx;
    std::vector<LazyTensor> params;
    for (size_t i = 1; i < leaves.size(); ++i)
        params.push_back(ctx.parameter(leaves[i].name, leaves[i].shape, leaves[i].values));
    InferenceLoop r;
    for (int step = 0; step < steps; ++step) {
        const LazyTensor x = ctx.input("x", leaves[0].shape, leaves[0].values);
        std::vector<ValueId> v{ctx.value(x)};
        for (const LazyTensor& p : params) v.push_back(ctx.value(p));
        const LazyTensor y = ctx.wrap(record(ctx.graph(), v), "y");
        ctx.mark_step();
        ctx.to_host(y);
        r.cycles.push_back(t.device.stats().last_launch.core_cycles.at(0));
    }
    r.launches = t.device.stats().launches;
    return r;
}

TEST(CompilerDeviceConv, StemRunsNearItsMxuBoundBitExact) {
    // One 112 x 112 RGB image through the stem (7 x 7, stride 2, pad 3, 3 -> 64, batch norm and
    // ReLU in the epilogue): 56 x 56 outputs, one run of 56 rows per output row and tap, the
    // runs taking the MXUs in turn. The MXU bound is 49 steps, each the rows one MXU streams
    // (28 runs of 56) plus the drain of its tile swap (MxuTimer::swap_step_cycles, R + C - 2
    // with core.mxu_swap_drains): 49 x (1 568 + 254) = 89 278 cycles. Dense 3-channel planes
    // (conv2d_pixel_channels) hold the whole image in VMEM, one block, so one swap per tap, and
    // the packing reads whole input rows, and the epilogue runs in 2 pieces of 28 output rows
    // (Conv2dTiling::epilogue_pieces), the first while the last step streams the second's; the
    // rest of a step (the launch, the packing, the last piece's store) stays within 8%. With
    // 128-channel planes packed a pixel per HBM request a step took 121 694 cycles (1.36x), with
    // dense planes and the epilogue after the last matmul 96 085; now 94 986 (1.064x).
    std::vector<Leaf> leaves = {
        {"x", f32({1, 112, 112, 3}), {randoms(112 * 112 * 3, 81)}},
        {"w", f32({7, 7, 3, 64}), {randoms(49 * 3 * 64, 82, -0.2f, 0.2f)}, true}};
    for (Leaf& l : bn_leaves("bn", 64, 83)) leaves.push_back(l);
    const Record stem = [](Graph& g, const std::vector<ValueId>& v) {
        return conv_bn(g, v[0], v[1], &v[2], 2, 3, kNoValue, true);
    };
    expect_bit_exact(leaves, stem);

    // Timing only, three steps: the third runs with the filter packed.
    const auto cfg = hw::BoardConfig::load("", {"sim.functional=false"});
    const uint64_t cycles = inference_loop(leaves, stem, 3).cycles.back();
    const uint64_t Ho = 56, Wo = 56;
    const uint64_t per_mxu = (Ho + cfg.core.mxus - 1) / cfg.core.mxus * Wo;
    const uint64_t bound = 49 * hw::MxuTimer::swap_step_cycles(cfg.core.mxu_rows, cfg.core.mxu_cols,
                                                               cfg.core.mxu_swap_drains, per_mxu);
    EXPECT_EQ(bound, 89278u);
    std::cout << "stem step: " << cycles << " cycles, MXU bound " << bound << "\n";
    EXPECT_GE(cycles, bound);
    EXPECT_LE(cycles, bound + bound * 8 / 100) << cycles << " cycles against a bound of " << bound;
}

TEST(CompilerDeviceConv, StemReadsTheRowBatchThroughItsReshapeBitExact) {
    // The zoo's ResNets record the batch as [B, H W C] rows and the stem reshapes it to NHWC
    // inside its fusion (trainer/module.cpp, as_nhwc). A row-major reshape moves no data, so
    // the stem reads the fusion's operand itself: before, this fusion fell back to the
    // host ("a convolution of operands computed in its fusion").
    std::vector<Leaf> leaves = {
        {"x", f32({2, 32 * 32 * 3}), {randoms(2 * 1024 * 3, 71)}},
        {"w", f32({7, 7, 3, 64}), {randoms(49 * 3 * 64, 72, -0.2f, 0.2f)}, true}};
    for (Leaf& l : bn_leaves("bn", 64, 73)) leaves.push_back(l);
    const DeviceBackendStats st = expect_bit_exact(leaves, [](Graph& g,
                                                              const std::vector<ValueId>& v) {
        const ValueId x = reshape(g, v[0], {2, 32, 32, 3});
        return pool(g, conv_bn(g, x, v[1], &v[2], 2, 3, kNoValue, true), PoolKind::Max, 3, 2, 1);
    });
    EXPECT_TRUE(st.fallbacks.empty());
}

TEST(CompilerDeviceConv, FilterGradientReadsTheRowBatchThroughItsReshapeBitExact) {
    // The first convolution's filter gradient in a training step reads the batch through the
    // same view (im2col of the fusion's operand itself).
    expect_bit_exact(
        {{"x", f32({2, 10 * 10 * 20}), {randoms(2 * 100 * 20, 111)}},
         {"dy", f32({2, 5, 5, 24}), {randoms(2 * 25 * 24, 112)}}},
        [](Graph& g, const std::vector<ValueId>& v) {
            return conv2d_filter_grad(g, reshape(g, v[0], {2, 10, 10, 20}), v[1], 3, 2, 1);
        });
}

TEST(CompilerDeviceConv, MaxPoolIsThePoolKernelBitExact) {
    // ResNet's stem pool, 3 x 3, stride 2, pad 1 on 2 x 16 x 16 x 64 (-inf padding).
    expect_bit_exact({{"x", f32({2, 16, 16, 64}), {randoms(2 * 256 * 64, 31)}}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return pool(g, v[0], PoolKind::Max, 3, 2, 1);
                     });
}

TEST(CompilerDeviceConv, AvgPoolIsThePoolKernelBitExact) {
    expect_bit_exact({{"x", f32({1, 8, 8, 128}), {randoms(64 * 128, 32)}}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return pool(g, v[0], PoolKind::Avg, 2, 2, 0);
                     });
}

TEST(CompilerDeviceConv, PoolGradientsAreThePoolKernelsBitExact) {
    // select-and-scatter (max-pool's gradient, ties to the first maximum: x rounded to 1/4 makes
    // some) and avg-pool-grad, 3 x 3 stride 2 pad 1 on 2 x 12 x 12 x 64 -> 6 x 6.
    std::vector<float> x = randoms(2 * 144 * 64, 91);
    for (float& v : x) v = std::round(v * 4) / 4;
    const Shape xs = f32({2, 12, 12, 64}), ys = f32({2, 6, 6, 64});
    expect_bit_exact({{"x", xs, {x}}, {"dy", ys, {randoms(2 * 36 * 64, 92)}}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return max_pool_grad(g, v[0], v[1], 3, 2, 1);
                     });
    expect_bit_exact({{"dy", ys, {randoms(2 * 36 * 64, 93)}}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return avg_pool_grad(g, v[0], {2, 12, 12, 64}, 3, 2, 1);
                     });
}

TEST(CompilerDeviceConv, ConvolutionGradientsBitExact) {
    // 2 x 10 x 10 x 20 -> 5 x 5 x 24, 3 x 3, stride 2, pad 1, as conv2d_grad lowers them: the
    // input's gradient dy w^T into the scratch, then col2im; the filter's im2col(x) into the
    // scratch, then col^T dy (K = 50 rows).
    const Shape xs = f32({2, 10, 10, 20}), ws = f32({3, 3, 20, 24}), ys = f32({2, 5, 5, 24});
    expect_bit_exact(
        {{"dy", ys, {randoms(2 * 25 * 24, 101)}}, {"w", ws, {randoms(9 * 20 * 24, 102)}, true}},
        [](Graph& g, const std::vector<ValueId>& v) {
            return conv2d_input_grad(g, v[0], v[1], {2, 10, 10, 20}, 2, 1);
        });
    expect_bit_exact(
        {{"x", xs, {randoms(2 * 100 * 20, 103)}}, {"dy", ys, {randoms(2 * 25 * 24, 104)}}},
        [](Graph& g, const std::vector<ValueId>& v) {
            return conv2d_filter_grad(g, v[0], v[1], 3, 2, 1);
        });
}

TEST(CompilerDeviceConv, GlobalAveragePoolBitExact) {
    // The sum over H and W of 8 x 12 x 12 x 128 (144 pixels: two chunks of 128 and 16, summed
    // per chunk, then the chunk sums), written into [8, 128]'s T(8,128) tile; the divide by 144
    // is a loop fusion.
    expect_bit_exact(
        {{"x", f32({8, 12, 12, 128}), {randoms(8 * 144 * 128, 41)}}},
        [](Graph& g, const std::vector<ValueId>& v) { return global_avg_pool(g, v[0]); });
}

/// Runs `steps` steps of y = relu(conv(x_i, w)) (and, if `update`, w = w * 0.5 in the same
/// step) on `backend`; returns each step's y and, on a device backend, its cycles.
std::vector<std::vector<float>> conv_steps(Backend& backend, int steps, bool update,
                                           std::vector<uint64_t>* cycles) {
    LazyContext ctx(backend);
    const Shape xs = f32({2, 8, 8, 128});
    const LazyTensor w =
        ctx.parameter("w", f32({3, 3, 128, 128}), {randoms(9 * 128 * 128, 71, -0.1f, 0.1f)});
    std::vector<std::vector<float>> out;
    for (int i = 0; i < steps; ++i) {
        const LazyTensor x = ctx.input("x", xs, {randoms(2 * 64 * 128, 72 + uint32_t(i))});
        Graph& g = ctx.graph();
        const ValueId wv = ctx.value(w);
        const LazyTensor y = ctx.wrap(relu(g, conv2d(g, ctx.value(x), wv, 1, 1)), "y");
        if (update) ctx.assign(w, mul(g, wv, full(g, 0.5, g.shape(wv))));
        ctx.mark_step();
        out.push_back(ctx.to_host(y));
        if (auto* d = dynamic_cast<DeviceBackend*>(&backend); d && cycles)
            cycles->push_back(d->stats().last_launch.core_cycles.at(0));
    }
    return out;
}

TEST(CompilerDeviceConv, AFilterParameterIsPackedOnceAndAgainOnlyAfterItChanges) {
    // The filter's packed bf16 tiles are a derived buffer the backend keeps with the program
    // (ProgramSegment::derived): the first step packs them, later steps of the same program
    // skip conv2d_pack_w, and a step that rewrites the filter in place makes the next one pack
    // again (else it would compute with the old filter: the results would differ).
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    for (const bool update : {false, true}) {
        auto dev = driver::Device::open(cfg);
        CodegenOptions cg;
        cg.board = cfg;
        DeviceBackend device(*dev, {0}, cg);
        HostBackend host(1);
        std::vector<uint64_t> cycles;
        const auto got = conv_steps(device, 4, update, &cycles);
        const auto want = conv_steps(host, 4, update, nullptr);
        for (size_t i = 0; i < got.size(); ++i)
            EXPECT_TRUE(same_bits(got[i], want[i])) << "step " << i << " update " << update;
        // Steps 0 and 1 compile (the first gives the parameter its layout), each packing once;
        // step 2 reuses step 1's program. Its packing of the filter (72 tiles, about 100
        // cycles each) is what it saves, or not when the filter was rewritten.
        std::cout << "update " << update << ": cycles " << cycles[1] << ", " << cycles[2] << ", "
                  << cycles[3] << "\n";
        if (update)
            EXPECT_GT(cycles[2] + 2000, cycles[1]);
        else
            EXPECT_LT(cycles[2] + 2000, cycles[1]);
    }
}

TEST(CompilerDeviceConv, GlobalSumAtBatchOneWritesPaddedTiles) {
    // ResNet's head at batch 1 (the validation rows): the sum over 7 x 7 of 1 x 7 x 7 x 320 goes
    // into [1, 320]'s T(8,128) tiles (7 padding rows and 64 padding lanes, zeroed first); the
    // divide after it streams the padded buffer flat. No fusion falls back; bit-exact.
    const Shape xs = f32({1, 7, 7, 320});
    const Record rec = [](Graph& g, const std::vector<ValueId>& v) {
        return global_avg_pool(g, v[0]);
    };
    std::vector<std::vector<float>> got;
    const auto st = probe({{"x", xs, {randoms(49 * 320, 121)}}}, rec, &got);
    for (const auto& [why, n] : st.fallbacks) std::cout << "  " << n << "x " << why << "\n";
    EXPECT_EQ(st.fallback_fusions, 0u);
    HostBackend host(1);
    EXPECT_TRUE(same_bits(got[0], run(host, {{"x", xs, {randoms(49 * 320, 121)}}}, rec)[0]));
}

/// A small ResNet: stem conv 7 x 7 stride 2 (3 -> 128, a pass per tap), BN, ReLU, max pool, two
/// basic blocks of 128 channels, global average pool, linear to 128 classes (8 images and 128
/// classes fill whole T(8,128) tiles: the padded tiles of the head are another emitter's work).
ValueId small_resnet(Graph& g, const std::vector<ValueId>& v) {
    size_t i = 1;
    const auto next = [&] { return &v[i]; };
    ValueId x = v[0];
    const ValueId* stem = next();
    x = conv_bn(g, x, stem[0], stem + 1, 2, 3, kNoValue, true);
    i += 5;
    x = pool(g, x, PoolKind::Max, 3, 2, 1);
    for (int b = 0; b < 2; ++b) {
        const ValueId* c1 = next();
        i += 5;
        const ValueId* c2 = next();
        i += 5;
        const ValueId h = conv_bn(g, x, c1[0], c1 + 1, 1, 1, kNoValue, true);
        x = conv_bn(g, h, c2[0], c2 + 1, 1, 1, x, true);
    }
    x = global_avg_pool(g, x);
    return linear(g, x, v[i], v[i + 1]);
}

std::vector<Leaf> small_resnet_leaves() {
    std::vector<Leaf> l = {{"x", f32({8, 16, 16, 3}), {randoms(8 * 256 * 3, 51)}}};
    uint32_t seed = 52;
    for (const char* name : {"stem", "b1.c1", "b1.c2", "b2.c1", "b2.c2"}) {
        const bool stem = std::string(name) == "stem";
        const int64_t k = stem ? 7 : 3, cin = stem ? 3 : 128;
        l.push_back({std::string(name) + ".w",
                     f32({k, k, cin, 128}),
                     {randoms(size_t(k * k * cin * 128), seed++, -0.05f, 0.05f)},
                     true});
        for (Leaf& b : bn_leaves(std::string(name) + ".bn", 128, seed)) l.push_back(b);
        seed += 4;
    }
    l.push_back({"fc.w", f32({128, 128}), {randoms(128 * 128, seed++, -0.1f, 0.1f)}, true});
    l.push_back({"fc.b", f32({128}), {randoms(128, seed++)}, true});
    return l;
}

/// A small CNN's training step by hand: conv 3 x 3 + ReLU, 2 x 2 max pool, global average
/// pool, linear; the backward from the logits' gradient (an input) down to the filter's, and
/// SGD on the filter (lr 0.1). Returns the updated filter.
ValueId cnn_train_step(Graph& g, const std::vector<ValueId>& v) {
    const ValueId x = v[0], w = v[1], fc = v[2], dlogits = v[3];
    const ValueId h = relu(g, conv2d(g, x, w, 1, 1));      // [8, 8, 8, 128]
    const ValueId p = pool(g, h, PoolKind::Max, 2, 2, 0);  // [8, 4, 4, 128]
    const ValueId feat = global_avg_pool(g, p);            // [8, 128]
    g.add_output(linear(g, feat, fc, kNoValue), "logits");
    const ValueId dfeat = matmul(g, dlogits, fc, false, false);  // [8, 128]
    const ValueId dp =
        broadcast(g, div(g, dfeat, full(g, 16.0, g.shape(dfeat))), {8, 4, 4, 128}, {0, 3});
    const ValueId dh = max_pool_grad(g, h, dp, 2, 2, 0);
    const ValueId zero = full(g, 0.0, g.shape(h));
    const ValueId dconv = select(g, compare(g, h, zero, Comparison::Gt), dh, zero);
    const ValueId dw = conv2d_filter_grad(g, x, dconv, 3, 1, 1);
    return sub(g, w, mul(g, dw, full(g, 0.1, g.shape(w))));
}

std::vector<Leaf> cnn_leaves() {
    return {{"x", f32({8, 8, 8, 128}), {randoms(8 * 64 * 128, 111)}},
            {"w", f32({3, 3, 128, 128}), {randoms(9 * 128 * 128, 112, -0.05f, 0.05f)}, true},
            {"fc.w", f32({128, 128}), {randoms(128 * 128, 113, -0.1f, 0.1f)}, true},
            {"dlogits", f32({8, 128}), {randoms(8 * 128, 114, -0.1f, 0.1f)}}};
}

TEST(CompilerDeviceConv, CnnTrainingStepIsOneLaunchBitExact) {
    // 9 fusions, every one generated (before this work 3 fell back to the host): the conv; the
    // max pool with the ReLU before it (a pass into its scratch); the global pool's sum and
    // divide; the linear; dfeat / 16 (a dot with its epilogue); the max pool's gradient, which
    // recomputes the ReLU and broadcasts dfeat / 16 over H and W (per-image rows) in passes into
    // its scratch; the ReLU's gradient; the filter's gradient with SGD in its epilogue.
    const auto st = probe(cnn_leaves(), cnn_train_step);
    for (const auto& [why, n] : st.fallbacks) std::cout << "  " << n << "x " << why << "\n";
    EXPECT_EQ(st.fallback_fusions, 0u);
    const auto dev = expect_bit_exact(cnn_leaves(), cnn_train_step);
    std::cout << "CNN training step: " << dev.last_launch.core_cycles.at(0) << " cycles\n";
}

TEST(CompilerDeviceConv, ProbeSmallResNet) {
    // Which fusions of the step fall back to the host, and why (none: every fusion generates).
    const auto st = probe(small_resnet_leaves(), small_resnet);
    for (const auto& [why, n] : st.fallbacks) std::cout << "  " << n << "x " << why << "\n";
    EXPECT_EQ(st.fallback_fusions, 0u);
}

TEST(CompilerDeviceConv, SmallResNetIsOneLaunchBitExact) {
    // 9 fusions (compiler/README.md, "Convolution and pooling fusions"): 5 convolutions with
    // their batch norms, ReLUs and residuals, the max pool (the stem's batch norm and ReLU in a
    // pass before it), the global sum (the last block's tail before it), its divide, the linear.
    const auto st = expect_bit_exact(small_resnet_leaves(), small_resnet);
    std::cout << "small ResNet, first step: " << st.last_launch.core_cycles.at(0) << " cycles\n";
}

TEST(CompilerDeviceConv, SmallResNetInferenceLoopCycles) {
    // Three inference steps in one LazyContext (timing only): steps 0 and 1 compile and pack
    // the filters; step 2 runs the same program with the filters already packed.
    const InferenceLoop loop = inference_loop(small_resnet_leaves(), small_resnet, 3);
    const std::vector<uint64_t>& cycles = loop.cycles;
    std::cout << "small ResNet inference steps: " << cycles[0] << ", " << cycles[1] << ", "
              << cycles[2] << " cycles\n";
    // The four 3 x 3 filters (9 tiles of 128 x 128 each) and the stem's 7 x 7 x 3 (49 tiles,
    // 3 rows each) are packed in step 1 and not in step 2.
    EXPECT_LT(cycles[2], cycles[1]);
    EXPECT_EQ(loop.launches, 3u);
}

}  // namespace
}  // namespace tpu::compiler
