// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::open_device;
using tutil::random_values;

std::string error_of(const std::function<void()>& f) {
    return tutil::error_of(f, /*usage=*/true);
}

const std::vector<uint32_t> kOne = {0};
const std::vector<uint32_t> kEight = {0, 1, 2, 3, 4, 5, 6, 7};

/// A tensor with different random contents per replica; data[i] is replica i's.
struct Filled {
    Tensor t;
    std::vector<std::vector<float>> data;
};

Filled filled(Device& dev, const std::vector<uint32_t>& cores, uint32_t rows, uint32_t cols,
              uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    Filled f{alloc_tensor(dev, cores, rows, cols), {}};
    for (size_t i = 0; i < cores.size(); ++i) {
        f.data.push_back(random_values(size_t(rows) * cols, seed * 131 + uint32_t(i), lo, hi));
        write_tensor(dev, f.t, i, f.data.back());
    }
    return f;
}

// ---- matmul ----------------------------------------------------------------------------------

struct MatmulCase {
    uint32_t M, K, N;
    bool ta, tb;
};

/// Checks every replica bit-exact against matmul_reference and close to the fp64 product.
/// With `with_bias`, c = op(a) op(b) + bias, which must equal bias_add of the product bit for
/// bit; the fp64 comparison below is on the product alone.
void check_matmul(Device& dev, ProgramCache& cache, const std::vector<uint32_t>& cores,
                  const MatmulCase& mc, Precision p, uint32_t seed, bool with_bias = false) {
    SCOPED_TRACE(fmt::format("{}x{}x{} ta={} tb={} {} on {} cores{}", mc.M, mc.K, mc.N, mc.ta,
                             mc.tb, precision_name(p), cores.size(), with_bias ? " + bias" : ""));
    const uint32_t ar = mc.ta ? mc.K : mc.M, ac = mc.ta ? mc.M : mc.K;
    const uint32_t br = mc.tb ? mc.N : mc.K, bc = mc.tb ? mc.K : mc.N;
    Filled a = filled(dev, cores, ar, ac, seed), b = filled(dev, cores, br, bc, seed + 1);
    Filled bias = filled(dev, cores, 1, mc.N, seed + 2);
    Tensor c = alloc_tensor(dev, cores, mc.M, mc.N);
    const uint64_t free_before = dev.free_bytes(cores[0]);
    matmul(dev, cache, a.t, mc.ta, b.t, mc.tb, c, p, with_bias ? &bias.t : nullptr);
    EXPECT_EQ(dev.free_bytes(cores[0]), free_before);  // scratch freed
    const double tol = p == Precision::Bf16 ? 1e-2 : p == Precision::Fp32Pass3 ? 1e-4 : 2e-6;
    for (size_t i = 0; i < cores.size(); ++i) {
        auto got = read_tensor(dev, c, i);
        const auto want = matmul_reference(a.data[i], ar, ac, mc.ta, b.data[i], br, bc, mc.tb, p,
                                           dev.config().core.mxu_rows);
        if (with_bias) {
            ASSERT_EQ(bits_of(got), bits_of(bias_add_reference(want, bias.data[i], mc.M, mc.N)))
                << "replica " << i;
            got = want;  // the fp64 check below is on the product
        }
        ASSERT_EQ(bits_of(got), bits_of(want)) << "replica " << i;
        // Close to the fp64 product, relative to sum |a| |b|.
        for (uint32_t r = 0; r < mc.M; r += 5)
            for (uint32_t n = 0; n < mc.N; n += 3) {
                double exact = 0, mag = 0;
                for (uint32_t k = 0; k < mc.K; ++k) {
                    const double x =
                        mc.ta ? a.data[i][size_t(k) * ac + r] : a.data[i][size_t(r) * ac + k];
                    const double y =
                        mc.tb ? b.data[i][size_t(n) * bc + k] : b.data[i][size_t(k) * bc + n];
                    exact += x * y;
                    mag += std::abs(x * y);
                }
                ASSERT_NEAR(got[size_t(r) * mc.N + n], exact, tol * mag + 1e-30);
            }
    }
    free_tensor(dev, a.t);
    free_tensor(dev, b.t);
    free_tensor(dev, bias.t);
    free_tensor(dev, c);
}

