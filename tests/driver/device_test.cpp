// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "driver/device.h"
#include "driver/kernels/gemm.h"
#include "hw/board.h"
#include "isa/assembler.h"
#include "tests/common/paths.h"

namespace tpu::driver {
namespace {

/// Tests run with the race detector on, so every kernel they launch is proven race-free.
hw::BoardConfig tiny() {
    return hw::BoardConfig::load(test::source_dir() + "/configs/tiny.json",
                                 {"sim.race_detector=true"});
}

std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
    try {
        f();
    } catch (const DeviceError& e) {
        if (kind) *kind = e.kind();
        return e.what();
    }
    return "no error";
}

TEST(Device, AllocatorReusesAndCoalescesFreedMemory) {
    auto dev = Device::open(tiny());
    const uint64_t total = dev->free_bytes(0);
    EXPECT_EQ(total, 64u << 20);
    const Buffer a = dev->alloc(1000, 0), b = dev->alloc(4096, 0), c = dev->alloc(1, 0);
    EXPECT_EQ(a.addr, 0u);
    EXPECT_EQ(b.addr, 1024u);  // 256-byte granules
    EXPECT_EQ(c.addr, 1024u + 4096u);
    dev->free(b);
    EXPECT_EQ(dev->alloc(4000, 0).addr, 1024u);  // first fit reuses the hole
    dev->free(Buffer{0, 1024, 4000});
    dev->free(a);
    dev->free(c);
    EXPECT_EQ(dev->free_bytes(0), total);
    EXPECT_EQ(dev->largest_free_block(0), total);  // neighbours coalesced
}

TEST(Device, ErrorsNameWhatAndWhere) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    EXPECT_EQ(error_of([&] { dev->alloc(100ull << 20, 1); }, &kind),
              "out of HBM on core 1: requested 100.00 MiB (104857600 bytes), 64.00 MiB free "
              "(67108864 bytes), largest free block 67108864 bytes");
    EXPECT_EQ(kind, ErrorKind::OutOfMemory);
    EXPECT_EQ(error_of([&] { dev->alloc(16, 2); }, &kind),
              "alloc: core 2 does not exist (the board has cores 0-1)");
    EXPECT_EQ(kind, ErrorKind::Usage);
    EXPECT_EQ(error_of([&] { dev->alloc(0, 0); }), "alloc: 0 bytes requested");
    const Buffer b = dev->alloc(64, 0);
    std::vector<uint8_t> data(65);
    EXPECT_EQ(error_of([&] { dev->write(b, data.data(), 65); }),
              "write: 65 bytes at offset 0 run past the 64-byte buffer");
    dev->free(b);
    EXPECT_EQ(error_of([&] { dev->free(b); }),
              "free: no live buffer at 0x0 on core 0 (freed twice?)");
    EXPECT_EQ(error_of([&] { dev->read(b, data.data(), 4); }),
              "read: buffer at 0x0 on core 0 is not allocated");
}

TEST(Device, TransfersAreTimedOnTheHostLink) {
    auto dev = Device::open(tiny());
    const Buffer b = dev->alloc(1 << 20, 0);
    std::vector<uint8_t> data(1 << 20, 7), back(1 << 20);
    const uint64_t t0 = dev->now_cycle();
    dev->write(b, data.data(), data.size());
    // 2000 ns set-up + 1048576 B / 12 GB/s = 89381.3 ns -> 84018.5 cycles at 940 MHz.
    EXPECT_EQ(dev->now_cycle() - t0, 84019u);
    dev->read(b, back.data(), back.size());
    EXPECT_EQ(back, data);
    EXPECT_EQ(dev->metrics().h2d_bytes, 1u << 20);
    EXPECT_EQ(dev->metrics().d2h_transfers, 1u);
}

