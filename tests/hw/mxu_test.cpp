// SPDX-License-Identifier: Apache-2.0
// The fast MXU (MxuTimer, mxu_matmul) against the cycle-stepped PE-level reference
// (hw/reference/systolic_ref.h): same start and done cycle for every instruction and
// bit-identical results, on random instruction streams; plus hand-checked cases.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"
#include "hw/reference/systolic_ref.h"

namespace tpu::hw {
namespace {

using Op = SystolicRefInstr::Op;

constexpr uint16_t kOne = 0x3F80;    // 1.0
constexpr uint16_t k2p24 = 0x4B80;   // 2^24
constexpr uint16_t kM2p24 = 0xCB80;  // -2^24

/// Runs `prog` through MxuTimer and returns the spans.
std::vector<MxuSpan> fast_timing(uint32_t R, uint32_t C, bool drains,
                                 const std::vector<SystolicRefInstr>& p) {
    MxuTimer timer(R, C, drains);
    std::vector<MxuSpan> spans;
    for (const auto& ins : p)
        spans.push_back(ins.op == Op::Lw ? timer.lw(ins.ready) : timer.mm(ins.ready, ins.T));
    return spans;
}

SystolicRefInstr lw(uint64_t ready, int K, int N, const uint16_t* w) {
    SystolicRefInstr i;
    i.op = Op::Lw;
    i.ready = ready;
    i.K = K;
    i.N = N;
    i.w = w;
    return i;
}

SystolicRefInstr mm(uint64_t ready, uint32_t T, int K, int N, const uint16_t* lhs, float* out,
                    bool acc = false) {
    SystolicRefInstr i;
    i.op = Op::Mm;
    i.ready = ready;
    i.T = T;
    i.K = K;
    i.N = N;
    i.lhs = lhs;
    i.out = out;
    i.accumulate = acc;
    return i;
}

TEST(MxuTiming, HandCheckedFourByFour) {
    // R = C = 4, so an mm takes T + 4 + 4 - 2 = T + 6 cycles and an lw 4.
    const std::vector<uint16_t> w(16, kOne), a(16, kOne);
    std::vector<float> o0(16), o1(16), o2(16), o3(16);
    const std::vector<SystolicRefInstr> prog = {
        lw(0, 4, 4, w.data()),                // start 0, done 0 + 4 = 4
        mm(0, 4, 4, 4, a.data(), o0.data()),  // waits lw0: start 4, done 4 + 4 + 6 = 14;
                                              //   input free at 8, shadow free at 4
        lw(1, 4, 4, w.data()),                // max(1, prev start 4, path 4, shadow 4) = 4,
                                              //   done 8: loads while mm0 streams
        mm(0, 2, 4, 4, a.data(), o1.data()),  // max(0, 4, input 8, lw1 done 8) = 8,
                                              //   done 8 + 2 + 6 = 16; input free at 10
        mm(9, 3, 4, 4, a.data(), o2.data()),  // reuses lw1: max(9, 8, input 10) = 10,
                                              //   done 10 + 3 + 6 = 19; input free at 13
        lw(0, 4, 4, w.data()),                // max(0, prev start 10, path 8, shadow 8)
                                              //   = 10, done 14
        lw(0, 4, 4, w.data()),                // lw2 never used, overwritten: max(0, 10,
                                              //   path 14, shadow = lw2 done 14) = 14 -> 18
        mm(0, 1, 4, 4, a.data(), o3.data()),  // max(0, 14, input 13, lw3 done 18) = 18,
                                              //   done 18 + 1 + 6 = 25
    };
    const std::vector<MxuSpan> want = {{0, 4},   {4, 14},  {4, 8},   {8, 16},
                                       {10, 19}, {10, 14}, {14, 18}, {18, 25}};
    // The wavefront swap (mxu_swap_drains off): mm1 overlaps mm0's drain.
    const auto fast = fast_timing(4, 4, false, prog);
    const auto ref = SystolicRef(4, 4, false).run(prog);
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(fast[i].start, want[i].start) << "fast " << i;
        EXPECT_EQ(fast[i].done, want[i].done) << "fast " << i;
        EXPECT_EQ(ref[i].start, want[i].start) << "ref " << i;
        EXPECT_EQ(ref[i].done, want[i].done) << "ref " << i;
    }
    for (float v : o0) EXPECT_EQ(v, 4.0f);  // 1 * 1 summed over K = 4
}

TEST(MxuTiming, FourFoldsOf128) {
    // The hw/README.md example: R = C = T = 128, lw/mm per fold, everything ready at 0.
    // Fold 0: lw 0 -> 128, mm 128 -> 128 + 128 + 254 = 510. Fold f > 0: lw starts when the
    // previous mm started (shadow free), mm at max(previous mm start + T, lw done) = 128(f + 1).
    MxuTimer t(128, 128, false);
    uint64_t last = 0;
    for (uint64_t f = 0; f < 4; ++f) {
        const MxuSpan l = t.lw(0);
        EXPECT_EQ(l.start, 128 * f);
        EXPECT_EQ(l.done, 128 * (f + 1));
        const MxuSpan m = t.mm(0, 128);
        EXPECT_EQ(m.start, 128 * (f + 1));
        EXPECT_EQ(m.done, 128 * (f + 1) + 382);
        last = m.done;
    }
    EXPECT_EQ(last, 894u);  // closed form without overlap: 4 * (2R + C + T - 2) = 2040
}

TEST(MxuTiming, FourFoldsOf128WithDrainingSwaps) {
    // The same program when the array swaps weights only once it is empty (the default board).
    // Fold 0 as above: lw 0 -> 128, mm 128 -> 510. Fold f > 0: the lw fills the shadow from the
    // previous mm's start, but the mm waits for the previous mm's done:
    // start = 128 + 382 f, done = start + 382 (T + R + C - 2).
    MxuTimer t(128, 128, true);
    for (uint64_t f = 0; f < 4; ++f) {
        t.lw(0);
        const MxuSpan m = t.mm(0, 128);
        EXPECT_EQ(m.start, 128 + 382 * f);
        EXPECT_EQ(m.done, 510 + 382 * f);
    }
    // Matmuls that reuse the tile do not wait: the next one starts when the port frees.
    const MxuSpan again = t.mm(0, 128);
    EXPECT_EQ(again.start, 128 + 382 * 3 + 128);
}

TEST(MxuTiming, MatmulWithoutWeightsThrows) {
    MxuTimer t(4, 4, true);
    try {
        t.mm(0, 1);
        FAIL() << "no throw";
    } catch (const std::logic_error& e) {
        EXPECT_STREQ(e.what(), "mxu.mm without loaded weights");
    }
    const std::vector<uint16_t> a(4, kOne);
    std::vector<float> o(4);
    EXPECT_THROW(SystolicRef(4, 4, true).run({mm(0, 1, 4, 1, a.data(), o.data())}),
                 std::logic_error);
}

TEST(MxuNumerics, RowOrderAndSignedZero) {
    // Column 0: w = [1, 2^24, -2^24]. In row order (0 + 1) + 2^24 = 2^24 (the 1 is lost to
    // rounding), then - 2^24 = 0. Any other order that adds 1 last would give 1.
    // Column 1: w = [-0, -0, -0] with a = 1: products are -0, but +0 + -0 = +0, so +0.
    const std::vector<uint16_t> w = {kOne, 0x8000, k2p24, 0x8000, kM2p24, 0x8000};
    const std::vector<uint16_t> a = {kOne, kOne, kOne};
    std::vector<float> fast = {-0.0f, -0.0f}, ref = fast;
    mxu_matmul(a.data(), 1, 3, w.data(), 2, fast.data(), true);  // -0 + +0 = +0 as well
    SystolicRef(4, 4, true)
        .run({lw(0, 3, 2, w.data()), mm(0, 1, 3, 2, a.data(), ref.data(), true)});
    for (const auto* o : {&fast, &ref}) {
        EXPECT_EQ(std::bit_cast<uint32_t>((*o)[0]), 0u);
        EXPECT_EQ(std::bit_cast<uint32_t>((*o)[1]), 0u);
    }
    // inf * 1 + (-inf) * 1 = NaN, written as the canonical quiet NaN.
    const std::vector<uint16_t> w2 = {0x7F80, 0xFF80}, a2 = {kOne, kOne};
    float o2 = 0.0f;
    mxu_matmul(a2.data(), 1, 2, w2.data(), 1, &o2, false);
    EXPECT_EQ(std::bit_cast<uint32_t>(o2), kMxuNanBits);
}

/// Random bf16: mostly normal values over a few binades (so sums cancel and round), with
/// `special` probability of inf, NaN, denormal or signed zero. Without `extremes` no product
/// under- or overflows fp32 (mxu_matmul may then use fused multiply-add).
uint16_t random_bf16(std::mt19937& rng, double special, bool extremes = true) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
    if (u(rng) < special) {
        switch (rng() % 4) {
            case 0:
                return sign | 0x7F80;  // +-inf
            case 1:
                return sign | 0x7F80 | uint16_t(1 + rng() % 127);  // NaN, any payload
            case 2:
                return sign | uint16_t(1 + rng() % 127);  // denormal
            default:
                return sign;  // +-0
        }
    }
    // One in 50 from the extremes of the range, to overflow and underflow products.
    const uint32_t e = extremes && u(rng) < 0.02 ? (rng() & 1 ? 1 + rng() % 10 : 244 + rng() % 10)
                                                 : 127 - 6 + rng() % 13;
    return uint16_t(sign | (e << 7) | (rng() & 0x7F));
}