/// Shapes drawn from {1, 7, 32, 127, 129, 300, 784} with every transpose combination.
std::vector<MatmulCase> random_cases(uint32_t seed, size_t count, uint64_t max_macs) {
    const uint32_t dims[] = {1, 7, 32, 127, 129, 300, 784};
    std::mt19937 rng(seed);
    std::vector<MatmulCase> out;
    while (out.size() < count) {
        MatmulCase mc{dims[rng() % 7], dims[rng() % 7], dims[rng() % 7], (out.size() & 1) != 0,
                      (out.size() & 2) != 0};
        if (uint64_t(mc.M) * mc.K * mc.N <= max_macs) out.push_back(mc);
    }
    return out;
}

class TensorMatmul : public ::testing::TestWithParam<Precision> {};

TEST_P(TensorMatmul, OneCoreIsBitExactForRandomShapesAndTransposes) {
    auto dev = open_device();
    ProgramCache cache;
    uint32_t seed = 10;
    for (const MatmulCase& mc : random_cases(uint32_t(GetParam()) + 1, 24, 40'000'000))
        check_matmul(*dev, cache, kOne, mc, GetParam(), seed++);
}

TEST_P(TensorMatmul, EightCoresAreBitExactPerReplica) {
    auto dev = open_device();
    ProgramCache cache;
    uint32_t seed = 50;
    // Every dimension value at least once, every transpose combination.
    const std::vector<MatmulCase> cases = {{1, 784, 7, false, false},
                                           {129, 32, 127, true, false},
                                           {300, 129, 1, false, true},
                                           {7, 127, 300, true, true}};
    for (const MatmulCase& mc : cases) check_matmul(*dev, cache, kEight, mc, GetParam(), seed++);
}

INSTANTIATE_TEST_SUITE_P(Driver, TensorMatmul,
                         ::testing::Values(Precision::Bf16, Precision::Fp32Pass3,
                                           Precision::Fp32Pass6),
                         [](const auto& info) {
                             std::string s(precision_name(info.param));
                             for (char& ch : s)
                                 if (ch == '-') ch = '_';
                             return s;
                         });

TEST(TensorMatmulOneMxu, CompactOutputOfTheLastPanelIsExact) {
    // One MXU: every column panel is a "full" group, so the last one's width is chosen at run
    // time (N = 129, 300); N = 7 is a single partial panel.
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true", "core.mxus=1"}));
    ProgramCache cache;
    uint32_t seed = 90;
    for (uint32_t N : {7u, 129u, 300u})
        for (bool with_bias : {false, true})
            check_matmul(*dev, cache, {0, 1}, {33, 130, N, false, true}, Precision::Fp32Pass3,
                         seed++, with_bias);
}

TEST(TensorMatmulFused, EdgeShapesAreBitExact) {
    // Tiny (M = 1, K = 3), one column (N = 1), K with an odd number of tiles (KT odd: a group's
    // first step waits for the previous group's last), a middle-group loop (N = 1000: 8 panels,
    // 4 groups), tall and wide shapes, each transpose.
    auto dev = open_device();
    ProgramCache cache;
    uint32_t seed = 120;
    const std::vector<MatmulCase> cases = {
        {1, 3, 1, false, false},      {1, 3, 5, true, true},        {3, 300, 1000, false, true},
        {2000, 40, 130, true, false}, {5, 1500, 260, false, false}, {257, 385, 129, true, true}};
    for (Precision p : {Precision::Bf16, Precision::Fp32Pass6})
        for (const MatmulCase& mc : cases) check_matmul(*dev, cache, kOne, mc, p, seed++);
    // The bias epilogue in every group kind: first and last (N = 1, 5), first, middle and last
    // (N = 1000), a narrow last panel (N = 129, 260).
    for (const MatmulCase& mc : cases)
        check_matmul(*dev, cache, kOne, mc, Precision::Bf16, seed++, true);
}

