// SPDX-License-Identifier: Apache-2.0
#include "sim/log.h"

#include <atomic>
#include <cstdio>
#include <stdexcept>

#include <systemc>

namespace tpu::sim {
namespace {

std::atomic<LogLevel> g_level{LogLevel::Warn};
std::function<void(std::string_view)>& sink() {
    static std::function<void(std::string_view)> s;
    return s;
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
    for (LogLevel l : {LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug})
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
    g_level = level;
}
LogLevel log_level() {
    return g_level;
}

void set_log_sink(std::function<void(std::string_view)> s) {
    sink() = std::move(s);
}

void log_line(LogLevel level, std::string_view block, std::string_view text) {
    // Before elaboration sc_time_stamp() is zero, which is also the truth.
    const double ns = sc_core::sc_time_stamp().to_seconds() * 1e9;
    const std::string line =
        fmt::format("[{:>12.0f} ns] {:<5} {}: {}", ns, log_level_name(level), block, text);
    if (sink())
        sink()(line);
    else
        std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace tpu::sim
