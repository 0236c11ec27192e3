// SPDX-License-Identifier: Apache-2.0
#include "sim/stats.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tpu::sim {

std::string_view unit_name(StatUnit unit) {
    switch (unit) {
        case StatUnit::Count:
            return "count";
        case StatUnit::Cycles:
            return "cycles";
        case StatUnit::Bytes:
            return "bytes";
        case StatUnit::Flops:
            return "flops";
        case StatUnit::Ratio:
            return "ratio";
        case StatUnit::Seconds:
            return "seconds";
        case StatUnit::BytesPerSecond:
            return "bytes_per_second";
        case StatUnit::FlopsPerByte:
            return "flops_per_byte";
        case StatUnit::Joules:
            return "joules";
        case StatUnit::Watts:
            return "watts";
    }
    return "?";
}

namespace {

/// A dot would make find() and the dotted paths ambiguous; an empty name makes "a..b".
void check_name(std::string_view what, std::string_view name, std::string_view where) {
    if (name.empty() || name.find('.') != std::string_view::npos)
        throw std::invalid_argument(fmt::format(
            "stats: {} name '{}' in '{}' must be non-empty and contain no '.'", what, name, where));
}

}  // namespace

StatGroup::StatGroup(std::string name, StatGroup* parent)
    : m_name(std::move(name)), m_parent(parent) {
    check_name("group", m_name, m_parent ? m_parent->path() : std::string());
    if (!m_parent) return;
    // Two siblings of one name would be one key in the JSON, silently losing one of them.
    for (const StatGroup* c : m_parent->m_children)
        if (c->m_name == m_name)
            throw std::invalid_argument(
                fmt::format("stats: group '{}' already exists", m_parent->path() + "." + m_name));
    m_parent->m_children.push_back(this);
}

StatGroup::~StatGroup() {
    if (m_parent) std::erase(m_parent->m_children, this);
    // Children outliving their parent must not unregister from freed memory.
    for (StatGroup* c : m_children) c->m_parent = nullptr;
}

void StatGroup::check_new_stat(std::string_view name) const {
    check_name("statistic", name, path());
    const bool taken = std::any_of(m_counters.begin(), m_counters.end(),
                                   [&](const Counter& c) { return c.name() == name; }) ||
                       std::any_of(m_formulas.begin(), m_formulas.end(),
                                   [&](const Formula& f) { return f.name == name; });
    if (taken)
        throw std::invalid_argument(
            fmt::format("stats: statistic '{}.{}' already exists", path(), name));
}

Counter& StatGroup::add(std::string name, std::string desc, StatUnit unit) {
    check_new_stat(name);
    return m_counters.emplace_back(std::move(name), std::move(desc), unit);
}

Counter& StatGroup::add(std::string name, std::string desc, StatUnit unit,
                        std::function<uint64_t()> source) {
    check_new_stat(name);
    return m_counters.emplace_back(std::move(name), std::move(desc), unit, std::move(source));
}

void StatGroup::add_formula(std::string name, std::string desc, StatUnit unit,
                            std::function<double()> eval) {
    check_new_stat(name);
    m_formulas.push_back({std::move(name), std::move(desc), unit, std::move(eval), std::nullopt});
}

std::string StatGroup::path() const {
    return m_parent ? m_parent->path() + "." + m_name : m_name;
}

const Counter* StatGroup::find(std::string_view dotted) const {
    const size_t dot = dotted.find('.');
    if (dot == std::string_view::npos) {
        for (const Counter& c : m_counters)
            if (c.name() == dotted) return &c;
        return nullptr;
    }
    const std::string_view head = dotted.substr(0, dot);
    for (const StatGroup* g : m_children)
        if (g->name() == head) return g->find(dotted.substr(dot + 1));
    return nullptr;
}

void StatGroup::reset() {
    for (Counter& c : m_counters) c.reset();
    for (Formula& f : m_formulas) f.mirrored.reset();
    for (StatGroup* g : m_children) g->reset();
}

