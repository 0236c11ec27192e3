// SPDX-License-Identifier: Apache-2.0
#include "isa/disassembler.h"

#include <map>
#include <set>

#include <fmt/format.h>

namespace tpu::isa {
namespace {

std::string value_text(const Operand& o) {
    if (o.reg == 0) return fmt::format("{}", o.imm);
    if (o.imm == 0) return fmt::format("s{}", o.reg);
    // imm is int32, so -imm of INT32_MIN must be printed without negating.
    if (o.imm < 0) return fmt::format("s{}-{}", o.reg, -static_cast<int64_t>(o.imm));
    return fmt::format("s{}+{}", o.reg, o.imm);
}

std::string format(const Instr& instr, const std::multimap<uint32_t, std::string>* labels) {
    const OpInfo& oi = info(instr.op);
    std::string out(oi.mnemonic);
    int slot = 0;
    for (char kind : oi.kinds) {
        if (kind == 'c') {
            if (instr.flag != kNoFlag) out += fmt::format(", f{}", instr.flag);
            break;
        }
        out += slot ? ", " : " ";
        const Operand& o = instr.ops[slot++];
        switch (kind) {
            case 'd':
                out += fmt::format("s{}", o.reg);
                break;
            case 'f':
                out += fmt::format("f{}", o.imm);
                break;
            case 'm':
                out += "[" + value_text(o) + "]";
                break;
            case 'l': {
                const auto it = labels ? labels->find(static_cast<uint32_t>(o.imm))
                                       : std::multimap<uint32_t, std::string>::const_iterator{};
                out += labels && it != labels->end() ? it->second : fmt::format("{}", o.imm);
                break;
            }
            default:
                out += value_text(o);
                break;
        }
    }
    return out;
}

}  // namespace

std::string to_string(const Instr& instr) {
    return format(instr, nullptr);
}

std::string disassemble(const Program& program, const DisasmOptions& options) {
    std::multimap<uint32_t, std::string> labels;
    std::set<std::string, std::less<>> names;
    for (const auto& [name, pc] : program.labels) {
        labels.emplace(pc, name);
        names.insert(name);
    }
    // Images carry no labels; naming every branch target keeps loops readable.
    for (const Instr& ins : program.code) {
        const std::string_view kinds = info(ins.op).kinds;
        for (size_t k = 0, slot = 0; k < kinds.size(); ++k) {
            if (kinds[k] == 'c') break;
            if (kinds[k] == 'l') {
                const auto target = static_cast<uint32_t>(ins.ops[slot].imm);
                const std::string name = fmt::format("L{}", target);
                if (target <= program.code.size() && !labels.count(target) && !names.count(name)) {
                    labels.emplace(target, name);
                    names.insert(name);
                }
            }
            ++slot;
        }
    }
    std::string out;
    auto emit_labels = [&](uint32_t pc) {
        const auto [b, e] = labels.equal_range(pc);
        for (auto it = b; it != e; ++it) out += it->second + ":\n";
    };
    for (uint32_t pc = 0; pc < program.code.size(); ++pc) {
        emit_labels(pc);
        const std::string text = format(program.code[pc], &labels);
        if (options.show_pc)
            out += fmt::format("    {:<60} # pc {}\n", text, pc);
        else
            out += "    " + text + "\n";
    }
    // Labels past the end stay so branches to "end" keep their names.
    for (auto it = labels.lower_bound(static_cast<uint32_t>(program.code.size()));
         it != labels.end(); ++it)
        out += it->second + ":\n";
    return out;
}

}  // namespace tpu::isa
