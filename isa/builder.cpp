// SPDX-License-Identifier: Apache-2.0
#include "isa/builder.h"

#include <bit>
#include <cctype>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace tpu::isa {

Arg fimm(float v) {
    return imm(std::bit_cast<int32_t>(v));
}

Label Builder::label(std::string name) {
    // Names must reassemble: identifiers that are not registers, flags or mnemonics.
    bool ok = name.empty() || std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_';
    for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok)
        throw std::invalid_argument(fmt::format(
            "label name '{}' must start with a letter or '_' and hold only letters, digits, '_'",
            name));
    const bool numbered = name.size() >= 2 && (name[0] == 's' || name[0] == 'f') &&
                          name.find_first_not_of("0123456789", 1) == std::string::npos;
    if (numbered || find_mnemonic(name))
        throw std::invalid_argument(
            fmt::format("label name '{}' is a register, flag or instruction name", name));
    m_label_names.push_back(std::move(name));
    m_label_pc.push_back(-1);
    return Label{static_cast<int>(m_label_pc.size()) - 1};
}

void Builder::bind(Label l) {
    if (l.id < 0 || l.id >= static_cast<int>(m_label_pc.size()))
        throw std::invalid_argument("bind: label does not belong to this builder");
    if (m_label_pc[l.id] >= 0)
        throw std::invalid_argument(fmt::format("bind: label {} is already bound", l.id));
    m_label_pc[l.id] = pc();
}

Builder& Builder::emit(Opcode op, std::initializer_list<Arg> args) {
    const OpInfo& oi = info(op);
    const int want = num_operands(op);
    const int have = static_cast<int>(args.size());
    const bool flag_arg = has_completion_flag(op) && have == want + 1;
    if (have != want && !flag_arg)
        throw std::invalid_argument(fmt::format("{} at pc {}: expects {} operands{}, got {}",
                                                oi.mnemonic, pc(), want,
                                                has_completion_flag(op) ? " (+1 flag)" : "", have));
    Instr ins;
    ins.op = op;
    auto it = args.begin();
    int slot = 0;
    auto bad = [&](std::string_view what) {
        return std::invalid_argument(
            fmt::format("{} at pc {}: operand {} {}", oi.mnemonic, pc(), slot + 1, what));
    };
    for (char kind : oi.kinds) {
        if (kind == 'c') break;
        const Arg& a = *it++;
        Operand& o = ins.ops[slot];
        switch (kind) {
            case 'd':
                if (a.kind != Arg::Kind::Value || a.imm != 0 || a.reg >= kNumSregs)
                    throw bad("must be a register s0..s31");
                o.reg = a.reg;
                break;
            case 'f':
                if (a.kind != Arg::Kind::Flag || a.imm < 0 || a.imm >= kNumFlags)
                    throw bad("must be a flag f0..f31");
                o.imm = static_cast<int32_t>(a.imm);
                break;
            case 'l':
                if (a.kind != Arg::Kind::Label) throw bad("must be a label");
                m_fixups.push_back({m_code.size(), slot, static_cast<int>(a.imm)});
                break;
            default:
                if (a.kind != Arg::Kind::Value || a.reg >= kNumSregs)
                    throw bad("must be a register, an immediate or their sum");
                if (a.imm < std::numeric_limits<int32_t>::min() || a.imm > 0xFFFFFFFFll)
                    throw bad(fmt::format("immediate {} does not fit in 32 bits", a.imm));
                o.reg = a.reg;
                o.imm = static_cast<int32_t>(static_cast<uint32_t>(a.imm));
                break;
        }
        ++slot;
    }
    if (flag_arg) {
        const Arg& a = *it;
        if (a.kind != Arg::Kind::Flag || a.imm < 0 || a.imm >= kNumFlags)
            throw bad("(completion) must be a flag f0..f31");
        ins.flag = static_cast<uint8_t>(a.imm);
    }
    m_code.push_back(ins);
    return *this;
}

Program Builder::finish() const {
    Program p;
    p.code = m_code;
    for (const Pending& f : m_fixups) {
        if (f.label < 0 || f.label >= static_cast<int>(m_label_pc.size()))
            throw std::invalid_argument("a branch uses a label of another builder");
        if (m_label_pc[f.label] < 0)
            throw std::invalid_argument(
                fmt::format("label '{}' is used by the instruction at pc {} but never bound",
                            m_label_names[f.label].empty() ? fmt::format("#{}", f.label)
                                                           : m_label_names[f.label],
                            f.instr));
        p.code[f.instr].ops[f.slot].imm = static_cast<int32_t>(m_label_pc[f.label]);
    }
    // Kernels reuse names like "loop"; numbered suffixes keep the disassembly reassemblable.
    std::set<std::string> taken;
    for (size_t i = 0; i < m_label_names.size(); ++i) {
        if (m_label_names[i].empty() || m_label_pc[i] < 0) continue;
        std::string name = m_label_names[i];
        for (int n = 2; taken.count(name); ++n) name = fmt::format("{}_{}", m_label_names[i], n);
        taken.insert(name);
        p.labels.emplace_back(std::move(name), static_cast<uint32_t>(m_label_pc[i]));
    }
    return p;
}

}  // namespace tpu::isa
