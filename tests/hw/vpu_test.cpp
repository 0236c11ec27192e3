// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "hw/core/vpu_unit.h"
#include "isa/scalar_alu.h"

namespace tpu::hw {
namespace {

using isa::Opcode;

TEST(VpuTimer, IssueAndLatencyFollowTheRegisterRule) {
    VpuTimer vpu(CoreConfig{});  // 8 x 128 lanes, 2 ALUs, latencies add 2, mul 2, trans 7
    // 8192 elements = 8 registers = 4 issue cycles; 8193 needs a ninth register: 5 cycles.
    EXPECT_EQ(vpu.issue_cycles(8192), 4u);
    EXPECT_EQ(vpu.issue_cycles(8193), 5u);
    EXPECT_EQ(vpu.issue_cycles(1), 1u);
    EXPECT_EQ(vpu.latency(Opcode::VAdd), 2u);
    EXPECT_EQ(vpu.latency(Opcode::VExp), 7u);
    // A reduction adds a lane tree of ceil(log2(128)) = 7 levels to the add latency.
    EXPECT_EQ(vpu.latency(Opcode::VRSum), 2u + 7u);
    vpu.start_at(10);
    // Started at 10: done at 10 + 4 - 1 + 2 = 15; the issue slot is free again at 14.
    EXPECT_EQ(vpu.run(Opcode::VAdd, 8192, 10), 15u);
    EXPECT_EQ(vpu.free_at(), 14u);
}

TEST(VpuShape, OperandsOfEachFormAreDefinedOnce) {
    const VpuShape add = vpu_shape(Opcode::VAdd, {0x100, 0x200, 0x300, 16, 0, 0});
    EXPECT_EQ(add.elements, 16u);
    ASSERT_EQ(add.reads.size(), 2u);
    EXPECT_EQ(add.reads[1].addr, 0x300u);
    EXPECT_EQ(add.write.bytes, 64u);
    EXPECT_TRUE(add.elementwise);
    // v.f2bf writes bf16: 2 bytes per element, 2-byte aligned.
    const VpuShape f2bf = vpu_shape(Opcode::VF2Bf, {0, 64, 10, 0, 0, 0});
    EXPECT_EQ(f2bf.write.bytes, 20u);
    EXPECT_EQ(f2bf.write.align, 2u);
    EXPECT_FALSE(f2bf.elementwise);  // bf16 out: half the bytes per element
    // Row sums of a 3 x 5 tile write one value per row; column sums one per column.
    EXPECT_EQ(vpu_shape(Opcode::VRSum, {0, 64, 3, 5, 0, 0}).write.bytes, 12u);
    EXPECT_EQ(vpu_shape(Opcode::VCSum, {0, 64, 3, 5, 0, 0}).write.bytes, 20u);
    // v.addrow broadcasts a row vector (one per column), v.mulcol a column vector.
    EXPECT_EQ(vpu_shape(Opcode::VAddRow, {0, 64, 512, 3, 5, 0}).reads[1].bytes, 20u);
    EXPECT_EQ(vpu_shape(Opcode::VMulCol, {0, 64, 512, 3, 5, 0}).reads[1].bytes, 12u);
    EXPECT_EQ(vpu_shape(Opcode::Add, {}).elements, 0u);  // not a VPU opcode
}

TEST(ScalarAlu, WrapsShiftsByFiveBitsAndReportsDivisionByZero) {
    EXPECT_EQ(isa::scalar_alu(Opcode::Sub, 0, 1)->value, 0xFFFFFFFFu);
    EXPECT_EQ(isa::scalar_alu(Opcode::Shl, 1, 33)->value, 2u);
    EXPECT_EQ(isa::scalar_alu(Opcode::Sra, 0x80000000u, 31)->value, 0xFFFFFFFFu);
    EXPECT_EQ(isa::scalar_alu(Opcode::Slt, 0xFFFFFFFFu, 0)->value, 1u);
    EXPECT_EQ(isa::scalar_alu(Opcode::Sltu, 0xFFFFFFFFu, 0)->value, 0u);
    EXPECT_TRUE(isa::scalar_alu(Opcode::Divu, 7, 0)->div_by_zero);
    EXPECT_FALSE(isa::scalar_alu(Opcode::Lw, 0, 0).has_value());  // memory, not the ALU
    static_assert(isa::scalar_alu(Opcode::Add, 2, 3)->value == 5);
}

}  // namespace
}  // namespace tpu::hw
