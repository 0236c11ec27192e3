// SPDX-License-Identifier: Apache-2.0
// The library GEMM, convolution and fused matmul on presets with four MXUs per core (issue 27):
// v4-8 (4 x 128 x 128) and v6e-8 (4 x 256 x 256). Every MXU is planned and used, the values are
// bit-exact against the host references, the kernels never deadlock (race detector on), and the
// kernels' programs run cycle for cycle as on the cycle-stepped TensorCore (CoreRef).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/gemm.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/tensor_ops.h"
#include "hw/board.h"
#include "hw/core/core_model.h"
#include "hw/mem/sparse_memory.h"
#include "hw/reference/core_ref.h"
#include "tests/common/paths.h"
#include "tests/driver/core_ref_check.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::expect_cycle_exact;
using tutil::random_values;

hw::BoardConfig preset(const std::string& name, std::vector<std::string> sets = {}) {
    sets.push_back("sim.race_detector=true");
    return hw::BoardConfig::load(test::source_dir() + "/configs/" + name + ".json", sets);
}

std::vector<uint32_t> first_cores(uint32_t n) {
    std::vector<uint32_t> c(n);
    for (uint32_t i = 0; i < n; ++i) c[i] = i;
    return c;
}

// ---- GEMM ------------------------------------------------------------------------------------

struct GemmCase {
    std::string preset;
    uint32_t M, K, N;
    Precision precision;
    uint32_t cores;
    std::vector<std::string> sets;
    std::string name;
};

void PrintTo(const GemmCase& c, std::ostream* os) {
    *os << c.name;
}

class ManyMxusGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(ManyMxusGemm, UsesEveryMxuAndIsBitExact) {
    const GemmCase& c = GetParam();
    auto dev = Device::open(preset(c.preset, c.sets));
    const auto a = random_values(size_t(c.M) * c.K, 11);
    const auto w = random_values(size_t(c.K) * c.N, 12);
    ProgramCache cache;
    const GemmResult r = gemm(*dev, cache, a, w, c.M, c.K, c.N, c.precision, first_cores(c.cores));
    EXPECT_EQ(r.tiling.mxus, 4u);
    EXPECT_EQ(bits_of(r.c), bits_of(gemm_reference(a, w, c.M, c.K, c.N, c.precision,
                                                   dev->config().core.mxu_rows)));
}

// N covers groups of four panels with tails of 0, 1, 2 and 3 panels; the small VMEM makes the
// planner stream A and cut the rows into several blocks.
INSTANTIATE_TEST_SUITE_P(
    Presets, ManyMxusGemm,
    ::testing::Values(
        GemmCase{"v6e-8", 300, 600, 1100, Precision::Bf16, 1, {}, "v6e_tail_of_1"},
        GemmCase{"v6e-8", 77, 256, 1024, Precision::Bf16, 1, {}, "v6e_no_tail"},
        GemmCase{"v6e-8", 129, 513, 600, Precision::Fp32Pass3, 1, {}, "v6e_fp32_3pass_tail_of_3"},
        GemmCase{"v6e-8", 520, 700, 1500, Precision::Bf16, 8, {}, "v6e_eight_cores"},
        GemmCase{"v4-8", 200, 384, 700, Precision::Bf16, 1, {}, "v4_tail_of_2"},
        GemmCase{"v4-8", 64, 200, 300, Precision::Fp32Pass6, 1, {}, "v4_fp32_6pass_tail_of_3"},
        GemmCase{"v4-8",
                 700,
                 1000,
                 900,
                 Precision::Bf16,
                 1,
                 {"core.vmem_bytes=1048576"},
                 "v4_a_streamed_in_blocks"},
        GemmCase{"v5e-8", 260, 300, 640, Precision::Bf16, 2, {}, "v5e_two_cores"}),
    [](const auto& info) { return info.param.name; });

