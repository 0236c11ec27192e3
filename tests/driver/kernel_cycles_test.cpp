// SPDX-License-Identifier: Apache-2.0
// Cycles of the issue-16 kernels on the default board (timing-only, values not computed), the
// figures driver/README.md quotes, pinned so that a change in their cost is seen.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <utility>

#include "driver/kernels/attention.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
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

/// Forward and backward of `s` on core 0; returns their cycles.
std::pair<uint64_t, uint64_t> attention_cycles(const AttentionShape& s) {
    auto dev = timing_only();
    ProgramCache cache;
    auto t = [&](uint32_t cols) { return alloc_tensor(*dev, {0}, s.groups() * s.seq, cols); };
    Tensor q = t(s.dhead), k = t(s.dhead), v = t(s.dhead), o = t(s.dhead), p = t(s.seq);
    Tensor dq = t(s.dhead), dk = t(s.dhead), dv = t(s.dhead);
    const Event f = attention(*dev, cache, s, q, k, v, o, p);
    const Event b = attention_grad(*dev, cache, s, q, k, v, p, o, dq, dk, dv);
    std::printf("attention %ux%ux%ux%u%s: forward %llu cycles (%.3f s), backward %llu (%.3f s)\n",
                s.batch, s.heads, s.seq, s.dhead, s.causal ? " causal" : "",
                (unsigned long long)cycles(f), f.host_seconds, (unsigned long long)cycles(b),
                b.host_seconds);
    for (const KernelStats& ks : dev->kernel_stats())
        std::printf("  %s: %llu launches, %llu cycles, MXU %.1f%%\n", ks.name.c_str(),
                    (unsigned long long)ks.launches, (unsigned long long)ks.cycles,
                    100 * ks.mxu_utilization());
    return {cycles(f), cycles(b)};
}

TEST(KernelCycles, Attention12Heads512x64OnOneCore) {
    // One launch each, a head per block (driver/README.md "Attention" derives the forward).
    const auto [fwd, bwd] = attention_cycles({.batch = 1, .heads = 12, .seq = 512, .dhead = 64});
    // Before the fused kernels: 346 917 forward in 73 launches, 735 258 backward.
    EXPECT_EQ(fwd, 119892u);
    EXPECT_EQ(bwd, 166659u);
}

TEST(KernelCycles, GptAttention16x4x64x32CausalOnOneCore) {
    // 64 heads in blocks of 8 (512 rows): 8 blocks per launch.
    const auto [fwd, bwd] =
        attention_cycles({.batch = 16, .heads = 4, .seq = 64, .dhead = 32, .causal = true});
    // Before: 673 714 forward and 1 332 740 backward, 3 launches per head and product.
    EXPECT_EQ(fwd, 32305u);
    EXPECT_EQ(bwd, 58114u);
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

/// Cycles of tensor_ops::matmul of op(a) (M x K) x b (K x N), bf16, on core 0.
uint64_t matmul_cycles(Device& dev, uint32_t M, uint32_t K, uint32_t N, bool ta) {
    ProgramCache cache;
    Tensor a = ta ? alloc_tensor(dev, {0}, K, M) : alloc_tensor(dev, {0}, M, K);
    Tensor b = alloc_tensor(dev, {0}, K, N), c = alloc_tensor(dev, {0}, M, N);
    const Event e = matmul(dev, cache, a, ta, b, false, c, Precision::Bf16);
    for (Tensor* x : {&a, &b, &c}) free_tensor(dev, *x);
    std::printf("matmul %ux%ux%u%s bf16: %llu cycles\n", M, K, N, ta ? " (a transposed)" : "",
                (unsigned long long)cycles(e));
    return cycles(e);
}

TEST(KernelCycles, BertProjectionMatmulsOnOneCore) {
    // BERT-base, seq 512: the q projection, fc_1 and fc_2 (driver/README.md, "matmul" derives
    // the first). Before the fused kernel (two packing launches and the GEMM): 40 161, 167 635
    // and 132 104.
    auto dev = timing_only();
    EXPECT_EQ(matmul_cycles(*dev, 512, 768, 768, false), 20418u);
    EXPECT_EQ(matmul_cycles(*dev, 512, 768, 3072, false), 138196u);
    EXPECT_EQ(matmul_cycles(*dev, 512, 3072, 768, false), 98057u);
}

TEST(KernelCycles, BertWeightGradientMatmulsOnOneCore) {
    // The weight gradients x^T dy of the same layers: a transposed, K = seq. Before: 41 171,
    // 180 398 and 148 467.
    auto dev = timing_only();
    EXPECT_EQ(matmul_cycles(*dev, 768, 512, 768, true), 18327u);
    EXPECT_EQ(matmul_cycles(*dev, 768, 512, 3072, true), 140638u);
    EXPECT_EQ(matmul_cycles(*dev, 3072, 512, 768, true), 57388u);
}

}  // namespace
}  // namespace tpu::driver