struct Stream {
    std::vector<SystolicRefInstr> prog;
    std::vector<std::vector<uint16_t>> data;  // weights and LHS
    std::vector<std::vector<float>> out_fast, out_ref;
};

/// A random lw/mm stream of `count` instructions for an R x C array.
Stream random_stream(std::mt19937& rng, uint32_t R, uint32_t C, int count, uint32_t max_T,
                     bool extremes) {
    Stream s;
    s.data.reserve(size_t(count));
    s.out_fast.reserve(size_t(count));
    s.out_ref.reserve(size_t(count));
    // Denormals are specials; without extremes only zeros, inf and NaN may appear.
    const double special = std::vector<double>{0.0, 0.003, 0.03}[rng() % 3];
    const auto value = [&] {
        uint16_t v = random_bf16(rng, special, extremes);
        while (!extremes && (v & 0x7F80) == 0 && (v & 0x7F) != 0)
            v = random_bf16(rng, special, extremes);
        return v;
    };
    uint64_t base = rng() % 8;
    int K = 0, N = 0;
    for (int i = 0; i < count; ++i) {
        // Ready cycles mostly increase, with bursts (delta 0), gaps, and some out of order.
        const uint32_t roll = rng() % 10;
        if (roll < 4)
            base += 0;
        else if (roll < 8)
            base += rng() % (R + 2);
        else
            base += rng() % (3 * (R + C));
        const uint64_t ready = roll == 9 && base > 20 ? base - rng() % 20 : base;
        const bool is_lw = i == 0 || rng() % 100 < 35;
        if (is_lw) {
            K = int(1 + rng() % R);
            N = int(1 + rng() % C);
            if (rng() % 3 == 0) K = int(R);  // full tiles are the common case
            if (rng() % 3 == 0) N = int(C);
            auto& w = s.data.emplace_back(size_t(K) * N);
            for (auto& v : w) v = value();
            // Rows of +-0 (padding channels) that the fast model skips where it may: a third of
            // the tiles lose some rows, sometimes all of them.
            if (rng() % 3 == 0) {
                const uint32_t every = 1 + rng() % 3;
                for (int k = 0; k < K; ++k)
                    if (k % every != 0 || every == 3)
                        for (int n = 0; n < N; ++n)
                            w[size_t(k) * N + size_t(n)] = rng() % 2 ? 0x8000 : 0x0000;
            }
            s.prog.push_back(lw(ready, K, N, w.data()));
            s.out_fast.emplace_back();
            s.out_ref.emplace_back();
        } else {
            const uint32_t T = 1 + rng() % max_T;
            auto& a = s.data.emplace_back(size_t(T) * K);
            for (auto& v : a) v = value();
            auto& of = s.out_fast.emplace_back(size_t(T) * N);
            for (auto& v : of) v = bf16_to_f32(random_bf16(rng, special));
            auto& orf = s.out_ref.emplace_back(of);
            (void)orf;
            s.prog.push_back(mm(ready, T, K, N, a.data(), nullptr, rng() % 2 == 0));
        }
    }
    for (size_t i = 0; i < s.prog.size(); ++i)
        if (s.prog[i].op == Op::Mm) s.prog[i].out = s.out_ref[i].data();
    return s;
}

