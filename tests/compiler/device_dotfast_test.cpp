// SPDX-License-Identifier: Apache-2.0
// Dot fusions with the activations stationary and an fp32 weight streamed, each panel of the
// weight read once (compiler/README.md, "Dot fusions as fast as the library GEMM"; issue #29):
// a group of several column panels per MXU (DotKey::group_panels), bit-exact with the evaluator
// on the device (race detector on, one launch) with the ReLU and the residual epilogues; the
// planner's choice of the width.
#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "device_test_util.h"
#include "driver/kernels/matmul_kernel.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::randoms;
using test::Record;

TEST(CompilerDotFast, TheFusedPlannerReadsAnFp32StreamedWeightOnce) {
    // BERT-large's fc_1 (512 x 1024 x 4096, bias + ReLU) as the compiler runs it: the weight
    // [4096, 1024] streams from its MXU tiles ({0,1:T(128,128)}, TransposedTiles of W^T), the
    // activations [512, 1024] are held (4 column panels of the transposed problem). With one
    // panel per MXU (2 groups), a block's first group brings the fp32 weight panel, 512 bytes
    // a streamed row, beside 2 held tiles per step: (T x 512 + 131 072) bytes in T + 254
    // cycles is above the planned 0.75 x 479.5 B per cycle for any T, while the second group
    // moves only its tiles. Two panels per MXU make one group, each weight panel read once
    // and used in its own step: (T x 512 + 262 144) bytes in 2 (T + 254) cycles.
    const auto cfg = hw::BoardConfig::load("", {});
    driver::DotKey shape;
    shape.M = 512;
    shape.K = 1024;
    shape.N = 4096;
    shape.a = driver::DotLayout::VpuTiles;
    shape.w = driver::DotLayout::Tiles;
    shape.c = driver::DotLayout::TransposedTiles;
    shape.stationary = driver::Stationary::Lhs;
    shape.column_sides = 1;
    shape.overlap_epilogue = true;
    const auto k = driver::plan_dot(cfg, shape, cfg.core.vmem_bytes);
    ASSERT_TRUE(k.has_value());
    EXPECT_EQ(k->group_panels, 2u);
    // The same tiling with one panel per MXU is planned slower (its first groups HBM-bound).
    driver::DotKey narrow = *k;
    narrow.group_panels = 1;
    EXPECT_LT(driver::dot_estimate_cycles(cfg, *k), driver::dot_estimate_cycles(cfg, narrow));
}

/// The column panels per MXU the fused planner gives a linear y = x W^T + b (+ r) with the
/// LHS stationary, as the compiler lays it out: x in T(8,128), W [N, K] in its MXU tiles, y in
/// T(8,128).
uint32_t planned_group_panels(uint32_t M, uint32_t K, uint32_t N, uint32_t full_sides) {
    const auto cfg = hw::BoardConfig::load("", {});
    driver::DotKey shape;
    shape.M = M;
    shape.K = K;
    shape.N = N;
    shape.a = driver::DotLayout::VpuTiles;
    shape.w = driver::DotLayout::Tiles;
    shape.c = driver::DotLayout::VpuTiles;
    shape.stationary = driver::Stationary::Lhs;
    shape.column_sides = 1;
    shape.full_sides = full_sides;
    shape.overlap_epilogue = true;
    const auto k = driver::plan_dot(cfg, shape, cfg.core.vmem_bytes);
    return k ? k->group_panels : 0;
}

TEST(CompilerDotFastDevice, AStreamedFp32WeightReadOnceWithReluBitExact) {
    // relu(x W^T + b), BERT-base's fc_1: x 512 x 768, W 3072 x 768. The planner streams W's
    // 3072 rows past the held x^T (4 column panels of 128 on 2 MXUs): one group of two panels
    // per MXU, each panel of W read once.
    const Shape xs{DType::F32, {512, 768}}, ws{DType::F32, {3072, 768}}, bs{DType::F32, {3072}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return relu(g, linear(g, v[0], v[1], v[2]));
    };
    Graph g;
    g.add_output(record(g, {g.input(xs, "x"), g.parameter(ws, "w"), g.parameter(bs, "b")}), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(planned_group_panels(512, 768, 3072, 0), 2u);
    expect_bit_exact({{"x", xs, {randoms(512 * 768, 11)}},
                      {"w", ws, {randoms(3072 * 768, 12)}, true},
                      {"b", bs, {randoms(3072, 13)}, true}},
                     record);
}

TEST(CompilerDotFastDevice, AStreamedFp32WeightReadOnceWithTheResidualBitExact) {
    // x W^T + b + r, x 512 x 3072, W 1024 x 3072 (fc_2's form: a long K, the residual a Full
    // side): the planner streams W's 1024 rows past 4 held panels on 2 MXUs, two panels per
    // MXU in one group, 24 K steps through the two panel slots.
    const Shape xs{DType::F32, {512, 3072}}, ws{DType::F32, {1024, 3072}}, bs{DType::F32, {1024}},
        rs{DType::F32, {512, 1024}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return add(g, linear(g, v[0], v[1], v[2]), v[3]);
    };
    Graph g;
    g.add_output(
        record(g, {g.input(xs, "x"), g.parameter(ws, "w"), g.parameter(bs, "b"), g.input(rs, "r")}),
        "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(planned_group_panels(512, 3072, 1024, 1), 2u);
    expect_bit_exact({{"x", xs, {randoms(512 * 3072, 21)}},
                      {"w", ws, {randoms(1024 * 3072, 22)}, true},
                      {"b", bs, {randoms(1024, 23)}, true},
                      {"r", rs, {randoms(512 * 1024, 24)}}},
                     record);
}

}  // namespace
}  // namespace tpu::compiler
