// SPDX-License-Identifier: Apache-2.0
// bf16 conversion and the fp32 split of the numerics contract (hw/README.md, "MXU numerics").
// Expected bits are worked out by hand in the comments; a random sweep compares against an
// independent nearest-value search in double precision.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "hw/core/numerics.h"

namespace tpu::hw {
namespace {

uint16_t cvt(uint32_t bits) {
    return f32_to_bf16(std::bit_cast<float>(bits));
}
uint32_t bits_of(float x) {
    return std::bit_cast<uint32_t>(x);
}

TEST(Numerics, TiesGoToEven) {
    // 0x3F80_8000 is exactly halfway between 0x3F80 and 0x3F81: 0x3F80 is even, stays.
    EXPECT_EQ(cvt(0x3F808000u), 0x3F80);
    // Halfway between 0x3F81 (odd) and 0x3F82: rounds up to the even one.
    EXPECT_EQ(cvt(0x3F818000u), 0x3F82);
    // The same for negative values (the magnitude rounds, the sign stays).
    EXPECT_EQ(cvt(0xBF808000u), 0xBF80);
    EXPECT_EQ(cvt(0xBF818000u), 0xBF82);
    // Just off the tie goes to the nearer neighbour.
    EXPECT_EQ(cvt(0x3F808001u), 0x3F81);
    EXPECT_EQ(cvt(0x3F807FFFu), 0x3F80);
    // 1 + 2^-8 is the tie between 1.0 and 1 + 2^-7.
    EXPECT_EQ(bits_of(bf16_round(1.00390625f)), 0x3F800000u);
}

TEST(Numerics, CarryIntoExponentAndOverflow) {
    // 0x3FFF_8000 (1.99996...) halfway, 0x3FFF odd: rounds up to 0x4000 = 2.0.
    EXPECT_EQ(cvt(0x3FFF8000u), 0x4000);
    // Largest finite fp32 is above the halfway point after 0x7F7F (largest finite bf16): inf.
    EXPECT_EQ(cvt(0x7F7FFFFFu), 0x7F80);
    EXPECT_EQ(cvt(0xFF7FFFFFu), 0xFF80);
    // Exactly halfway to the next binade with 0x7F7F odd: ties to even = inf.
    EXPECT_EQ(cvt(0x7F7F8000u), 0x7F80);
    // Below halfway stays the largest finite bf16.
    EXPECT_EQ(cvt(0x7F7F7FFFu), 0x7F7F);
}

TEST(Numerics, InfinitiesZerosAndNaN) {
    EXPECT_EQ(cvt(0x7F800000u), 0x7F80);  // +inf
    EXPECT_EQ(cvt(0xFF800000u), 0xFF80);  // -inf
    EXPECT_EQ(cvt(0x00000000u), 0x0000);  // +0
    EXPECT_EQ(cvt(0x80000000u), 0x8000);  // -0 keeps its sign
    EXPECT_EQ(cvt(0x7FC00000u), 0x7FC0);  // quiet NaN unchanged
    // A signalling NaN whose payload sits only in the dropped bits would truncate to inf and
    // rounding could carry it anywhere: it becomes a quiet NaN instead.
    EXPECT_EQ(cvt(0x7F800001u), 0x7FC0);
    EXPECT_EQ(cvt(0x7FFFFFFFu), 0x7FFF);  // all-ones payload: no carry out of the NaN
    // Negative signalling NaN 0xFFA0_0000: quietened (bit 6), sign and top payload kept.
    EXPECT_EQ(cvt(0xFFA00000u), 0xFFE0);
    for (uint32_t payload : {0x1u, 0x7FFFu, 0x8000u, 0x400000u, 0x7FFFFFu}) {
        const uint16_t h = cvt(0x7F800000u | payload);
        EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << payload;
        EXPECT_EQ(h & 0x8000, 0);
    }
}

TEST(Numerics, DenormalsAreKept) {
    EXPECT_EQ(cvt(0x00010000u), 0x0001);  // smallest bf16 denormal, 2^-133: exact
    EXPECT_EQ(cvt(0x80010000u), 0x8001);
    EXPECT_EQ(cvt(0x00018000u), 0x0002);  // halfway, 0x0001 odd: up
    EXPECT_EQ(cvt(0x00008000u), 0x0000);  // halfway between +0 and 2^-133: down to even +0
    EXPECT_EQ(cvt(0x00008001u), 0x0001);  // above halfway: up, not flushed
    EXPECT_EQ(cvt(0x00000001u), 0x0000);  // smallest fp32 denormal is far below half
    EXPECT_EQ(cvt(0x807F8000u), 0x8080);  // largest denormal rounds up to the smallest normal
    EXPECT_EQ(bits_of(bf16_to_f32(0x0001)), 0x00010000u);
    EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
    EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
    EXPECT_EQ(bits_of(bf16_to_f32(0x8000)), 0x80000000u);
}

// Independent check: the bf16 value nearest to x, found by comparing distances in double.
uint16_t nearest_bf16(uint32_t u) {
    const uint16_t lo = uint16_t(u >> 16);  // magnitude truncated
    if ((u & 0xFFFFu) == 0) return lo;
    const uint16_t hi = uint16_t(lo + 1);  // next magnitude up (may be inf)
    const double x = std::fabs(double(std::bit_cast<float>(u)));
    const double dl = std::fabs(double(bf16_to_f32(lo)));
    // Rounding past the largest finite value: inf stands for 2^128 with unbounded exponent.
    const double dh =
        (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(double(bf16_to_f32(hi)));
    if (x - dl < dh - x) return lo;
    if (x - dl > dh - x) return hi;
    return (lo & 1) ? hi : lo;
}

TEST(Numerics, RandomMatchesNearestValueSearch) {
    std::mt19937 rng(20240611);
    for (int i = 0; i < 2000000; ++i) {
        const uint32_t u = rng();
        if (std::isnan(std::bit_cast<float>(u))) continue;
        ASSERT_EQ(cvt(u), nearest_bf16(u)) << std::hex << u;
    }
    // Every tie pattern around every exponent.
    for (uint32_t e = 0; e < 255; ++e)
        for (uint32_t m : {0x0000u, 0x8000u, 0x18000u, 0x7F8000u, 0x7FFFFFu, 0x7F7FFFu})
            for (uint32_t s : {0u, 0x80000000u}) {
                const uint32_t u = s | (e << 23) | m;
                ASSERT_EQ(cvt(u), nearest_bf16(u)) << std::hex << u;
            }
}

TEST(Numerics, Split3HandCase) {
    // x = 1 + 2^-9 + 2^-20: 2^-9 + 2^-20 is below half an ulp of 1.0 in bf16 (2^-8), so hi = 1;
    // mid = bf16(2^-9 + 2^-20) = 2^-9 (2^-20 is below half its ulp 2^-16); lo = 2^-20.
    const float x = 1.0f + std::ldexp(1.0f, -9) + std::ldexp(1.0f, -20);
    const auto [hi, mid, lo] = split3(x);
    EXPECT_EQ(bf16_to_f32(hi), 1.0f);
    EXPECT_EQ(bf16_to_f32(mid), std::ldexp(1.0f, -9));
    EXPECT_EQ(bf16_to_f32(lo), std::ldexp(1.0f, -20));
    // Rounding up in hi makes mid negative: x = 1 + 2^-7 - 2^-12 rounds to hi = 1 + 2^-7.
    const float y = 1.0f + std::ldexp(1.0f, -7) - std::ldexp(1.0f, -12);
    const auto [h2, m2, l2] = split3(y);
    EXPECT_EQ(bf16_to_f32(h2), 1.0f + std::ldexp(1.0f, -7));
    EXPECT_EQ(bf16_to_f32(m2), -std::ldexp(1.0f, -12));
    EXPECT_EQ(l2, 0x0000);
}

TEST(Numerics, Split3ReconstructsExactly) {
    // x - hi is exact and has at most 16 significant bits below hi's ulp; mid takes 8 of them
    // and the rest (at most 8) fit lo exactly. So hi + mid + lo == x as real numbers whenever
    // no part falls below the bf16 denormal range (|x| >= 2^-100 is plenty).
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> exp(127 - 100, 127 + 100);
    for (int i = 0; i < 200000; ++i) {
        const uint32_t u = (rng() & 0x807FFFFFu) | (exp(rng) << 23);
        const float x = std::bit_cast<float>(u);
        const auto [hi, mid, lo] = split3(x);
        const double sum =
            double(bf16_to_f32(hi)) + double(bf16_to_f32(mid)) + double(bf16_to_f32(lo));
        ASSERT_EQ(sum, double(x)) << std::hex << u;
        // The parts shrink by at least 2^-8 each (ulp step of bf16).
        ASSERT_LE(std::fabs(bf16_to_f32(mid)), std::ldexp(std::fabs(x), -8)) << std::hex << u;
    }
    // One pass alone errs by at most half a bf16 ulp (2^-9 relative).
    const float pi = 3.14159265f;
    EXPECT_LE(std::fabs(bf16_round(pi) - pi), std::ldexp(pi, -9));
}

}  // namespace
}  // namespace tpu::hw
