// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "isa/isa.h"

namespace tpu::isa {

/// An operand under construction: sreg + imm, a flag, or a label reference.
struct Arg {
    enum class Kind : uint8_t { Value, Flag, Label };
    Kind kind = Kind::Value;  ///< what the operand is
    uint8_t reg = 0;          ///< Value: scalar register
    int64_t imm = 0;          ///< Value: immediate; Flag: flag number; Label: label id
    /// `s(3) + 64`
    friend Arg operator+(Arg a, int64_t d) {
        a.imm += d;
        return a;
    }
    friend Arg operator-(Arg a, int64_t d) {
        a.imm -= d;
        return a;
    }
};

/// Scalar register sN.
inline Arg s(int n) {
    return Arg{Arg::Kind::Value, static_cast<uint8_t>(n), 0};
}
/// Integer immediate.
inline Arg imm(int64_t v) {
    return Arg{Arg::Kind::Value, 0, v};
}
/// fp32 immediate (stored as its bit pattern).
Arg fimm(float v);
/// Sync flag fN.
inline Arg f(int n) {
    return Arg{Arg::Kind::Flag, 0, n};
}

/// A branch target; create with Builder::label(), place with Builder::bind().
struct Label {
    int id = -1;  ///< index into the builder's label table
    operator Arg() const { return Arg{Arg::Kind::Label, 0, id}; }
};

/// Builds programs from C++ (the kernel library uses it). Operands are checked against the
/// opcode table as they are emitted; errors throw std::invalid_argument naming the instruction.
class Builder {
public:
    /// A new, unbound label. `name` appears in disassembly.
    Label label(std::string name = {});
    /// Binds a label to the next instruction.
    void bind(Label l);
    /// Appends an instruction. `args` follow the opcode's operand kinds; for kinds ending in
    /// 'c' an extra trailing flag argument f(n) sets the completion flag.
    Builder& emit(Opcode op, std::initializer_list<Arg> args);
    /// Current instruction count (the pc of the next instruction).
    uint32_t pc() const { return static_cast<uint32_t>(m_code.size()); }
    /// Resolves labels; throws if one is used but never bound or immediates overflow int32.
    Program finish() const;

private:
    struct Pending {
        size_t instr;
        int slot;
        int label;
    };
    std::vector<Instr> m_code;
    std::vector<Pending> m_fixups;
    std::vector<std::string> m_label_names;
    std::vector<int64_t> m_label_pc;
};

}  // namespace tpu::isa
