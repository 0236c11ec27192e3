// SPDX-License-Identifier: Apache-2.0
#include "isa/isa.h"

#include <cstring>

#include <fmt/format.h>

namespace tpu::isa {
namespace {

constexpr OpInfo kTable[] = {
#define OP(e, m, u, t, f, d) {Opcode::e, m, Unit::u, Timing::t, f, d},
#include "isa/opcodes.def"
#undef OP
};
static_assert(std::size(kTable) == kNumOpcodes);
static_assert(kNumOpcodes < 256, "the opcode is one byte");

constexpr char kMagic[8] = {'T', 'P', 'U', 'P', 'R', 'O', 'G', '1'};
constexpr size_t kHeaderBytes = 16;

void put32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace

const OpInfo& info(Opcode op) {
    return kTable[static_cast<size_t>(op)];
}

std::span<const OpInfo> op_table() {
    return kTable;
}

std::optional<Opcode> find_mnemonic(std::string_view mnemonic) {
    for (const auto& e : kTable)
        if (e.mnemonic == mnemonic) return e.op;
    return std::nullopt;
}

std::string_view unit_name(Unit unit) {
    switch (unit) {
        case Unit::Scalar:
            return "scalar";
        case Unit::Branch:
            return "branch";
        case Unit::Sync:
            return "sync";
        case Unit::Dma:
            return "dma";
        case Unit::Mxu:
            return "mxu";
        case Unit::Vpu:
            return "vpu";
        case Unit::Ici:
            return "ici";
    }
    return "?";
}

std::string_view timing_name(Timing timing) {
    switch (timing) {
        case Timing::Alu:
            return "alu";
        case Timing::Branch:
            return "branch";
        case Timing::Sync:
            return "sync";
        case Timing::Dma:
            return "dma";
        case Timing::Ici:
            return "ici";
        case Timing::MxuLoad:
            return "mxu.load";
        case Timing::MxuMatmul:
            return "mxu.matmul";
        case Timing::VpuAdd:
            return "vpu.add";
        case Timing::VpuMul:
            return "vpu.mul";
        case Timing::VpuTrans:
            return "vpu.transcendental";
        case Timing::VpuReduce:
            return "vpu.reduce";
        case Timing::VpuMove:
            return "vpu.move";
    }
    return "?";
}

int num_operands(Opcode op) {
    int n = 0;
    for (char k : info(op).kinds)
        if (k != 'c') ++n;
    return n;
}

bool has_completion_flag(Opcode op) {
    return info(op).kinds.find('c') != std::string_view::npos;
}

void encode(const Instr& instr, std::span<uint8_t, kInstrBytes> out) {
    std::memset(out.data(), 0, kInstrBytes);
    out[0] = static_cast<uint8_t>(instr.op);
    out[1] = instr.flag;
    for (int i = 0; i < kMaxOperands; ++i) {
        out[2 + i] = instr.ops[i].reg;
        put32(&out[8 + 4 * i], static_cast<uint32_t>(instr.ops[i].imm));
    }
}

Instr decode(std::span<const uint8_t, kInstrBytes> in, size_t index) {
    if (in[0] >= kNumOpcodes)
        throw DecodeError(fmt::format("instruction {}: unknown opcode 0x{:02x}", index, in[0]));
    Instr instr;
    instr.op = static_cast<Opcode>(in[0]);
    instr.flag = in[1];
    for (int i = 0; i < kMaxOperands; ++i)
        instr.ops[i] = Operand{in[2 + i], static_cast<int32_t>(get32(&in[8 + 4 * i]))};
    validate(instr, index);
    return instr;
}

void validate(const Instr& instr, size_t index) {
    if (static_cast<int>(instr.op) >= kNumOpcodes)
        throw DecodeError(fmt::format("instruction {}: unknown opcode 0x{:02x}", index,
                                      static_cast<unsigned>(instr.op)));
    // Every load of a program checks each instruction (CoreModel::load): one pass over the
    // opcode's operand kinds, nothing more.
    const OpInfo& oi = info(instr.op);
    if (instr.flag != kNoFlag &&
        (instr.flag >= kNumFlags || oi.kinds.find('c') == std::string_view::npos))
        throw DecodeError(fmt::format("instruction {} ({}): invalid completion flag byte 0x{:02x}",
                                      index, oi.mnemonic, instr.flag));
    int slot = 0;
    for (char kind : oi.kinds) {
        if (kind == 'c') continue;
        const auto [reg, imm] = instr.ops[slot];
        if (reg >= kNumSregs)
            throw DecodeError(fmt::format("instruction {} ({}): operand {} names register s{}",
                                          index, oi.mnemonic, slot, reg));
        const bool reg_forbidden = kind == 'f' || kind == 'l';
        if (reg_forbidden && reg != 0)
            throw DecodeError(fmt::format("instruction {} ({}): operand {} cannot use a register",
                                          index, oi.mnemonic, slot));
        if (kind == 'd' && imm != 0)
            throw DecodeError(
                fmt::format("instruction {} ({}): destination operand {} has a non-zero immediate",
                            index, oi.mnemonic, slot));
        // A negative number is no flag name: "f-3" would read as one.
        if (kind == 'f' && imm < 0)
            throw DecodeError(fmt::format(
                "instruction {} ({}): operand {} names flag number {} (flags are f0..f{})", index,
                oi.mnemonic, slot, imm, kNumFlags - 1));
        if (kind == 'f' && imm >= kNumFlags)
            throw DecodeError(fmt::format("instruction {} ({}): operand {} names flag f{}", index,
                                          oi.mnemonic, slot, imm));
        ++slot;
    }
    for (int i = slot; i < kMaxOperands; ++i)
        if (instr.ops[i].reg != 0 || instr.ops[i].imm != 0)
            throw DecodeError(fmt::format("instruction {} ({}): unused operand slot {} is not zero",
                                          index, oi.mnemonic, i));
}

std::vector<uint8_t> encode_program(const Program& program) {
    std::vector<uint8_t> image(kHeaderBytes + program.code.size() * kInstrBytes, 0);
    std::memcpy(image.data(), kMagic, sizeof kMagic);
    put32(&image[8], static_cast<uint32_t>(program.code.size()));
    for (size_t i = 0; i < program.code.size(); ++i)
        encode(program.code[i], std::span<uint8_t, kInstrBytes>(
                                    &image[kHeaderBytes + i * kInstrBytes], kInstrBytes));
    return image;
}

Program decode_program(std::span<const uint8_t> image) {
    if (image.size() < sizeof kMagic || std::memcmp(image.data(), kMagic, sizeof kMagic) != 0)
        throw DecodeError("not a tpusim program image (missing TPUPROG1 header)");
    if (image.size() < kHeaderBytes)
        throw DecodeError(fmt::format("program image is {} bytes, shorter than its {}-byte header",
                                      image.size(), kHeaderBytes));
    const uint32_t count = get32(&image[8]);
    if (get32(&image[12]) != 0) throw DecodeError("program header: reserved word is not zero");
    const size_t want = kHeaderBytes + size_t(count) * kInstrBytes;
    if (image.size() != want)
        throw DecodeError(
            fmt::format("program image is {} bytes; header says {} instructions ({} bytes)",
                        image.size(), count, want));
    Program p;
    p.code.reserve(count);
    for (size_t i = 0; i < count; ++i)
        p.code.push_back(decode(std::span<const uint8_t, kInstrBytes>(
                                    &image[kHeaderBytes + i * kInstrBytes], kInstrBytes),
                                i));
    return p;
}

uint64_t image_hash(const Program& program) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint8_t b : encode_program(program)) h = (h ^ b) * 0x100000001b3ull;
    return h;
}

}  // namespace tpu::isa
