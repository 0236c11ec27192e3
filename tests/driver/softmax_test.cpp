// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "driver/kernels/softmax.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::open_device;
using tutil::random_values;

const std::vector<uint32_t> kEight = {0, 1, 2, 3, 4, 5, 6, 7};

/// Runs softmax and softmax_grad on `cores` (different data per replica) and compares every
/// replica bit for bit with the references; rows of y must also sum to 1 within fp32 rounding.
void check_softmax(Device& dev, ProgramCache& cache, const std::vector<uint32_t>& cores,
                   uint32_t rows, uint32_t cols, uint32_t seed) {
    SCOPED_TRACE(fmt::format("{} x {} on {} cores", rows, cols, cores.size()));
    Tensor x = alloc_tensor(dev, cores, rows, cols), y = alloc_tensor(dev, cores, rows, cols);
    Tensor dy = alloc_tensor(dev, cores, rows, cols), dx = alloc_tensor(dev, cores, rows, cols);
    std::vector<std::vector<float>> xs, dys;
    for (size_t i = 0; i < cores.size(); ++i) {
        xs.push_back(random_values(size_t(rows) * cols, seed + uint32_t(i), -8.0f, 8.0f));
        dys.push_back(random_values(size_t(rows) * cols, seed + 100 + uint32_t(i)));
        write_tensor(dev, x, i, xs.back());
        write_tensor(dev, dy, i, dys.back());
    }
    softmax(dev, cache, x, y);
    softmax_grad(dev, cache, y, dy, dx);
    for (size_t i = 0; i < cores.size(); ++i) {
        const auto want = softmax_reference(xs[i], rows, cols);
        const auto got = read_tensor(dev, y, i);
        ASSERT_EQ(bits_of(got), bits_of(want)) << "replica " << i;
        for (uint32_t r = 0; r < rows; ++r) {
            double sum = 0;
            for (uint32_t j = 0; j < cols; ++j) sum += got[size_t(r) * cols + j];
            EXPECT_NEAR(sum, 1.0, 1e-5 * std::sqrt(double(cols)) + 1e-6) << "row " << r;
        }
        EXPECT_EQ(bits_of(read_tensor(dev, dx, i)),
                  bits_of(softmax_grad_reference(want, dys[i], rows, cols)))
            << "replica " << i;
    }
    for (Tensor* t : {&x, &y, &dy, &dx}) free_tensor(dev, *t);
}

TEST(Softmax, BitExactOnOneCoreForOddShapes) {
    auto dev = open_device();
    ProgramCache cache;
    // One value, rows narrower than a lane, a ragged last tile, cols past 128 and not a
    // multiple of it, and rows wide enough that a tile holds a few rows only.
    for (auto [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
             {1, 1}, {3, 5}, {37, 200}, {130, 1000}, {9, 5000}})
        check_softmax(*dev, cache, {0}, rows, cols, rows + cols);
}

TEST(Softmax, BitExactPerReplicaOnEightCores) {
    auto dev = open_device();
    ProgramCache cache;
    check_softmax(*dev, cache, kEight, 45, 131, 7);
}

TEST(Softmax, ScaledCausalRowsMaskPerBlock) {
    auto dev = open_device();
    ProgramCache cache;
    // Three 20 x 20 blocks (heads): row r of each block keeps columns 0..r.
    const uint32_t cols = 20, rows = 3 * cols;
    const float scale = 0.125f;
    Tensor x = alloc_tensor(*dev, {0}, rows, cols), y = alloc_tensor(*dev, {0}, rows, cols);
    Tensor dy = alloc_tensor(*dev, {0}, rows, cols), dx = alloc_tensor(*dev, {0}, rows, cols);
    const auto xv = random_values(size_t(rows) * cols, 3, -6.0f, 6.0f);
    const auto dyv = random_values(size_t(rows) * cols, 4);
    write_tensor(*dev, x, 0, xv);
    write_tensor(*dev, dy, 0, dyv);
    scaled_softmax(*dev, cache, x, scale, true, y);
    scaled_softmax_grad(*dev, cache, y, dy, scale, dx);
    const auto want = softmax_reference(xv, rows, cols, scale, true);
    const auto got = read_tensor(*dev, y, 0);
    EXPECT_EQ(bits_of(got), bits_of(want));
    for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t j = 0; j < cols; ++j)
            if (j > r % cols) {
                EXPECT_EQ(got[size_t(r) * cols + j], 0.0f) << r << "," << j;
            }
    EXPECT_EQ(bits_of(read_tensor(*dev, dx, 0)),
              bits_of(softmax_grad_reference(want, dyv, rows, cols, scale)));
}

TEST(Softmax, MismatchedTensorsAreUsageErrors) {
    auto dev = open_device();
    ProgramCache cache;
    Tensor x = alloc_tensor(*dev, {0}, 4, 8), y = alloc_tensor(*dev, {0}, 4, 7);
    EXPECT_NE(tutil::error_of([&] { softmax(*dev, cache, x, y); }, true).find("softmax"),
              std::string::npos);
}

}  // namespace
}  // namespace tpu::driver
