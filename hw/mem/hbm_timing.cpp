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

uint64_t HbmTimingModel::access_rows(uint64_t start, uint64_t rows, uint64_t row_bytes,
                                     uint64_t addr, uint64_t stride, uint32_t chunk, uint32_t port,
                                     bool write) {
    uint64_t before = 0;  // bytes of this transfer ahead of the request
    uint64_t done = start;
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t off = 0; off < row_bytes; off += chunk) {
            const auto len = static_cast<uint32_t>(std::min<uint64_t>(chunk, row_bytes - off));
            done =
                std::max(done, access(start + before / port, addr + r * stride + off, len, write));
            before += len;
        }
    return done;
}

double hbm_peak_bytes_per_cycle(const BoardConfig& cfg) {
    return cfg.hbm.model == "hbm2" ? Hbm2Timing::peak(cfg) : SimpleHbmTiming::peak(cfg);
}

double SimpleHbmTiming::peak(const BoardConfig& cfg) {
    const HbmConfig& h = cfg.hbm;
    // Every channel moves bus_bits per edge, two edges per HBM clock: bytes per us, then per
    // core cycle.
    const double bytes_per_us =
        double(h.channels) * h.bus_bits / 8.0 * 2.0 * (1e6 / double(h.tck_ps));
    return bytes_per_us / cfg.clock().mhz();
}

SimpleHbmTiming::SimpleHbmTiming(const BoardConfig& cfg)
    : m_bytes_per_cycle(peak(cfg)),
      m_latency(cfg.clock().ns_to_cycles(cfg.hbm.simple_latency_ns)) {}

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
