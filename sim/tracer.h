// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

/// Performance traces in Chrome / Perfetto trace-event JSON, written streaming.
namespace tpu::sim {

/// One `args` entry of a trace event.
struct TraceArg {
    std::string_view key;                                             ///< argument name
    std::variant<int64_t, uint64_t, double, std::string_view> value;  ///< argument value
};

/// The trace process of the trainer's estimated wall clock (trainer/host_timeline.h): its
/// tracks are on a clock of their own (TrackWindow::Own), so readers leave it out of the run.
inline constexpr std::string_view kWallClockProcess = "wall clock (estimate)";

/// Which cycles a track's events are on.
enum class TrackWindow : uint8_t {
    Run,  ///< the run's cycles: the cycle window applies, and the events end the run
    Own,  ///< a clock of their own (an estimate drawn beside the run): always kept
};

/// Writes trace events as they happen; disabled tracers cost one branch per call site.
/// Times are core cycles; the writer stamps whole nanoseconds at the configured clock (written
/// as microseconds with three decimals, the format's unit) and puts the cycle numbers in args
/// ("begin_cycle", "end_cycle"). No two complete events of one thread overlap: an event that
/// would overlap an earlier one of its track goes to the track's next free lane, a thread of
/// its own named "THREAD#1", "THREAD#2", ... (Perfetto drops slices that partially overlap).
class Tracer {
public:
    /// A disabled tracer.
    Tracer();
    ~Tracer();
    Tracer(const Tracer&) = delete;
    Tracer& operator=(const Tracer&) = delete;

    /// Starts writing to `path` at a clock of `clock_mhz`. `unit_filter` is a comma-separated
    /// list of track-name prefixes ("core3.mxu,hbm"); empty = everything. Events outside
    /// [window_begin, window_end) cycles are dropped (window_end 0 = no end).
    void open(const std::string& path, double clock_mhz, std::string_view unit_filter = {},
              uint64_t window_begin = 0, uint64_t window_end = 0);
    /// Finishes the JSON array, records the cycles the trace covers in `otherData.window`
    /// {begin_cycle, end_cycle} (an open window ends at the latest cycle of any complete or
    /// instant event offered) and closes the file; throws OutputError if any write failed. The
    /// destructor closes too, logging such an error instead.
    void close();
    /// The effective config of the run (a JSON object), written into `otherData.config` at
    /// close() so that a reader of the trace never guesses the clock or the board.
    void set_config(std::string config_json);
    /// Moves the cycle window (same meaning as in open()); for tools that learn where the
    /// interesting part starts only while running, e.g. the trainer tracing a few steps.
    void set_window(uint64_t window_begin, uint64_t window_end);
    bool enabled() const { return m_enabled; }

    /// A track: process `process` (e.g. "core3", "hbm", "host"), thread `thread` (e.g. "mxu0").
    /// Returns an id for the event calls, stable for the tracer's lifetime; names are emitted
    /// as metadata once. Returns -1 when the track is filtered out. `window` Own: the events
    /// are on a clock of their own, kept whatever the cycle window, and do not end the run.
    int track(std::string_view process, std::string_view thread,
              TrackWindow window = TrackWindow::Run);
    /// A complete ('X') event on a track from cycle `begin` to `end`, on the track's first lane
    /// whose last event ended by `begin` (a new lane if none did).
    void complete(int track, std::string_view name, uint64_t begin, uint64_t end,
                  std::initializer_list<TraceArg> args = {});
    /// An instant ('i') event.
    void instant(int track, std::string_view name, uint64_t at,
                 std::initializer_list<TraceArg> args = {});
    /// A counter ('C') sample on a process's counter track `name`.
    void counter(std::string_view process, std::string_view name, uint64_t at, double value);

    /// Number of events written so far, by kind ("X", "i", "C").
    uint64_t events_written(char phase) const;

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
    bool m_enabled = false;
};

}  // namespace tpu::sim