TEST(TensorMatmulFused, SeveralRowBlocksAreBitExact) {
    // 1 MiB of VMEM: a few hundred rows per block, so blocks follow each other (the next block's
    // A panels overwrite the ones the previous block read; the last block is short).
    auto dev = Device::open(
        hw::BoardConfig::load("", {"sim.race_detector=true", "core.vmem_bytes=1048576"}));
    ProgramCache cache;
    uint32_t seed = 140;
    for (Precision p : {Precision::Bf16, Precision::Fp32Pass3})
        for (const MatmulCase& mc :
             {MatmulCase{1000, 260, 300, false, false}, MatmulCase{900, 129, 200, true, true}})
            check_matmul(*dev, cache, {0, 3}, mc, p, seed++, p == Precision::Bf16);
}

TEST(TensorMatmulFused, FallsBackToPackingWhenTheKernelDoesNotFit) {
    // 16 KiB of instruction memory (512 instructions): the unrolled K loop of K = 2000 does not
    // fit, so the operands are packed and the library GEMM runs (three launches, three programs).
    auto dev = Device::open(
        hw::BoardConfig::load("", {"sim.race_detector=true", "core.imem_bytes=16384"}));
    ProgramCache cache;
    check_matmul(*dev, cache, kOne, {40, 2000, 100, true, false}, Precision::Fp32Pass3, 160);
    EXPECT_EQ(cache.misses(), 4u);  // the fused kernel that did not fit, two packs, the GEMM
    // With a bias the fallback adds it with bias_add: the same bits.
    check_matmul(*dev, cache, kOne, {40, 2000, 100, true, false}, Precision::Fp32Pass3, 161, true);
}

TEST(TensorMatmulCache, RepeatedCallsHitTheCache) {
    auto dev = open_device();
    ProgramCache cache;
    Filled a = filled(*dev, kEight, 32, 784, 1), b = filled(*dev, kEight, 784, 512, 2);
    Tensor c = alloc_tensor(*dev, kEight, 32, 512);
    matmul(*dev, cache, a.t, false, b.t, false, c, Precision::Bf16);
    EXPECT_EQ(cache.misses(), 1u);  // the fused kernel
    const Event ev = matmul(*dev, cache, a.t, false, b.t, false, c, Precision::Bf16);
    EXPECT_EQ(cache.misses(), 1u);
    EXPECT_EQ(cache.hits(), 1u);
    EXPECT_EQ(ev.cores, kEight);
    EXPECT_GT(ev.end_cycle, ev.start_cycle);
    const auto want = matmul_reference(a.data[5], 32, 784, false, b.data[5], 784, 512, false,
                                       Precision::Bf16, dev->config().core.mxu_rows);
    EXPECT_BITS_EQ(read_tensor(*dev, c, 5), want);
    // Figures for the report (not asserted).
    std::printf("matmul 32x784 @ 784x512 bf16 on 8 cores: %llu cycles, %.3f host ms\n",
                static_cast<unsigned long long>(ev.end_cycle - ev.start_cycle),
                ev.host_seconds * 1e3);
}

TEST(TensorMatmulErrors, ShapeAndCoreMismatchesAreUsageErrors) {
    auto dev = open_device();
    ProgramCache cache;
    Tensor a = alloc_tensor(*dev, kOne, 4, 6), b = alloc_tensor(*dev, kOne, 5, 3);
    Tensor c = alloc_tensor(*dev, kOne, 4, 3), b2 = alloc_tensor(*dev, {0, 1}, 6, 3);
    EXPECT_EQ(error_of([&] { matmul(*dev, cache, a, false, b, false, c, Precision::Bf16); }),
              "matmul: op(a) is 4 x 6 but op(b) is 5 x 3 (inner dimensions differ)");
    Tensor b3 = alloc_tensor(*dev, kOne, 6, 3), c2 = alloc_tensor(*dev, kOne, 5, 3);
    EXPECT_EQ(error_of([&] { matmul(*dev, cache, a, false, b3, false, c2, Precision::Bf16); }),
              "matmul: c is 5 x 3 but op(a) x op(b) is 4 x 3");
    // Transposes apply before the checks: a^T is 6 x 4, b3^T 3 x 6.
    EXPECT_EQ(error_of([&] { matmul(*dev, cache, a, true, b3, true, c2, Precision::Bf16); }),
              "matmul: op(a) is 6 x 4 but op(b) is 3 x 6 (inner dimensions differ)");
    EXPECT_EQ(error_of([&] { matmul(*dev, cache, a, false, b2, false, c, Precision::Bf16); }),
              "matmul: a, b and c must be on the same cores (a on [0], b on [0, 1], c on [0])");
    EXPECT_EQ(dev->metrics().launches, 0u);
}

