// SPDX-License-Identifier: Apache-2.0
#include "hw/core/counter_track.h"

#include <algorithm>

#include "sim/tracer.h"

namespace tpu::hw {

void CounterTrack::add(uint64_t begin, uint64_t end, double amount) {
    if (end <= begin) return;
    const double per_cycle = amount / double(end - begin);
    for (uint64_t w = begin / m_window; w * m_window < end; ++w) {
        const uint64_t lo = std::max(begin, w * m_window), hi = std::min(end, (w + 1) * m_window);
        m_bins[w] += per_cycle * double(hi - lo);
    }
}

void CounterTrack::flush_before(uint64_t cycle, sim::Tracer& tracer) {
    while (!m_bins.empty()) {
        const auto it = m_bins.begin();
        if (cycle != UINT64_MAX && (it->first + 1) * m_window > cycle) break;
        if (m_next_zero != UINT64_MAX && m_next_zero < it->first)
            tracer.counter(m_process, m_name, m_next_zero * m_window, 0.0);
        tracer.counter(m_process, m_name, it->first * m_window,
                       it->second * m_scale / double(m_window));
        m_next_zero = it->first + 1;
        m_bins.erase(it);
    }
    if (cycle == UINT64_MAX && m_next_zero != UINT64_MAX) {
        tracer.counter(m_process, m_name, m_next_zero * m_window, 0.0);
        m_next_zero = UINT64_MAX;
    }
}

}  // namespace tpu::hw
