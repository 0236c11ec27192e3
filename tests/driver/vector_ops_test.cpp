// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "driver/kernels/vector_ops.h"
#include "tests/common/paths.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::error_of;
using tutil::open_device;
using tutil::random_values;

Buffer upload(Device& dev, const std::vector<float>& v, uint32_t core = 0) {
    const Buffer b = dev.alloc(v.size() * 4, core);
    dev.write(b, v.data(), v.size() * 4);
    return b;
}

std::vector<float> download(Device& dev, const Buffer& b, size_t n) {
    std::vector<float> v(n);
    dev.read(b, v.data(), n * 4);
    return v;
}

class VectorOpsElementwise : public ::testing::TestWithParam<uint32_t> {};

TEST_P(VectorOpsElementwise, EveryKernelIsBitExact) {
    const uint32_t n = GetParam();
    auto dev = open_device();
    ProgramCache cache;
    auto a = random_values(n, 1), b = random_values(n, 2);
    a[0] = -0.0f;  // relu must return +0.0 for -0.0, relu_grad must reject it
    const Buffer ba = upload(*dev, a), bb = upload(*dev, b), out = dev->alloc(n * 4, 0);

    add(*dev, cache, ba, bb, out, n);
    EXPECT_BITS_EQ(download(*dev, out, n), add_reference(a, b));
    mul(*dev, cache, ba, bb, out, n);
    EXPECT_BITS_EQ(download(*dev, out, n), mul_reference(a, b));
    scale(*dev, cache, ba, -0.37f, out, n);
    EXPECT_BITS_EQ(download(*dev, out, n), scale_reference(a, -0.37f));
    relu(*dev, cache, ba, out, n);
    EXPECT_BITS_EQ(download(*dev, out, n), relu_reference(a));
    relu_grad(*dev, cache, ba, bb, out, n);
    EXPECT_BITS_EQ(download(*dev, out, n), relu_grad_reference(a, b));
    EXPECT_EQ(cache.misses(), 5u);
    add(*dev, cache, bb, ba, out, n);  // same shape, other buffers: a cache hit
    EXPECT_BITS_EQ(download(*dev, out, n), add_reference(b, a));
    EXPECT_EQ(cache.hits(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Driver, VectorOpsElementwise,
                         ::testing::Values(1u, 7u, 1000u, 70000u, 100003u));

class VectorOpsOptimizers : public ::testing::TestWithParam<uint32_t> {};

TEST_P(VectorOpsOptimizers, SgdMomentumAndAdamAreBitExactOverSteps) {
    const uint32_t n = GetParam();
    auto dev = open_device();
    ProgramCache cache;
    auto w = random_values(n, 3), v = random_values(n, 4), w2 = random_values(n, 5);
    auto m2 = random_values(n, 6), v2 = random_values(n, 7, 0.0f, 1.0f);
    const Buffer bw = upload(*dev, w), bv = upload(*dev, v), bw2 = upload(*dev, w2),
                 bm2 = upload(*dev, m2), bv2 = upload(*dev, v2), bg = dev->alloc(n * 4, 0);
    for (uint32_t step = 1; step <= 3; ++step) {
        const auto g = random_values(n, 100 + step);
        dev->write(bg, g.data(), n * 4);
        sgd_momentum(*dev, cache, bw, bg, bv, n, 0.05f, 0.9f);
        sgd_momentum_reference(w, g, v, 0.05f, 0.9f);
        adam(*dev, cache, bw2, bg, bm2, bv2, n, 1e-3f, 0.9f, 0.999f, 1e-8f, step);
        adam_reference(w2, g, m2, v2, 1e-3f, 0.9f, 0.999f, 1e-8f, step);
    }
    EXPECT_BITS_EQ(download(*dev, bw, n), w);
    EXPECT_BITS_EQ(download(*dev, bv, n), v);
    EXPECT_BITS_EQ(download(*dev, bw2, n), w2);
    EXPECT_BITS_EQ(download(*dev, bm2, n), m2);
    EXPECT_BITS_EQ(download(*dev, bv2, n), v2);
    // The step's scalars are launch arguments, not part of the program.
    EXPECT_EQ(cache.misses(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Driver, VectorOpsOptimizers, ::testing::Values(1u, 7u, 1000u, 70000u));

class VectorOpsRows : public ::testing::TestWithParam<std::pair<uint32_t, uint32_t>> {};

TEST_P(VectorOpsRows, RowKernelsAreBitExact) {
    const auto [rows, cols] = GetParam();
    const size_t n = size_t(rows) * cols;
    auto dev = open_device();
    ProgramCache cache;
    const auto x = random_values(n, rows), bias = random_values(cols, cols);
    const Buffer bx = upload(*dev, x), bbias = upload(*dev, bias), out = dev->alloc(n * 4, 0);

    bias_add(*dev, cache, bx, bbias, out, rows, cols);
    EXPECT_BITS_EQ(download(*dev, out, n), bias_add_reference(x, bias, rows, cols));
    row_sum(*dev, cache, bx, out, rows, cols);
    EXPECT_BITS_EQ(download(*dev, out, rows), row_sum_reference(x, rows, cols));
    col_sum(*dev, cache, bx, out, rows, cols);
    const uint32_t tile = col_sum_tile_rows(dev->config(), rows, cols);
    EXPECT_BITS_EQ(download(*dev, out, cols), col_sum_reference(x, rows, cols, tile));
}

TEST_P(VectorOpsRows, SoftmaxCrossEntropyIsBitExact) {
    const auto [rows, classes] = GetParam();
    const size_t n = size_t(rows) * classes;
    auto dev = open_device();
    ProgramCache cache;
    const auto logits = random_values(n, 11, -8.0f, 8.0f);
    std::vector<float> y(n, 0.0f);
    std::mt19937 rng(12);
    for (size_t r = 0; r < rows; ++r) y[r * classes + rng() % classes] = 1.0f;
    const Buffer bl = upload(*dev, logits), by = upload(*dev, y), loss = dev->alloc(rows * 4, 0),
                 dl = dev->alloc(n * 4, 0);
    softmax_cross_entropy(*dev, cache, bl, by, loss, dl, rows, classes);
    const auto want = softmax_cross_entropy_reference(logits, y, rows, classes);
    EXPECT_BITS_EQ(download(*dev, loss, rows), want.loss);
    EXPECT_BITS_EQ(download(*dev, dl, n), want.dlogits);
    // Sanity of the maths, not just of the agreement: the loss is positive and each row of
    // dlogits sums to about zero.
    const auto got = download(*dev, dl, n);
    for (size_t r = 0; r < rows; ++r) {
        EXPECT_GE(want.loss[r], 0.0f);
        double s = 0;
        for (size_t j = 0; j < classes; ++j) s += got[r * classes + j];
        EXPECT_NEAR(s, 0.0, 1e-6 * classes + 1e-6);
    }
}

INSTANTIATE_TEST_SUITE_P(Driver, VectorOpsRows,
                         ::testing::Values(std::pair{3u, 10u}, std::pair{128u, 784u},
                                           std::pair{37u, 129u}, std::pair{300u, 300u},
                                           std::pair{5000u, 1u}, std::pair{2u, 40000u}));

TEST(VectorOps, TilingPipelinesLargeTensors) {
    // 128 x 784 takes 32768 / 784 = 41 rows per tile: four tiles, so col_sum adds tile sums.
    const auto cfg = hw::BoardConfig::load("", {});
    EXPECT_EQ(col_sum_tile_rows(cfg, 128, 784), 41u);
    EXPECT_EQ(col_sum_tile_rows(cfg, 3, 10), 3u);
    EXPECT_EQ(col_sum_tile_rows(cfg, 2, 40000), 1u);
}

TEST(VectorOps, AdamIsPyTorchsFormulaWithEpsOutsideTheRoot) {
    // torch.optim.Adam, step 1: w -= lr * m_hat / (sqrt(v_hat) + eps) with m_hat = g and
    // v_hat = g^2, so the step is lr * |g| / (|g| + eps): half of lr where |g| = eps (eps inside
    // the root would give lr / sqrt(2)), lr for large |g|, 0 for g = 0.
    auto dev = open_device();
    ProgramCache cache;
    const float lr = 1e-2f, eps = 1e-6f;
    std::vector<float> g = {1e-6f, -1e-6f, 3.0f, 0.0f, 4e-6f}, w(g.size(), 1.0f);
    std::vector<float> m(g.size(), 0.0f), v(g.size(), 0.0f);
    const auto n = static_cast<uint32_t>(g.size());
    const Buffer bw = upload(*dev, w), bg = upload(*dev, g), bm = upload(*dev, m),
                 bv = upload(*dev, v);
    adam(*dev, cache, bw, bg, bm, bv, n, lr, 0.9f, 0.999f, eps, 1);
    adam_reference(w, g, m, v, lr, 0.9f, 0.999f, eps, 1);
    EXPECT_BITS_EQ(download(*dev, bw, n), w);
    for (size_t i = 0; i < g.size(); ++i) {
        const double a = std::abs(double(g[i]));
        const double torch = 1.0 - (g[i] < 0 ? -1.0 : 1.0) * lr * a / (a + eps);
        EXPECT_NEAR(w[i], torch, 1e-6) << "g = " << g[i];
    }
}

TEST(VectorOps, SmallVmemBoundsTheTile) {
    // The tiny board has 1 MiB of VMEM: Adam's six areas in two slots fit (512 KiB - 6 x 256)
    // / 24 = 21 781 values a tile, fewer than the 32 768 cap, so 70 000 values take 4 tiles.
    auto dev = Device::open(hw::BoardConfig::load(test::source_dir() + "/configs/tiny.json",
                                                  {"sim.race_detector=true"}));
    ProgramCache cache;
    const uint32_t n = 70000;
    auto w = random_values(n, 21), g = random_values(n, 22), m = random_values(n, 23);
    auto v = random_values(n, 24, 0.0f, 1.0f);
    const Buffer bw = upload(*dev, w), bg = upload(*dev, g), bm = upload(*dev, m),
                 bv = upload(*dev, v);
    adam(*dev, cache, bw, bg, bm, bv, n, 1e-2f, 0.8f, 0.99f, 1e-6f, 5);
    adam_reference(w, g, m, v, 1e-2f, 0.8f, 0.99f, 1e-6f, 5);
    EXPECT_BITS_EQ(download(*dev, bw, n), w);
    EXPECT_BITS_EQ(download(*dev, bm, n), m);
    EXPECT_BITS_EQ(download(*dev, bv, n), v);
    const auto cfg = dev->config();
    EXPECT_EQ(col_sum_tile_rows(cfg, 1000, 1000), 32u);  // 32768 / 1000 rows, not VMEM-bound
    EXPECT_EQ(col_sum_tile_rows(cfg, 1000, 50000), 1u);
    // col_sum keeps two rows of sums next to the slots: 4 x 100000 x 4 bytes do not fit.
    EXPECT_THROW(col_sum_tile_rows(cfg, 1000, 100000), DeviceError);
}

TEST(VectorOps, CycleCounts) {
    // The bounds are the kernels' own: the launch's start and end costs are left out.
    auto dev = Device::open(
        hw::BoardConfig::load("", {"sim.race_detector=true", "sim.launch_costs=false"}));
    ProgramCache cache;
    for (uint32_t n : {1000u, 70000u, 1u << 20}) {
        const Buffer a = dev->alloc(n * 4, 0), b = dev->alloc(n * 4, 0), o = dev->alloc(n * 4, 0);
        const Event e = add(*dev, cache, a, b, o, n);
        const uint64_t cycles = e.end_cycle - e.start_cycle;
        std::cout << "add n=" << n << ": " << cycles << " cycles\n";
        // Three streams of 4n bytes through one HBM pipe of 479.5 B/cycle bound it from below.
        EXPECT_GE(double(cycles), 3.0 * 4 * n / 479.5);
        EXPECT_LT(double(cycles), 3.0 * 4 * n / 479.5 * 1.5 + 1000);
        dev->free(a);
        dev->free(b);
        dev->free(o);
    }
    const Buffer l = dev->alloc(128 * 784 * 4, 0), y = dev->alloc(128 * 784 * 4, 0),
                 loss = dev->alloc(128 * 4, 0), d = dev->alloc(128 * 784 * 4, 0);
    const Event e = softmax_cross_entropy(*dev, cache, l, y, loss, d, 128, 784);
    std::cout << "softmax_cross_entropy 128x784: " << e.end_cycle - e.start_cycle << " cycles\n";
}

TEST(VectorOps, ErrorsNameKernelBufferAndSizes) {
    auto dev = open_device();
    ProgramCache cache;
    const Buffer small = dev->alloc(256, 0), big = dev->alloc(4096, 0), other = dev->alloc(4096, 1);
    EXPECT_EQ(error_of([&] { add(*dev, cache, big, small, big, 1000); }),
              "add: b holds 256 bytes; 1000 fp32 values need 4000");
    EXPECT_EQ(error_of([&] { relu(*dev, cache, big, other, 10); }),
              "relu: out is on core 1 but x is on core 0; all buffers must be on one core");
    EXPECT_EQ(error_of([&] { scale(*dev, cache, big, 2.0f, big, 0); }),
              "scale: empty shape (0 x 1)");
    EXPECT_EQ(error_of([&] { bias_add(*dev, cache, big, small, big, 10, 100); }),
              "bias_add: bias holds 256 bytes; 100 fp32 values need 400");
    EXPECT_EQ(error_of([&] { row_sum(*dev, cache, big, big, 0, 5); }),
              "row_sum: empty shape (0 x 5)");
    EXPECT_EQ(error_of([&] { softmax_cross_entropy(*dev, cache, big, big, small, big, 100, 20); }),
              "softmax_cross_entropy: logits holds 4096 bytes; 2000 fp32 values need 8000");
    EXPECT_EQ(
        error_of([&] { adam(*dev, cache, big, big, big, big, 10, 1e-3f, 0.9f, 0.999f, 1e-8f, 0); }),
        "adam: step must be >= 1");
    // A row wider than two tile slots of VMEM cannot be tiled by rows.
    const Buffer huge = dev->alloc(uint64_t(3) << 22, 0);
    EXPECT_EQ(error_of([&] { row_sum(*dev, cache, huge, huge, 1, 3u << 20); }),
              "row_sum: a row of 3145728 values needs 25166336 bytes of VMEM in two tile slots; "
              "the core has 16777216");
    // Issue #30, item 4: an address near 2^64 plus its size wrapped to a small end and passed;
    // the kernel would have used the address's low 32 bits.
    const Buffer wraps{0, UINT64_MAX - 8, 4096};
    EXPECT_EQ(error_of([&] { relu(*dev, cache, wraps, big, 10); }),
              "relu: x ends past the 4 GiB of HBM a kernel addresses");
    EXPECT_EQ(cache.misses(), 0u);  // nothing was compiled for a bad call
}

// ---- Tensor overloads: one launch over the core set, each core on its own replica ---------

const std::vector<uint32_t> kEightCores = {0, 1, 2, 3, 4, 5, 6, 7};

/// A tensor on every core with different random contents per replica.
struct Replicas {
    Tensor t;
    std::vector<std::vector<float>> data;
};

Replicas replicas(Device& dev, uint32_t rows, uint32_t cols, uint32_t seed, float lo = -2.0f,
                  float hi = 2.0f) {
    Replicas r{alloc_tensor(dev, kEightCores, rows, cols), {}};
    for (size_t i = 0; i < kEightCores.size(); ++i) {
        r.data.push_back(random_values(size_t(rows) * cols, seed * 97 + uint32_t(i), lo, hi));
        write_tensor(dev, r.t, i, r.data.back());
    }
    return r;
}

class VectorOpsTensors : public ::testing::TestWithParam<std::pair<uint32_t, uint32_t>> {};

TEST_P(VectorOpsTensors, EveryKernelIsOneLaunchAndBitExactPerReplica) {
    const auto [rows, cols] = GetParam();
    auto dev = open_device();
    ProgramCache cache;
    Replicas a = replicas(*dev, rows, cols, 1), b = replicas(*dev, rows, cols, 2);
    Replicas bias = replicas(*dev, 1, cols, 3);
    Tensor out = alloc_tensor(*dev, kEightCores, rows, cols);
    Tensor rs = alloc_tensor(*dev, kEightCores, rows, 1),
           cs = alloc_tensor(*dev, kEightCores, 1, cols);
    const size_t R = kEightCores.size();
    auto check = [&](const Tensor& t, const std::function<std::vector<float>(size_t)>& want) {
        for (size_t i = 0; i < R; ++i) EXPECT_BITS_EQ(read_tensor(*dev, t, i), want(i)) << i;
    };
    const uint64_t launches = dev->metrics().launches;
    const Event e = add(*dev, cache, a.t, b.t, out);
    EXPECT_EQ(e.cores, kEightCores);
    check(out, [&](size_t i) { return add_reference(a.data[i], b.data[i]); });
    mul(*dev, cache, a.t, b.t, out);
    check(out, [&](size_t i) { return mul_reference(a.data[i], b.data[i]); });
    scale(*dev, cache, a.t, 0.37f, out);
    check(out, [&](size_t i) { return scale_reference(a.data[i], 0.37f); });
    relu(*dev, cache, a.t, out);
    check(out, [&](size_t i) { return relu_reference(a.data[i]); });
    relu_grad(*dev, cache, a.t, b.t, out);
    check(out, [&](size_t i) { return relu_grad_reference(a.data[i], b.data[i]); });
    add_relu(*dev, cache, a.t, b.t, out);
    check(out, [&](size_t i) { return add_relu_reference(a.data[i], b.data[i]); });
    bias_add(*dev, cache, a.t, bias.t, out);
    check(out, [&](size_t i) { return bias_add_reference(a.data[i], bias.data[i], rows, cols); });
    row_sum(*dev, cache, a.t, rs);
    check(rs, [&](size_t i) { return row_sum_reference(a.data[i], rows, cols); });
    col_sum(*dev, cache, a.t, cs);
    const uint32_t tile = col_sum_tile_rows(dev->config(), rows, cols);
    check(cs, [&](size_t i) { return col_sum_reference(a.data[i], rows, cols, tile); });
    EXPECT_EQ(dev->metrics().launches - launches, 9u);  // one launch per kernel call

    // Softmax cross-entropy with one-hot labels.
    Replicas y{alloc_tensor(*dev, kEightCores, rows, cols), {}};
    for (size_t i = 0; i < R; ++i) {
        std::vector<float> v(size_t(rows) * cols, 0.0f);
        for (uint32_t r = 0; r < rows; ++r) v[size_t(r) * cols + (r * 7 + i) % cols] = 1.0f;
        y.data.push_back(v);
        write_tensor(*dev, y.t, i, v);
    }
    softmax_cross_entropy(*dev, cache, a.t, y.t, rs, out);
    for (size_t i = 0; i < R; ++i) {
        const auto want = softmax_cross_entropy_reference(a.data[i], y.data[i], rows, cols);
        EXPECT_BITS_EQ(read_tensor(*dev, rs, i), want.loss);
        EXPECT_BITS_EQ(read_tensor(*dev, out, i), want.dlogits);
    }

    // Optimizers, in place, over two steps.
    Replicas w = replicas(*dev, rows, cols, 4), v = replicas(*dev, rows, cols, 5);
    Replicas w2 = replicas(*dev, rows, cols, 6), m2 = replicas(*dev, rows, cols, 7),
             v2 = replicas(*dev, rows, cols, 8, 0.0f, 1.0f);
    for (uint32_t step = 1; step <= 2; ++step) {
        Replicas g = replicas(*dev, rows, cols, 100 + step);
        sgd_momentum(*dev, cache, w.t, g.t, v.t, 0.05f, 0.9f);
        adam(*dev, cache, w2.t, g.t, m2.t, v2.t, 1e-3f, 0.9f, 0.999f, 1e-8f, step);
        for (size_t i = 0; i < R; ++i) {
            sgd_momentum_reference(w.data[i], g.data[i], v.data[i], 0.05f, 0.9f);
            adam_reference(w2.data[i], g.data[i], m2.data[i], v2.data[i], 1e-3f, 0.9f, 0.999f,
                           1e-8f, step);
        }
        free_tensor(*dev, g.t);
    }
    check(w.t, [&](size_t i) { return w.data[i]; });
    check(v.t, [&](size_t i) { return v.data[i]; });
    check(w2.t, [&](size_t i) { return w2.data[i]; });
    check(m2.t, [&](size_t i) { return m2.data[i]; });
    check(v2.t, [&](size_t i) { return v2.data[i]; });
}

INSTANTIATE_TEST_SUITE_P(Driver, VectorOpsTensors,
                         ::testing::Values(std::pair{1u, 1u}, std::pair{7u, 300u},
                                           std::pair{300u, 129u}, std::pair{3u, 40000u}));

TEST(VectorOps, TensorShapeAndCoreMismatchesAreNamed) {
    auto dev = open_device();
    ProgramCache cache;
    Tensor x = alloc_tensor(*dev, {0, 1}, 4, 6), y = alloc_tensor(*dev, {0, 1}, 4, 5);
    Tensor z = alloc_tensor(*dev, {0, 2}, 4, 6), bias = alloc_tensor(*dev, {0, 1}, 1, 5);
    Tensor r = alloc_tensor(*dev, {0, 1}, 1, 6);
    EXPECT_EQ(error_of([&] { add(*dev, cache, x, y, x); }),
              "add: tensors differ in shape or cores (4 x 6 on 2 cores vs 4 x 5 on 2 cores)");
    EXPECT_EQ(error_of([&] { relu(*dev, cache, x, z); }),
              "relu: tensors differ in shape or cores (4 x 6 on 2 cores vs 4 x 6 on 2 cores)");
    EXPECT_EQ(error_of([&] { bias_add(*dev, cache, x, bias, x); }),
              "bias_add: bias is 1 x 5 on cores [0, 1]; expected 1 x 6 on cores [0, 1]");
    EXPECT_EQ(error_of([&] { row_sum(*dev, cache, x, r); }),
              "row_sum: out is 1 x 6 on cores [0, 1]; expected 4 x 1 on cores [0, 1]");
    EXPECT_EQ(error_of([&] { col_sum(*dev, cache, x, bias); }),
              "col_sum: out is 1 x 5 on cores [0, 1]; expected 1 x 6 on cores [0, 1]");
    EXPECT_EQ(error_of([&] { softmax_cross_entropy(*dev, cache, x, x, r, x); }),
              "softmax_cross_entropy: loss_per_row is 1 x 6 on cores [0, 1]; expected 4 x 1 on "
              "cores [0, 1]");
    EXPECT_EQ(error_of([&] { adam(*dev, cache, x, x, x, x, 1e-3f, 0.9f, 0.999f, 1e-8f, 0); }),
              "adam: step must be >= 1");
    EXPECT_EQ(dev->metrics().launches, 0u);
}

}  // namespace
}  // namespace tpu::driver
