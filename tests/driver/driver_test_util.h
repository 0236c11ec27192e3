// SPDX-License-Identifier: Apache-2.0
// Helpers the driver tests share: exact float comparison and error capture.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "driver/device.h"
#include "hw/board_config.h"

namespace tpu::driver::tutil {

/// The default board with the race detector on: a race in a kernel is a device fault, so every
/// test that uses it also proves its kernels race-free.
inline std::unique_ptr<Device> open_device() {
    return Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
}

/// `n` values uniform in [lo, hi) from `seed`.
inline std::vector<float> random_values(size_t n, uint32_t seed, float lo = -2.0f,
                                        float hi = 2.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

/// Bit patterns, so the comparison is exact (and -0.0 differs from +0.0).
inline std::vector<uint32_t> bits_of(const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<uint32_t>(v[i]);
    return b;
}

/// The DeviceError message `f` throws ("no error" if it returns); with `usage`, the error must
/// be a Usage error.
inline std::string error_of(const std::function<void()>& f, bool usage = false) {
    try {
        f();
    } catch (const DeviceError& e) {
        if (usage) {
            EXPECT_EQ(e.kind(), ErrorKind::Usage);
        }
        return e.what();
    }
    return "no error";
}

}  // namespace tpu::driver::tutil

#define EXPECT_BITS_EQ(got, want) \
    EXPECT_EQ(::tpu::driver::tutil::bits_of(got), ::tpu::driver::tutil::bits_of(want))
