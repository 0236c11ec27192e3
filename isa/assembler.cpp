// SPDX-License-Identifier: Apache-2.0
#include "isa/assembler.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

namespace tpu::isa {

AsmError::AsmError(std::string file, int line, int col, std::string message)
    : std::runtime_error(fmt::format("{}:{}:{}: error: {}", file, line, col, message)),
      m_file(std::move(file)),
      m_line(line),
      m_col(col),
      m_message(std::move(message)) {}

namespace {

enum class Tok : uint8_t { Ident, Number, Comma, LBracket, RBracket, Plus, Minus, Colon, End };

struct Token {
    Tok kind;
    std::string_view text;
    int col;  // 1-based
};

/// One source line split into tokens; the End token sits one past the last character.
struct Line {
    int number = 0;
    std::vector<Token> toks;
};

bool ident_start(char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}
bool ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

std::string quoted(const Token& t) {
    return t.kind == Tok::End ? "end of line" : fmt::format("'{}'", t.text);
}

int edit_distance(std::string_view a, std::string_view b) {
    std::vector<int> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
    for (size_t i = 1; i <= a.size(); ++i) {
        int diag = row[0];
        row[0] = static_cast<int>(i);
        for (size_t j = 1; j <= b.size(); ++j) {
            const int up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[b.size()];
}

/// "s7" -> 7, "f12" -> 12; nullopt if the text is not prefix + digits. Out-of-range numbers
/// are returned as-is so the caller can name them.
std::optional<int> numbered_name(std::string_view text, char prefix) {
    if (text.size() < 2 || text.size() > 4 || text[0] != prefix) return std::nullopt;
    int v = 0;
    for (char c : text.substr(1)) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
        v = v * 10 + (c - '0');
    }
    return v;
}

/// What the assembler knows about a name.
struct Symbol {
    enum class Kind : uint8_t { Label, Constant } kind;
    int64_t value;
    int line;
};

class Assembler {
public:
    Assembler(std::string_view text, std::string_view file) : m_text(text), m_file(file) {}

    Program run() {
        split_lines();
        first_pass();
        second_pass();
        return std::move(m_prog);
    }

private:
    [[noreturn]] void fail(int line, int col, std::string msg) const {
        throw AsmError(std::string(m_file), line, col, std::move(msg));
    }

    void split_lines() {
        int number = 0;
        size_t pos = 0;
        while (pos <= m_text.size()) {
            size_t end = m_text.find('\n', pos);
            if (end == std::string_view::npos) end = m_text.size();
            ++number;
            tokenize(number, m_text.substr(pos, end - pos));
            pos = end + 1;
        }
    }

    void tokenize(int number, std::string_view s) {
        if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
        Line line{number, {}};
        size_t i = 0;
        while (i < s.size()) {
            const char c = s[i];
            const int col = static_cast<int>(i) + 1;
            if (c == ' ' || c == '\t') {
                ++i;
            } else if (c == '#' || c == ';' || (c == '/' && i + 1 < s.size() && s[i + 1] == '/')) {
                break;
            } else if (ident_start(c)) {
                size_t j = i;
                while (j < s.size() && ident_char(s[j])) ++j;
                line.toks.push_back({Tok::Ident, s.substr(i, j - i), col});
                i = j;
            } else if (std::isdigit(static_cast<unsigned char>(c))) {
                // Numbers swallow letters, dots and exponent signs so "0x1g" and "1.5e-3" stay
                // one token and are judged whole.
                size_t j = i + 1;
                while (j < s.size() &&
                       (ident_char(s[j]) ||
                        ((s[j] == '+' || s[j] == '-') && (s[j - 1] == 'e' || s[j - 1] == 'E') &&
                         !(s.substr(i, 2) == "0x" || s.substr(i, 2) == "0X"))))
                    ++j;
                line.toks.push_back({Tok::Number, s.substr(i, j - i), col});
                i = j;
            } else {
                Tok kind;
                switch (c) {
                    case ',':
                        kind = Tok::Comma;
                        break;
                    case '[':
                        kind = Tok::LBracket;
                        break;
                    case ']':
                        kind = Tok::RBracket;
                        break;
                    case '+':
                        kind = Tok::Plus;
                        break;
                    case '-':
                        kind = Tok::Minus;
                        break;
                    case ':':
                        kind = Tok::Colon;
                        break;
                    default:
                        if (std::isprint(static_cast<unsigned char>(c)))
                            fail(number, col, fmt::format("unexpected character '{}'", c));
                        fail(number, col,
                             fmt::format("unexpected byte 0x{:02x}", static_cast<uint8_t>(c)));
                }
                line.toks.push_back({kind, s.substr(i, 1), col});
                ++i;
            }
        }
        line.toks.push_back({Tok::End, {}, static_cast<int>(s.size()) + 1});
        m_lines.push_back(std::move(line));
    }

    /// Labels and constants; counts instructions so forward references resolve.
    void first_pass() {
        uint32_t pc = 0;
        for (const Line& line : m_lines) {
            size_t i = 0;
            const auto& t = line.toks;
            while (t[i].kind == Tok::Ident && t[i + 1].kind == Tok::Colon) {
                define(line.number, t[i], Symbol::Kind::Label, pc);
                m_prog.labels.emplace_back(std::string(t[i].text), pc);
                i += 2;
            }
            if (t[i].kind == Tok::End) continue;
            if (t[i].kind != Tok::Ident)
                fail(line.number, t[i].col,
                     fmt::format("expected an instruction, label or directive, found {}",
                                 quoted(t[i])));
            if (t[i].text[0] == '.') {
                directive(line, i);
                continue;
            }
            if (pc == std::numeric_limits<int32_t>::max())
                fail(line.number, t[i].col, "program has too many instructions");
            ++pc;
        }
    }

    void define(int line, const Token& name, Symbol::Kind kind, int64_t value) {
        const std::string_view what = kind == Symbol::Kind::Label ? "label" : "constant";
        if (numbered_name(name.text, 's'))
            fail(line, name.col,
                 fmt::format("'{}' is a register name and cannot be a {}", name.text, what));
        if (numbered_name(name.text, 'f'))
            fail(line, name.col,
                 fmt::format("'{}' is a flag name and cannot be a {}", name.text, what));
        if (name.text[0] == '.')
            fail(line, name.col, fmt::format("a {} name cannot start with '.'", what));
        if (find_mnemonic(name.text))
            fail(line, name.col,
                 fmt::format("'{}' is an instruction name and cannot be a {}", name.text, what));
        const auto [it, inserted] =
            m_symbols.emplace(std::string(name.text), Symbol{kind, value, line});
        if (!inserted)
            fail(line, name.col,
                 fmt::format("'{}' is already defined at line {}", name.text, it->second.line));
    }

    void directive(const Line& line, size_t i) {
        const auto& t = line.toks;
        const Token& d = t[i];
        if (d.text == ".text") {
            if (t[i + 1].kind != Tok::End)
                fail(line.number, t[i + 1].col,
                     fmt::format("expected end of line after .text, found {}", quoted(t[i + 1])));
            return;
        }
        if (d.text == ".equ") {
            if (t[i + 1].kind != Tok::Ident)
                fail(line.number, t[i + 1].col,
                     fmt::format(".equ expects NAME, VALUE; found {} where the name should be",
                                 quoted(t[i + 1])));
            if (t[i + 2].kind != Tok::Comma)
                fail(line.number, t[i + 2].col,
                     fmt::format(".equ expects NAME, VALUE; found {} where ',' should be",
                                 quoted(t[i + 2])));
            size_t j = i + 3;
            const Operand v = value(line, j, /*allow_reg=*/false, /*labels=*/false);
            if (t[j].kind != Tok::End)
                fail(line.number, t[j].col,
                     fmt::format("expected end of line after the .equ value, found {}",
                                 quoted(t[j])));
            define(line.number, t[i + 1], Symbol::Kind::Constant, v.imm);
            return;
        }
        if (d.text == ".data" || d.text == ".bss" || d.text == ".section")
            fail(line.number, d.col,
                 fmt::format("unknown directive '{}': programs have no data sections; load data "
                             "into HBM or VMEM with the driver or 'tpusim run --load'",
                             d.text));
        fail(line.number, d.col,
             fmt::format("unknown directive '{}' (expected .equ or .text)", d.text));
    }

    void second_pass() {
        for (const Line& line : m_lines) {
            size_t i = 0;
            const auto& t = line.toks;
            while (t[i].kind == Tok::Ident && t[i + 1].kind == Tok::Colon) i += 2;
            if (t[i].kind == Tok::End || t[i].text[0] == '.') continue;
            m_prog.code.push_back(instruction(line, i));
        }
    }

    static std::string_view kind_word(char k) {
        switch (k) {
            case 'd':
                return "register";
            case 'v':
                return "value";
            case 'm':
                return "[address]";
            case 'f':
                return "flag";
            case 'l':
                return "label";
            default:
                return "?";
        }
    }

    std::string signature(const OpInfo& oi) const {
        std::string s;
        int n = 0;
        for (char k : oi.kinds) {
            if (k == 'c') continue;
            s += (n++ ? ", " : "");
            s += kind_word(k);
        }
        std::string out =
            fmt::format("'{}' expects {} operand{}", oi.mnemonic, n, n == 1 ? "" : "s");
        if (n) out += fmt::format(" ({})", s);
        if (has_completion_flag(oi.op)) out += " and an optional completion flag";
        return out;
    }

    Instr instruction(const Line& line, size_t i) {
        const auto& t = line.toks;
        const Token& mn = t[i];
        const auto op = find_mnemonic(mn.text);
        if (!op) {
            std::string_view best;
            int best_d = 3;
            for (const OpInfo& e : op_table()) {
                const int d = edit_distance(mn.text, e.mnemonic);
                if (d < best_d) best_d = d, best = e.mnemonic;
            }
            if (!best.empty())
                fail(line.number, mn.col,
                     fmt::format("unknown instruction '{}'; did you mean '{}'?", mn.text, best));
            fail(line.number, mn.col, fmt::format("unknown instruction '{}'", mn.text));
        }
        const OpInfo& oi = info(*op);
        Instr ins;
        ins.op = *op;
        ++i;
        const int want = num_operands(*op);
        int slot = 0;
        for (char kind : oi.kinds) {
            if (kind == 'c') {
                if (t[i].kind == Tok::Comma) {
                    ++i;
                    ins.flag = static_cast<uint8_t>(flag(line, i, "completion flag"));
                }
                break;
            }
            if (slot > 0) {
                if (t[i].kind == Tok::End)
                    fail(line.number, t[i].col, fmt::format("{}; found {}", signature(oi), slot));
                if (t[i].kind != Tok::Comma)
                    fail(line.number, t[i].col,
                         fmt::format("expected ',' before operand {}, found {}", slot + 1,
                                     quoted(t[i])));
                ++i;
            } else if (t[i].kind == Tok::End && want > 0) {
                fail(line.number, t[i].col, fmt::format("{}; found 0", signature(oi)));
            }
            if (t[i].kind == Tok::Comma || t[i].kind == Tok::End)
                fail(line.number, t[i].col,
                     fmt::format("expected {} for operand {}, found {}", kind_word(kind), slot + 1,
                                 quoted(t[i])));
            ins.ops[slot] = operand(line, i, kind);
            ++slot;
        }
        if (t[i].kind != Tok::End) {
            if (t[i].kind == Tok::Comma && !has_completion_flag(*op) &&
                t[i + 1].kind == Tok::Ident && numbered_name(t[i + 1].text, 'f') &&
                std::string_view(oi.kinds).find('f') == std::string_view::npos)
                fail(line.number, t[i + 1].col,
                     fmt::format("'{}' takes no completion flag", oi.mnemonic));
            if (t[i].kind == Tok::Comma)
                fail(line.number, t[i].col, fmt::format("{}; found more", signature(oi)));
            fail(line.number, t[i].col,
                 fmt::format("expected end of line after the operands of '{}', found {}",
                             oi.mnemonic, quoted(t[i])));
        }
        return ins;
    }

    int flag(const Line& line, size_t& i, std::string_view what) {
        const Token& t = line.toks[i];
        const auto n = t.kind == Tok::Ident ? numbered_name(t.text, 'f') : std::nullopt;
        if (!n)
            fail(line.number, t.col,
                 fmt::format("expected a {} f0..f{}, found {}", what, kNumFlags - 1, quoted(t)));
        if (*n >= kNumFlags)
            fail(line.number, t.col,
                 fmt::format("flag '{}' does not exist (f0..f{})", t.text, kNumFlags - 1));
        ++i;
        return *n;
    }

    Operand operand(const Line& line, size_t& i, char kind) {
        const auto& t = line.toks;
        switch (kind) {
            case 'd': {
                const auto n =
                    t[i].kind == Tok::Ident ? numbered_name(t[i].text, 's') : std::nullopt;
                if (!n)
                    fail(line.number, t[i].col,
                         fmt::format("expected a destination register s0..s{}, found {}",
                                     kNumSregs - 1, quoted(t[i])));
                check_reg(line, t[i], *n);
                ++i;
                return Operand{static_cast<uint8_t>(*n), 0};
            }
            case 'f':
                return Operand{0, flag(line, i, "sync flag")};
            case 'l': {
                if (t[i].kind == Tok::Number) return Operand{0, branch_number(line, t[i++])};
                if (t[i].kind != Tok::Ident || t[i].text[0] == '.' ||
                    numbered_name(t[i].text, 's') || numbered_name(t[i].text, 'f'))
                    fail(line.number, t[i].col,
                         fmt::format("expected a branch target (label or instruction index), "
                                     "found {}",
                                     quoted(t[i])));
                const auto it = m_symbols.find(std::string(t[i].text));
                if (it == m_symbols.end())
                    fail(line.number, t[i].col, fmt::format("undefined label '{}'", t[i].text));
                if (it->second.kind != Symbol::Kind::Label)
                    fail(line.number, t[i].col,
                         fmt::format("'{}' is a constant, not a label", t[i].text));
                ++i;
                return Operand{0, static_cast<int32_t>(it->second.value)};
            }
            case 'm': {
                if (t[i].kind != Tok::LBracket)
                    fail(line.number, t[i].col,
                         fmt::format("expected a memory operand like [s1+64], found {}",
                                     quoted(t[i])));
                ++i;
                if (t[i].kind == Tok::RBracket)
                    fail(line.number, t[i].col, "empty memory operand '[]'");
                const Operand v = value(line, i, true, true);
                if (t[i].kind != Tok::RBracket)
                    fail(line.number, t[i].col,
                         fmt::format("expected ']' to close the memory operand, found {}",
                                     quoted(t[i])));
                ++i;
                return v;
            }
            default: {
                if (t[i].kind == Tok::LBracket)
                    fail(line.number, t[i].col,
                         "expected a value (register, number or name), found '['; memory "
                         "brackets are only for address operands");
                return value(line, i, true, true);
            }
        }
    }

    void check_reg(const Line& line, const Token& t, int n) const {
        if (n >= kNumSregs)
            fail(line.number, t.col,
                 fmt::format("register '{}' does not exist (s0..s{})", t.text, kNumSregs - 1));
    }

    int32_t branch_number(const Line& line, const Token& t) const {
        const auto v = integer(line, t);
        if (v < 0 || v > std::numeric_limits<int32_t>::max())
            fail(line.number, t.col, fmt::format("branch target {} is out of range", t.text));
        return static_cast<int32_t>(v);
    }

    /// Parses an integer literal: decimal, 0x hex or 0b binary. Floats are handled by value().
    int64_t integer(const Line& line, const Token& t) const {
        std::string_view s = t.text;
        int base = 10;
        if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
            base = 16, s.remove_prefix(2);
        else if (s.size() > 2 && s[0] == '0' && (s[1] == 'b' || s[1] == 'B'))
            base = 2, s.remove_prefix(2);
        uint64_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
        if (ec == std::errc::result_out_of_range ||
            (ec == std::errc() && p == s.data() + s.size() && v > 0xFFFFFFFFull))
            fail(line.number, t.col, fmt::format("number '{}' does not fit in 32 bits", t.text));
        if (ec != std::errc() || p != s.data() + s.size())
            fail(line.number, t.col, fmt::format("malformed number '{}'", t.text));
        return static_cast<int64_t>(v);
    }

    static bool looks_float(std::string_view s) {
        if (s.size() > 1 && s[0] == '0' &&
            (s[1] == 'x' || s[1] == 'X' || s[1] == 'b' || s[1] == 'B'))
            return false;
        return s.find_first_of(".eE") != std::string_view::npos;
    }

    int32_t float_bits(const Line& line, const Token& t, bool negative) const {
        float f = 0;
        const auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), f);
        if (ec == std::errc::result_out_of_range)
            fail(line.number, t.col,
                 fmt::format("floating-point literal '{}' is out of range for fp32", t.text));
        if (ec != std::errc() || p != t.text.data() + t.text.size())
            fail(line.number, t.col, fmt::format("malformed number '{}'", t.text));
        if (negative) f = -f;
        int32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        return bits;
    }

