// SPDX-License-Identifier: Apache-2.0
#include "sim/config_io.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/file_io.h"

namespace tpu::sim {
namespace {

using Json = nlohmann::ordered_json;

std::string join(const std::vector<std::string>& path, std::string_view leaf = {}) {
    std::string out;
    for (const auto& p : path) {
        if (!out.empty()) out += '.';
        out += p;
    }
    if (!leaf.empty()) {
        if (!out.empty()) out += '.';
        out += leaf;
    }
    return out;
}

/// One leaf as seen by the walkers: full dotted key plus everything the struct declared.
struct Leaf {
    std::string key;
    FieldRef ref;
    std::string unit;
    std::string doc;
    Check check;
};

/// Flattens the config into its leaves and section keys, in declaration order.
class Collector : public Visitor {
public:
    std::vector<Leaf> leaves;
    std::vector<std::string> sections;

    void field(std::string_view key, FieldRef ref, std::string_view unit, std::string_view doc,
               const Check& check) override {
        leaves.push_back({join(m_path, key), ref, std::string(unit), std::string(doc), check});
    }
    void enter(std::string_view key, std::string_view) override {
        m_path.emplace_back(key);
        sections.push_back(join(m_path));
    }
    void leave() override { m_path.pop_back(); }

private:
    std::vector<std::string> m_path;
};

Collector collect(const VisitRoot& root) {
    Collector c;
    root(c);
    return c;
}

// Levenshtein distance, for "did you mean" suggestions on unknown keys.
size_t distance(std::string_view a, std::string_view b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string unknown_key(const Collector& c, const std::string& key) {
    std::string best;
    size_t best_d = 4;  // farther than this is no useful suggestion
    auto consider = [&](const std::string& k) {
        const size_t d = distance(k, key);
        // A suggestion that rewrites half the key is a guess, not a typo fix.
        if (d < best_d && 2 * d < key.size()) best_d = d, best = k;
    };
    for (const auto& l : c.leaves) consider(l.key);
    for (const auto& s : c.sections) consider(s);
    std::string msg = fmt::format("unknown key '{}'", key);
    if (!best.empty()) msg += fmt::format(" (did you mean '{}'?)", best);
    return msg;
}

const char* type_name(const FieldRef& ref) {
    struct V {
        const char* operator()(bool*) const { return "a boolean"; }
        const char* operator()(uint32_t*) const { return "an unsigned 32-bit integer"; }
        const char* operator()(uint64_t*) const { return "an unsigned 64-bit integer"; }
        const char* operator()(int64_t*) const { return "an integer"; }
        const char* operator()(double*) const { return "a number"; }
        const char* operator()(std::string*) const { return "a string"; }
    };
    return std::visit(V{}, ref);
}

std::string value_text(const FieldRef& ref) {
    return std::visit(
        [](auto* p) -> std::string {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, bool>)
                return *p ? "true" : "false";
            else if constexpr (std::is_same_v<T, std::string>)
                return *p;
            else if constexpr (std::is_same_v<T, double>)
                return fmt::format("{}", *p);
            else
                return std::to_string(*p);
        },
        ref);
}

Json to_json(const FieldRef& ref) {
    return std::visit([](auto* p) -> Json { return Json(*p); }, ref);
}

/// JSON text of a value for an error message. A --set string may hold invalid UTF-8, which a
/// plain dump() would throw on; replace those bytes instead.
std::string shown(const Json& j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

/// Stores a JSON value into a field; returns an error text or empty on success.
std::string assign(const FieldRef& ref, const Json& j) {
    const std::string want = fmt::format("expected {}, got {}", type_name(ref), shown(j));
    return std::visit(
        [&](auto* p) -> std::string {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, bool>) {
                if (!j.is_boolean()) return want;
                *p = j.get<bool>();
            } else if constexpr (std::is_same_v<T, std::string>) {
                if (!j.is_string()) return want;
                *p = j.get<std::string>();
            } else if constexpr (std::is_same_v<T, double>) {
                if (!j.is_number()) return want;
                *p = j.get<double>();
            } else if constexpr (std::is_same_v<T, int64_t>) {
                if (j.is_number_integer()) {
                    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX))
                        return want;
                    *p = j.get<int64_t>();
                } else {
                    return want;
                }
            } else {  // unsigned
                if (!j.is_number_integer()) return want;
                if (!j.is_number_unsigned())
                    return fmt::format("must not be negative (got {})", shown(j));
                const uint64_t v = j.get<uint64_t>();
                if (v > std::numeric_limits<T>::max())
                    return fmt::format("{} does not fit {}", v, type_name(ref));
                *p = static_cast<T>(v);
            }
            return {};
        },
        ref);
}

