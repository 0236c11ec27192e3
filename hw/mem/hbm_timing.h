// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>

namespace tpu::sim {
class StatGroup;
}

namespace tpu::hw {

struct BoardConfig;

/// Timing of one core's HBM as its requesters (the DMA engine, ICI writes) see it. Requests
/// reserve the resources they use (bus, banks) with busy-until bookkeeping, so a model never
/// needs a clock and concurrent streams share bandwidth.
class HbmTimingModel {
public:
    virtual ~HbmTimingModel() = default;
    /// A request of `bytes` at byte address `addr` that reaches the HBM controller at core cycle
    /// `arrive`; returns the core cycle its last byte has been transferred.
    virtual uint64_t access(uint64_t arrive, uint64_t addr, uint32_t bytes, bool write) = 0;
    /// Peak bytes per core cycle (for reports).
    virtual double peak_bytes_per_cycle() const = 0;
    /// Adds the model's statistics (views of its counters) to a core's "hbm" group.
    virtual void register_stats(sim::StatGroup& group) = 0;
};

/// The model selected by `hbm.model`.
std::unique_ptr<HbmTimingModel> make_hbm_timing(const BoardConfig& cfg);

/// "simple": one pipe at the peak bandwidth of all channels, and a fixed latency.
/// done = ceil(max(arrive, pipe free) + bytes / peak) + latency, where the pipe stays busy for
/// bytes / peak (fractional cycles, so small requests do not round the bandwidth down).
class SimpleHbmTiming : public HbmTimingModel {
public:
    explicit SimpleHbmTiming(const BoardConfig& cfg);
    uint64_t access(uint64_t arrive, uint64_t addr, uint32_t bytes, bool write) override;
    double peak_bytes_per_cycle() const override { return m_bytes_per_cycle; }
    void register_stats(sim::StatGroup& group) override;
    uint64_t latency_cycles() const { return m_latency; }

private:
    double m_bytes_per_cycle;
    uint64_t m_latency;
    double m_free = 0;  ///< cycle the pipe is free (fractional)
    uint64_t m_requests = 0;
    uint64_t m_bytes = 0;
};

}  // namespace tpu::hw
