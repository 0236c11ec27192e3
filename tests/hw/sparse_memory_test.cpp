// SPDX-License-Identifier: Apache-2.0
// SparseMemory: unwritten bytes read as zero, writes and fills across page boundaries, the same
// contents with the reservation and with the paged fallback.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "hw/mem/sparse_memory.h"

namespace tpu::hw {
namespace {

using Backing = SparseMemory::Backing;
constexpr uint64_t kPage = SparseMemory::kPageBytes;

TEST(SparseMemory, BothBackingsHoldTheSameBytes) {
    SparseMemory reserve("r", 16 * kPage), pages("p", 16 * kPage, Backing::Pages);
    EXPECT_TRUE(reserve.contiguous());
    EXPECT_FALSE(pages.contiguous());
    std::vector<uint8_t> model(16 * kPage, 0);
    std::mt19937 rng(1);
    for (int i = 0; i < 300; ++i) {
        // Ranges that start and end inside pages, cover whole pages, or straddle two.
        const uint64_t addr = rng() % (16 * kPage);
        const uint64_t bytes = 1 + rng() % std::min<uint64_t>(3 * kPage, 16 * kPage - addr);
        const uint32_t what = rng() % 3;
        if (what == 0) {
            std::vector<uint8_t> in(bytes);
            for (auto& b : in) b = uint8_t(rng());
            reserve.write(addr, in);
            pages.write(addr, in);
            std::copy(in.begin(), in.end(), model.begin() + ptrdiff_t(addr));
        } else if (what == 1) {
            const uint8_t v = rng() % 2 ? 0 : uint8_t(rng());
            reserve.fill(addr, bytes, v);
            pages.fill(addr, bytes, v);
            std::fill_n(model.begin() + ptrdiff_t(addr), bytes, v);
        } else {
            std::vector<uint8_t> a(bytes), b(bytes);
            reserve.read(addr, a);
            pages.read(addr, b);
            ASSERT_EQ(a, std::vector<uint8_t>(model.begin() + ptrdiff_t(addr),
                                              model.begin() + ptrdiff_t(addr + bytes)));
            ASSERT_EQ(b, a);
        }
    }
    std::vector<uint8_t> a(16 * kPage), b(16 * kPage);
    reserve.read(0, a);
    pages.read(0, b);
    EXPECT_EQ(a, model);
    EXPECT_EQ(b, model);
}

TEST(SparseMemory, AWriteIntoANewPageLeavesTheRestZero) {
    SparseMemory pages("p", 4 * kPage, Backing::Pages);
    const std::vector<uint8_t> in(100, 0xAB);
    pages.write(kPage + 1000, in);  // allocates page 1, uninitialised only where written
    std::vector<uint8_t> out(kPage);
    pages.read(kPage, out);
    for (uint64_t i = 0; i < kPage; ++i) ASSERT_EQ(out[i], i >= 1000 && i < 1100 ? 0xAB : 0) << i;
}

TEST(SparseMemory, HugeReservationCostsNothingUntilWritten) {
    SparseMemory big("hbm", uint64_t(16) << 30);  // 16 GiB, as a default core's HBM
    std::vector<uint8_t> out(64, 0xFF);
    big.read((uint64_t(16) << 30) - 64, out);
    EXPECT_EQ(out, std::vector<uint8_t>(64, 0));
    const std::vector<uint8_t> in(64, 7);
    big.write(uint64_t(8) << 30, in);
    big.read(uint64_t(8) << 30, out);
    EXPECT_EQ(out, in);
}

TEST(SparseMemory, AccessesOutsideTheMemoryAreErrorsNotWrites) {
    // Callers check with in_range(); a missed check must not write past the reservation (issue
    // #30, item 4). An address plus a size that wraps 2^64 is outside too.
    for (const Backing b : {Backing::Reserve, Backing::Pages}) {
        SparseMemory m("vmem3", 4 * kPage, b);
        std::vector<uint8_t> buf(16, 1);
        try {
            m.write(4 * kPage - 8, buf);
            ADD_FAILURE() << "write past the end accepted";
        } catch (const std::out_of_range& e) {
            EXPECT_STREQ(e.what(),
                         "vmem3: write of 16 bytes at 0x3fff8 is outside its 262144 bytes");
        }
        EXPECT_THROW(m.read(UINT64_MAX - 4, buf), std::out_of_range);
        EXPECT_THROW(m.fill(8, UINT64_MAX - 4, 0xFF), std::out_of_range);
        // The bytes up to the end stay writable.
        m.write(4 * kPage - 16, buf);
        std::vector<uint8_t> out(16);
        m.read(4 * kPage - 16, out);
        EXPECT_EQ(out, buf);
    }
}

TEST(SparseMemory, ATimingOnlyMemoryHoldsNoBytesButKeepsItsBounds) {
    // Backing::None (sim.functional = false): writes and fills are dropped, reads are zeros, and
    // an access outside is still the same error.
    SparseMemory none("hbm0", uint64_t(16) << 30, Backing::None);
    EXPECT_FALSE(none.holds_values());
    EXPECT_FALSE(none.contiguous());
    const std::vector<uint8_t> in(64, 7);
    none.write(uint64_t(8) << 30, in);
    none.fill(0, 1 << 20, 0xFF);
    std::vector<uint8_t> out(64, 0xEE);
    none.read(uint64_t(8) << 30, out);
    EXPECT_EQ(out, std::vector<uint8_t>(64, 0));
    none.read(0, out);
    EXPECT_EQ(out, std::vector<uint8_t>(64, 0));
    try {
        none.write((uint64_t(16) << 30) - 8, in);
        ADD_FAILURE() << "write past the end accepted";
    } catch (const std::out_of_range& e) {
        EXPECT_STREQ(e.what(),
                     "hbm0: write of 64 bytes at 0x3fffffff8 is outside its 17179869184 bytes");
    }
}

}  // namespace
}  // namespace tpu::hw
