// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the builder GEMM and fused matmul kernels emit the same
// binaries as the text kernels they replace, for every tiling the planners choose on many
// shapes and boards and for random tilings.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "driver/kernels/gemm.h"
#include "driver/kernels/matmul_kernel.h"
#include "hw/board.h"

namespace tpu::driver::text {
isa::Program gemm_program_text(const GemmTiling& t, uint32_t n_out);
isa::Program matmul_program_text(const MatmulKey& t);
}  // namespace tpu::driver::text

namespace tpu::driver {
namespace {

std::string describe(const GemmKey& k) {
    const GemmTiling& t = k.tiling;
    return fmt::format("R{} C{} Kp{} Np{} T{} mxus{} {} tiled{} stream{} compact{}", t.R, t.C,
                       t.Kp, t.Np, t.block_rows, t.mxus, precision_name(t.precision), t.tiled,
                       t.a_stream, k.compact_cols);
}
std::string describe(const MatmulKey& t) {
    return fmt::format("R{} C{} M{} K{} N{} ta{} tb{} T{} mxus{} {} bias{}", t.R, t.C, t.M, t.K,
                       t.N, t.ta, t.tb, t.block_rows, t.mxus, precision_name(t.precision), t.bias);
}

TEST(GemmMigration, BuilderProgramsEqualTheTextKernels) {
    std::mt19937 rng(7);
    std::vector<GemmKey> gkeys;
    std::vector<MatmulKey> mkeys;
    const std::vector<std::vector<std::string>> boards = {
        {}, {"core.vmem_bytes=1048576"}, {"core.vmem_bytes=2097152"}, {"core.mxus=1"},
        {"core.mxu_rows=8", "core.mxu_cols=8"}};
    const Precision precs[] = {Precision::Bf16, Precision::Fp32Pass3, Precision::Fp32Pass6};
    std::vector<std::array<uint32_t, 3>> shapes = {
        {1, 1, 1},       {37, 300, 129},   {300, 1152, 129}, {8, 256, 129},   {64, 2048, 300},
        {256, 512, 1024}, {1100, 384, 640}, {129, 300, 384},  {1100, 1152, 640}, {600, 1024, 640},
        {300, 260, 140}, {512, 768, 768},  {512, 768, 3072}, {512, 3072, 768}, {1024, 1024, 1024},
        {32, 784, 512},  {5000, 8192, 512}, {16, 100, 10},   {100, 784, 32},  {2, 3, 4}};
    std::uniform_int_distribution<uint32_t> d(1, 700);
    for (int i = 0; i < 30; ++i) shapes.push_back({d(rng), d(rng), d(rng)});
    for (const auto& o : boards) {
        const auto cfg = hw::BoardConfig::load("", o);
        for (const auto& [M, K, N] : shapes)
            for (Precision p : precs) {
                try {
                    GemmTiling t = plan_gemm(cfg, M, K, N, p);
                    gkeys.push_back({t, 0});
                    if (N > t.Np - t.C) gkeys.push_back({t, N});
                    t.tiled = true;
                    gkeys.push_back({t, 0});
                    t.a_stream = !t.a_stream;
                    gkeys.push_back({t, 0});
                } catch (const DeviceError&) {
                }
                for (bool ta : {false, true})
                    for (bool tb : {false, true})
                        for (bool bias : {false, true})
                            if (auto mt = plan_matmul(cfg, M, K, N, ta, tb, p, bias))
                                mkeys.push_back(*mt);
            }
    }
    // Small block rows (several blocks) on the default MXU.
    for (const auto& [M, K, N] : shapes)
        for (Precision p : precs) {
            MatmulKey t{.M = M, .K = K, .N = N, .ta = M % 2 == 0, .tb = N % 3 == 0,
                        .precision = p, .block_rows = 8 * (1 + M % 5), .bias = K % 2 == 1};
            mkeys.push_back(t);
            GemmTiling g{.R = 128, .C = 128, .Kp = (K + 127) / 128 * 128,
                         .Np = (N + 127) / 128 * 128, .block_rows = 8 * (1 + M % 7),
                         .mxus = 1 + N % 2, .precision = p, .tiled = M % 3 == 0,
                         .a_stream = K % 3 == 0};
            gkeys.push_back({g, 0});
        }
    int checked = 0;
    for (const GemmKey& k : gkeys) {
        const auto want = isa::encode_program(text::gemm_program_text(k.tiling, k.compact_cols));
        const isa::Program got = generate(k);
        ASSERT_EQ(isa::encode_program(got), want) << describe(k);
        ++checked;
    }
    for (const MatmulKey& k : mkeys) {
        const auto want = isa::encode_program(text::matmul_program_text(k));
        const isa::Program got = generate(k);
        ASSERT_EQ(isa::encode_program(got), want) << describe(k);
        ++checked;
    }
    EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace tpu::driver
