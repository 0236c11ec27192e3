// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

/// Logging with the simulated time and the block path:
///   [    1234 ns] warn  board.core3.dma: zero-length row skipped
/// Levels below the current one cost one comparison; messages go to stderr or a sink.
namespace tpu::sim {

/// Severity, most severe first.
enum class LogLevel : uint8_t { Error, Warn, Info, Debug };

/// "error", "warn", "info", "debug"; throws std::invalid_argument naming the valid ones.
LogLevel parse_log_level(std::string_view name);
std::string_view log_level_name(LogLevel level);

/// Messages at or above this severity are written (default Warn; sim.log_level sets it).
void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) {
    return level <= log_level();
}

/// Where formatted lines go (one call per line, without the newline); empty: stderr.
void set_log_sink(std::function<void(std::string_view)> sink);

/// Writes one line: simulated time (SystemC's clock when it runs, else 0), level, block, text.
void log_line(LogLevel level, std::string_view block, std::string_view text);

/// Formats and writes a message if the level is enabled.
template <class... Args>
void log(LogLevel level, std::string_view block, fmt::format_string<Args...> f, Args&&... args) {
    if (log_enabled(level)) log_line(level, block, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tpu::sim

/// TPU_LOG(Info, "board.core3.mxu0", "loaded {} bytes", n): formats only when enabled.
#define TPU_LOG(level, block, ...)                                            \
    do {                                                                      \
        if (::tpu::sim::log_enabled(::tpu::sim::LogLevel::level))             \
            ::tpu::sim::log(::tpu::sim::LogLevel::level, block, __VA_ARGS__); \
    } while (0)
