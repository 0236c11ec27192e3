// SPDX-License-Identifier: Apache-2.0
// conv2d_grad on device-resident Tensors: bit-exact per replica against the host reference
// (race detector on); the reference against central differences of an fp64 convolution; and
// the cycles of the Fashion-MNIST CNN's two backward convolutions.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/core/numerics.h"
#include "tests/driver/conv2d_case.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

std::vector<uint32_t> first_cores(uint32_t n) {
    std::vector<uint32_t> c(n);
    for (uint32_t i = 0; i < n; ++i) c[i] = i;
    return c;
}

struct GradTensors {
    Tensor x, w, dy, dx, dw, db;
};

GradTensors alloc_grad(Device& dev, const Conv2dShape& s, const std::vector<uint32_t>& set) {
    const uint32_t k = s.kernel, M = s.batch * s.out_height() * s.out_width();
    const uint32_t X = s.batch * s.height * s.width;
    return {alloc_tensor(dev, set, X, s.cin),
            alloc_tensor(dev, set, k * k * s.cin, s.cout),
            alloc_tensor(dev, set, M, s.cout),
            alloc_tensor(dev, set, X, s.cin),
            alloc_tensor(dev, set, k * k * s.cin, s.cout),
            alloc_tensor(dev, set, 1, s.cout)};
}

/// Runs conv2d_grad on `cores` cores, each replica with its own x, w and dy (and garbage in
/// the outputs), and checks every replica's dx, dw and db against the reference bit for bit.
void check_grad(const Conv2dShape& s, uint32_t cores) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const std::vector<uint32_t> set = first_cores(cores);
    GradTensors t = alloc_grad(*dev, s, set);
    std::vector<std::vector<float>> xs, ws, dys;
    for (uint32_t i = 0; i < cores; ++i) {
        xs.push_back(tutil::random_values(t.x.elements(), 10 + i));
        ws.push_back(tutil::random_values(t.w.elements(), 100 + i));
        dys.push_back(tutil::random_values(t.dy.elements(), 1000 + i));
        write_tensor(*dev, t.x, i, xs[i]);
        write_tensor(*dev, t.w, i, ws[i]);
        write_tensor(*dev, t.dy, i, dys[i]);
        // The kernel must not depend on what the outputs held.
        write_tensor(*dev, t.dx, i, std::vector<float>(t.dx.elements(), NAN));
        write_tensor(*dev, t.dw, i, std::vector<float>(t.dw.elements(), NAN));
    }
    const uint64_t free_before = dev->free_bytes(0);
    ProgramCache cache;
    conv2d_grad(*dev, cache, s, t.x, t.w, t.dy, t.dx, t.dw, t.db);
    EXPECT_EQ(dev->free_bytes(0), free_before) << "scratch HBM is freed";
    const uint32_t M = s.batch * s.out_height() * s.out_width();
    const uint32_t tile = col_sum_tile_rows(dev->config(), M, s.cout);
    for (uint32_t i = 0; i < cores; ++i) {
        const Conv2dGradResult want =
            conv2d_grad_reference(xs[i], ws[i], dys[i], s, dev->config().core.mxu_rows, tile);
        EXPECT_BITS_EQ(read_tensor(*dev, t.dx, i), want.dx);
        EXPECT_BITS_EQ(read_tensor(*dev, t.dw, i), want.dw);
        EXPECT_BITS_EQ(read_tensor(*dev, t.db, i), want.db);
    }
}

class Conv2dGrad : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dGrad, EveryReplicaMatchesTheReferenceBitExactly) {
    check_grad(GetParam().shape, GetParam().cores);
}

// {batch, H, W, Cin, Cout, k, stride, pad}
INSTANTIATE_TEST_SUITE_P(
    Odd, Conv2dGrad,
    ::testing::Values(ConvCase{{2, 6, 5, 3, 20, 3, 1, 1}, 1, "k3_s1_p1"},
                      ConvCase{{2, 7, 6, 20, 3, 3, 2, 1}, 1, "k3_s2_p1"},
                      ConvCase{{2, 7, 7, 3, 20, 3, 2, 0}, 1, "k3_s2_p0"},
                      ConvCase{{2, 5, 6, 20, 3, 3, 1, 0}, 1, "k3_s1_p0"},
                      ConvCase{{2, 4, 5, 20, 3, 1, 1, 0}, 1, "k1_s1_p0"},
                      ConvCase{{2, 5, 5, 3, 20, 1, 2, 1}, 1, "k1_s2_p1"},
                      ConvCase{{1, 9, 8, 3, 5, 5, 2, 2}, 1, "k5_s2_p2"},
                      ConvCase{{2, 6, 6, 130, 129, 3, 1, 1}, 1, "k3_two_tiles_each_way"},
                      ConvCase{{2, 7, 9, 1, 32, 3, 1, 1}, 8, "cin1_on_8_cores"},
                      ConvCase{{1, 6, 5, 20, 3, 3, 2, 1}, 8, "k3_s2_p1_on_8_cores"},
                      // Rows too wide for the row kernels' VMEM staging: the per-tap kernels.
                      ConvCase{{1, 2, 512, 128, 3, 7, 1, 3}, 1, "k7_wide_rows_per_tap"}),
    [](const auto& info) { return info.param.name; });