/// Property: random shapes (every dimension 1-700), on v4-8 and v6e-8, in bf16 and fp32-3pass,
/// are bit-exact and planned on four MXUs.
TEST(ManyMxusGemmProperty, RandomShapesAreBitExact) {
    std::mt19937 rng(2027);
    for (const char* name : {"v4-8", "v6e-8"}) {
        auto dev = Device::open(preset(name));
        ProgramCache cache;
        for (int i = 0; i < 6; ++i) {
            const uint32_t M = 1 + rng() % 700, K = 1 + rng() % 700, N = 1 + rng() % 700;
            const Precision p = i % 3 == 2 ? Precision::Fp32Pass3 : Precision::Bf16;
            SCOPED_TRACE(fmt::format("{} {}x{}x{} {}", name, M, K, N, precision_name(p)));
            const auto a = random_values(size_t(M) * K, 100 + i);
            const auto w = random_values(size_t(K) * N, 200 + i);
            const GemmResult r = gemm(*dev, cache, a, w, M, K, N, p, {0});
            ASSERT_EQ(r.tiling.mxus, 4u);
            ASSERT_EQ(bits_of(r.c),
                      bits_of(gemm_reference(a, w, M, K, N, p, dev->config().core.mxu_rows)));
        }
    }
}

/// Four MXUs do four column panels at once where two did two: on a compute-bound v4 GEMM
/// (2048 cubed: 2048 MACs a byte of A, W and C, against 65 536 MACs a cycle over 571 HBM bytes)
/// the planner's estimate with the same tiling on two MXUs is twice the MXU steps, and the
/// simulated kernel follows the four-MXU estimate.
TEST(ManyMxusGemmPlan, FourMxusHalveTheComputeBoundSteps) {
    const uint32_t n = 2048;
    const hw::BoardConfig v4 = preset("v4-8", {"sim.functional=false"});
    const GemmTiling t4 = plan_gemm(v4, n, n, n, Precision::Bf16);
    ASSERT_EQ(t4.mxus, 4u);
    GemmTiling t2 = t4;
    t2.mxus = 2;
    const double e2 = gemm_estimate_cycles(v4, t2, n), e4 = gemm_estimate_cycles(v4, t4, n);
    // Sixteen K steps of at least T + R + C - 2 cycles per group: 8 groups on two MXUs, 4 on four.
    EXPECT_GE(e4, 4.0 * 16 * (t4.block_rows + 254));
    EXPECT_LT(e4, 0.6 * e2);
    auto dev = Device::open(v4);
    ProgramCache cache;
    const std::vector<float> zeros(size_t(n) * n);
    const GemmResult r = gemm(*dev, cache, zeros, zeros, n, n, n, Precision::Bf16, {0});
    const uint64_t cycles = r.event.end_cycle - r.event.start_cycle;
    EXPECT_LT(double(cycles), 1.1 * e4) << cycles;
    EXPECT_GT(r.mxu_utilization, 0.75);
}

// ---- convolution ------------------------------------------------------------------------------

struct ConvCase4 {
    std::string preset;
    Conv2dShape shape;
    uint32_t cores;
    std::vector<std::string> sets;
    std::string name;
};

void PrintTo(const ConvCase4& c, std::ostream* os) {
    *os << c.name;
}

class ManyMxusConv : public ::testing::TestWithParam<ConvCase4> {};

TEST_P(ManyMxusConv, UsesEveryMxuAndIsBitExact) {
    const ConvCase4& c = GetParam();
    auto dev = Device::open(preset(c.preset, c.sets));
    const Conv2dShape& s = c.shape;
    const auto x = random_values(size_t(s.batch) * s.height * s.width * s.cin, 1);
    const auto w = random_values(size_t(s.kernel) * s.kernel * s.cin * s.cout, 2);
    const auto b = random_values(s.cout, 3);
    ProgramCache cache;
    const Conv2dResult r = conv2d(*dev, cache, x, w, b, s, first_cores(c.cores));
    EXPECT_FALSE(r.folded);  // the implicit GEMM, whose runs the MXUs share
    EXPECT_EQ(r.tiling.mxus, 4u);
    EXPECT_EQ(bits_of(r.y), bits_of(conv2d_reference(x, w, b, s, dev->config().core.mxu_rows)));
}

