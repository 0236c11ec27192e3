// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

/// The tpusim instruction set: types, the opcode table and the binary encoding.
namespace tpu::isa {

/// The unit an instruction runs on; the sequencer executes Scalar, Branch and Sync inline and
/// queues the others to their unit.
enum class Unit : uint8_t { Scalar, Branch, Sync, Dma, Mxu, Vpu, Ici };

/// The timing rule a unit applies to an instruction (hw/README.md gives each formula).
enum class Timing : uint8_t {
    Alu,        ///< scalar ALU or scalar memory, 1 cycle in the sequencer
    Branch,     ///< branch resolved in the sequencer, 1 cycle
    Sync,       ///< flag operation; waits stall issue until the condition holds
    Dma,        ///< 2-D copy: HBM/VMEM bandwidth and latency
    Ici,        ///< inter-core transfer: link bandwidth and per-hop latency
    MxuLoad,    ///< weight tile into the shadow buffer, one PE row per cycle
    MxuMatmul,  ///< LHS rows streamed through the array: fill, skew and drain
    VpuAdd,     ///< VPU op with the add latency
    VpuMul,     ///< VPU op with the multiply latency
    VpuTrans,   ///< VPU transcendental latency
    VpuReduce,  ///< VPU reduction: add latency plus a lane-reduction tree
    VpuMove,    ///< VPU data movement (transpose), add latency
};

/// Every opcode, in table order (isa/opcodes.def).
enum class Opcode : uint8_t {
#define OP(e, m, u, t, f, d) e,
#include "isa/opcodes.def"
#undef OP
};

/// Number of opcodes in the table.
inline constexpr int kNumOpcodes = 0
#define OP(e, m, u, t, f, d) +1
#include "isa/opcodes.def"
#undef OP
    ;

inline constexpr int kNumSregs = 32;      ///< scalar registers s0..s31; s0 reads as zero
inline constexpr int kNumFlags = 32;      ///< sync flags f0..f31 per core
inline constexpr int kMaxOperands = 6;    ///< operand slots in every instruction
inline constexpr int kInstrBytes = 32;    ///< fixed instruction size in bytes
inline constexpr uint8_t kNoFlag = 0xFF;  ///< "no completion flag"
/// HBM windows (isa/README.md, "HBM windows"): a 32-bit HBM address is window `addr >>
/// kHbmWindowBits` and offset `addr & (kHbmWindowBytes - 1)`; `hbm.map w, b` maps window w to
/// byte b x kHbmMapUnit (the driver's allocation alignment), so 32-bit operands reach 1 TiB.
inline constexpr int kHbmWindowBits = 29;
inline constexpr uint64_t kHbmWindowBytes = uint64_t(1) << kHbmWindowBits;  ///< 512 MiB
inline constexpr uint32_t kHbmWindows = 8;                               ///< 8 x 512 MiB = 4 GiB
inline constexpr uint64_t kHbmMapUnit = 256;  ///< hbm.map's base unit in bytes

/// Static facts about one opcode, straight from the table.
struct OpInfo {
    Opcode op;                  ///< the opcode
    std::string_view mnemonic;  ///< assembly mnemonic
    Unit unit;                  ///< executing unit
    Timing timing;              ///< timing rule
    std::string_view kinds;     ///< operand kinds, one char each (see opcodes.def)
    std::string_view summary;   ///< semantics, one line
};

/// Table entry of an opcode.
const OpInfo& info(Opcode op);
/// The whole table, in opcode order.
std::span<const OpInfo> op_table();
/// Opcode for a mnemonic, if any.
std::optional<Opcode> find_mnemonic(std::string_view mnemonic);
/// Lower-case unit name ("scalar", "mxu", ...).
std::string_view unit_name(Unit unit);
/// Timing class name as in the ISA reference ("alu", "mxu.matmul", ...).
std::string_view timing_name(Timing timing);
/// Number of operand slots the opcode uses (kinds without the optional completion flag 'c').
int num_operands(Opcode op);
/// True when the opcode takes an optional completion flag.
bool has_completion_flag(Opcode op);

/// One operand: the value is sreg[reg] + imm (s0 is zero). Flags and branch targets keep their
/// number in imm with reg = 0.
struct Operand {
    uint8_t reg = 0;  ///< scalar register index, 0..31
    int32_t imm = 0;  ///< signed immediate
    friend bool operator==(const Operand&, const Operand&) = default;
};

/// A decoded instruction.
struct Instr {
    Opcode op = Opcode::Nop;                  ///< what to do
    uint8_t flag = kNoFlag;                   ///< completion flag, or kNoFlag
    std::array<Operand, kMaxOperands> ops{};  ///< operands in table order; unused are zero
    friend bool operator==(const Instr&, const Instr&) = default;
};

/// A malformed binary instruction or program image.
class DecodeError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Binary layout of one instruction (32 bytes, little-endian):
///   byte 0: opcode; byte 1: completion flag (0..31 or 0xFF); bytes 2..7: register of operand
///   0..5; bytes 8..31: imm of operand 0..5 as int32. Unused slots and registers must be zero.
void encode(const Instr& instr, std::span<uint8_t, kInstrBytes> out);
/// Decodes and validates one instruction; `index` only names it in the error message.
Instr decode(std::span<const uint8_t, kInstrBytes> in, size_t index = 0);
/// Checks an instruction built in memory by the rules decode() applies to an encoded one (an
/// opcode of the table, a completion flag only where the opcode takes one, registers s0..s31,
/// flags f0..f31, zero destination immediates and unused slots); throws DecodeError naming
/// instruction `index`. For programs from outside the assembler, builder and decoder.
void validate(const Instr& instr, size_t index = 0);

/// A name a Builder gave to a register, flag or memory range, and the instructions it held it
/// for (the disassembler prints them; nothing of it is encoded).
struct Symbol {
    /// What was named.
    enum class Kind : uint8_t { Reg, Flag, Vmem, Smem };
    Kind kind = Kind::Reg;  ///< register, flag, VMEM or scalar-memory range
    std::string name;       ///< "tile"; "softmax.tile" when emitted by a nested kernel
    uint64_t index = 0;     ///< register or flag number, or the range's first byte address
    uint64_t bytes = 0;     ///< size of a memory range (0 for registers and flags)
    uint32_t first_pc = 0;  ///< first instruction emitted while it was held
    uint32_t end_pc = 0;    ///< one past the last (== first_pc: held by no instruction)
    friend bool operator==(const Symbol&, const Symbol&) = default;
};

/// A program: instructions plus the label table the assembler saw (for disassembly).
struct Program {
    std::vector<Instr> code;                               ///< instructions, pc = index
    std::vector<std::pair<std::string, uint32_t>> labels;  ///< optional names of pcs
    std::string name;  ///< kernel name for per-kernel statistics (not encoded; may be empty)
    /// Names of the launch arguments s1, s2, ... in order (Builder::arg; not encoded).
    std::vector<std::string> args;
    /// Names of registers, flags and memory ranges (Builder programs; not encoded).
    std::vector<Symbol> symbols;
};

/// Program image: "TPUPROG1" magic, u32 instruction count, u32 reserved (0), then the
/// instructions. Labels are not stored.
std::vector<uint8_t> encode_program(const Program& program);
/// Decodes a program image; errors name the byte offset and instruction index.
Program decode_program(std::span<const uint8_t> image);
/// FNV-1a (64-bit) of the program image: equal for byte-identical programs (golden tests).
uint64_t image_hash(const Program& program);

}  // namespace tpu::isa