TEST(Conv2dGrad, WithoutDxSkipsTheInputGradientAndKeepsDwAndDb) {
    // An image needs no gradient: dw and db come out the same, in fewer cycles (no dcol GEMM,
    // no col2im).
    const Conv2dShape s{2, 9, 8, 3, 16, 7, 2, 3};
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const std::vector<uint32_t> set = first_cores(1);
    GradTensors t = alloc_grad(*dev, s, set);
    const auto x = tutil::random_values(t.x.elements(), 1);
    const auto w = tutil::random_values(t.w.elements(), 2);
    const auto dy = tutil::random_values(t.dy.elements(), 3);
    write_tensor(*dev, t.x, 0, x);
    write_tensor(*dev, t.w, 0, w);
    write_tensor(*dev, t.dy, 0, dy);
    ProgramCache cache;
    const Event full = conv2d_grad(*dev, cache, s, t.x, t.w, t.dy, t.dx, t.dw, t.db);
    const Event no_dx = conv2d_grad(*dev, cache, s, t.x, t.w, t.dy, Tensor{}, t.dw, t.db);
    EXPECT_LT(no_dx.end_cycle - no_dx.start_cycle, full.end_cycle - full.start_cycle);
    const uint32_t M = s.batch * s.out_height() * s.out_width();
    const Conv2dGradResult want = conv2d_grad_reference(
        x, w, dy, s, dev->config().core.mxu_rows, col_sum_tile_rows(dev->config(), M, s.cout));
    EXPECT_BITS_EQ(read_tensor(*dev, t.dw, 0), want.dw);
    EXPECT_BITS_EQ(read_tensor(*dev, t.db, 0), want.db);
}

/// Values that are multiples of 1/8 in [-2, 2]: exact in bf16, and every product and every
/// partial sum of a tiny shape exact in fp32, so the reference must equal the fp64 gradient.
std::vector<float> eighths(size_t n, uint32_t seed) {
    std::vector<float> v = tutil::random_values(n, seed);
    for (float& f : v) f = std::round(f * 8.0f) / 8.0f;
    return v;
}

TEST(Conv2dGrad, ReferenceIsTheDerivativeOfTheConvolution) {
    for (const Conv2dShape s :
         {Conv2dShape{2, 5, 4, 3, 2, 3, 1, 1}, Conv2dShape{1, 6, 5, 2, 3, 3, 2, 1},
          Conv2dShape{1, 4, 4, 2, 2, 1, 2, 0}}) {
        const uint32_t k = s.kernel, M = s.batch * s.out_height() * s.out_width();
        std::vector<float> x = eighths(size_t(s.batch) * s.height * s.width * s.cin, 1);
        std::vector<float> w = eighths(size_t(k) * k * s.cin * s.cout, 2);
        const std::vector<float> bias = eighths(s.cout, 3);
        const std::vector<float> dy = eighths(size_t(M) * s.cout, 4);
        // L = sum dy * conv(x, w); central differences with h = 1/4 (exact steps; L is
        // linear in each operand, so the difference quotient is the derivative).
        auto loss = [&] {
            const std::vector<double> y = conv2d_reference_fp64(x, w, bias, s);
            double l = 0;
            for (size_t i = 0; i < y.size(); ++i) l += double(dy[i]) * y[i];
            return l;
        };
        auto diff = [&](float& v) {
            const float keep = v;
            v = keep + 0.25f;
            const double up = loss();
            v = keep - 0.25f;
            const double down = loss();
            v = keep;
            return (up - down) / 0.5;
        };
        const Conv2dGradResult g = conv2d_grad_reference(x, w, dy, s, 128, M);
        for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(g.dx[i], diff(x[i]), 1e-9) << "dx " << i;
        for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g.dw[i], diff(w[i]), 1e-9) << "dw " << i;
        for (uint32_t co = 0; co < s.cout; ++co) {
            double want = 0;
            for (uint32_t r = 0; r < M; ++r) want += dy[size_t(r) * s.cout + co];
            EXPECT_NEAR(g.db[co], want, 1e-9) << "db " << co;
        }
    }
}

/// Cycles of conv2d_grad on one core, timing-only.
uint64_t grad_cycles(const Conv2dShape& s) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
    GradTensors t = alloc_grad(*dev, s, first_cores(1));
    ProgramCache cache;
    const Event ev = conv2d_grad(*dev, cache, s, t.x, t.w, t.dy, t.dx, t.dw, t.db);
    return ev.end_cycle - ev.start_cycle;
}

// The Fashion-MNIST CNN's backward convolutions at 16 images per core (driver/README.md,
// "Convolution").
TEST(Conv2dGrad, CnnConv1Cycles) {
    const uint64_t c = grad_cycles({16, 28, 28, 1, 32, 3, 1, 1});
    RecordProperty("cycles", std::to_string(c));
    fmt::print("conv 1 -> 32, 28 x 28, batch 16, backward: {} cycles\n", c);
    EXPECT_GT(c, 0u);
}

TEST(Conv2dGrad, CnnConv2Cycles) {
    const uint64_t c = grad_cycles({16, 14, 14, 32, 64, 3, 1, 1});
    RecordProperty("cycles", std::to_string(c));
    fmt::print("conv 32 -> 64, 14 x 14, batch 16, backward: {} cycles\n", c);
    EXPECT_GT(c, 0u);
}

}  // namespace
}  // namespace tpu::driver
