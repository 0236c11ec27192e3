// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/isa.h"

/// The program builder: typed instructions, labels, and pools of named registers, flags, VMEM
/// and scalar memory, so that several kernels can be emitted into one program without clashing.
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

/// Scalar register sN (a fixed number; kernels take theirs from Builder::reg).
inline Arg s(int n) {
    return Arg{Arg::Kind::Value, static_cast<uint8_t>(n), 0};
}
/// Integer immediate.
inline Arg imm(int64_t v) {
    return Arg{Arg::Kind::Value, 0, v};
}
/// fp32 immediate (stored as its bit pattern).
Arg fimm(float v);
/// Sync flag fN (a fixed number; kernels take theirs from Builder::flag).
inline Arg f(int n) {
    return Arg{Arg::Kind::Flag, 0, n};
}

/// A branch target; create with Builder::label(), place with Builder::bind().
struct Label {
    int id = -1;  ///< index into the builder's label table
    operator Arg() const { return Arg{Arg::Kind::Label, 0, id}; }
};

/// A program that cannot be built: a bad operand, an exhausted or clashing resource, a label
/// never bound. The message names the kernel and the resource.
class BuildError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

/// Sizes of the memories a builder's pools hand out. The defaults are the ISA's 32-bit address
/// ranges: a kernel planned for a board fits by construction; a caller composing kernels into
/// one program passes the board's sizes (core.vmem_bytes, core.smem_bytes).
struct Limits {
    uint64_t vmem_bytes = uint64_t(1) << 32;  ///< VMEM bytes the pool hands out
    uint64_t smem_bytes = uint64_t(1) << 32;  ///< scalar-memory bytes the pool hands out
};

/// Branch conditions of Builder::if_ (signed unless the name ends in 'u').
enum class Cond : uint8_t { Eq, Ne, Lt, Ge, Ltu, Geu };

class Builder;

/// A resource taken from a builder's pool, returned when the handle is destroyed or released.
/// Move-only; a handle must not outlive its builder.
class Held {
public:
    Held() = default;
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    Held(Held&& o) noexcept { *this = std::move(o); }
    Held& operator=(Held&& o) noexcept;
    ~Held() { release(); }
    /// Returns the resource to the pool now; the handle becomes empty.
    void release() noexcept;
    /// True while the handle holds a resource.
    explicit operator bool() const { return m_b != nullptr; }
    /// The name it was allocated under (with its kernel prefix when nested).
    const std::string& name() const;

protected:
    Held(Builder* b, size_t id, uint64_t index, uint64_t bytes)
        : m_b(b), m_id(id), m_index(index), m_bytes(bytes) {}
    /// Throws BuildError when the handle is empty (released, moved from or default).
    void check(const char* what) const;

    Builder* m_b = nullptr;
    size_t m_id = 0;       ///< index into the builder's symbol table
    uint64_t m_index = 0;  ///< register or flag number, or first byte address
    uint64_t m_bytes = 0;  ///< bytes of a memory range
};

/// A scalar register from Builder::reg or Builder::arg. Converts to the operand sN.
class Reg : public Held {
public:
    Reg() = default;
    /// Register number (1..31).
    int index() const { return static_cast<int>(m_index); }
    /// The operand sN.
    operator Arg() const {
        check("register");
        return s(index());
    }
    /// The operand sN + d.
    friend Arg operator+(const Reg& r, int64_t d) { return Arg(r) + d; }
    /// The operand sN - d.
    friend Arg operator-(const Reg& r, int64_t d) { return Arg(r) - d; }

private:
    friend class Builder;
    using Held::Held;
};

/// A sync flag from Builder::flag. Converts to the operand fN.
class Flag : public Held {
public:
    Flag() = default;
    /// Flag number (0..31).
    int index() const { return static_cast<int>(m_index); }
    /// The operand fN.
    operator Arg() const {
        check("flag");
        return f(index());
    }

private:
    friend class Builder;
    using Held::Held;
};

/// A VMEM range from Builder::vmem. Converts to its first byte address (an immediate).
class Vmem : public Held {
public:
    Vmem() = default;
    /// First byte address.
    uint64_t addr() const { return m_index; }
    /// Size in bytes.
    uint64_t bytes() const { return m_bytes; }
    /// The address `offset` bytes in, as an immediate.
    Arg at(uint64_t offset) const {
        check("VMEM range");
        return imm(static_cast<int64_t>(addr() + offset));
    }
    /// The first byte address, as an immediate.
    operator Arg() const { return at(0); }

private:
    friend class Builder;
    using Held::Held;
};

/// Words of scalar memory from Builder::smem.
class Smem : public Held {
public:
    Smem() = default;
    /// First byte address.
    uint64_t addr() const { return m_index; }
    /// Number of 32-bit words.
    uint64_t words() const { return m_bytes / 4; }
    /// The address of word `i`, as an immediate (for lw/sw).
    Arg word(uint64_t i) const {
        check("scalar-memory range");
        return imm(static_cast<int64_t>(addr() + 4 * i));
    }

private:
    friend class Builder;
    using Held::Held;
};

