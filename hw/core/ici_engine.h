// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tpu::hw {

/// Timing of a core's ICI engine (hw/README.md, "ICI engine"). The board's IciNetwork says when
/// a transfer's data arrives; the engine adds its own two rules:
///   - it takes one descriptor per cycle: a transfer or signal started at `s` frees it at s + 1
///     (bandwidth is the links' business, so transfers on different links overlap);
///   - delivery is in order per destination: done = max(arrival, done of this core's previous
///     transfer or signal to the same core), so a signal never overtakes earlier data.
/// The core applies the first rule when it issues; the board applies the second when it
/// resolves the core's posts (in their issue order), so it keeps an engine per core too.
/// Example: a 4 KiB transfer to core 5 arriving at 1000, then a signal to core 5 whose message
/// would arrive at 990, is done at 1000.
class IciEngine {
public:
    /// Cycle the engine may take its next descriptor.
    uint64_t free_at() const { return m_free; }
    /// Forgets earlier transfers: a launch starting at `cycle`.
    void start_at(uint64_t cycle) {
        m_free = cycle;
        std::fill(m_arrival.begin(), m_arrival.end(), 0);
    }
    /// Takes a descriptor at `start`.
    void take(uint64_t start) { m_free = start + 1; }
    /// The done cycle, under in-order delivery, of the next descriptor to `dst`, whose data or
    /// message reaches it at `arrival`.
    uint64_t deliver(uint32_t dst, uint64_t arrival) {
        if (m_arrival.size() <= dst) m_arrival.resize(dst + 1, 0);
        m_arrival[dst] = std::max(arrival, m_arrival[dst]);
        return m_arrival[dst];
    }
    /// take() and deliver() at once (a core with no board around it).
    uint64_t issue(uint64_t start, uint32_t dst, uint64_t arrival) {
        take(start);
        return deliver(dst, arrival);
    }

private:
    uint64_t m_free = 0;
    std::vector<uint64_t> m_arrival;  ///< per destination: latest done
};

}  // namespace tpu::hw
