// SPDX-License-Identifier: Apache-2.0
#include "sim/log.h"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <systemc>

namespace tpu::sim {
namespace {

constexpr LogLevel kAllLevels[] = {LogLevel::Error, LogLevel::Warn, LogLevel::Info,
                                   LogLevel::Debug};

// The sink is swapped by tests and tools while models may log from other threads (host
// runtime); one lock keeps lines whole and the sink alive while it runs.
struct Output {
    std::mutex mutex;
    std::function<void(std::string_view)> sink;
};
Output& output() {
    static Output o;
    return o;
}

/// Simulated time in whole nanoseconds. Before elaboration sc_time_stamp() is zero, which is
/// also the truth; rounding keeps 999.9999 ns (a double artefact) from printing as 999.
long long now_ns() {
    return std::llround(sc_core::sc_time_stamp().to_seconds() * 1e9);
}

void write(LogLevel level, std::string_view block, std::optional<uint64_t> cycle,
           std::string_view text) {
    fmt::memory_buffer line;
    if (cycle)
        fmt::format_to(std::back_inserter(line), "[{:>12} ns @ cycle {}] ", now_ns(), *cycle);
    else
        fmt::format_to(std::back_inserter(line), "[{:>12} ns] ", now_ns());
    fmt::format_to(std::back_inserter(line), "{:<5} {}: {}", log_level_name(level), block, text);
    const std::string_view sv(line.data(), line.size());
    Output& o = output();
    const std::lock_guard lock(o.mutex);
    if (o.sink)
        o.sink(sv);
    else
        std::fprintf(stderr, "%.*s\n", static_cast<int>(sv.size()), sv.data());
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
    for (LogLevel l : kAllLevels)
        if (log_level_name(l) == name) return l;
    throw std::invalid_argument(
        fmt::format("unknown log level '{}' (expected error, warn, info or debug)", name));
}

std::string_view log_level_name(LogLevel level) {
    switch (level) {
        case LogLevel::Error:
            return "error";
        case LogLevel::Warn:
            return "warn";
        case LogLevel::Info:
            return "info";
        case LogLevel::Debug:
            return "debug";
    }
    return "?";
}

void set_log_level(LogLevel level) {
    detail::g_log_level.store(level, std::memory_order_relaxed);
}

void set_log_sink(std::function<void(std::string_view)> sink) {
    Output& o = output();
    const std::lock_guard lock(o.mutex);
    o.sink = std::move(sink);
}

void log_line(LogLevel level, std::string_view block, std::string_view text) {
    write(level, block, std::nullopt, text);
}

void log_line_at(LogLevel level, std::string_view block, uint64_t cycle, std::string_view text) {
    write(level, block, cycle, text);
}

}  // namespace tpu::sim
