// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tpu::sim {
class Tracer;
}

namespace tpu::hw {

/// A trace counter track built from intervals: each interval's amount is spread evenly over its
/// cycles, summed per window, and a window is written (as value x scale / window) once nothing
/// can change it any more. After a busy window an idle one is written as 0 so the track drops.
class CounterTrack {
public:
    CounterTrack(std::string process, std::string name, uint64_t window, double scale)
        : m_process(std::move(process)),
          m_name(std::move(name)),
          m_window(window),
          m_scale(scale) {}

    /// Adds `amount` spread over [begin, end) (end > begin).
    void add(uint64_t begin, uint64_t end, double amount);
    /// Writes every window that ends at or before `cycle`.
    void flush_before(uint64_t cycle, sim::Tracer& tracer);
    /// Writes everything left.
    void flush_all(sim::Tracer& tracer) { flush_before(UINT64_MAX, tracer); }

private:
    std::string m_process, m_name;
    uint64_t m_window;
    double m_scale;
    std::map<uint64_t, double> m_bins;  ///< window index -> amount
    uint64_t m_next_zero = UINT64_MAX;  ///< window to write as 0 if nothing lands in it
};

}  // namespace tpu::hw