    /// value := ['-'] term (('+' | '-') term)*; term := register | integer | name. A register
    /// may appear once and only added; a float literal must be the whole value.
    Operand value(const Line& line, size_t& i, bool allow_reg, bool labels) {
        const auto& t = line.toks;
        Operand out;
        bool have_reg = false;
        std::string_view reg_text;
        int64_t sum = 0;
        bool negative = false;
        const size_t first = i;
        if (t[i].kind == Tok::Minus) negative = true, ++i;
        for (;;) {
            const Token& term = t[i];
            if (term.kind == Tok::Number && looks_float(term.text)) {
                const bool alone = (i == first || (i == first + 1 && negative)) &&
                                   t[i + 1].kind != Tok::Plus && t[i + 1].kind != Tok::Minus;
                if (!alone)
                    fail(line.number, term.col,
                         "a floating-point literal must be the whole operand");
                out.imm = float_bits(line, term, negative);
                ++i;
                return out;
            }
            int64_t v = 0;
            if (term.kind == Tok::Number) {
                v = integer(line, term);
            } else if (term.kind == Tok::Ident && numbered_name(term.text, 's')) {
                check_reg(line, term, *numbered_name(term.text, 's'));
                if (!allow_reg)
                    fail(line.number, term.col,
                         fmt::format("a constant cannot use a register, found '{}'", term.text));
                if (have_reg)
                    fail(line.number, term.col,
                         fmt::format("an operand can use at most one register, found '{}' after "
                                     "'{}'",
                                     term.text, reg_text));
                if (negative)
                    fail(line.number, term.col,
                         fmt::format("a register can only be added, not subtracted ('-{}')",
                                     term.text));
                have_reg = true;
                reg_text = term.text;
                out.reg = static_cast<uint8_t>(*numbered_name(term.text, 's'));
            } else if (term.kind == Tok::Ident && term.text[0] != '.') {
                const auto it = m_symbols.find(std::string(term.text));
                if (it == m_symbols.end() || (!labels && it->second.kind == Symbol::Kind::Label))
                    fail(line.number, term.col,
                         fmt::format("undefined name '{}' (not a constant{})", term.text,
                                     labels ? " or label" : " defined above"));
                v = it->second.value;
            } else {
                fail(line.number, term.col,
                     fmt::format("expected a register, number or name, found {}", quoted(term)));
            }
            sum += negative ? -v : v;
            ++i;
            if (t[i].kind != Tok::Plus && t[i].kind != Tok::Minus) break;
            negative = t[i].kind == Tok::Minus;
            ++i;
        }
        if (sum < std::numeric_limits<int32_t>::min() || sum > 0xFFFFFFFFll)
            fail(line.number, t[first].col, fmt::format("value {} does not fit in 32 bits", sum));
        out.imm = static_cast<int32_t>(static_cast<uint32_t>(sum));
        return out;
    }

    std::string_view m_text;
    std::string_view m_file;
    std::vector<Line> m_lines;
    std::map<std::string, Symbol, std::less<>> m_symbols;
    Program m_prog;
};

}  // namespace

Program assemble(std::string_view text, std::string_view filename) {
    return Assembler(text, filename).run();
}

Program assemble_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw AsmError(path, 0, 0, fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
    std::ostringstream ss;
    ss << in.rdbuf();
    return assemble(ss.str(), path);
}

}  // namespace tpu::isa