// ---- copies and rounding ---------------------------------------------------------------------

TEST(TensorCopies, CopyColumnSlicesAndRoundBf16AreExactPerReplica) {
    auto dev = open_device();
    ProgramCache cache;
    for (auto [rows, cols] : {std::pair{1u, 1u}, {7u, 300u}, {300u, 129u}}) {
        Filled x = filled(*dev, kEight, rows, cols, rows + cols, -3e4f, 3e4f);
        x.data[0][0] = NAN;
        write_tensor(*dev, x.t, 0, x.data[0]);
        Tensor y = alloc_tensor(*dev, kEight, rows, cols);
        copy(*dev, cache, x.t, y);
        for (size_t i = 0; i < kEight.size(); ++i)
            EXPECT_BITS_EQ(read_tensor(*dev, y, i), x.data[i]);
        round_bf16(*dev, cache, x.t, y);
        for (size_t i = 0; i < kEight.size(); ++i)
            EXPECT_BITS_EQ(read_tensor(*dev, y, i), round_bf16_reference(x.data[i]));
        const uint32_t first = cols / 3, width = cols - first - (cols > 2 ? 1 : 0);
        Tensor z = alloc_tensor(*dev, kEight, rows, width);
        copy_columns(*dev, cache, x.t, first, z);
        for (size_t i = 0; i < kEight.size(); ++i) {
            std::vector<float> want;
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t j = 0; j < width; ++j)
                    want.push_back(x.data[i][size_t(r) * cols + first + j]);
            EXPECT_BITS_EQ(read_tensor(*dev, z, i), want);
        }
        // Back into columns first.. of y (a copy of x): y equals x again, every other column
        // untouched.
        copy(*dev, cache, x.t, y);
        Filled w = filled(*dev, kEight, rows, width, rows + 7, -1.0f, 1.0f);
        copy_into_columns(*dev, cache, w.t, y, first);
        for (size_t i = 0; i < kEight.size(); ++i) {
            std::vector<float> want = x.data[i];
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t j = 0; j < width; ++j)
                    want[size_t(r) * cols + first + j] = w.data[i][size_t(r) * width + j];
            EXPECT_BITS_EQ(read_tensor(*dev, y, i), want);
        }
    }
    Tensor a = alloc_tensor(*dev, kOne, 4, 6), b = alloc_tensor(*dev, kOne, 4, 5);
    EXPECT_EQ(error_of([&] { copy_into_columns(*dev, cache, a, b, 0); }),
              "copy_into_columns: a 4 x 6 tensor on cores [0] does not fit columns 0..6 of a 4 x "
              "5 tensor on cores [0]");
    EXPECT_EQ(error_of([&] { copy(*dev, cache, a, b); }),
              "copy: tensors differ in shape or cores (4 x 6 on 1 cores vs 4 x 5 on 1 cores)");
    EXPECT_EQ(error_of([&] { copy_columns(*dev, cache, a, 2, b); }),
              "copy_columns: columns 2..7 of a 4 x 6 tensor on cores [0] do not fit a 4 x 5 "
              "tensor on cores [0]");
}

// ---- GELU, dropout, layer norm ---------------------------------------------------------------

