// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

#include "isa/isa.h"

namespace tpu::isa {

/// How disassembly is laid out.
struct DisasmOptions {
    bool show_pc = false;  ///< append "# pc N" to each instruction
    /// With Program::symbols (builder programs): append the names of the registers and flags an
    /// instruction uses. The table of every name is printed at the top either way.
    bool names = true;
};

/// One instruction in assembly syntax, e.g. "dma.hv [s1], [s2+64], 8, 512, 512, 512, f3".
/// Branch targets are instruction numbers.
std::string to_string(const Instr& instr);
/// A whole program; labels from `program.labels` are emitted and used as branch targets, and
/// the names of `program.symbols` and `program.args` are printed as comments. The text
/// reassembles to the identical binary.
std::string disassemble(const Program& program, const DisasmOptions& options = {});

}  // namespace tpu::isa
