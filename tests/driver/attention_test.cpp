// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "driver/kernels/attention.h"
#include "tests/common/paths.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::open_device;
using tutil::random_values;

/// fp64 attention of one head (the math the bf16 kernel approximates).
std::vector<double> attention64(const AttentionShape& s, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v,
                                uint32_t g) {
    const uint32_t S = s.seq, D = s.dhead;
    const size_t base = size_t(g) * S * D;
    std::vector<double> o(size_t(S) * D, 0.0), p(S);
    for (uint32_t i = 0; i < S; ++i) {
        double m = -INFINITY, sum = 0;
        for (uint32_t j = 0; j < S; ++j) {
            double d = 0;
            for (uint32_t c = 0; c < D; ++c) d += double(q[base + i * D + c]) * k[base + j * D + c];
            p[j] = (s.causal && j > i) ? -INFINITY : d / std::sqrt(double(D));
            m = std::max(m, p[j]);
        }
        for (uint32_t j = 0; j < S; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (uint32_t j = 0; j < S; ++j)
            for (uint32_t c = 0; c < D; ++c) o[i * D + c] += p[j] / sum * v[base + j * D + c];
    }
    return o;
}

/// Forward and backward on `cores` with different data per replica, bit-exact against the
/// references, and the forward within bf16 rounding of the fp64 attention; on the default
/// board or on `preset` (configs/NAME.json).
void check_attention(const std::vector<uint32_t>& cores, const AttentionShape& s, uint32_t seed,
                     const std::string& preset = "") {
    SCOPED_TRACE(fmt::format("{}x{}x{}x{} causal={} on {} cores {}", s.batch, s.heads, s.seq,
                             s.dhead, s.causal, cores.size(), preset));
    auto dev =
        preset.empty()
            ? open_device()
            : Device::open(hw::BoardConfig::load(
                  test::source_dir() + "/configs/" + preset + ".json", {"sim.race_detector=true"}));
    ProgramCache cache;
    const uint32_t rows = s.groups() * s.seq;
    auto t = [&](uint32_t cols) { return alloc_tensor(*dev, cores, rows, cols); };
    Tensor q = t(s.dhead), k = t(s.dhead), v = t(s.dhead), dout = t(s.dhead), o = t(s.dhead);
    Tensor p = t(s.seq), dq = t(s.dhead), dk = t(s.dhead), dv = t(s.dhead);
    std::vector<std::vector<float>> in(cores.size() * 4);
    for (size_t i = 0; i < cores.size(); ++i) {
        const Tensor* ts[] = {&q, &k, &v, &dout};
        for (int j = 0; j < 4; ++j) {
            in[i * 4 + j] = random_values(size_t(rows) * s.dhead, seed + uint32_t(i * 4 + j));
            write_tensor(*dev, *ts[j], i, in[i * 4 + j]);
        }
    }
    attention(*dev, cache, s, q, k, v, o, p);
    attention_grad(*dev, cache, s, q, k, v, p, dout, dq, dk, dv);
    const uint32_t R = dev->config().core.mxu_rows;
    for (size_t i = 0; i < cores.size(); ++i) {
        const auto& qv = in[i * 4];
        const auto& kv = in[i * 4 + 1];
        const auto& vv = in[i * 4 + 2];
        const auto fwd = attention_reference(s, qv, kv, vv, R);
        const auto got = read_tensor(*dev, o, i);
        ASSERT_EQ(bits_of(got), bits_of(fwd.o)) << "replica " << i;
        ASSERT_EQ(bits_of(read_tensor(*dev, p, i)), bits_of(fwd.p)) << "replica " << i;
        const auto bwd = attention_grad_reference(s, qv, kv, vv, fwd.p, in[i * 4 + 3], R);
        EXPECT_EQ(bits_of(read_tensor(*dev, dq, i)), bits_of(bwd.dq)) << "replica " << i;
        EXPECT_EQ(bits_of(read_tensor(*dev, dk, i)), bits_of(bwd.dk)) << "replica " << i;
        EXPECT_EQ(bits_of(read_tensor(*dev, dv, i)), bits_of(bwd.dv)) << "replica " << i;
        const auto exact = attention64(s, qv, kv, vv, s.groups() - 1);
        const size_t base = size_t(s.groups() - 1) * s.seq * s.dhead;
        for (size_t j = 0; j < exact.size(); ++j)
            ASSERT_NEAR(got[base + j], exact[j], 3e-2) << "value " << j;
    }
}

TEST(Attention, BitExactOnOneCoreWithSeqNotAMultipleOf128) {
    check_attention({0}, {.batch = 1, .heads = 2, .seq = 130, .dhead = 24}, 11);
}

TEST(Attention, CausalBitExactOnOneCore) {
    check_attention({0}, {.batch = 2, .heads = 1, .seq = 67, .dhead = 16, .causal = true}, 12);
}

TEST(Attention, CausalBitExactPerReplicaOnEightCores) {
    check_attention({0, 1, 2, 3, 4, 5, 6, 7},
                    {.batch = 1, .heads = 2, .seq = 20, .dhead = 8, .causal = true}, 13);
}

TEST(Attention, OneHeadPerBlockWithTwoKeyTilesBitExact) {
    // 3 heads of 200 rows exceed a block of 512 rows: one head per block, rows halved over the
    // MXUs in P V.
    check_attention({0}, {.batch = 1, .heads = 3, .seq = 200, .dhead = 64}, 14);
}

TEST(Attention, OneKeyTileOneHeadCausalBitExact) {
    // One score tile: both MXUs take half its rows.
    check_attention({0}, {.batch = 1, .heads = 1, .seq = 50, .dhead = 128, .causal = true}, 15);
}

TEST(Attention, FourMxusOfEitherArrayAreBitExact) {
    // v4-8's four 128 x 128 MXUs and v6e-8's four 256 x 256 (issue 27): the fused block with
    // key tiles of the array's width (seq 300: two tiles of 256, three of 128), causal; dhead
    // 200 fits v6e's array and runs per head on v4's.
    for (const char* preset : {"v4-8", "v6e-8"}) {
        check_attention({0}, {.batch = 1, .heads = 3, .seq = 300, .dhead = 64}, 17, preset);
        check_attention({0}, {.batch = 1, .heads = 2, .seq = 130, .dhead = 200, .causal = true}, 18,
                        preset);
    }
}

TEST(Attention, DheadBeyondTheArrayUsesPerHeadMatmulsBitExact) {
    check_attention({0}, {.batch = 1, .heads = 2, .seq = 24, .dhead = 130}, 16);
}

TEST(Attention, WrongShapesAreUsageErrors) {
    auto dev = open_device();
    ProgramCache cache;
    const AttentionShape s{.batch = 1, .heads = 2, .seq = 4, .dhead = 8};
    Tensor a = alloc_tensor(*dev, {0}, 8, 8), pbad = alloc_tensor(*dev, {0}, 8, 8);
    EXPECT_NE(tutil::error_of([&] { attention(*dev, cache, s, a, a, a, a, pbad); }, true)
                  .find("attention: p is 8 x 8"),
              std::string::npos);
    // Issue #30, class 1: batch x heads wrapped in 32 bits (65537 x 65537 = 2^32 + 2^17 + 1
    // -> 131073 heads), so tensors sized for the wrapped count passed. In 64 bits it is refused.
    const AttentionShape huge{.batch = 65537, .heads = 65537, .seq = 1, .dhead = 1};
    Tensor t = alloc_tensor(*dev, {0}, 131073, 1);
    EXPECT_EQ(tutil::error_of([&] { attention(*dev, cache, huge, t, t, t, t, t); }, true),
              "attention: batch 65537 x heads 65537 x seq 1 = 4295098369 rows, more than a "
              "tensor holds (2^32 - 1)");
}

TEST(Tensor, SizesBeyondWhatAKernelAddressesAreUsageErrors) {
    // 2^31 x 2^31 fp32 values are 2^64 bytes, which wrapped to "alloc: 0 bytes requested".
    auto dev = open_device();
    EXPECT_EQ(tutil::error_of([&] { alloc_tensor(*dev, {0}, 2147483648u, 2147483648u); }, true),
              "a tensor of 2147483648 x 2147483648 fp32 values is larger than the 4 GiB a kernel "
              "addresses");
    // A view whose offset alone runs past its tensor.
    Tensor t = alloc_tensor(*dev, {0}, 4, 4);
    EXPECT_NE(tutil::error_of([&] { view(t, UINT64_MAX - 2, 2, 2); }, true).find("view of 2 x 2"),
              std::string::npos);
}

}  // namespace
}  // namespace tpu::driver
