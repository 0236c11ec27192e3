// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <random>

#include "isa/isa.h"

namespace tpu::isa {
namespace {

/// A random valid instruction of opcode `op`, respecting every operand kind.
Instr random_instr(Opcode op, std::mt19937& rng) {
    Instr ins;
    ins.op = op;
    std::uniform_int_distribution<int> reg(0, kNumSregs - 1), flag(0, kNumFlags - 1);
    std::uniform_int_distribution<int32_t> imm(INT32_MIN, INT32_MAX);
    int slot = 0;
    for (char k : info(op).kinds) {
        if (k == 'c') {
            ins.flag = rng() % 2 ? static_cast<uint8_t>(flag(rng)) : kNoFlag;
            break;
        }
        Operand& o = ins.ops[slot++];
        switch (k) {
            case 'd':
                o.reg = static_cast<uint8_t>(reg(rng));
                break;
            case 'f':
                o.imm = flag(rng);
                break;
            case 'l':
                o.imm = imm(rng) & 0x7fffffff;
                break;
            default:
                o.reg = static_cast<uint8_t>(reg(rng));
                o.imm = imm(rng);
        }
    }
    return ins;
}

TEST(Encoding, EveryOpcodeRoundTripsWithRandomOperands) {
    std::mt19937 rng(12345);
    for (const OpInfo& oi : op_table()) {
        for (int trial = 0; trial < 200; ++trial) {
            const Instr ins = random_instr(oi.op, rng);
            std::array<uint8_t, kInstrBytes> bytes{};
            encode(ins, bytes);
            EXPECT_EQ(bytes[0], static_cast<uint8_t>(oi.op));
            const Instr back = decode(bytes);
            ASSERT_EQ(back, ins) << oi.mnemonic << " trial " << trial;
        }
    }
}

TEST(Encoding, TableIsConsistent) {
    EXPECT_EQ(static_cast<int>(op_table().size()), kNumOpcodes);
    for (const OpInfo& oi : op_table()) {
        EXPECT_EQ(&info(oi.op), &oi);
        EXPECT_EQ(find_mnemonic(oi.mnemonic), oi.op) << oi.mnemonic;
        EXPECT_LE(num_operands(oi.op), kMaxOperands) << oi.mnemonic;
        const auto c = oi.kinds.find('c');
        EXPECT_TRUE(c == std::string_view::npos || c == oi.kinds.size() - 1)
            << oi.mnemonic << ": the completion flag must be last";
        EXPECT_EQ(oi.kinds.find_first_not_of("dvmflc"), std::string_view::npos) << oi.mnemonic;
        EXPECT_FALSE(oi.summary.empty()) << oi.mnemonic;
    }
    EXPECT_FALSE(find_mnemonic("bogus"));
}

std::array<uint8_t, kInstrBytes> bytes_of(const Instr& ins) {
    std::array<uint8_t, kInstrBytes> b{};
    encode(ins, b);
    return b;
}

void expect_decode_error(std::array<uint8_t, kInstrBytes> b, const std::string& msg) {
    try {
        decode(b, 7);
        ADD_FAILURE() << "no error, expected: " << msg;
    } catch (const DecodeError& e) {
        EXPECT_EQ(e.what(), msg);
    }
}

TEST(Encoding, DecodeRejectsMalformedInstructions) {
    std::array<uint8_t, kInstrBytes> b{};
    b[0] = 0xF0;
    expect_decode_error(b, "instruction 7: unknown opcode 0xf0");

    Instr add{Opcode::Add};
    b = bytes_of(add);
    b[3] = 40;
    expect_decode_error(b, "instruction 7 (add): operand 1 names register s40");

    b = bytes_of(add);
    b[1] = 3;
    expect_decode_error(b, "instruction 7 (add): invalid completion flag byte 0x03");

    Instr vadd{Opcode::VAdd};
    b = bytes_of(vadd);
    b[1] = 32;
    expect_decode_error(b, "instruction 7 (v.add): invalid completion flag byte 0x20");

    Instr wait{Opcode::Wait};
    b = bytes_of(wait);
    b[2] = 1;
    expect_decode_error(b, "instruction 7 (wait): operand 0 cannot use a register");
    b = bytes_of(wait);
    b[8] = 33;
    expect_decode_error(b, "instruction 7 (wait): operand 0 names flag f33");

    b = bytes_of(add);
    b[8] = 1;
    expect_decode_error(b, "instruction 7 (add): destination operand 0 has a non-zero immediate");

    b = bytes_of(add);
    b[31] = 1;
    expect_decode_error(b, "instruction 7 (add): unused operand slot 5 is not zero");
}

TEST(Encoding, ANegativeFlagNumberIsNamedAsANumber) {
    // Issue #30: an image whose flag operand reads as -285212427 was reported as "flag
    // f-285212427", a name that does not exist.
    Instr wait{Opcode::Wait};
    wait.ops[0].imm = -285212427;
    expect_decode_error(bytes_of(wait),
                        "instruction 7 (wait): operand 0 names flag number -285212427 (flags are "
                        "f0..f31)");
}

TEST(Encoding, ValidateAppliesDecodesRulesToInstructionsBuiltInMemory) {
    std::mt19937 rng(5);
    for (const OpInfo& oi : op_table()) EXPECT_NO_THROW(validate(random_instr(oi.op, rng), 3));
    // What a hand-built program could hold that no encoded one can: each is refused with the
    // message decode gives for the same bytes.
    Instr add{Opcode::Add};
    add.ops[1].reg = 200;
    try {
        validate(add, 4);
        ADD_FAILURE() << "register s200 accepted";
    } catch (const DecodeError& e) {
        EXPECT_STREQ(e.what(), "instruction 4 (add): operand 1 names register s200");
    }
    Instr bad_op{static_cast<Opcode>(kNumOpcodes + 3)};
    EXPECT_THROW(validate(bad_op), DecodeError);
    Instr vadd{Opcode::VAdd};
    vadd.flag = 40;
    EXPECT_THROW(validate(vadd), DecodeError);
}

TEST(Encoding, ProgramImage) {
    Program p;
    p.code = {Instr{Opcode::Li, kNoFlag, {Operand{1, 0}, Operand{0, 42}}}, Instr{Opcode::Halt}};
    const auto img = encode_program(p);
    ASSERT_EQ(img.size(), 16u + 2 * kInstrBytes);
    EXPECT_EQ(std::string(img.begin(), img.begin() + 8), "TPUPROG1");
    EXPECT_EQ(decode_program(img).code, p.code);

    auto truncated = img;
    truncated.pop_back();
    try {
        decode_program(truncated);
        ADD_FAILURE();
    } catch (const DecodeError& e) {
        EXPECT_STREQ(e.what(), "program image is 79 bytes; header says 2 instructions (80 bytes)");
    }
    auto bad_magic = img;
    bad_magic[0] = 'X';
    EXPECT_THROW(decode_program(bad_magic), DecodeError);
    auto reserved = img;
    reserved[12] = 1;
    try {
        decode_program(reserved);
        ADD_FAILURE();
    } catch (const DecodeError& e) {
        EXPECT_STREQ(e.what(), "program header: reserved word is not zero");
    }
}

}  // namespace
}  // namespace tpu::isa
