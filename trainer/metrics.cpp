// SPDX-License-Identifier: Apache-2.0
#include "trainer/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace tpu::trainer {

void Metrics::add_time(std::string_view name, double device_seconds, double host_seconds) {
    auto it = m_metrics.try_emplace(std::string(name)).first;
    it->second.value.push_back(device_seconds);
    it->second.host.push_back(host_seconds);
}

void Metrics::add_data(std::string_view name, uint64_t bytes) {
    auto it = m_metrics.try_emplace(std::string(name)).first;
    it->second.bytes = true;
    it->second.value.push_back(double(bytes));
    it->second.host.push_back(0);
}

void Metrics::count(std::string_view name, uint64_t n) {
    m_counters[std::string(name)] += n;
}

uint64_t Metrics::counter(std::string_view name) const {
    auto it = m_counters.find(name);
    return it == m_counters.end() ? 0 : it->second;
}

const MetricSamples* Metrics::metric(std::string_view name) const {
    auto it = m_metrics.find(name);
    return it == m_metrics.end() ? nullptr : &it->second;
}

std::string format_duration(double seconds) {
    // Whole nanoseconds, then split the way PyTorch/XLA's humanised durations read.
    const auto ns = static_cast<uint64_t>(std::llround(std::max(0.0, seconds) * 1e9));
    const uint64_t s = ns / 1000000000, ms = ns / 1000000 % 1000, us = ns / 1000 % 1000,
                   frac = ns % 1000;
    if (s > 0) return fmt::format("{:02}s{:03}ms{:03}.{:03}us", s, ms, us, frac);
    if (ms > 0) return fmt::format("{:03}ms{:03}.{:03}us", ms, us, frac);
    return fmt::format("{}.{:03}us", us, frac);
}

std::string format_bytes(double bytes) {
    static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        ++u;
    }
    return fmt::format("{:.2f}{}", bytes, kUnits[u]);
}

namespace {

std::string percentiles(std::vector<double> v, bool bytes) {
    std::sort(v.begin(), v.end());
    std::string out;
    for (int p : {1, 5, 10, 20, 50, 80, 90, 95, 99}) {
        // Nearest rank, as XLA's percentile reporter does on its sample window.
        const size_t i = std::min(v.size() - 1, size_t(double(p) / 100.0 * double(v.size())));
        out += fmt::format("{}{}%={}", out.empty() ? "" : "; ", p,
                           bytes ? format_bytes(v[i]) : format_duration(v[i]));
    }
    return out;
}

}  // namespace

std::string Metrics::report() const {
    std::string out;
    for (const auto& [name, m] : m_metrics) {
        if (m.value.empty()) continue;
        const double total = std::accumulate(m.value.begin(), m.value.end(), 0.0);
        const double host = std::accumulate(m.host.begin(), m.host.end(), 0.0);
        out += fmt::format("Metric: {}\n  TotalSamples: {}\n", name, m.value.size());
        out += fmt::format("  Accumulator: {}\n",
                           m.bytes ? format_bytes(total) : format_duration(total));
        out += fmt::format("  Percentiles: {}\n", percentiles(m.value, m.bytes));
        if (!m.bytes) {
            out += fmt::format("  HostAccumulator: {}\n", format_duration(host));
            out += fmt::format("  HostPercentiles: {}\n", percentiles(m.host, false));
        }
    }
    for (const auto& [name, v] : m_counters)
        out += fmt::format("Counter: {}\n  Value: {}\n", name, v);
    return out;
}

}  // namespace tpu::trainer