// Blocks whose runs split unevenly over four MXUs (5 x 6 or 3 x 7 output rows), bands of a
// small VMEM, strides and several Cout tiles; channels too many to fold the taps into K.
INSTANTIATE_TEST_SUITE_P(
    Presets, ManyMxusConv,
    ::testing::Values(
        ConvCase4{"v6e-8", {5, 6, 6, 130, 300, 3, 1, 1}, 1, {}, "v6e_five_images_two_cout_tiles"},
        ConvCase4{"v6e-8", {2, 9, 7, 130, 40, 3, 2, 1}, 1, {}, "v6e_stride2"},
        ConvCase4{"v4-8", {3, 7, 7, 64, 130, 3, 1, 1}, 1, {}, "v4_three_images"},
        // 15 images of 5 output rows: 75 runs a step, 19 on MXUs 0-2 and 18 on MXU 3, and an
        // epilogue lag of 3 images (a quarter of 15), so pending images' targets are the class
        // counts less the runs queued after them.
        ConvCase4{"v4-8", {15, 5, 5, 64, 130, 3, 1, 1}, 1, {}, "v4_lag3_uneven_runs"},
        ConvCase4{"v4-8", {16, 7, 7, 64, 40, 3, 1, 1}, 8, {}, "v4_batch16_on_8_cores"},
        ConvCase4{"v4-8",
                  {2, 20, 18, 130, 20, 3, 1, 1},
                  1,
                  {"core.vmem_bytes=262144"},
                  "v4_bands_in_small_vmem"}),
    [](const auto& info) { return info.param.name; });

// ---- the trainer's fused matmul ----------------------------------------------------------------

/// Property: random shapes and transposes of tensor_ops::matmul (the fused dot kernel) on four
/// MXUs, bit-exact against matmul_reference.
TEST(ManyMxusMatmulProperty, RandomShapesAndTransposesAreBitExact) {
    std::mt19937 rng(427);
    for (const char* name : {"v4-8", "v6e-8"}) {
        auto dev = Device::open(preset(name));
        ProgramCache cache;
        const std::vector<uint32_t> core = {0};
        for (int i = 0; i < 6; ++i) {
            const uint32_t M = 1 + rng() % 600, K = 1 + rng() % 600, N = 1 + rng() % 1100;
            const bool ta = i & 1, tb = i & 2;
            const Precision p = i == 5 ? Precision::Fp32Pass3 : Precision::Bf16;
            SCOPED_TRACE(fmt::format("{} {}x{}x{} ta={} tb={}", name, M, K, N, ta, tb));
            const auto plan = plan_matmul(dev->config(), M, K, N, ta, tb, p, false);
            ASSERT_TRUE(plan);
            EXPECT_EQ(plan->mxus, 4u);
            const uint32_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            const auto av = random_values(size_t(ar) * ac, 300 + i);
            const auto bv = random_values(size_t(br) * bc, 400 + i);
            Tensor a = alloc_tensor(*dev, core, ar, ac), b = alloc_tensor(*dev, core, br, bc);
            Tensor c = alloc_tensor(*dev, core, M, N);
            write_tensor(*dev, a, 0, av);
            write_tensor(*dev, b, 0, bv);
            matmul(*dev, cache, a, ta, b, tb, c, p, nullptr);
            ASSERT_EQ(bits_of(read_tensor(*dev, c, 0)),
                      bits_of(matmul_reference(av, ar, ac, ta, bv, br, bc, tb, p,
                                               dev->config().core.mxu_rows)));
            for (Tensor* t : {&a, &b, &c}) free_tensor(*dev, *t);
        }
    }
}

// ---- the cycle-stepped TensorCore ---------------------------------------------------------------

/// v6e-8's TensorCore with the simple HBM pipe CoreRef models, timing only.
hw::BoardConfig v6e_core() {
    hw::BoardConfig cfg = preset("v6e-8");
    cfg.chips = 1;
    cfg.hbm.bytes_per_core = 64 << 20;
    cfg.hbm.model = "simple";
    cfg.sim.functional = false;
    cfg.sim.race_detector = false;
    return cfg;
}