/// Checks fast timing and functional results against the reference on `streams` streams.
void check_streams(uint32_t R, uint32_t C, uint32_t seed, int streams, int count, uint32_t max_T,
                   bool extremes = true) {
    std::mt19937 rng(seed);
    for (int si = 0; si < streams; ++si) {
        Stream s = random_stream(rng, R, C, count, max_T, extremes);
        // Fast path: MxuTimer plus mxu_matmul with the weights of the latest lw.
        const bool drains = si % 2 == 1;  // both swap rules, alternately
        const auto fast = fast_timing(R, C, drains, s.prog);
        const uint16_t* w = nullptr;
        for (size_t i = 0; i < s.prog.size(); ++i) {
            const auto& ins = s.prog[i];
            if (ins.op == Op::Lw) {
                w = ins.w;
            } else {
                mxu_matmul(ins.lhs, int(ins.T), ins.K, w, ins.N, s.out_fast[i].data(),
                           ins.accumulate);
            }
        }
        const auto ref = SystolicRef(R, C, drains).run(s.prog);
        ASSERT_EQ(ref.size(), fast.size());
        for (size_t i = 0; i < fast.size(); ++i) {
            ASSERT_EQ(fast[i].start, ref[i].start)
                << R << "x" << C << " stream " << si << " instr " << i;
            ASSERT_EQ(fast[i].done, ref[i].done)
                << R << "x" << C << " stream " << si << " instr " << i;
            const auto& of = s.out_fast[i];
            const auto& orf = s.out_ref[i];
            ASSERT_EQ(of.size(), orf.size());
            // Bits, not values: NaN == NaN, +0 != -0.
            if (of.empty()) continue;  // memcmp of null pointers is undefined even for 0 bytes
            ASSERT_EQ(std::memcmp(of.data(), orf.data(), of.size() * sizeof(float)), 0)
                << R << "x" << C << " stream " << si << " instr " << i;
        }
    }
}

