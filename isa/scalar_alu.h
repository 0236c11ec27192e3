// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>

#include "isa/isa.h"

namespace tpu::isa {

/// What the scalar ALU makes of one instruction.
struct AluResult {
    uint32_t value = 0;        ///< the result written to the destination register
    bool div_by_zero = false;  ///< divu/remu by 0: a device fault, no result
};

/// The scalar ALU: the one definition of the register-to-register scalar instructions (the
/// semantics column of isa/opcodes.def), shared by the fast core model and the cycle-stepped
/// reference. `b` and `c` are operands 1 and 2 (register + immediate). Shift amounts use their
/// low 5 bits, comparisons give 0 or 1, and arithmetic wraps modulo 2^32. nullopt for an
/// opcode that is not an ALU operation (memory, core id, control).
constexpr std::optional<AluResult> scalar_alu(Opcode op, uint32_t b, uint32_t c) {
    switch (op) {
        case Opcode::Li:
            return AluResult{b};
        case Opcode::Add:
            return AluResult{b + c};
        case Opcode::Sub:
            return AluResult{b - c};
        case Opcode::Mul:
            return AluResult{b * c};
        case Opcode::Divu:
            return c == 0 ? AluResult{0, true} : AluResult{b / c};
        case Opcode::Remu:
            return c == 0 ? AluResult{0, true} : AluResult{b % c};
        case Opcode::And:
            return AluResult{b & c};
        case Opcode::Or:
            return AluResult{b | c};
        case Opcode::Xor:
            return AluResult{b ^ c};
        case Opcode::Shl:
            return AluResult{b << (c & 31)};
        case Opcode::Shr:
            return AluResult{b >> (c & 31)};
        case Opcode::Sra:
            return AluResult{static_cast<uint32_t>(static_cast<int32_t>(b) >> (c & 31))};
        case Opcode::Slt:
            return AluResult{static_cast<int32_t>(b) < static_cast<int32_t>(c) ? 1u : 0u};
        case Opcode::Sltu:
            return AluResult{b < c ? 1u : 0u};
        default:
            return std::nullopt;
    }
}

}  // namespace tpu::isa