TEST(ManyMxusCycleExact, GemmConvAndDotKernelsMatchTheCycleSteppedCore) {
    const hw::BoardConfig cfg = v6e_core();
    // GEMM: 300 x 600 x 1100 in the tiled layout: KT = 3, NT = 5 (a group of four panels and
    // a tail of one), one block of 304 rows.
    GemmTiling t = plan_gemm(cfg, 300, 600, 1100, Precision::Bf16);
    t.tiled = true;
    ASSERT_EQ(t.mxus, 4u);
    const uint32_t a = 0, w = 8 << 20, c = 16 << 20;
    expect_cycle_exact(cfg, generate(GemmKey{t}), {a, w, c, 300, 300 * t.Kp * 2});
    // Convolution: 5 images of 6 x 6 x 20 -> 300 channels (two Cout tiles), 3 x 3: the runs of a
    // block split 2, 1, 1, 1 over the MXUs.
    const Conv2dShape s{5, 6, 6, 20, 300, 3, 1, 1};
    const Conv2dTiling ct = plan_conv2d(cfg, s, s.batch);
    ASSERT_EQ(ct.mxus, 4u);
    expect_cycle_exact(cfg, generate(Conv2dKey{s, ct}), {a, w, c, 24 << 20, conv2d_blocks(s, ct)});
    // 15 images of 5 x 5: 75 runs a step over four MXUs (19, 19, 19, 18) and an epilogue lag of
    // 3 images (conv2d_lag: the quarter-block cap, below 256 + 256 - 2 + 8 x 5 = 550 rows).
    const Conv2dShape s2{15, 5, 5, 64, 130, 3, 1, 1};
    const Conv2dTiling ct2 = plan_conv2d(cfg, s2, s2.batch);
    ASSERT_EQ(ct2.block_images, 15u);
    ASSERT_EQ(ct2.lag, 3u);
    expect_cycle_exact(cfg, generate(Conv2dKey{s2, ct2}),
                       {a, w, c, 24 << 20, conv2d_blocks(s2, ct2)});
    // The fused matmul: 200 x 600 x 1300 row-major fp32: a group of four panels, then a last
    // one of two.
    const auto mk = plan_matmul(cfg, 200, 600, 1300, false, false, Precision::Bf16, false);
    ASSERT_TRUE(mk);
    ASSERT_EQ(mk->mxus, 4u);
    expect_cycle_exact(cfg, generate(*mk), {a, w, c});
}

TEST(ManyMxusCycleExact, CompiledDotLayoutsMatchTheCycleSteppedCore) {
    const hw::BoardConfig cfg = v6e_core();
    const uint32_t a = 0, w = 8 << 20, c = 16 << 20;
    // The compiler's forward dot on v6e: an activation in 8 x 128 tiles through a weight in
    // the MXU's 256 x 256 tiles, C in 8 x 128 tiles (each 256-value row of a panel two tiles of
    // a band): K = 512 in two steps, N = 1280 a group of four panels and one more.
    DotKey fwd{.M = 64,
               .K = 512,
               .N = 1280,
               .a = DotLayout::VpuTiles,
               .w = DotLayout::Tiles,
               .c = DotLayout::VpuTiles};
    const auto kf = plan_dot(cfg, fwd, cfg.core.vmem_bytes);
    ASSERT_TRUE(kf);
    ASSERT_EQ(kf->R, 256u);
    expect_cycle_exact(cfg, generate(*kf), {a, w, c});
    // A weight gradient in its parameter's 256 x 256 tiles: dY^T streamed from transposed
    // 8 x 128 tiles in blocks of two tile columns (the last, of 44 rows, reads one); two K steps,
    // two panels.
    DotKey grad{.M = 300,
                .K = 512,
                .N = 512,
                .a = DotLayout::TransposedVpuTiles,
                .w = DotLayout::VpuTiles,
                .c = DotLayout::TransposedTiles};
    const auto kg = plan_dot(cfg, grad, cfg.core.vmem_bytes);
    ASSERT_TRUE(kg);
    ASSERT_EQ(kg->block_rows, 256u);
    expect_cycle_exact(cfg, generate(*kg), {a, w, c});
}

}  // namespace
}  // namespace tpu::driver