TEST(Device, FaultsAndDeadlocksBecomeErrors) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    const std::string fault =
        error_of([&] { dev->launch({1}, isa::assemble("li s1, 7\ndivu s2, s1, 0\nhalt")); }, &kind);
    EXPECT_EQ(kind, ErrorKind::Fault);
    EXPECT_EQ(fault,
              "device fault on core 1 at pc 1 (divu s2, s1, 0) in sequencer, cycle 1: "
              "division by zero");
    EXPECT_EQ(error_of([&] { dev->launch({0}, isa::assemble("halt")); }),
              "launch: the board stopped on a device fault; open a new device to run again");
}

TEST(Device, DeadlockBecomesAnError) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    const std::string msg = error_of(
        [&] {
            dev->launch({0, 1}, isa::assemble("wait f0, 1\nhalt"));
        },
        &kind);
    EXPECT_EQ(kind, ErrorKind::Deadlock);
    EXPECT_EQ(msg.rfind("deadlock at cycle 0: every running core waits on a flag", 0), 0u) << msg;
}

TEST(Device, LaunchArgumentsPerCore) {
    auto dev = Device::open(tiny());
    const auto ev =
        dev->launch({0, 1}, isa::assemble("li s3, 1\nloop: sub s1, s1, 1\nbne s1, 0, loop\nhalt"),
                    [](size_t i) { return std::vector<uint32_t>{i == 0 ? 5u : 50u}; });
    // li, then (sub, bne) per iteration, halt: 1 + 2n cycles.
    EXPECT_EQ(ev.core_cycles, (std::vector<uint64_t>{11, 101}));
}

class GemmShapes : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, uint32_t>> {};

TEST_P(GemmShapes, BitExactAgainstTheReferenceInEveryPrecision) {
    const auto [M, K, N] = GetParam();
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    ProgramCache cache;
    std::mt19937 rng(M * 131 + K * 7 + N);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> a(size_t(M) * K), w(size_t(K) * N);
    for (auto& x : a) x = u(rng);
    for (auto& x : w) x = u(rng);
    for (Precision p : {Precision::Bf16, Precision::Fp32Pass3, Precision::Fp32Pass6}) {
        for (const std::vector<uint32_t>& cores :
             {std::vector<uint32_t>{0}, {0, 1, 2, 3, 4, 5, 6, 7}}) {
            const auto r = gemm(*dev, cache, a, w, M, K, N, p, cores);
            const auto want = gemm_reference(a, w, M, K, N, p, 128);
            ASSERT_EQ(0, std::memcmp(r.c.data(), want.data(), want.size() * 4))
                << M << "x" << K << "x" << N << " " << precision_name(p) << " on " << cores.size()
                << " cores";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Driver, GemmShapes,
                         ::testing::Values(std::tuple{1u, 1u, 1u}, std::tuple{7u, 127u, 129u},
                                           std::tuple{127u, 129u, 7u}, std::tuple{129u, 300u, 1u},
                                           std::tuple{300u, 7u, 300u},
                                           std::tuple{1000u, 129u, 127u}));

TEST(Driver, ProgramCacheCountsRecompilation) {
    auto dev = Device::open(tiny());
    ProgramCache cache;
    std::vector<float> a(16 * 8, 1.0f), w(8 * 8, 1.0f);
    gemm(*dev, cache, a, w, 16, 8, 8, Precision::Bf16, {0});
    gemm(*dev, cache, a, w, 16, 8, 8, Precision::Bf16, {0});
    EXPECT_EQ(cache.misses(), 1u);
    EXPECT_EQ(cache.hits(), 1u);
    std::vector<float> w2(8 * 16, 1.0f);
    const auto r = gemm(*dev, cache, a, w2, 16, 8, 16, Precision::Bf16, {0});  // new shape
    EXPECT_EQ(cache.misses(), 2u);
    for (float x : r.c) ASSERT_EQ(x, 8.0f);
    EXPECT_EQ(error_of([&] { parse_precision("fp16"); }),
              "unknown precision 'fp16' (expected bf16, fp32-3pass or fp32-6pass)");
}

}  // namespace
}  // namespace tpu::driver
