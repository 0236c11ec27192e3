// SPDX-License-Identifier: Apache-2.0
// How fast the compiled dot fusions run (compiler/README.md, "Code generation", "Dot fusions
// as fast as the library GEMM"; issue #29): a parameter that a dot streams lies in the MXU's
// tiles, so each streamed panel is whole contiguous tiles; bit-exact with the evaluator on the
// device (race detector on, one launch), and the BERT block's ffn dots against the library
// GEMM of the same shape in the steady state (the third step: the parameters in their
// kernels' layouts).
#include <gtest/gtest.h>

#include <iostream>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "driver/device.h"
#include "driver/kernels/gemm.h"
#include "driver/program_cache.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::Leaf;
using test::randoms;
using test::Record;

TEST(CompilerDotPerfDevice, AStreamedWeightLiesInMxuTilesBitExact) {
    // relu(x W^T + b) + r, x 256 x 256, W 1024 x 256: the planner streams W's 1024 rows
    // (C^T = W x^T). W lies in the MXU's tiles as a held weight does, K major
    // ({0,1:T(128,128)}, DotLayout::Tiles): the transposed problem's streamed panel of a block
    // is the block's tiles of one tile row, one contiguous run, each tile transposed in VMEM.
    const Shape xs{DType::F32, {256, 256}}, ws{DType::F32, {1024, 256}}, bs{DType::F32, {1024}},
        rs{DType::F32, {256, 1024}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return add(g, relu(g, linear(g, v[0], v[1], v[2])), v[3]);
    };
    expect_bit_exact({{"x", xs, {randoms(256 * 256, 71)}},
                      {"w", ws, {randoms(1024 * 256, 72)}, true},
                      {"b", bs, {randoms(1024, 73)}, true},
                      {"r", rs, {randoms(256 * 1024, 74)}}},
                     record);
    Graph g;
    std::vector<ValueId> v{g.input(xs, "x"), g.parameter(ws, "w"), g.parameter(bs, "b"),
                           g.input(rs, "r")};
    g.add_output(record(g, v), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(s.parameters[0].layout.to_string(), "{0,1:T(128,128)}");
}

TEST(CompilerDotPerfDevice, APaddedContractingDimKeepsTheEightByOneTwentyEightTiles) {
    // K = 200 is no whole number of MXU tiles: the streamed weight stays in T(8,128), whose
    // padded last lanes the kernel reads band by band.
    const Shape xs{DType::F32, {256, 200}}, ws{DType::F32, {1024, 200}}, bs{DType::F32, {1024}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return linear(g, v[0], v[1], v[2]);
    };
    expect_bit_exact({{"x", xs, {randoms(256 * 200, 95)}},
                      {"w", ws, {randoms(1024 * 200, 96)}, true},
                      {"b", bs, {randoms(1024, 97)}, true}},
                     record);
    Graph g;
    g.add_output(record(g, {g.input(xs, "x"), g.parameter(ws, "w"), g.parameter(bs, "b")}), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(s.parameters[0].layout.to_string(), "{1,0:T(8,128)}");
}

/// The library GEMM of the same shape on one core (`tpusim gemm --m M --k K --n N`).
uint64_t library_gemm_cycles(uint32_t M, uint32_t K, uint32_t N) {
    const auto cfg = hw::BoardConfig::load("", {"sim.functional=false"});
    auto dev = driver::Device::open(cfg);
    driver::ProgramCache cache;
    const std::vector<float> a(size_t(M) * K), w(size_t(K) * N);
    const driver::GemmResult r =
        driver::gemm(*dev, cache, a, w, M, K, N, driver::Precision::Bf16, {0});
    return r.event.end_cycle - r.event.start_cycle;
}

TEST(CompilerDotPerf, TheBertFfnDotsRunWithinTwentyPercentOfTheLibraryGemm) {
    // BERT-base's ffn (hidden 768, seq 512): fc_1 512 x 768 x 3072 with bias and GELU, fc_2
    // 512 x 3072 x 768 with bias and the residual, as `tpusim model bert-block` compiles them.
    // Both stream their weight (C^T = W^T x^T, the longer side) from its MXU tiles (a block's
    // panel one contiguous run), fp32 converted to bf16 in VMEM; fc_1 writes h transposed in MXU
    // tiles and fc_2 holds it as it lies; each panel's epilogue runs beside a step of the next
    // group. The library GEMM (58 572 and 58 262 cycles) reads bf16 tile-major operands the host
    // packed. Lower bounds: the MXUs' MACs, 512 x 768 x 3072 / (2 x 128 x 128) = 36 864 cycles; the
    // fp32 weight once at HBM peak, 9 437 184 B / 479.5 B per cycle = 19 682. What is left
    // above the library: each block's first group reads the fp32 weight panel (512 KiB for
    // fc_1's blocks of 1024 streamed rows) and two held tiles per 1 278-cycle step, more than
    // the HBM's peak, so those steps are HBM-bound (twice the library's bf16 bytes). Was 99 464
    // and 129 820 cycles (the weight in 8 x 128 tiles: strided 4 KiB runs, one opened HBM row
    // each; the epilogue of both panels at once beside one MXU step).
    const auto [fc1, fc2] = test::steady_ffn_cycles(512, 768, 3072, false);
    const uint64_t lib1 = library_gemm_cycles(512, 768, 3072);
    const uint64_t lib2 = library_gemm_cycles(512, 3072, 768);
    std::cout << fmt::format("[bert ffn] fc_1 {} cycles (library GEMM {}), fc_2 {} ({})\n", fc1,
                             lib1, fc2, lib2);
    EXPECT_GE(fc1, 36864u);
    EXPECT_GE(fc2, 36864u);
    EXPECT_LE(double(fc1), 1.2 * double(lib1));
    EXPECT_LE(double(fc2), 1.2 * double(lib2));
}

}  // namespace
}  // namespace tpu::compiler
