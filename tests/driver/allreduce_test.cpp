// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "driver/kernels/allreduce.h"
#include "hw/board.h"

namespace tpu::driver {
namespace {

/// Exact host sums in ring order are not what a ring computes (each chunk is summed starting
/// at a different core), so the test uses values whose sums are exact in fp32: small integers.
std::vector<std::vector<float>> integer_data(size_t cores, uint32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<float>> d(cores, std::vector<float>(n));
    for (auto& v : d)
        for (auto& x : v) x = float(int(rng() % 2001) - 1000);
    return d;
}

class AllReduceSizes
    : public ::testing::TestWithParam<std::tuple<std::vector<uint32_t>, uint32_t>> {};

TEST_P(AllReduceSizes, EveryCoreGetsTheExactSumAndTheKernelIsRaceFree) {
    const auto& [cores, n] = GetParam();
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const auto data = integer_data(cores.size(), n, n);
    const auto r = allreduce(*dev, cores, data);
    std::vector<float> sum(n, 0.0f);
    for (const auto& v : data)
        for (uint32_t i = 0; i < n; ++i) sum[i] += v[i];
    for (size_t c = 0; c < cores.size(); ++c) ASSERT_EQ(r.out[c], sum) << "core " << cores[c];
}

INSTANTIATE_TEST_SUITE_P(
    Driver, AllReduceSizes,
    ::testing::Values(std::tuple{std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}, 1u},
                      std::tuple{std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}, 1000u},
                      std::tuple{std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}, 65536u},
                      std::tuple{std::vector<uint32_t>{2, 5}, 777u},
                      std::tuple{std::vector<uint32_t>{0, 2, 4, 6}, 4096u}));

TEST(AllReduce, CyclesFollowTheRingFormula) {
    // 8 cores, 1 MiB per core: 2 (N-1)/N S / (2 bw) + 2 (N-1) hop, bw = 85.1 B/cycle, hop = 940.
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
    const uint32_t n = 1 << 18;
    const auto r = allreduce(*dev, {0, 1, 2, 3, 4, 5, 6, 7},
                             std::vector<std::vector<float>>(8, std::vector<float>(n)));
    const double bw = 80e9 / 940e6, S = 4.0 * n;
    const double formula = 2.0 * 7 / 8 * S / (2 * bw) + 2 * 7 * 940;
    const double cycles = double(r.event.end_cycle - r.event.start_cycle);
    EXPECT_NEAR(cycles / formula, 1.0, 0.05) << cycles << " vs " << formula;
}

TEST(AllReduce, Errors) {
    auto dev = Device::open(hw::BoardConfig::load("", {}));
    try {
        allreduce(*dev, {0}, {{1.0f}});
        ADD_FAILURE();
    } catch (const DeviceError& e) {
        EXPECT_STREQ(e.what(), "all-reduce needs at least 2 cores");
    }
    EXPECT_THROW(allreduce(*dev, {0, 1}, {{1.0f}, {1.0f, 2.0f}}), DeviceError);
    EXPECT_THROW(
        allreduce(*dev, {0, 1}, std::vector<std::vector<float>>(2, std::vector<float>(3u << 20))),
        DeviceError);
}

}  // namespace
}  // namespace tpu::driver