void StatGroup::snapshot(std::vector<uint64_t>& counters, std::vector<double>& formulas) const {
    for (const Counter& c : m_counters) counters.push_back(c.value());
    for (const Formula& f : m_formulas) formulas.push_back(f.value());
    for (const StatGroup* g : m_children) g->snapshot(counters, formulas);
}

namespace {
/// mirror() of `g`, consuming the snapshot from the front of the spans.
void mirror_from(StatGroup& g, std::span<const uint64_t>& counters,
                 std::span<const double>& formulas, std::deque<Counter>& cs,
                 std::vector<Formula>& fs) {
    if (counters.size() < cs.size() || formulas.size() < fs.size())
        throw std::invalid_argument(
            fmt::format("stats mirror of '{}': the snapshot is of another tree", g.path()));
    for (Counter& c : cs) c.mirror(counters.front()), counters = counters.subspan(1);
    for (Formula& f : fs) f.mirrored = formulas.front(), formulas = formulas.subspan(1);
}
}  // namespace

void StatGroup::mirror(std::span<const uint64_t> counters, std::span<const double> formulas) {
    const auto walk = [&](auto&& self, StatGroup& g) -> void {
        mirror_from(g, counters, formulas, g.m_counters, g.m_formulas);
        for (StatGroup* c : g.m_children) self(self, *c);
    };
    walk(walk, *this);
    if (!counters.empty() || !formulas.empty())
        throw std::invalid_argument(
            fmt::format("stats mirror of '{}': the snapshot is of another tree", path()));
}

namespace {

nlohmann::ordered_json to_json(const StatGroup& g) {
    nlohmann::ordered_json j;
    auto& counters = j["counters"] = nlohmann::ordered_json::object();
    for (const Counter& c : g.counters())
        counters[c.name()] = {
            {"value", c.value()}, {"unit", unit_name(c.unit())}, {"desc", c.desc()}};
    for (const Formula& f : g.formulas()) {
        const double v = f.value();
        counters[f.name] = {{"value", std::isfinite(v) ? nlohmann::ordered_json(v) : nullptr},
                            {"unit", unit_name(f.unit)},
                            {"desc", f.desc}};
    }
    auto& children = j["children"] = nlohmann::ordered_json::object();
    for (const StatGroup* c : g.children()) children[c->name()] = to_json(*c);
    return j;
}

std::string csv_field(std::string_view s) {
    // RFC 4180: quote fields holding separators, quotes or line breaks; double the quotes.
    if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
    std::string out = "\"";
    for (char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

template <class F>
void walk(const StatGroup& g, F&& visit) {
    const std::string p = g.path();
    for (const Counter& c : g.counters())
        visit(p, c.name(), fmt::format("{}", c.value()), c.unit(), c.desc());
    for (const Formula& f : g.formulas())
        visit(p, f.name, fmt::format("{:.6g}", f.value()), f.unit, f.desc);
    for (const StatGroup* c : g.children()) walk(*c, visit);
}

}  // namespace

void StatGroup::write_json(std::ostream& os) const {
    nlohmann::ordered_json root;
    root[m_name] = to_json(*this);
    os << root.dump(2) << "\n";
}

void StatGroup::write_csv(std::ostream& os) const {
    os << "path,name,value,unit,description\n";
    walk(*this, [&](const std::string& p, const std::string& n, const std::string& v, StatUnit u,
                    const std::string& d) {
        os << csv_field(p) << ',' << csv_field(n) << ',' << v << ',' << unit_name(u) << ','
           << csv_field(d) << '\n';
    });
}

void StatGroup::write_text(std::ostream& os) const {
    walk(*this, [&](const std::string& p, const std::string& n, const std::string& v, StatUnit u,
                    const std::string& d) {
        os << fmt::format("{:<48} {:>16} {:<16} # {}\n", p + "." + n, v, unit_name(u), d);
    });
}

}  // namespace tpu::sim
