// SPDX-License-Identifier: Apache-2.0
#include "isa/builder.h"

#include <bit>
#include <cctype>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace tpu::isa {

Arg fimm(float v) {
    return imm(std::bit_cast<int32_t>(v));
}

// ---- handles ---------------------------------------------------------------------------------

Held& Held::operator=(Held&& o) noexcept {
    if (this != &o) {
        release();
        m_b = o.m_b;
        m_id = o.m_id;
        m_index = o.m_index;
        m_bytes = o.m_bytes;
        o.m_b = nullptr;
    }
    return *this;
}

void Held::release() noexcept {
    if (m_b) m_b->free_entry(m_id);
    m_b = nullptr;
}

const std::string& Held::name() const {
    check("resource");
    return m_b->m_entries[m_id].sym.name;
}

void Held::check(const char* what) const {
    if (!m_b) throw BuildError(fmt::format("use of a released or empty {} handle", what));
}

// ---- builder: code ---------------------------------------------------------------------------

Builder::Builder(std::string kernel, Limits limits)
    : m_kernel(std::move(kernel)), m_limits(limits) {
    m_reg_owner.fill(-1);
    m_flag_owner.fill(-1);
    m_reg_owner[0] = std::numeric_limits<int64_t>::max();  // s0 reads as zero: never handed out
}

Builder::~Builder() = default;

Label Builder::label(std::string name) {
    // Names must reassemble: identifiers that are not registers, flags or mnemonics.
    bool ok = name.empty() || std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_';
    for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok)
        throw BuildError(fmt::format(
            "label name '{}' must start with a letter or '_' and hold only letters, digits, '_'",
            name));
    const bool numbered = name.size() >= 2 && (name[0] == 's' || name[0] == 'f') &&
                          name.find_first_not_of("0123456789", 1) == std::string::npos;
    if (numbered || find_mnemonic(name))
        throw BuildError(
            fmt::format("label name '{}' is a register, flag or instruction name", name));
    m_label_names.push_back(std::move(name));
    m_label_pc.push_back(-1);
    return Label{static_cast<int>(m_label_pc.size()) - 1};
}

void Builder::bind(Label l) {
    if (l.id < 0 || l.id >= static_cast<int>(m_label_pc.size()))
        throw BuildError("bind: label does not belong to this builder");
    if (m_label_pc[l.id] >= 0)
        throw BuildError(fmt::format("bind: label {} is already bound", l.id));
    m_label_pc[l.id] = pc();
}