TEST(TensorGelu, ForwardAndBackwardAreBitExact) {
    auto dev = open_device();
    ProgramCache cache;
    for (uint32_t n : {1u, 1000u, 70000u}) {
        Filled x = filled(*dev, kEight, 1, n, n, -6.0f, 6.0f);
        Filled dy = filled(*dev, kEight, 1, n, n + 1);
        Tensor out = alloc_tensor(*dev, kEight, 1, n);
        gelu(*dev, cache, x.t, out);
        for (size_t i = 0; i < kEight.size(); ++i)
            EXPECT_BITS_EQ(read_tensor(*dev, out, i), gelu_reference(x.data[i]));
        gelu_grad(*dev, cache, x.t, dy.t, out);
        for (size_t i = 0; i < kEight.size(); ++i)
            EXPECT_BITS_EQ(read_tensor(*dev, out, i), gelu_grad_reference(x.data[i], dy.data[i]));
    }
    // The tanh form against the exact erf form and a finite difference of itself.
    const std::vector<float> xs = {-3.0f, -1.0f, -0.1f, 0.0f, 0.5f, 2.0f};
    const auto g = gelu_reference(xs);
    const auto d = gelu_grad_reference(xs, std::vector<float>(xs.size(), 1.0f));
    for (size_t i = 0; i < xs.size(); ++i) {
        const double x = xs[i];
        EXPECT_NEAR(g[i], 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))), 1e-3);
        const float h = 1e-2f;
        const auto gp = gelu_reference({xs[i] + h}), gm = gelu_reference({xs[i] - h});
        EXPECT_NEAR(d[i], (gp[0] - gm[0]) / (2 * h), 1e-3);
    }
}

TEST(TensorDropout, DeterministicPerSeedDifferentPerReplicaAndNearKeepRate) {
    auto dev = open_device();
    ProgramCache cache;
    const uint32_t n = 70000;
    Filled x = filled(*dev, kEight, 7, n / 7, 3);
    Tensor mask = alloc_tensor(*dev, kEight, 7, n / 7), out = alloc_tensor(*dev, kEight, 7, n / 7);
    const uint32_t tile = dropout_tile_values(dev->config(), n);
    EXPECT_LT(tile, n);  // several tiles, so the per-tile seeds are exercised
    const float p = 0.3f;
    dropout(*dev, cache, x.t, p, 42, mask, out);
    std::vector<std::vector<float>> masks;
    for (size_t i = 0; i < kEight.size(); ++i) {
        const auto want = dropout_reference(x.data[i], p, 42 + uint32_t(i), tile);
        masks.push_back(read_tensor(*dev, mask, i));
        EXPECT_BITS_EQ(masks.back(), want.mask);
        EXPECT_BITS_EQ(read_tensor(*dev, out, i), want.out);
        size_t kept = 0;
        for (float m : masks.back()) {
            EXPECT_TRUE(m == 0.0f || m == 1.0f / (1.0f - p));
            kept += m != 0.0f;
        }
        EXPECT_NEAR(double(kept) / n, 1.0 - p, 0.01);
    }
    EXPECT_NE(masks[0], masks[1]);
    // The same seed repeats; another seed differs.
    dropout(*dev, cache, x.t, p, 42, mask, out);
    EXPECT_EQ(read_tensor(*dev, mask, 0), masks[0]);
    dropout(*dev, cache, x.t, p, 43, mask, out);
    EXPECT_NE(read_tensor(*dev, mask, 0), masks[0]);
    EXPECT_EQ(cache.misses(), 1u);  // seeds and p are launch arguments
    // p = 0 keeps everything.
    dropout(*dev, cache, x.t, 0.0f, 7, mask, out);
    EXPECT_BITS_EQ(read_tensor(*dev, out, 3), x.data[3]);
    EXPECT_EQ(read_tensor(*dev, mask, 3), std::vector<float>(n, 1.0f));
    EXPECT_EQ(error_of([&] { dropout(*dev, cache, x.t, 1.0f, 7, mask, out); }),
              "dropout: p = 1 is outside [0, 1)");
}

