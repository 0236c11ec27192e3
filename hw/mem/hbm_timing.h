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
    /// A DMA transfer: `rows` rows of `row_bytes` at `addr` + r x `stride`, each cut into
    /// requests of at most `chunk` bytes, request i arriving at core cycle `start` + floor(bytes
    /// of the transfer before it / `port`). Returns the latest completion (`start` if none).
    /// Equal to access() of every request in order (the default); a model may serve them in
    /// another order where that cannot change a result, since no other requester can come
    /// between them.
    virtual uint64_t access_rows(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                                 uint64_t stride, uint32_t chunk, uint32_t port, bool write);
    /// Peak bytes per core cycle (for reports).
    virtual double peak_bytes_per_cycle() const = 0;
    /// Adds the model's statistics (views of its counters) to a core's "hbm" group.
    virtual void register_stats(sim::StatGroup& group) = 0;
};

/// The model selected by `hbm.model`.
std::unique_ptr<HbmTimingModel> make_hbm_timing(const BoardConfig& cfg);
/// peak_bytes_per_cycle() of that model, without making one (planners ask it per candidate).
double hbm_peak_bytes_per_cycle(const BoardConfig& cfg);

/// "simple": one pipe at the peak bandwidth of all channels, and a fixed latency.
/// done = ceil(max(arrive, pipe free) + bytes / peak) + latency, where the pipe stays busy for
/// bytes / peak (fractional cycles, so small requests do not round the bandwidth down).
class SimpleHbmTiming : public HbmTimingModel {
public:
    explicit SimpleHbmTiming(const BoardConfig& cfg);
    /// Peak bytes per core cycle of every channel together.
    static double peak(const BoardConfig& cfg);
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