Builder& Builder::emit(Opcode op, std::span<const Arg> args) {
    const OpInfo& oi = info(op);
    const int want = num_operands(op);
    const int have = static_cast<int>(args.size());
    const bool flag_arg = has_completion_flag(op) && have == want + 1;
    if (have != want && !flag_arg)
        throw BuildError(fmt::format("{} at pc {}: expects {} operands{}, got {}", oi.mnemonic,
                                     pc(), want, has_completion_flag(op) ? " (+1 flag)" : "",
                                     have));
    Instr ins;
    ins.op = op;
    auto it = args.begin();
    int slot = 0;
    auto bad = [&](std::string_view what) {
        return BuildError(
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
    if (!m_deferred.empty()) throw BuildError(m_deferred.front());
    Program p;
    p.code = m_code;
    for (const Pending& f : m_fixups) {
        if (f.label < 0 || f.label >= static_cast<int>(m_label_pc.size()))
            throw BuildError("a branch uses a label of another builder");
        if (m_label_pc[f.label] < 0)
            throw BuildError(
                fmt::format("label '{}' is used by the instruction at pc {} but never bound",
                            m_label_names[f.label].empty() ? fmt::format("#{}", f.label)
                                                           : m_label_names[f.label],
                            f.instr));
        p.code[f.instr].ops[f.slot].imm = static_cast<int32_t>(m_label_pc[f.label]);
    }
    // Kernels reuse names like "loop"; numbered suffixes keep the disassembly reassemblable.
    // A name's suffix search resumes where its last one stopped (the suffixes below it are
    // still taken): a compiled step has thousands of "loop"s, and probing from 2 each time
    // made this quadratic.
    std::unordered_set<std::string> taken;
    std::unordered_map<std::string, int> next_suffix;
    for (size_t i = 0; i < m_label_names.size(); ++i) {
        if (m_label_names[i].empty() || m_label_pc[i] < 0) continue;
        std::string name = m_label_names[i];
        if (taken.count(name)) {
            int& n = next_suffix.try_emplace(name, 2).first->second;
            do name = fmt::format("{}_{}", m_label_names[i], n++);
            while (taken.count(name));
        }
        taken.insert(name);
        p.labels.emplace_back(std::move(name), static_cast<uint32_t>(m_label_pc[i]));
    }
    p.name = m_kernel;
    p.args = m_args;
    for (const Entry& e : m_entries) {
        p.symbols.push_back(e.sym);
        if (e.live) p.symbols.back().end_pc = pc();
    }
    return p;
}

// ---- builder: resources ----------------------------------------------------------------------

namespace {

const char* kind_text(Symbol::Kind k) {
    switch (k) {
        case Symbol::Kind::Reg:
            return "scalar registers";
        case Symbol::Kind::Flag:
            return "sync flags";
        case Symbol::Kind::Vmem:
            return "VMEM";
        case Symbol::Kind::Smem:
            return "scalar memory";
    }
    return "?";
}

}  // namespace

const std::string& Builder::kernel() const {
    static const std::string kUnnamed = "program";
    if (!m_scopes.empty()) return m_scopes.back();
    return m_kernel.empty() ? kUnnamed : m_kernel;
}

BuildError Builder::error(const std::string& what) const {
    return BuildError(fmt::format("kernel '{}': {}", kernel(), what));
}

void Builder::defer_error(std::string message) {
    m_deferred.push_back(std::move(message));
}

std::string Builder::qualified(std::string name) const {
    if (name.empty()) name = "unnamed";
    std::string prefix;
    for (const std::string& s : m_scopes) prefix += s + ".";
    return prefix + name;
}

size_t Builder::add_entry(Symbol::Kind kind, std::string name, uint64_t index, uint64_t bytes) {
    Entry e;
    e.sym.kind = kind;
    e.sym.name = std::move(name);
    e.sym.index = index;
    e.sym.bytes = bytes;
    e.sym.first_pc = e.sym.end_pc = pc();
    m_entries.push_back(std::move(e));
    return m_entries.size() - 1;
}

void Builder::free_entry(size_t id) noexcept {
    Entry& e = m_entries[id];
    if (!e.live) return;
    e.live = false;
    e.sym.end_pc = pc();
    switch (e.sym.kind) {
        case Symbol::Kind::Reg:
            m_reg_owner[e.sym.index] = -1;
            break;
        case Symbol::Kind::Flag:
            m_flag_owner[e.sym.index] = -1;
            break;
        case Symbol::Kind::Vmem:
            m_vmem.erase(e.sym.index);
            break;
        case Symbol::Kind::Smem:
            m_smem.erase(e.sym.index);
            break;
    }
}

std::string Builder::held_list(Symbol::Kind kind) const {
    std::string out;
    size_t n = 0;
    auto add = [&](const std::string& item) { out += (n++ ? ", " : "") + item; };
    if (kind == Symbol::Kind::Reg) {
        for (int r = 1; r < kNumSregs; ++r)
            if (m_reg_owner[r] >= 0)
                add(fmt::format("s{} {}", r, m_entries[m_reg_owner[r]].sym.name));
    } else if (kind == Symbol::Kind::Flag) {
        for (int r = 0; r < kNumFlags; ++r)
            if (m_flag_owner[r] >= 0)
                add(fmt::format("f{} {}", r, m_entries[m_flag_owner[r]].sym.name));
    } else {
        for (const auto& [addr, id] : kind == Symbol::Kind::Vmem ? m_vmem : m_smem) {
            const Symbol& s = m_entries[id].sym;
            add(fmt::format("[{}, {}) {}", addr, addr + s.bytes, s.name));
        }
    }
    return fmt::format("{} in use: {}", n, n ? out : "none");
}

Reg Builder::arg(std::string name) {
    name = qualified(std::move(name));
    const int r = static_cast<int>(m_args.size()) + 1;
    if (r >= kNumSregs)
        throw error(fmt::format("launch argument '{}' would be s{}; at most {} fit in s1..s{}",
                                name, r, kNumSregs - 1, kNumSregs - 1));
    if (m_reg_owner[r] >= 0)
        throw error(fmt::format(
            "launch argument '{}' must be s{}, which holds '{}'; declare launch arguments before "
            "other registers",
            name, r, m_entries[m_reg_owner[r]].sym.name));
    const size_t id = add_entry(Symbol::Kind::Reg, name, r, 0);
    m_reg_owner[r] = static_cast<int64_t>(id);
    m_args.push_back(m_entries[id].sym.name);
    return Reg(this, id, r, 0);
}

Reg Builder::reg(std::string name, int hint) {
    name = qualified(std::move(name));
    int r = hint > 0 && hint < kNumSregs && m_reg_owner[hint] < 0 ? hint : -1;
    for (int i = 1; r < 0 && i < kNumSregs; ++i)
        if (m_reg_owner[i] < 0) r = i;
    if (r < 0)
        throw error(fmt::format("out of {} for '{}' ({})", kind_text(Symbol::Kind::Reg), name,
                                held_list(Symbol::Kind::Reg)));
    const size_t id = add_entry(Symbol::Kind::Reg, std::move(name), r, 0);
    m_reg_owner[r] = static_cast<int64_t>(id);
    return Reg(this, id, r, 0);
}

Flag Builder::flag(std::string name, int hint) {
    name = qualified(std::move(name));
    int r = hint >= 0 && hint < kNumFlags && m_flag_owner[hint] < 0 ? hint : -1;
    for (int i = 0; r < 0 && i < kNumFlags; ++i)
        if (m_flag_owner[i] < 0) r = i;
    if (r < 0)
        throw error(fmt::format("out of {} for '{}' ({})", kind_text(Symbol::Kind::Flag), name,
                                held_list(Symbol::Kind::Flag)));
    // A flag counts up for the whole launch: a previous holder's count must not satisfy the
    // new holder's waits.
    if (m_flag_used[r]) emit(Opcode::Fset, {f(r), imm(0)});
    m_flag_used[r] = true;
    const size_t id = add_entry(Symbol::Kind::Flag, std::move(name), r, 0);
    m_flag_owner[r] = static_cast<int64_t>(id);
    return Flag(this, id, r, 0);
}

uint64_t Builder::range_fit(const std::map<uint64_t, size_t>& held, uint64_t size, uint64_t bytes,
                            uint64_t align) const {
    uint64_t at = 0;
    for (const auto& [addr, id] : held) {
        if (addr >= at && addr - at >= bytes) return at;
        at = std::max(at, (addr + m_entries[id].sym.bytes + align - 1) / align * align);
    }
    return at <= size && size - at >= bytes ? at : std::numeric_limits<uint64_t>::max();
}

Vmem Builder::vmem(std::string name, uint64_t bytes, uint64_t align) {
    name = qualified(std::move(name));
    if (bytes == 0 || align == 0 || !std::has_single_bit(align))
        throw error(
            fmt::format("VMEM range '{}' of {} bytes aligned to {}: need bytes > 0 and "
                        "a power-of-two alignment",
                        name, bytes, align));
    const uint64_t at = range_fit(m_vmem, m_limits.vmem_bytes, bytes, align);
    if (at == std::numeric_limits<uint64_t>::max())
        throw error(fmt::format("out of VMEM for '{}' ({} bytes; largest free block {} of {}; {})",
                                name, bytes, vmem_free(align), m_limits.vmem_bytes,
                                held_list(Symbol::Kind::Vmem)));
    const size_t id = add_entry(Symbol::Kind::Vmem, std::move(name), at, bytes);
    m_vmem.emplace(at, id);
    return Vmem(this, id, at, bytes);
}

Vmem Builder::vmem_at(std::string name, uint64_t addr, uint64_t bytes) {
    name = qualified(std::move(name));
    if (bytes == 0 || addr + bytes > m_limits.vmem_bytes)
        throw error(fmt::format("VMEM [{}, {}) for '{}' is empty or outside the {} bytes of VMEM",
                                addr, addr + bytes, name, m_limits.vmem_bytes));
    for (const auto& [a, id] : m_vmem) {
        const Symbol& s = m_entries[id].sym;
        if (a < addr + bytes && addr < a + s.bytes)
            throw error(
                fmt::format("VMEM [{}, {}) for '{}' overlaps '{}' [{}, {}), held since pc {}", addr,
                            addr + bytes, name, s.name, a, a + s.bytes, s.first_pc));
    }
    const size_t id = add_entry(Symbol::Kind::Vmem, std::move(name), addr, bytes);
    m_vmem.emplace(addr, id);
    return Vmem(this, id, addr, bytes);
}

Smem Builder::smem(std::string name, uint64_t words) {
    name = qualified(std::move(name));
    const uint64_t bytes = words * 4;
    const uint64_t at = words ? range_fit(m_smem, m_limits.smem_bytes, bytes, 4)
                              : std::numeric_limits<uint64_t>::max();
    if (at == std::numeric_limits<uint64_t>::max())
        throw error(fmt::format("out of scalar memory for '{}' ({} words of {} bytes; {})", name,
                                words, m_limits.smem_bytes, held_list(Symbol::Kind::Smem)));
    const size_t id = add_entry(Symbol::Kind::Smem, std::move(name), at, bytes);
    m_smem.emplace(at, id);
    return Smem(this, id, at, bytes);
}

uint32_t Builder::free_regs() const {
    uint32_t n = 0;
    for (int i = 1; i < kNumSregs; ++i) n += m_reg_owner[i] < 0;
    return n;
}

uint64_t Builder::vmem_free(uint64_t align) const {
    uint64_t at = 0, best = 0;
    for (const auto& [addr, id] : m_vmem) {
        if (addr > at) best = std::max(best, addr - at);
        at = std::max(at, (addr + m_entries[id].sym.bytes + align - 1) / align * align);
    }
    if (m_limits.vmem_bytes > at) best = std::max(best, m_limits.vmem_bytes - at);
    return best;
}

Builder::Scope Builder::scope(std::string kernel) {
    if (kernel.empty()) throw BuildError("a kernel scope needs a name");
    m_scopes.push_back(std::move(kernel));
    return Scope(*this, m_scopes.size());
}

Builder::Scope::~Scope() {
    // Scopes close in reverse order of opening (they are locals).
    if (m_b.m_scopes.size() == m_depth) m_b.m_scopes.pop_back();
}

// ---- builder: control flow -------------------------------------------------------------------

void Builder::loop(const Reg& counter, Arg begin, Arg end, int64_t step,
                   const std::function<void()>& body) {
    if (step == 0) throw error("loop: step 0 never ends");
    const bool known = begin.kind == Arg::Kind::Value && begin.reg == 0 &&
                       end.kind == Arg::Kind::Value && end.reg == 0;
    if (known && (step > 0 ? begin.imm >= end.imm : begin.imm <= end.imm))
        throw error(fmt::format("loop from {} to {} step {} is empty (the body runs at least once)",
                                begin.imm, end.imm, step));
    emit(Opcode::Li, {counter, begin});
    const Label top = label("loop");
    bind(top);
    body();
    emit(Opcode::Add, {counter, counter, imm(step)});
    if (step > 0)
        emit(Opcode::Blt, {counter, end, top});
    else
        emit(Opcode::Blt, {end, counter, top});
}

void Builder::if_(Cond cond, Arg a, Arg b, const std::function<void()>& then,
                  const std::function<void()>& otherwise) {
    const Label skip = label(otherwise ? "else" : "endif");
    // Branch around `then` on the inverse condition; bltu has no inverse, so it branches into
    // `then` and falls through to a jump around it.
    switch (cond) {
        case Cond::Eq:
            emit(Opcode::Bne, {a, b, skip});
            break;
        case Cond::Ne:
            emit(Opcode::Beq, {a, b, skip});
            break;
        case Cond::Lt:
            emit(Opcode::Bge, {a, b, skip});
            break;
        case Cond::Ge:
            emit(Opcode::Blt, {a, b, skip});
            break;
        case Cond::Geu:
            emit(Opcode::Bltu, {a, b, skip});
            break;
        case Cond::Ltu: {
            const Label go = label("then");
            emit(Opcode::Bltu, {a, b, go});
            emit(Opcode::Jmp, {skip});
            bind(go);
            break;
        }
    }
    then();
    if (otherwise) {
        const Label done = label("endif");
        emit(Opcode::Jmp, {done});
        bind(skip);
        otherwise();
        bind(done);
    } else {
        bind(skip);
    }
}

// ---- counted flags and double buffers --------------------------------------------------------

CountedFlag::CountedFlag(Builder& b, std::string name, Count count, int flag_hint, int reg_hint)
    : m_b(b) {
    if (count == Count::InRegister) {
        m_counter.emplace(b.reg(name + ".count", reg_hint));
        b.emit(Opcode::Li, {*m_counter, imm(0)});
    }
    m_flag = b.flag(std::move(name), flag_hint);
}

CountedFlag::~CountedFlag() {
    if (m_unwaited && m_flag)
        m_b.defer_error(
            fmt::format("kernel '{}': counted flag '{}' was released with issued "
                        "instructions not waited for (wait_all)",
                        m_b.kernel(), m_flag.name()));
}

void CountedFlag::issue(Opcode op, std::initializer_list<Arg> args) {
    issue_deferred(op, args);
    count_deferred();
}

void CountedFlag::issue_deferred(Opcode op, std::initializer_list<Arg> args) {
    if (!has_completion_flag(op))
        throw m_b.error(fmt::format("counted flag '{}': {} has no completion flag", m_flag.name(),
                                    info(op).mnemonic));
    std::vector<Arg> all(args);
    all.push_back(m_flag);
    m_b.emit(op, all);
    ++m_deferred;
    m_unwaited = true;
}

void CountedFlag::count_deferred() {
    if (!m_deferred) return;
    if (m_counter) m_b.emit(Opcode::Add, {*m_counter, *m_counter, imm(m_deferred)});
    m_issued += m_deferred;
    m_deferred = 0;
}

void CountedFlag::wait_all_but(int64_t later) {
    if (m_deferred)
        throw m_b.error(
            fmt::format("counted flag '{}': a wait with {} issues not counted yet "
                        "(count_deferred)",
                        m_flag.name(), m_deferred));
    if (later < 0 || (!m_counter && later > m_issued))
        throw m_b.error(fmt::format("counted flag '{}': cannot wait for all but {} of {} issues",
                                    m_flag.name(), later, m_issued));
    if (m_counter)
        m_b.emit(Opcode::Wait, {m_flag, *m_counter - later});
    else if (m_issued > later)
        m_b.emit(Opcode::Wait, {m_flag, imm(m_issued - later)});
    if (later == 0) m_unwaited = false;
}

void CountedFlag::wait_all() {
    wait_all_but(0);
}

DoubleBuffer::DoubleBuffer(Builder& b, const std::string& name, uint64_t slot_bytes,
                           FlagHints hints) {
    for (int i = 0; i < 2; ++i) m_slot[i] = b.vmem(fmt::format("{}.slot{}", name, i), slot_bytes);
    for (int i = 0; i < 2; ++i) m_loads[i] = b.flag(fmt::format("{}.loads{}", name, i), hints[i]);
    for (int i = 0; i < 2; ++i)
        m_stores[i] = b.flag(fmt::format("{}.stores{}", name, i), hints[2 + i]);
}

}  // namespace tpu::isa