TEST(TensorLayerNorm, ForwardAndBackwardAreBitExact) {
    auto dev = open_device();
    ProgramCache cache;
    for (auto [rows, cols] : {std::pair{1u, 1u}, {7u, 300u}, {300u, 129u}, {130u, 784u}}) {
        SCOPED_TRACE(fmt::format("{} x {}", rows, cols));
        Filled x = filled(*dev, kEight, rows, cols, rows, -3.0f, 5.0f);
        Filled dy = filled(*dev, kEight, rows, cols, rows + 7);
        Filled gamma = filled(*dev, kEight, 1, cols, 5, 0.5f, 1.5f);
        Filled beta = filled(*dev, kEight, 1, cols, 6);
        Tensor out = alloc_tensor(*dev, kEight, rows, cols),
               dx = alloc_tensor(*dev, kEight, rows, cols);
        Tensor mean = alloc_tensor(*dev, kEight, rows, 1),
               rstd = alloc_tensor(*dev, kEight, rows, 1);
        Tensor dg = alloc_tensor(*dev, kEight, 1, cols), db = alloc_tensor(*dev, kEight, 1, cols);
        layer_norm(*dev, cache, x.t, gamma.t, beta.t, 1e-5f, out, mean, rstd);
        layer_norm_grad(*dev, cache, x.t, dy.t, gamma.t, mean, rstd, dx, dg, db);
        const uint32_t tile = layer_norm_grad_tile_rows(dev->config(), rows, cols);
        for (size_t i = 0; i < kEight.size(); i += 3) {
            const auto f =
                layer_norm_reference(x.data[i], gamma.data[i], beta.data[i], 1e-5f, rows, cols);
            EXPECT_BITS_EQ(read_tensor(*dev, out, i), f.out);
            EXPECT_BITS_EQ(read_tensor(*dev, mean, i), f.mean);
            EXPECT_BITS_EQ(read_tensor(*dev, rstd, i), f.rstd);
            const auto g = layer_norm_grad_reference(x.data[i], dy.data[i], gamma.data[i], f.mean,
                                                     f.rstd, rows, cols, tile);
            EXPECT_BITS_EQ(read_tensor(*dev, dx, i), g.dx);
            EXPECT_BITS_EQ(read_tensor(*dev, dg, i), g.dgamma);
            EXPECT_BITS_EQ(read_tensor(*dev, db, i), g.dbeta);
        }
    }
    // The backward against a central difference of the forward (loss = sum dy * out).
    const uint32_t C = 5;
    std::vector<float> x = {0.3f, -1.2f, 2.0f, 0.7f, -0.4f}, dy = {1.0f, -0.5f, 0.25f, 2.0f, 0.1f};
    std::vector<float> gamma = {1.0f, 0.5f, 2.0f, 1.5f, 0.8f}, beta(C, 0.1f);
    const auto f = layer_norm_reference(x, gamma, beta, 1e-5f, 1, C);
    const auto g = layer_norm_grad_reference(x, dy, gamma, f.mean, f.rstd, 1, C, 1);
    for (uint32_t j = 0; j < C; ++j) {
        auto loss = [&](float d) {
            auto xp = x;
            xp[j] += d;
            const auto o = layer_norm_reference(xp, gamma, beta, 1e-5f, 1, C).out;
            double s = 0;
            for (uint32_t k = 0; k < C; ++k) s += double(dy[k]) * o[k];
            return s;
        };
        EXPECT_NEAR(g.dx[j], (loss(1e-2f) - loss(-1e-2f)) / 2e-2, 1e-2);
    }
}

TEST(TensorOpsErrors, MismatchedNormParametersAreNamed) {
    auto dev = open_device();
    ProgramCache cache;
    Tensor x = alloc_tensor(*dev, kOne, 4, 6), g = alloc_tensor(*dev, kOne, 1, 5);
    Tensor m = alloc_tensor(*dev, kOne, 4, 1);
    EXPECT_EQ(error_of([&] { layer_norm(*dev, cache, x, g, g, 1e-5f, x, m, m); }),
              "layer_norm: gamma is 1 x 5 on cores [0]; expected 1 x 6 on cores [0]");
}

}  // namespace
}  // namespace tpu::driver