/// Builds programs from C++: every kernel of the library is written with it. Instructions are
/// checked against the opcode table as they are emitted. Registers, flags, VMEM and scalar
/// memory come from pools as named RAII handles, so kernels emitted into one builder (each in
/// its Scope) never share one by accident; the names travel with the program
/// (Program::symbols, Program::args) and the disassembler prints them. Errors throw BuildError.
class Builder {
public:
    /// `kernel` names the program (Program::name) and the errors; `limits` sizes the pools.
    explicit Builder(std::string kernel = {}, Limits limits = {});
    Builder(const Builder&) = delete;
    Builder& operator=(const Builder&) = delete;
    ~Builder();

    // ---- code -----------------------------------------------------------------------------

    /// A new, unbound label. `name` appears in disassembly.
    Label label(std::string name = {});
    /// Binds a label to the next instruction.
    void bind(Label l);
    /// Appends an instruction. `args` follow the opcode's operand kinds; for kinds ending in
    /// 'c' an extra trailing flag argument sets the completion flag.
    Builder& emit(Opcode op, std::initializer_list<Arg> args) {
        return emit(op, std::span<const Arg>(args.begin(), args.size()));
    }
    /// emit() with the operands in a span.
    Builder& emit(Opcode op, std::span<const Arg> args);
    /// Current instruction count (the pc of the next instruction).
    uint32_t pc() const { return static_cast<uint32_t>(m_code.size()); }
    /// The program: labels resolved, name, launch arguments and symbols (resources still held
    /// end at pc()). Throws if a label is used but never bound, an immediate overflows, or a
    /// counted flag was released with instructions not waited for.
    Program finish() const;

    // ---- resources --------------------------------------------------------------------------

    /// The next launch argument: s1, s2, ... in declaration order (the board loads launch
    /// arguments there). Throws if that register is already held: declare launch arguments
    /// before any other register.
    Reg arg(std::string name);
    /// A free register, `hint` if it is free (migrated kernels keep their old numbering with
    /// hints), else the lowest free one. Throws naming every held register when none is free.
    Reg reg(std::string name, int hint = 0);
    /// A free flag, `hint` if it is free, else the lowest free one. A flag that was used before
    /// in this program is reset to 0 (`fset`, emitted here) when it is handed out again, so
    /// release a flag only after everything that signals it has completed (CountedFlag checks
    /// that) and take it where the reset runs on every path (not inside one branch).
    Flag flag(std::string name, int hint = -1);
    /// `bytes` of VMEM at the lowest `align`-aligned free address.
    Vmem vmem(std::string name, uint64_t bytes, uint64_t align = 256);
    /// `bytes` of VMEM at exactly `addr` (a caller-given place); throws naming the held range
    /// it overlaps.
    Vmem vmem_at(std::string name, uint64_t addr, uint64_t bytes);
    /// `words` 32-bit words of scalar memory at the lowest free word address.
    Smem smem(std::string name, uint64_t words);
    /// Bytes of the largest free VMEM block from an `align`-aligned address (a composed kernel
    /// plans its tiles in it).
    uint64_t vmem_free(uint64_t align = 256) const;
    /// Scalar registers free now (a generator that may hold a register through a loop that
    /// takes others asks first).
    uint32_t free_regs() const;

    /// While the returned Scope lives, resources are allocated for kernel `kernel` (nested in
    /// the enclosing one): errors name it and symbol names get its prefix ("softmax.tile").
    class Scope;
    [[nodiscard]] Scope scope(std::string kernel);
    /// The kernel currently emitting (the innermost scope, else the builder's kernel).
    const std::string& kernel() const;

    // ---- structured control flow ------------------------------------------------------------

    /// `for (counter = begin; counter < end; counter += step) body();` (for step < 0,
    /// counter > end), signed. The body runs at least once: the range must not be empty
    /// (checked when begin and end are immediates).
    void loop(const Reg& counter, Arg begin, Arg end, int64_t step,
              const std::function<void()>& body);
    /// `if (a cond b) then(); else otherwise();` (otherwise may be empty).
    void if_(Cond cond, Arg a, Arg b, const std::function<void()>& then,
             const std::function<void()>& otherwise = {});

    /// Records an error that finish() throws (for checks in destructors, which cannot throw).
    void defer_error(std::string message);
    /// "kernel 'name': " + what, as a BuildError.
    BuildError error(const std::string& what) const;

private:
    friend class Held;
    struct Pending {
        size_t instr;
        int slot;
        int label;
    };
    /// A held or returned resource: its symbol (pc range), its pool and its owner scope.
    struct Entry {
        Symbol sym;
        bool live = true;
    };
    size_t add_entry(Symbol::Kind kind, std::string name, uint64_t index, uint64_t bytes);
    void free_entry(size_t id) noexcept;
    std::string qualified(std::string name) const;
    std::string held_list(Symbol::Kind kind) const;
    uint64_t range_fit(const std::map<uint64_t, size_t>& held, uint64_t size, uint64_t bytes,
                       uint64_t align) const;