TEST(MxuVsReference, Random4x4) {
    check_streams(4, 4, 1, 200, 40, 12);
}
TEST(MxuVsReference, Random8x8) {
    check_streams(8, 8, 2, 150, 40, 20);
}
TEST(MxuVsReference, Random16x16) {
    check_streams(16, 16, 3, 80, 40, 40);
}
TEST(MxuVsReference, RandomNonSquare) {
    check_streams(4, 12, 4, 80, 30, 16);  // C > R: a row's weight pipeline outlives a load
    check_streams(12, 4, 5, 80, 30, 16);
}
TEST(MxuVsReference, Random128x128) {
    const auto t0 = std::chrono::steady_clock::now();
    check_streams(128, 128, 6, 3, 16, 256);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RecordProperty("seconds", std::to_string(s));
}
TEST(MxuVsReference, Random256x256) {
    // The v6e-8 preset's array (configs/v6e-8.json): a few short streams, as the PE-level
    // reference steps 65536 PEs a cycle.
    check_streams(256, 256, 9, 2, 10, 300);
}
TEST(MxuVsReference, RandomWithoutExtremes) {
    // Every product exact in fp32: the fused multiply-add path of mxu_matmul where the host has
    // one (see mxu_model.cpp), the separate multiply and add elsewhere.
    check_streams(16, 16, 7, 40, 40, 40, false);
    check_streams(128, 128, 8, 2, 16, 200, false);
}

}  // namespace
}  // namespace tpu::hw
