// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "tests/common/paths.h"

namespace tpu::isa {
namespace {

TEST(Assembler, OperandForms) {
    const Program p = assemble(R"(
.equ BASE, 0x100
.equ OFF, BASE+8           ; constants may use earlier ones
start:  li   s1, -8
        add  s2, s1, s3+BASE
        sub  s2, OFF-4+s4, 0b101
        v.adds [s5+BASE], [OFF], 1.5, 1024, f3
        wait f3, 1
        li   s6, start     // a label as a value is its pc
        bne  s1, 0, done
        jmp  start
done:   halt
)",
                               "t.s");
    ASSERT_EQ(p.code.size(), 9u);
    EXPECT_EQ(p.code[0], (Instr{Opcode::Li, kNoFlag, {Operand{1, 0}, Operand{0, -8}}}));
    EXPECT_EQ(p.code[1].ops[2], (Operand{3, 0x100}));
    EXPECT_EQ(p.code[2].ops[1], (Operand{4, 0x104}));
    EXPECT_EQ(p.code[2].ops[2], (Operand{0, 5}));
    EXPECT_EQ(p.code[3].ops[0], (Operand{5, 0x100}));
    EXPECT_EQ(p.code[3].ops[1], (Operand{0, 0x108}));
    EXPECT_EQ(p.code[3].ops[2].imm, std::bit_cast<int32_t>(1.5f));
    EXPECT_EQ(p.code[3].flag, 3);
    EXPECT_EQ(p.code[4].flag, kNoFlag);
    EXPECT_EQ(p.code[5].ops[1].imm, 0);
    EXPECT_EQ(p.code[6].ops[2].imm, 8);
    EXPECT_EQ(p.code[7].ops[0].imm, 0);
    ASSERT_EQ(p.labels.size(), 2u);
    EXPECT_EQ(p.labels[1], (std::pair<std::string, uint32_t>{"done", 8}));
}

TEST(Assembler, HbmMapTakesAWindowAndABaseAndRoundTrips) {
    // hbm.map a, b: window a maps to byte b x 256 (isa/README.md, "HBM windows").
    const Program p = assemble("hbm.map 3, s7\nhbm.map s2, 0x100000\n", "t.s");
    ASSERT_EQ(p.code.size(), 2u);
    EXPECT_EQ(p.code[0], (Instr{Opcode::HbmMap, kNoFlag, {Operand{0, 3}, Operand{7, 0}}}));
    EXPECT_EQ(p.code[1], (Instr{Opcode::HbmMap, kNoFlag, {Operand{2, 0}, Operand{0, 0x100000}}}));
    EXPECT_EQ(assemble(disassemble(p), "t.s").code, p.code);
    EXPECT_EQ(info(Opcode::HbmMap).unit, Unit::Scalar);
}

TEST(Assembler, ImmediateLimits) {
    EXPECT_EQ(assemble("li s1, 0xFFFFFFFF").code[0].ops[1].imm, -1);
    EXPECT_EQ(assemble("li s1, -2147483648").code[0].ops[1].imm, INT32_MIN);
    EXPECT_EQ(assemble("li s1, -2.5").code[0].ops[1].imm, std::bit_cast<int32_t>(-2.5f));
    EXPECT_EQ(assemble("li s1, 1e-3").code[0].ops[1].imm, std::bit_cast<int32_t>(1e-3f));
    EXPECT_EQ(assemble("li s1, s2-2147483648").code[0].ops[1], (Operand{2, INT32_MIN}));
}

TEST(Assembler, EmptyAndCommentOnlySources) {
    EXPECT_TRUE(assemble("").code.empty());
    EXPECT_TRUE(assemble("# nothing\n\n  ; here\r\n.text\n").code.empty());
}

struct BadCase {
    const char* source;
    const char* message;
};

class MalformedAssembly : public ::testing::TestWithParam<BadCase> {};

TEST_P(MalformedAssembly, NamesLocationFoundAndExpected) {
    try {
        assemble(GetParam().source, "k.s");
        ADD_FAILURE() << "assembled without error: " << GetParam().source;
    } catch (const AsmError& e) {
        EXPECT_EQ(std::string(e.what()), GetParam().message);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Assembler, MalformedAssembly,
    ::testing::Values(
        BadCase{"mxu.mn 0", "k.s:1:1: error: unknown instruction 'mxu.mn'; did you mean 'mxu.mm'?"},
        BadCase{"frobnicate s1", "k.s:1:1: error: unknown instruction 'frobnicate'"},
        BadCase{"nop\nadd s1, s2",
                "k.s:2:11: error: 'add' expects 3 operands (register, value, value); found 2"},
        BadCase{"add s1, s2, s3, s4",
                "k.s:1:15: error: 'add' expects 3 operands (register, value, value); found more"},
        BadCase{"halt\n  li 5, 1",
                "k.s:2:6: error: expected a destination register s0..s31, found '5'"},
        BadCase{"li s32, 1", "k.s:1:4: error: register 's32' does not exist (s0..s31)"},
        BadCase{"v.exp s1, [0], 8",
                "k.s:1:7: error: expected a memory operand like [s1+64], found 's1'"},
        BadCase{"v.exp [s1+4, [0], 8",
                "k.s:1:12: error: expected ']' to close the memory operand, found ','"},
        BadCase{"wait f40, 1", "k.s:1:6: error: flag 'f40' does not exist (f0..f31)"},
        BadCase{"wait s1, 1", "k.s:1:6: error: expected a sync flag f0..f31, found 's1'"},
        BadCase{"jmp nowhere", "k.s:1:5: error: undefined label 'nowhere'"},
        BadCase{"a: nop\na: nop", "k.s:2:1: error: 'a' is already defined at line 1"},
        BadCase{"li s1, 0x100000000",
                "k.s:1:8: error: number '0x100000000' does not fit in 32 bits"},
        BadCase{"li s1, 0x", "k.s:1:8: error: malformed number '0x'"},
        BadCase{"li s1, 12abc", "k.s:1:8: error: malformed number '12abc'"},
        BadCase{".data\n",
                "k.s:1:1: error: unknown directive '.data': programs have no data sections; load "
                "data into HBM or VMEM with the driver or 'tpusim run --load'"},
        BadCase{".align 4", "k.s:1:1: error: unknown directive '.align' (expected .equ or .text)"},
        BadCase{".equ X 5",
                "k.s:1:8: error: .equ expects NAME, VALUE; found '5' where ',' should be"},
        BadCase{"sub s1, 4, -s2",
                "k.s:1:13: error: a register can only be added, not subtracted ('-s2')"},
        BadCase{"add s1, s2+s3, 0",
                "k.s:1:12: error: an operand can use at most one register, found 's3' after 's2'"},
        BadCase{"li s1, s2+1.5",
                "k.s:1:11: error: a floating-point literal must be the whole operand"},
        BadCase{"li s1, 3 @", "k.s:1:10: error: unexpected character '@'"},
        BadCase{"s3: nop", "k.s:1:1: error: 's3' is a register name and cannot be a label"},
        BadCase{"add s1, , s2", "k.s:1:9: error: expected value for operand 2, found ','"},
        BadCase{"add s1, s2, 1, f3", "k.s:1:16: error: 'add' takes no completion flag"},
        BadCase{"jmp [s1]",
                "k.s:1:5: error: expected a branch target (label or instruction index), found '['"},
        BadCase{"li s1, UNDEF", "k.s:1:8: error: undefined name 'UNDEF' (not a constant or label)"},
        BadCase{"li s1, 1e50",
                "k.s:1:8: error: floating-point literal '1e50' is out of range for fp32"},
        BadCase{"v.add [0], [0], [0], 8, f99",
                "k.s:1:25: error: flag 'f99' does not exist (f0..f31)"},
        BadCase{"li s1 s2", "k.s:1:7: error: expected ',' before operand 2, found 's2'"},
        BadCase{"li s1, [4]",
                "k.s:1:8: error: expected a value (register, number or name), found '['; memory "
                "brackets are only for address operands"},
        BadCase{"halt extra",
                "k.s:1:6: error: expected end of line after the operands of 'halt', found 'extra'"},
        BadCase{"li s1, 0xFFFFFFFF+1",
                "k.s:1:8: error: value 4294967296 does not fit in 32 bits"}));

TEST(Assembler, MissingFileIsAnError) {
    try {
        assemble_file("/nonexistent/k.s");
        ADD_FAILURE();
    } catch (const AsmError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "/nonexistent/k.s:0:0: error: cannot open '/nonexistent/k.s': No such file or "
                  "directory");
    }
}

/// Every kernel in the repository: asm(disasm(asm(x))) == asm(x), with and without labels.
TEST(Assembler, EveryKernelInTheRepoRoundTrips) {
    namespace fs = std::filesystem;
    int count = 0;
    for (const char* dir : {"isa", "tests/fuzz/corpus/asm"}) {
        const fs::path root = fs::path(test::source_dir()) / dir;
        if (!fs::exists(root)) continue;
        for (const auto& entry : fs::recursive_directory_iterator(root)) {
            if (entry.path().extension() != ".s") continue;
            std::ifstream in(entry.path());
            std::stringstream ss;
            ss << in.rdbuf();
            Program p;
            try {
                p = assemble(ss.str(), entry.path().string());
            } catch (const AsmError& e) {
                // Deliberately broken kernels live under bad/ and must fail cleanly.
                EXPECT_NE(entry.path().string().find("/bad"), std::string::npos) << e.what();
                continue;
            }
            ++count;
            const auto img = encode_program(p);
            EXPECT_EQ(encode_program(assemble(disassemble(p), "rt.s")), img) << entry.path();
            Program unlabeled = decode_program(img);
            EXPECT_EQ(encode_program(assemble(disassemble(unlabeled, {.show_pc = true}), "rt.s")),
                      img)
                << entry.path();
        }
    }
    EXPECT_GE(count, 3) << "expected the example kernels under isa/examples";
}

TEST(Disassembler, Formats) {
    Instr ins{Opcode::DmaHv,
              3,
              {Operand{1, 0}, Operand{2, 64}, Operand{0, 8}, Operand{0, 512}, Operand{3, -8},
               Operand{0, INT32_MIN}}};
    EXPECT_EQ(to_string(ins), "dma.hv [s1], [s2+64], 8, 512, s3-8, -2147483648, f3");
    Program p;
    p.code = {Instr{Opcode::Nop}, Instr{Opcode::Jmp, kNoFlag, {Operand{0, 0}}},
              Instr{Opcode::Jmp, kNoFlag, {Operand{0, 99}}}};
    EXPECT_EQ(disassemble(p), "L0:\n    nop\n    jmp L0\n    jmp 99\n");
}

TEST(Disassembler, RandomProgramsRoundTrip) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
        Program p;
        const int n = 1 + static_cast<int>(rng() % 20);
        for (int i = 0; i < n; ++i) {
            Instr ins;
            ins.op = static_cast<Opcode>(rng() % kNumOpcodes);
            int slot = 0;
            for (char k : info(ins.op).kinds) {
                if (k == 'c') {
                    if (rng() % 2) ins.flag = static_cast<uint8_t>(rng() % kNumFlags);
                    break;
                }
                Operand& o = ins.ops[slot++];
                if (k == 'f')
                    o.imm = static_cast<int32_t>(rng() % kNumFlags);
                else if (k == 'l')
                    o.imm = static_cast<int32_t>(rng() % (n + 3));
                else if (k == 'd')
                    o.reg = static_cast<uint8_t>(rng() % kNumSregs);
                else
                    o.reg = static_cast<uint8_t>(rng() % kNumSregs),
                    o.imm = static_cast<int32_t>(rng());
            }
            p.code.push_back(ins);
        }
        const std::string text = disassemble(p);
        ASSERT_EQ(assemble(text, "rt.s").code, p.code) << text;
    }
}

}  // namespace
}  // namespace tpu::isa