    std::vector<Instr> m_code;
    std::vector<Pending> m_fixups;
    std::vector<std::string> m_label_names;
    std::vector<int64_t> m_label_pc;

    std::string m_kernel;
    Limits m_limits;
    std::vector<std::string> m_scopes;  ///< nested kernels, innermost last
    std::vector<Entry> m_entries;
    std::vector<std::string> m_args;
    std::array<int64_t, kNumSregs> m_reg_owner;   ///< entry id, or -1 when free
    std::array<int64_t, kNumFlags> m_flag_owner;  ///< entry id, or -1 when free
    std::bitset<kNumFlags> m_flag_used;           ///< held before: reset when handed out
    std::map<uint64_t, size_t> m_vmem, m_smem;    ///< first address -> entry id of held ranges
    std::vector<std::string> m_deferred;
};

/// Closes a nested kernel's scope (Builder::scope) when destroyed.
class Builder::Scope {
public:
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

private:
    friend class Builder;
    Scope(Builder& b, size_t depth) : m_b(b), m_depth(depth) {}
    Builder& m_b;
    size_t m_depth;
};

/// How a CountedFlag counts its issues.
enum class Count : uint8_t {
    AtBuild,     ///< in the builder: for straight-line code (wait_all waits for a constant)
    InRegister,  ///< in a register at run time: for loops (wait_all waits for the register)
};

/// A flag that completes the instructions issued on it and counts them, so that wait_all()
/// waits for exactly those: "issue with a completion flag, count the issues, wait for the
/// count". Releasing it with issues not waited for is an error at finish().
class CountedFlag {
public:
    /// Takes a flag (`flag_hint` preferred) and, for Count::InRegister, a counter register
    /// (`reg_hint` preferred) set to 0 here.
    CountedFlag(Builder& b, std::string name, Count count = Count::AtBuild, int flag_hint = -1,
                int reg_hint = 0);
    CountedFlag(const CountedFlag&) = delete;
    CountedFlag& operator=(const CountedFlag&) = delete;
    ~CountedFlag();
    /// Emits `op args..., flag` and counts it (InRegister: `add counter, counter, 1` after it).
    void issue(Opcode op, std::initializer_list<Arg> args);
    /// Waits until every instruction issued so far has completed (AtBuild with nothing issued:
    /// emits nothing).
    void wait_all();
    /// Emits `op args..., flag` like issue() but counts it only at the next count_deferred():
    /// a long straight-line body then updates the counter once, not once per instruction.
    void issue_deferred(Opcode op, std::initializer_list<Arg> args);
    /// Counts the issue_deferred() instructions since the last call (InRegister: one `add
    /// counter, counter, n`; nothing when there were none).
    void count_deferred();
    /// Waits until all but the last `later` instructions issued have completed (a unit that
    /// completes in issue order: the earlier ones are done).
    void wait_all_but(int64_t later);
    /// The flag.
    const Flag& flag() const { return m_flag; }
    /// Instructions issued (AtBuild; for InRegister the emitted issue sites).
    int64_t issued() const { return m_issued; }

private:
    Builder& m_b;
    Flag m_flag;
    std::optional<Reg> m_counter;
    int64_t m_issued = 0;
    int64_t m_deferred = 0;  ///< issue_deferred() instructions not counted yet
    bool m_unwaited = false;
};

/// Two equal VMEM slots for double buffering, each with its own load and store flag (a banked
/// HBM can finish a DMA before an earlier one, so only per-slot counts prove a slot's transfers
/// done). `base ^ toggle()` turns one slot's base address into the other's.
class DoubleBuffer {
public:
    /// Hints for the flags, in the order loads(0), loads(1), stores(0), stores(1).
    using FlagHints = std::array<int, 4>;
    DoubleBuffer(Builder& b, const std::string& name, uint64_t slot_bytes,
                 FlagHints hints = {-1, -1, -1, -1});
    /// Slot 0 or 1.
    const Vmem& slot(int i) const { return m_slot[i]; }
    /// Counts transfers into slot i.
    const Flag& loads(int i) const { return m_loads[i]; }
    /// Counts transfers out of slot i.
    const Flag& stores(int i) const { return m_stores[i]; }
    /// slot(0).addr() ^ slot(1).addr(): xor-ing a slot's base with it gives the other's.
    uint64_t toggle() const { return m_slot[0].addr() ^ m_slot[1].addr(); }

private:
    std::array<Vmem, 2> m_slot;
    std::array<Flag, 2> m_loads, m_stores;
};

}  // namespace tpu::isa
