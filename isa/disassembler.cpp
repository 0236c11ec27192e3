// SPDX-License-Identifier: Apache-2.0
#include "isa/disassembler.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

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

/// The symbol of register or flag `index` held at `pc` (the latest allocated), or nullptr.
const Symbol* held_at(const Program& p, Symbol::Kind kind, uint64_t index, uint32_t pc) {
    const Symbol* found = nullptr;
    for (const Symbol& s : p.symbols)
        if (s.kind == kind && s.index == index && s.first_pc <= pc && pc < s.end_pc) found = &s;
    return found;
}

/// "s19 tiles.slot, f2 vpu": the names of the registers and flags instruction `pc` uses.
std::string names_used(const Program& p, uint32_t pc) {
    if (p.symbols.empty()) return {};
    const Instr& ins = p.code[pc];
    std::vector<std::string> parts;
    auto add = [&](Symbol::Kind kind, uint64_t index) {
        const Symbol* s = held_at(p, kind, index, pc);
        if (!s) return;
        const std::string text =
            fmt::format("{}{} {}", kind == Symbol::Kind::Reg ? 's' : 'f', index, s->name);
        if (std::find(parts.begin(), parts.end(), text) == parts.end()) parts.push_back(text);
    };
    int slot = 0;
    for (char kind : info(ins.op).kinds) {
        if (kind == 'c') break;
        const Operand& o = ins.ops[slot++];
        if (kind == 'f')
            add(Symbol::Kind::Flag, static_cast<uint64_t>(o.imm));
        else if (kind != 'l' && o.reg != 0)
            add(Symbol::Kind::Reg, o.reg);
    }
    if (ins.flag != kNoFlag) add(Symbol::Kind::Flag, ins.flag);
    std::string out;
    for (const std::string& s : parts) out += (out.empty() ? "" : ", ") + s;
    return out;
}

/// The comment block naming the kernel, its launch arguments and every symbol.
std::string symbol_table(const Program& p) {
    if (p.symbols.empty() && p.args.empty()) return {};
    std::string out = fmt::format("# kernel '{}'\n", p.name);
    if (!p.args.empty()) {
        out += "# launch arguments:";
        for (size_t i = 0; i < p.args.size(); ++i)
            out += fmt::format("{} s{} {}", i ? "," : "", i + 1, p.args[i]);
        out += "\n";
    }
    if (!p.symbols.empty()) out += "# names, held for instructions [first, end):\n";
    for (const Symbol& s : p.symbols) {
        std::string what;
        switch (s.kind) {
            case Symbol::Kind::Reg:
                what = fmt::format("s{}", s.index);
                break;
            case Symbol::Kind::Flag:
                what = fmt::format("f{}", s.index);
                break;
            case Symbol::Kind::Vmem:
                what = fmt::format("vmem [{}, {})", s.index, s.index + s.bytes);
                break;
            case Symbol::Kind::Smem:
                what = fmt::format("smem [{}, {})", s.index, s.index + s.bytes);
                break;
        }
        out += fmt::format("#   {:<24} {:<28} [{}, {})\n", what, s.name, s.first_pc, s.end_pc);
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
    std::string out = symbol_table(program);
    auto emit_labels = [&](uint32_t pc) {
        const auto [b, e] = labels.equal_range(pc);
        for (auto it = b; it != e; ++it) out += it->second + ":\n";
    };
    for (uint32_t pc = 0; pc < program.code.size(); ++pc) {
        emit_labels(pc);
        const std::string text = format(program.code[pc], &labels);
        std::string note = options.show_pc ? fmt::format("pc {}", pc) : "";
        if (options.names) {
            const std::string used = names_used(program, pc);
            if (!used.empty()) note += (note.empty() ? "" : " | ") + used;
        }
        if (!note.empty())
            out += fmt::format("    {:<60} # {}\n", text, note);
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
