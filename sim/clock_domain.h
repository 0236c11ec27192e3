// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>

namespace tpu::sim {

/// One clock: every ns <-> cycles <-> seconds conversion of a block goes through here, so a
/// derived time is computed one way everywhere (hw/README.md, "Clock").
///
/// Cycles are the unit of truth. Conversions to real time use the exact period 1 / f; only
/// SystemC needs a whole number of picoseconds per cycle (940 MHz: 1063.83 ps -> 1064 ps), and
/// that rounding never leaks out of the kernel: the board turns SystemC time back into cycles
/// by dividing by the same rounded step, and reports seconds from cycles.
class ClockDomain {
public:
    /// A clock of `mhz` megahertz (positive).
    explicit constexpr ClockDomain(double mhz) : m_mhz(mhz) {}

    /// Frequency in MHz.
    constexpr double mhz() const { return m_mhz; }
    /// Frequency in Hz.
    constexpr double hz() const { return m_mhz * 1e6; }
    /// SystemC time step per cycle: the period rounded to the nearest picosecond.
    uint64_t sc_period_ps() const { return static_cast<uint64_t>(1e6 / m_mhz + 0.5); }

    /// Whole cycles that cover `ns` nanoseconds (rounded up): a latency given in ns never
    /// finishes early.
    uint64_t ns_to_cycles(double ns) const {
        return static_cast<uint64_t>(std::ceil(ns * m_mhz / 1000.0));
    }
    /// Exact real time of `cycles`, in seconds.
    constexpr double seconds(double cycles) const { return cycles / hz(); }
    /// Exact real time of `cycles`, in microseconds.
    constexpr double us(double cycles) const { return cycles / m_mhz; }
    /// Real time of `cycles` in whole nanoseconds, rounded to the nearest one (trace stamps).
    /// Monotonic in `cycles`, so spans that touch or nest in cycles still do in nanoseconds.
    int64_t ns(uint64_t cycles) const {
        return std::llround(static_cast<double>(cycles) * 1e3 / m_mhz);
    }
    /// Bytes per cycle of a link of `gb_per_s` GB/s (1e9 B/s).
    constexpr double bytes_per_cycle(double gb_per_s) const { return gb_per_s * 1e9 / hz(); }

private:
    double m_mhz;
};

}  // namespace tpu::sim
