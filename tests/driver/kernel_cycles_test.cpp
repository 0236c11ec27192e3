// SPDX-License-Identifier: Apache-2.0
// Cycles of the issue-16 kernels on the default board (timing-only, values not computed), the
// figures driver/README.md quotes, pinned so that a change in their cost is seen.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>

#include "driver/kernels/attention.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/softmax.h"
#include "hw/board_config.h"

namespace tpu::driver {
namespace {

std::unique_ptr<Device> timing_only() {
    return Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
}

uint64_t cycles(const Event& e) {
    return e.end_cycle - e.start_cycle;
}

TEST(KernelCycles, Softmax2048x2048OnOneCore) {
    auto dev = timing_only();
    ProgramCache cache;
    Tensor x = alloc_tensor(*dev, {0}, 2048, 2048), y = alloc_tensor(*dev, {0}, 2048, 2048);
    const Event e = softmax(*dev, cache, x, y);
    std::printf("softmax 2048x2048: %llu cycles, core %llu\n", (unsigned long long)cycles(e),
                (unsigned long long)e.core_cycles[0]);
    // 32 MiB through HBM at 479.5 bytes per cycle is the floor (69 980 cycles): 88% of it.
    EXPECT_EQ(cycles(e), 79923u);
}

TEST(KernelCycles, Attention12Heads512x64OnOneCore) {
    auto dev = timing_only();
    ProgramCache cache;
    const AttentionShape s{.batch = 1, .heads = 12, .seq = 512, .dhead = 64};
    auto t = [&](uint32_t cols) { return alloc_tensor(*dev, {0}, 12 * 512, cols); };
    Tensor q = t(64), k = t(64), v = t(64), o = t(64), p = t(512);
    const Event e = attention(*dev, cache, s, q, k, v, o, p);
    std::printf("attention 1x12x512x64: %llu cycles, core %llu\n", (unsigned long long)cycles(e),
                (unsigned long long)e.core_cycles[0]);
    for (const KernelStats& k : dev->kernel_stats())
        std::printf("  %s: %llu launches, %llu cycles, MXU %.1f%%\n", k.name.c_str(),
                    (unsigned long long)k.launches, (unsigned long long)k.cycles,
                    100 * k.mxu_utilization());
    // 73 launches (3 per matmul, 24 matmuls, one softmax): launch costs dominate.
    EXPECT_EQ(cycles(e), 346917u);
}

TEST(KernelCycles, MaxPool3x3Stride2On112x112x64) {
    auto dev = timing_only();
    ProgramCache cache;
    const PoolShape s{.batch = 1,
                      .height = 112,
                      .width = 112,
                      .channels = 64,
                      .kernel = 3,
                      .stride = 2,
                      .pad = 1};
    Tensor x = alloc_tensor(*dev, {0}, 112 * 112, 64), y = alloc_tensor(*dev, {0}, 56 * 56, 64);
    const Event e = max_pool2d(*dev, cache, s, x, y);
    std::printf("max_pool2d 112x112x64 k3 s2 p1: %llu cycles, core %llu\n",
                (unsigned long long)cycles(e), (unsigned long long)e.core_cycles[0]);
    // Each output row reads its 3 input rows (4.8 MB) and writes 14 KiB: 11 700 cycles at HBM
    // peak.
    EXPECT_EQ(cycles(e), 17192u);
}

}  // namespace
}  // namespace tpu::driver