/// Parses `--set` text by the field's type into JSON, so one assignment path serves both.
Json parse_text(const FieldRef& ref, const std::string& text, std::string& error) {
    if (std::holds_alternative<std::string*>(ref)) return Json(text);
    if (std::holds_alternative<bool*>(ref)) {
        if (text == "true" || text == "1") return Json(true);
        if (text == "false" || text == "0") return Json(false);
        error = fmt::format("expected true, false, 1 or 0, got '{}'", text);
        return {};
    }
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_number()) {
        error = fmt::format("expected {}, got '{}'", type_name(ref), text);
        return {};
    }
    return j;
}

void apply_object(const Collector& c, const Json& obj, const std::string& prefix,
                  std::string_view source) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
        const Leaf* leaf = nullptr;
        for (const auto& l : c.leaves)
            if (l.key == key) leaf = &l;
        if (leaf) {
            const std::string err = assign(leaf->ref, it.value());
            if (!err.empty()) throw ConfigError(fmt::format("{}: key '{}': {}", source, key, err));
            continue;
        }
        if (std::find(c.sections.begin(), c.sections.end(), key) != c.sections.end()) {
            if (!it.value().is_object())
                throw ConfigError(
                    fmt::format("{}: key '{}': expected an object (a section), got {}", source, key,
                                shown(it.value())));
            apply_object(c, it.value(), key, source);
            continue;
        }
        throw ConfigError(fmt::format("{}: {}", source, unknown_key(c, key)));
    }
}

std::string check_leaf(const Leaf& l) {
    if (auto* s = std::get_if<std::string*>(&l.ref)) {
        if (l.check.choices.empty()) return {};
        std::string_view rest = l.check.choices;
        while (!rest.empty()) {
            const size_t comma = rest.find(',');
            if (rest.substr(0, comma) == **s) return {};
            rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        }
        return fmt::format("{} must be one of {} (got '{}')", l.key, l.check.choices, **s);
    }
    if (std::holds_alternative<bool*>(l.ref)) return {};
    const double v = std::visit(
        [](auto* p) -> double {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_arithmetic_v<T>)
                return static_cast<double>(*p);
            else
                return 0.0;
        },
        l.ref);
    if (!std::isfinite(v)) return fmt::format("{} must be a finite number (got {})", l.key, v);
    if (v < l.check.min)
        return fmt::format("{} must be >= {} (got {})", l.key, l.check.min, value_text(l.ref));
    if (v > l.check.max)
        return fmt::format("{} must be <= {} (got {})", l.key, l.check.max, value_text(l.ref));
    if (l.check.pow2) {
        const uint64_t u = std::visit(
            [](auto* p) -> uint64_t {
                using T = std::remove_pointer_t<decltype(p)>;
                if constexpr (std::is_integral_v<T>)
                    return static_cast<uint64_t>(*p);
                else
                    return 0;
            },
            l.ref);
        if (u == 0 || (u & (u - 1)) != 0)
            return fmt::format("{} must be a power of two (got {})", l.key, value_text(l.ref));
    }
    return {};
}

}  // namespace

void apply_json(const VisitRoot& root, std::string_view text, std::string_view source) {
    const Collector fields = collect(root);
    // No config value is an object deeper than the deepest section, or an array of more than
    // one level; a file nested deeper is refused as it is parsed, so a huge nesting costs
    // neither memory nor stack (printing such a value in an error would recurse through it).
    size_t max_nesting = 1;
    for (const auto& sec : fields.sections)
        max_nesting = std::max<size_t>(max_nesting, 2 + std::count(sec.begin(), sec.end(), '.'));
    ++max_nesting;  // an array (or object) as a leaf's value gets the leaf's type error
    // nlohmann keeps the last of duplicate keys; a file that sets a field twice is ambiguous
    // (which did the user mean?), so the parser callback refuses the second, naming its path.
    // Each open object keeps its own keys only; the dotted path is joined for an error.
    struct Object {
        std::set<std::string> keys;
        std::string last;  ///< the key whose value is being parsed
    };
    std::vector<Object> open;
    size_t nesting = 0;  // open objects and arrays
    const auto path_to = [&](const std::string& leaf) {
        std::string path;
        for (size_t i = 0; i + 1 < open.size(); ++i) path += open[i].last + ".";
        return path + leaf;
    };
    const auto refuse_duplicates = [&](int, nlohmann::json::parse_event_t event, Json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start || event == Event::array_start) {
            if (++nesting > max_nesting)
                throw ConfigError(fmt::format(
                    "{}: key '{}': nested {} levels deep; no config value is nested more than {}",
                    source, open.empty() ? std::string() : path_to(open.back().last), nesting,
                    max_nesting));
            // Arrays are transparent: an object in one takes the path of the array's key.
            if (event == Event::object_start) open.push_back({});
        } else if (event == Event::object_end || event == Event::array_end) {
            --nesting;
            if (event == Event::object_end) open.pop_back();
        } else if (event == Event::key) {
            Object& o = open.back();
            o.last = parsed.get<std::string>();
            if (!o.keys.insert(o.last).second)
                throw ConfigError(fmt::format("{}: duplicate key '{}'", source, path_to(o.last)));
        }
        return true;
    };
    Json j;
    try {
        j = Json::parse(text, refuse_duplicates);
    } catch (const nlohmann::json::parse_error& e) {
        // nlohmann reports a byte offset; turn it into line:column for the user.
        size_t line = 1, col = 1;
        for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
            if (text[i] == '\n')
                ++line, col = 1;
            else
                ++col;
        }
        std::string what = e.what();
        if (auto p = what.find("syntax error"); p != std::string::npos) what = what.substr(p);
        throw ConfigError(fmt::format("{}:{}:{}: malformed JSON: {}", source, line, col, what));
    } catch (const nlohmann::json::exception& e) {
        // Not a syntax error but still unreadable, e.g. a number that overflows a double.
        std::string what = e.what();
        if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
        throw ConfigError(fmt::format("{}: malformed JSON: {}", source, what));
    }
    if (!j.is_object())
        throw ConfigError(fmt::format("{}: expected a JSON object at the top level", source));
    apply_object(fields, j, "", source);
}

