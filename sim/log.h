// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

/// Logging with the simulated time and the block path:
///   [        1234 ns] warn  board.core3.dma: zero-length row skipped
///   [        1234 ns @ cycle 1160] info  board.core3.mxu0: loaded 64 bytes
/// Levels below the current one cost one comparison; messages go to stderr or a sink.
namespace tpu::sim {

/// Severity, most severe first.
enum class LogLevel : uint8_t { Error, Warn, Info, Debug };

/// "error", "warn", "info", "debug"; throws std::invalid_argument naming the valid ones.
LogLevel parse_log_level(std::string_view name);
/// The name parse_log_level accepts for `level`.
std::string_view log_level_name(LogLevel level);

namespace detail {
// Inline so that a disabled TPU_LOG is one relaxed load and a compare, not a call.
inline std::atomic<LogLevel> g_log_level{LogLevel::Warn};
}  // namespace detail

/// Messages at or above this severity are written (default Warn; sim.log_level sets it).
void set_log_level(LogLevel level);
/// The current threshold.
inline LogLevel log_level() {
    return detail::g_log_level.load(std::memory_order_relaxed);
}
/// True if messages at `level` are written.
inline bool log_enabled(LogLevel level) {
    return level <= log_level();
}

/// Where formatted lines go (one call per line, without the newline); empty: stderr. The sink
/// runs under the logger's lock, so it must not log itself.
void set_log_sink(std::function<void(std::string_view)> sink);

/// Writes one line: simulated time (SystemC's clock when it runs, else 0), level, block, text.
void log_line(LogLevel level, std::string_view block, std::string_view text);
/// As log_line, with the block's cycle number when the caller knows it.
void log_line_at(LogLevel level, std::string_view block, uint64_t cycle, std::string_view text);

/// Formats and writes a message if the level is enabled.
template <class... Args>
void log(LogLevel level, std::string_view block, fmt::format_string<Args...> f, Args&&... args) {
    if (log_enabled(level)) log_line(level, block, fmt::format(f, std::forward<Args>(args)...));
}

/// Formats and writes a message with a cycle number if the level is enabled.
template <class... Args>
void log_at(LogLevel level, std::string_view block, uint64_t cycle, fmt::format_string<Args...> f,
            Args&&... args) {
    if (log_enabled(level))
        log_line_at(level, block, cycle, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tpu::sim

/// TPU_LOG(Info, "board.core3.mxu0", "loaded {} bytes", n): formats only when enabled, and the
/// arguments are not even evaluated otherwise.
#define TPU_LOG(level, block, ...)                                            \
    do {                                                                      \
        if (::tpu::sim::log_enabled(::tpu::sim::LogLevel::level))             \
            ::tpu::sim::log(::tpu::sim::LogLevel::level, block, __VA_ARGS__); \
    } while (0)

/// TPU_LOG_AT(Debug, "board.core0.dma", cycle, "row {} done", r): TPU_LOG with a cycle number.
#define TPU_LOG_AT(level, block, cycle, ...)                                            \
    do {                                                                                \
        if (::tpu::sim::log_enabled(::tpu::sim::LogLevel::level))                       \
            ::tpu::sim::log_at(::tpu::sim::LogLevel::level, block, cycle, __VA_ARGS__); \
    } while (0)
