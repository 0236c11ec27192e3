// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

/// Statistics: each block owns a StatGroup of named counters with unit and description; one
/// walker writes them all (JSON, CSV, text). The hot path increments plain integers.
namespace tpu::sim {

/// What a statistic counts.
enum class StatUnit {
    Count,
    Cycles,
    Bytes,
    Flops,
    Ratio,
    Seconds,
    BytesPerSecond,
    FlopsPerByte,
    Joules,
    Watts,
};

/// Unit name as written in stats files ("count", "cycles", ...).
std::string_view unit_name(StatUnit unit);

/// A monotonically updated 64-bit counter: either its own integer, or a view of an integer
/// that a block keeps on its hot path (read only when stats are written).
class Counter {
public:
    Counter(std::string name, std::string desc, StatUnit unit)
        : m_name(std::move(name)), m_desc(std::move(desc)), m_unit(unit) {}
    /// A counter that reads `source` when stats are written.
    Counter(std::string name, std::string desc, StatUnit unit, std::function<uint64_t()> source)
        : m_name(std::move(name)),
          m_desc(std::move(desc)),
          m_unit(unit),
          m_source(std::move(source)) {}
    Counter& operator++() {
        ++m_value;
        return *this;
    }
    Counter& operator+=(uint64_t n) {
        m_value += n;
        return *this;
    }
    /// Sets the value (for maxima and snapshots).
    void set(uint64_t v) { m_value = v; }
    /// The count since the last reset().
    uint64_t value() const {
        if (m_mirror) return *m_mirror;
        return m_source ? m_source() - m_value : m_value;
    }
    /// Shows `v` from now on: the block runs in another MPI rank, which sent its value.
    void mirror(uint64_t v) { m_mirror = v; }
    const std::string& name() const { return m_name; }
    const std::string& desc() const { return m_desc; }
    StatUnit unit() const { return m_unit; }
    /// Starts counting from zero again (a view keeps the source's value as its base).
    void reset() {
        m_mirror.reset();
        m_value = m_source ? m_source() : 0;
    }

private:
    std::string m_name;
    std::string m_desc;
    StatUnit m_unit;
    std::function<uint64_t()> m_source;  ///< empty: the count is m_value
    uint64_t m_value = 0;                ///< the count, or the source's value at the last reset
    std::optional<uint64_t> m_mirror;    ///< another rank's value, shown instead (mirror())
};

/// A value computed from counters when stats are written (utilisation, bandwidth, ...).
struct Formula {
    std::string name;                ///< key
    std::string desc;                ///< one line
    StatUnit unit;                   ///< unit
    std::function<double()> eval;    ///< evaluated at dump time
    std::optional<double> mirrored;  ///< another rank's value, shown instead of eval()
    /// The value to write.
    double value() const { return mirrored ? *mirrored : eval ? eval() : 0.0; }
};

/// A named node of the stats tree. Children register themselves with their parent.
class StatGroup {
public:
    /// A root group (parent == nullptr) or a child of `parent`. Names are non-empty, without
    /// '.', and unique among siblings (std::invalid_argument otherwise).
    explicit StatGroup(std::string name, StatGroup* parent = nullptr);
    virtual ~StatGroup();
    StatGroup(const StatGroup&) = delete;
    StatGroup& operator=(const StatGroup&) = delete;

    /// Registers a counter; the reference stays valid for the group's lifetime. Counter and
    /// formula names are unique within a group (std::invalid_argument otherwise).
    Counter& add(std::string name, std::string desc, StatUnit unit);
    /// Registers a counter that reads `source` (a block's plain integer) when stats are written.
    Counter& add(std::string name, std::string desc, StatUnit unit,
                 std::function<uint64_t()> source);
    /// Registers a view of `value`, which must outlive the group.
    Counter& add(std::string name, std::string desc, StatUnit unit, const uint64_t& value) {
        return add(std::move(name), std::move(desc), unit, [&value] { return value; });
    }
    /// Registers a formula evaluated when stats are written.
    void add_formula(std::string name, std::string desc, StatUnit unit,
                     std::function<double()> eval);

    const std::string& name() const { return m_name; }
    /// Dotted path from the root ("board.core3.mxu0").
    std::string path() const;
    const std::deque<Counter>& counters() const { return m_counters; }
    const std::vector<Formula>& formulas() const { return m_formulas; }
    const std::vector<StatGroup*>& children() const { return m_children; }
    /// Finds a counter by dotted path relative to this group, or nullptr.
    const Counter* find(std::string_view dotted) const;

    /// Every counter and formula value of this group and below, in a fixed walk order (for
    /// another rank's mirror()).
    void snapshot(std::vector<uint64_t>& counters, std::vector<double>& formulas) const;
    /// Shows the values of a snapshot() of the same tree, taken in another rank.
    void mirror(std::span<const uint64_t> counters, std::span<const double> formulas);
    /// Zeroes every counter below this group (region-of-interest reset).
    void reset();

    /// Nested JSON: {"name": {"counters": {key: {"value", "unit", "desc"}}, "children": ...}}.
    void write_json(std::ostream& os) const;
    /// Flat CSV: path,name,value,unit,description.
    void write_csv(std::ostream& os) const;
    /// Aligned text, one line per statistic.
    void write_text(std::ostream& os) const;

private:
    /// Throws std::invalid_argument if `name` is not a valid new counter or formula name.
    void check_new_stat(std::string_view name) const;

    std::string m_name;
    StatGroup* m_parent;
    std::deque<Counter> m_counters;
    std::vector<Formula> m_formulas;
    std::vector<StatGroup*> m_children;
};

}  // namespace tpu::sim
