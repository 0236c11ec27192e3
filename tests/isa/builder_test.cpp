// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "isa/assembler.h"
#include "isa/builder.h"
#include "isa/disassembler.h"

namespace tpu::isa {
namespace {

TEST(Builder, BuildsTheSameProgramAsTheAssembler) {
    Builder b;
    const Label loop = b.label("loop");
    const Label done = b.label("done");
    b.emit(Opcode::Li, {s(1), imm(4)});
    b.bind(loop);
    b.emit(Opcode::VMulS, {s(2) + 64, imm(0x100), fimm(2.0f), imm(1024), f(1)});
    b.emit(Opcode::Sub, {s(1), s(1), imm(1)});
    b.emit(Opcode::Beq, {s(1), imm(0), done});
    b.emit(Opcode::Jmp, {loop});
    b.bind(done);
    b.emit(Opcode::Halt, {});
    const Program p = b.finish();
    const Program q = assemble(R"(
        li s1, 4
loop:   v.muls [s2+64], [0x100], 2.0, 1024, f1
        sub s1, s1, 1
        beq s1, 0, done
        jmp loop
done:   halt
)");
    EXPECT_EQ(p.code, q.code);
    EXPECT_EQ(p.labels, q.labels);
    EXPECT_EQ(assemble(disassemble(p)).code, p.code);
}

TEST(Builder, RejectsBadOperands) {
    Builder b;
    auto msg = [&](Opcode op, std::initializer_list<Arg> args) -> std::string {
        try {
            b.emit(op, args);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "no error";
    };
    EXPECT_EQ(msg(Opcode::Add, {s(1), s(2)}), "add at pc 0: expects 3 operands, got 2");
    EXPECT_EQ(msg(Opcode::Add, {imm(1), s(2), s(3)}),
              "add at pc 0: operand 1 must be a register s0..s31");
    EXPECT_EQ(msg(Opcode::Wait, {s(1), imm(1)}), "wait at pc 0: operand 1 must be a flag f0..f31");
    EXPECT_EQ(msg(Opcode::Li, {s(1), imm(1ll << 33)}),
              "li at pc 0: operand 2 immediate 8589934592 does not fit in 32 bits");
    EXPECT_EQ(msg(Opcode::VExp, {imm(0), imm(0), imm(8), f(40)}),
              "v.exp at pc 0: operand 4 (completion) must be a flag f0..f31");
    EXPECT_EQ(msg(Opcode::VExp, {imm(0), imm(0), imm(8), f(2)}), "no error");
}

TEST(Builder, UnboundLabelAndDuplicateNames) {
    Builder b;
    const Label l = b.label("never");
    b.emit(Opcode::Jmp, {l});
    try {
        b.finish();
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "label 'never' is used by the instruction at pc 0 but never bound");
    }
    Builder c;
    const Label a1 = c.label("loop"), a2 = c.label("loop");
    c.bind(a1);
    c.emit(Opcode::Nop, {});
    c.bind(a2);
    c.emit(Opcode::Jmp, {a2});
    const Program p = c.finish();
    ASSERT_EQ(p.labels.size(), 2u);
    EXPECT_EQ(p.labels[1].first, "loop_2");
    EXPECT_EQ(assemble(disassemble(p)).code, p.code);
    EXPECT_THROW(c.label("s3"), std::invalid_argument);
    EXPECT_THROW(c.label("9lives"), std::invalid_argument);
    EXPECT_THROW(c.bind(a1), std::invalid_argument);
}

}  // namespace
}  // namespace tpu::isa
