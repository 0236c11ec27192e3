// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tpu::trainer {

/// Samples of one metric: each has a simulated device time (or a byte count) and host seconds.
struct MetricSamples {
    bool bytes = false;         ///< values are byte counts, not seconds
    std::vector<double> value;  ///< device seconds (time metrics) or bytes (data metrics)
    std::vector<double> host;   ///< host seconds spent on each sample
};

/// What a training run did, kept as PyTorch/XLA keeps it: metrics with samples (CompileTime,
/// ExecuteTime, TransferToDeviceTime, TransferFromDeviceTime, InboundData, OutboundData) and
/// plain counters (CachedCompile, UncachedCompile, MarkStep, HostSync, ...).
class Metrics {
public:
    /// One time sample: simulated device seconds and host seconds.
    void add_time(std::string_view name, double device_seconds, double host_seconds);
    /// One data sample of `bytes`.
    void add_data(std::string_view name, uint64_t bytes);
    /// Adds `n` to a counter.
    void count(std::string_view name, uint64_t n = 1);

    uint64_t counter(std::string_view name) const;
    /// Samples of `name`, or nullptr.
    const MetricSamples* metric(std::string_view name) const;
    const std::map<std::string, MetricSamples, std::less<>>& metrics() const { return m_metrics; }
    const std::map<std::string, uint64_t, std::less<>>& counters() const { return m_counters; }

    /// The report in PyTorch/XLA's metrics_report() layout: per metric TotalSamples,
    /// Accumulator, Percentiles (device time or bytes) plus HostAccumulator and
    /// HostPercentiles (host time); then each counter's Value.
    std::string report() const;

private:
    std::map<std::string, MetricSamples, std::less<>> m_metrics;
    std::map<std::string, uint64_t, std::less<>> m_counters;
};

/// A duration as PyTorch/XLA prints it: "01s234ms567.890us", "012ms345.678us", "3.210us".
std::string format_duration(double seconds);
/// A byte count as PyTorch/XLA prints it: "1.50MB", "512.00B".
std::string format_bytes(double bytes);

}  // namespace tpu::trainer