void apply_json_file(const VisitRoot& root, const std::string& path) {
    // Opening a directory succeeds on Linux and reads as empty; without this check the user
    // would see "malformed JSON ... unexpected end of input" for a path that is not a file.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw ConfigError(fmt::format("{}: is a directory, not a config file", path));
    if (!std::ifstream(path, std::ios::binary))
        throw ConfigError(fmt::format("{}: cannot open config file", path));
    std::string text;
    try {
        text = read_input_file(path, kMaxConfigBytes);
    } catch (const InputFileError& e) {
        throw ConfigError(e.what());
    }
    apply_json(root, text, path);
}

void apply_override(const VisitRoot& root, std::string_view assignment) {
    const size_t eq = assignment.find('=');
    if (eq == std::string_view::npos)
        throw ConfigError(fmt::format("--set {}: expected key.path=value", assignment));
    const std::string key(assignment.substr(0, eq));
    const std::string text(assignment.substr(eq + 1));
    if (key.empty())
        throw ConfigError(fmt::format("--set {}: the key before '=' is empty", assignment));
    const Collector c = collect(root);
    for (const auto& l : c.leaves) {
        if (l.key != key) continue;
        std::string err;
        const Json j = parse_text(l.ref, text, err);
        if (err.empty()) err = assign(l.ref, j);
        if (!err.empty()) throw ConfigError(fmt::format("--set {}: {}", assignment, err));
        return;
    }
    if (std::find(c.sections.begin(), c.sections.end(), key) != c.sections.end())
        throw ConfigError(
            fmt::format("--set {}: '{}' is a section; set one of its fields", assignment, key));
    throw ConfigError(fmt::format("--set {}: {}", assignment, unknown_key(c, key)));
}

void validate_fields(const VisitRoot& root) {
    for (const auto& l : collect(root).leaves)
        if (std::string err = check_leaf(l); !err.empty()) throw ConfigError(err);
}

std::string dump_json(const VisitRoot& root) {
    // Rebuild the nesting from the visitor so keys keep declaration order.
    class Dumper : public Visitor {
    public:
        Json out = Json::object();
        std::vector<Json*> stack{&out};
        void field(std::string_view key, FieldRef ref, std::string_view, std::string_view,
                   const Check&) override {
            (*stack.back())[std::string(key)] = to_json(ref);
        }
        void enter(std::string_view key, std::string_view) override {
            Json& sub = (*stack.back())[std::string(key)];
            sub = Json::object();
            stack.push_back(&sub);
        }
        void leave() override { stack.pop_back(); }
    } d;
    root(d);
    // A --set string may hold any bytes; replace invalid UTF-8 rather than throw from the dump.
    return d.out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string doc_table(const VisitRoot& root) {
    std::string out = "| key | type | unit | default | description |\n|---|---|---|---|---|\n";
    for (const auto& l : collect(root).leaves) {
        std::string type = type_name(l.ref);
        if (type.rfind("a ", 0) == 0)
            type = type.substr(2);
        else if (type.rfind("an ", 0) == 0)
            type = type.substr(3);
        std::string doc = l.doc;
        if (!l.check.choices.empty()) doc += fmt::format(" (one of: {})", l.check.choices);
        if (l.check.pow2) doc += " (power of two)";
        out += fmt::format("| `{}` | {} | {} | `{}` | {} |\n", l.key, type,
                           l.unit.empty() ? "–" : l.unit, value_text(l.ref), doc);
    }
    return out;
}

}  // namespace tpu::sim
