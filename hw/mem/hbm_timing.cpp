// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/hbm_timing.h"

#include <algorithm>

#include "hw/board_config.h"
#include "hw/mem/hbm2.h"
#include "sim/stats.h"

namespace tpu::hw {

std::unique_ptr<HbmTimingModel> make_hbm_timing(const BoardConfig& cfg) {
    if (cfg.hbm.model == "hbm2") return std::make_unique<Hbm2Timing>(cfg);
    return std::make_unique<SimpleHbmTiming>(cfg);
}

SimpleHbmTiming::SimpleHbmTiming(const BoardConfig& cfg) {
    const HbmConfig& h = cfg.hbm;
    // Every channel moves bus_bits per edge, two edges per HBM clock: bytes per us, then per
    // core cycle.
    const double bytes_per_us =
        double(h.channels) * h.bus_bits / 8.0 * 2.0 * (1e6 / double(h.tck_ps));
    m_bytes_per_cycle = bytes_per_us / cfg.clock().mhz();
    m_latency = cfg.clock().ns_to_cycles(h.simple_latency_ns);
}

void SimpleHbmTiming::register_stats(sim::StatGroup& g) {
    g.add("requests", "requests served", sim::StatUnit::Count, m_requests);
    g.add("bytes", "bytes read or written", sim::StatUnit::Bytes, m_bytes);
}

uint64_t SimpleHbmTiming::access(uint64_t arrive, uint64_t, uint32_t bytes, bool) {
    ++m_requests;
    m_bytes += bytes;
    const double start = std::max(double(arrive), m_free);
    m_free = start + double(bytes) / m_bytes_per_cycle;
    return static_cast<uint64_t>(std::ceil(m_free)) + m_latency;
}

}  // namespace tpu::hw
