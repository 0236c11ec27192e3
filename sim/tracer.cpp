// SPDX-License-Identifier: Apache-2.0
#include "sim/tracer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sim/clock_domain.h"
#include "sim/file_io.h"
#include "sim/log.h"

namespace tpu::sim {
namespace {

using Buffer = fmt::memory_buffer;

void put(Buffer& b, std::string_view s) {
    b.append(s.data(), s.data() + s.size());
}

/// Appends `s` as a JSON string body (without the quotes).
void put_escaped(Buffer& b, std::string_view s) {
    for (const char c : s) {
        switch (c) {
            case '"':
                put(b, "\\\"");
                break;
            case '\\':
                put(b, "\\\\");
                break;
            case '\n':
                put(b, "\\n");
                break;
            case '\r':
                put(b, "\\r");
                break;
            case '\t':
                put(b, "\\t");
                break;
            default:
                if (static_cast<unsigned char>(c) < 0x20)
                    fmt::format_to(std::back_inserter(b), "\\u{:04x}",
                                   static_cast<unsigned>(static_cast<unsigned char>(c)));
                else
                    b.push_back(c);
        }
    }
}

void put_string(Buffer& b, std::string_view s) {
    b.push_back('"');
    put_escaped(b, s);
    b.push_back('"');
}

/// JSON has no NaN or infinity; a viewer rejects the whole file over one bad number.
void put_double(Buffer& b, double v, bool short_form) {
    if (!std::isfinite(v))
        put(b, "null");
    else if (short_form)
        fmt::format_to(std::back_inserter(b), "{:.6g}", v);
    else
        fmt::format_to(std::back_inserter(b), "{}", v);
}

/// Whole nanoseconds as microseconds (the trace-event format's unit) with exactly three
/// decimals, printed from integers: a viewer reads back the same integer nanoseconds (Perfetto
/// rounds ts x 1000), so spans that touch in cycles touch in the viewer too.
void put_us(Buffer& b, int64_t ns) {
    fmt::format_to(std::back_inserter(b), "{}.{:03}", ns / 1000, ns % 1000);
}

}  // namespace

/// Writer state: the open file, the track table and the filters. Events go straight to a
/// buffered ofstream through one reused line buffer, so memory stays constant however long
/// the run; only the track table grows, with the number of distinct tracks.
struct Tracer::Impl {
    static constexpr size_t kFileBufferBytes = 256 * 1024;

    std::unique_ptr<OutputFile> file;
    std::ostream* out = nullptr;  // file->stream()
    Buffer line;
    std::string path;
    double clock_mhz = 1000.0;
    std::vector<std::string> filters;
    std::string config_json;  ///< otherData.config, empty for none
    uint64_t window_begin = 0, window_end = 0;
    /// Latest cycle of any complete or instant event offered, kept or not: the end of the run
    /// so far, which ends an open window. (Counter tracks are not: their last sample closes a
    /// sampling window that may reach past the run.)
    uint64_t last_cycle = 0;
    /// One track as callers see it, and the lanes its complete events are spread over.
    struct Track {
        int pid = 0;
        std::string thread;
        std::vector<int> lane_tid;       ///< thread id of each lane (lane 0: the track's own)
        std::vector<uint64_t> lane_end;  ///< end cycle of the last event put on each lane
        bool own_clock = false;          ///< TrackWindow::Own
    };
    std::map<std::string, int, std::less<>> pids;                    // process -> pid
    std::map<std::pair<int, std::string>, int, std::less<>> by_key;  // (pid, thread) -> track
    std::vector<Track> tracks;
    int next_tid = 1;                   ///< tids are unique across processes, lanes included
    std::array<uint64_t, 3> written{};  // X, i, C
    bool first = true;

    /// Writes the event in `line` as the next array element.
    void flush_line() {
        out->write(first ? "\n" : ",\n", first ? 1 : 2);
        first = false;
        out->write(line.data(), static_cast<std::streamsize>(line.size()));
        line.clear();
    }

    bool keep_unit(std::string_view process, std::string_view thread) const {
        if (filters.empty()) return true;
        for (const std::string& f : filters) {
            // Match "process.thread" against the prefix without building the joined string.
            const std::string_view fv(f);
            if (fv.size() <= process.size()) {
                if (process.substr(0, fv.size()) == fv) return true;
                continue;
            }
            if (fv.substr(0, process.size()) != process || fv[process.size()] != '.') continue;
            const std::string_view rest = fv.substr(process.size() + 1);
            if (thread.substr(0, rest.size()) == rest) return true;
        }
        return false;
    }

    /// Half-open window [window_begin, window_end): an interval is kept if it overlaps it, a
    /// point (begin == end) if it lies in it.
    bool in_window(uint64_t begin, uint64_t end) const {
        if (begin == end ? begin < window_begin : end <= window_begin) return false;
        return window_end == 0 || begin < window_end;
    }

    /// Cycles to whole nanoseconds at the configured clock (exact period, rounded per stamp).
    int64_t ns(uint64_t cycles) const { return ClockDomain{clock_mhz}.ns(cycles); }

    /// Names thread `tid` of `pid` and places it at `sort_index` among the process's threads.
    void name_thread(int pid, int tid, std::string_view name, int64_t sort_index) {
        fmt::format_to(std::back_inserter(line),
                       R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":)", pid,
                       tid);
        put_string(line, name);
        put(line, "}}");
        flush_line();
        fmt::format_to(std::back_inserter(line),
                       R"({{"ph":"M","name":"thread_sort_index","pid":{},"tid":{},)"
                       R"("args":{{"sort_index":{}}}}})",
                       pid, tid, sort_index);
        flush_line();
    }

    /// The lane of `track` for a complete event [begin, end): the first lane whose last event
    /// ended by `begin`, else a new lane ("dma#1", "dma#2", ...). Perfetto drops a slice that
    /// starts inside another of its thread and ends after it (slice_drop_overlapping_complete_
    /// event), and a unit's queued work overlaps in flight, so no two events of a lane may
    /// overlap at all; lanes sort right after their track.
    int lane_tid(int track, uint64_t begin, uint64_t end) {
        Track& t = tracks.at(static_cast<size_t>(track));
        for (size_t i = 0; i < t.lane_end.size(); ++i) {
            if (t.lane_end[i] <= begin) {
                t.lane_end[i] = end;
                return t.lane_tid[i];
            }
        }
        const int tid = next_tid++;
        name_thread(t.pid, tid, fmt::format("{}#{}", t.thread, t.lane_tid.size()),
                    int64_t(t.lane_tid.front()) * kLanesPerTrack + int64_t(t.lane_tid.size()));
        t.lane_tid.push_back(tid);
        t.lane_end.push_back(end);
        return tid;
    }
    /// Sort-index stride between tracks: room for this many lanes after each.
    static constexpr int64_t kLanesPerTrack = 1000;

    int pid_of(std::string_view process) {
        if (auto it = pids.find(process); it != pids.end()) return it->second;
        // 1-based: some viewers treat pid 0 as the idle process.
        const int pid = static_cast<int>(pids.size()) + 1;
        pids.emplace(std::string(process), pid);
        put(line, R"({"ph":"M","name":"process_name","pid":)");
        fmt::format_to(std::back_inserter(line), R"({},"tid":0,"args":{{"name":)", pid);
        put_string(line, process);
        put(line, "}}");
        flush_line();
        // Sort processes in order of first use (core0 before host) rather than by name.
        fmt::format_to(std::back_inserter(line),
                       R"({{"ph":"M","name":"process_sort_index","pid":{},"tid":0,)"
                       R"("args":{{"sort_index":{}}}}})",
                       pid, pid);
        flush_line();
        return pid;
    }

    /// `"args":{...}` with the cycle numbers first, then the caller's arguments.
    void put_args(std::initializer_list<TraceArg> args, uint64_t begin, const uint64_t* end) {
        fmt::format_to(std::back_inserter(line), R"("args":{{"begin_cycle":{})", begin);
        if (end) fmt::format_to(std::back_inserter(line), R"(,"end_cycle":{})", *end);
        for (const TraceArg& a : args) {
            line.push_back(',');
            put_string(line, a.key);
            line.push_back(':');
            std::visit(
                [&](const auto& v) {
                    using T = std::decay_t<decltype(v)>;
                    if constexpr (std::is_same_v<T, std::string_view>)
                        put_string(line, v);
                    else if constexpr (std::is_same_v<T, double>)
                        put_double(line, v, false);
                    else
                        fmt::format_to(std::back_inserter(line), "{}", v);
                },
                a.value);
        }
        line.push_back('}');
    }

    /// `{"ph":"P","name":"N","pid":p,"tid":t,` shared by the event kinds.
    void put_head(char phase, std::string_view name, int pid, int tid) {
        fmt::format_to(std::back_inserter(line), R"({{"ph":"{}","name":)", phase);
        put_string(line, name);
        fmt::format_to(std::back_inserter(line), R"(,"pid":{},"tid":{},)", pid, tid);
    }
};

Tracer::Tracer() : m_impl(std::make_unique<Impl>()) {}

Tracer::~Tracer() {
    if (!m_enabled) return;
    // A trace up to a fault is worth keeping; a write error can only be logged here.
    try {
        close();
    } catch (const OutputError& e) {
        TPU_LOG(Error, "tracer", "{}", e.what());
    }
}

void Tracer::set_config(std::string config_json) {
    if (m_impl) m_impl->config_json = std::move(config_json);
}

void Tracer::set_window(uint64_t window_begin, uint64_t window_end) {
    if (!m_impl) return;
    m_impl->window_begin = window_begin;
    m_impl->window_end = window_end;
}

void Tracer::open(const std::string& path, double clock_mhz, std::string_view unit_filter,
                  uint64_t window_begin, uint64_t window_end) {
    if (!(clock_mhz > 0.0) || !std::isfinite(clock_mhz))
        throw std::invalid_argument(
            fmt::format("trace file '{}': clock_mhz must be positive, got {}", path, clock_mhz));
    close();
    auto im = std::make_unique<Impl>();
    // Over MPI each rank traces its own cores, into its own file (rank_path).
    im->file = std::make_unique<OutputFile>(rank_path(path), Impl::kFileBufferBytes,
                                            OutputFile::Ranks::Each);
    im->out = &im->file->stream();
    im->path = path;
    im->clock_mhz = clock_mhz;
    im->window_begin = window_begin;
    im->window_end = window_end;
    for (size_t pos = 0; pos <= unit_filter.size();) {
        size_t comma = unit_filter.find(',', pos);
        if (comma == std::string_view::npos) comma = unit_filter.size();
        std::string_view item = unit_filter.substr(pos, comma - pos);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        if (!item.empty()) im->filters.emplace_back(item);
        pos = comma + 1;
    }
    // otherData goes at the end, once the window the trace covers is known.
    *im->out << R"({"displayTimeUnit":"ns","traceEvents":[)";
    m_impl = std::move(im);
    m_enabled = true;
}

void Tracer::close() {
    if (!m_impl || !m_impl->file) return;
    Impl& im = *m_impl;
    m_enabled = false;
    const std::unique_ptr<OutputFile> file = std::move(im.file);
    im.out = nullptr;
    // The cycles the trace covers, so that a reader never divides a whole run's counters by a
    // window's cycles: [begin, end) of the window, an open end being the last cycle seen.
    const uint64_t end = im.window_end ? std::min(im.window_end, im.last_cycle) : im.last_cycle;
    file->stream() << fmt::format(
        "\n],\"otherData\":{{\"generator\":\"tpusim\",\"window\":{{\"begin_cycle\":{},"
        "\"end_cycle\":{}}}{}}}}}\n",
        std::min(im.window_begin, end), end,
        im.config_json.empty() ? std::string() : ",\"config\":" + im.config_json);
    file->commit();
}

int Tracer::track(std::string_view process, std::string_view thread, TrackWindow window) {
    if (!m_enabled) return -1;
    Impl& im = *m_impl;
    if (!im.keep_unit(process, thread)) return -1;
    const int pid = im.pid_of(process);
    auto key = std::make_pair(pid, std::string(thread));
    if (auto it = im.by_key.find(key); it != im.by_key.end()) return it->second;
    // tids are unique across processes so a track is identified by its tid alone.
    const int tid = im.next_tid++;
    const int id = static_cast<int>(im.tracks.size());
    im.tracks.push_back({pid, std::string(thread), {tid}, {0}, window == TrackWindow::Own});
    im.by_key.emplace(std::move(key), id);
    im.name_thread(pid, tid, thread, int64_t(tid) * Impl::kLanesPerTrack);
    return id;
}

void Tracer::complete(int track, std::string_view name, uint64_t begin, uint64_t end,
                      std::initializer_list<TraceArg> args) {
    if (!m_enabled) return;
    Impl& im = *m_impl;
    if (end < begin) end = begin;  // a negative duration would be a model bug; keep JSON sane
    const bool own = track >= 0 && im.tracks[static_cast<size_t>(track)].own_clock;
    if (!own) im.last_cycle = std::max(im.last_cycle, end);
    if (track < 0 || (!own && !im.in_window(begin, end))) return;
    const int pid = im.tracks.at(static_cast<size_t>(track)).pid;
    im.put_head('X', name, pid, im.lane_tid(track, begin, end));
    // dur is the difference of the rounded ends so back-to-back events touch exactly.
    const int64_t b = im.ns(begin);
    put(im.line, R"("ts":)");
    put_us(im.line, b);
    put(im.line, R"(,"dur":)");
    put_us(im.line, im.ns(end) - b);
    im.line.push_back(',');
    im.put_args(args, begin, &end);
    im.line.push_back('}');
    im.flush_line();
    ++im.written[0];
}

void Tracer::instant(int track, std::string_view name, uint64_t at,
                     std::initializer_list<TraceArg> args) {
    if (!m_enabled) return;
    Impl& im = *m_impl;
    const bool own = track >= 0 && im.tracks[static_cast<size_t>(track)].own_clock;
    if (!own) im.last_cycle = std::max(im.last_cycle, at);
    if (track < 0 || (!own && !im.in_window(at, at))) return;
    // An instant has no extent: it nests in whatever the track's first lane has open.
    const Impl::Track& t = im.tracks.at(static_cast<size_t>(track));
    im.put_head('i', name, t.pid, t.lane_tid.front());
    put(im.line, R"("s":"t","ts":)");
    put_us(im.line, im.ns(at));
    im.line.push_back(',');
    im.put_args(args, at, nullptr);
    im.line.push_back('}');
    im.flush_line();
    ++im.written[1];
}

void Tracer::counter(std::string_view process, std::string_view name, uint64_t at, double value) {
    if (!m_enabled) return;
    Impl& im = *m_impl;
    if (!im.keep_unit(process, name) || !im.in_window(at, at)) return;
    const int pid = im.pid_of(process);
    im.put_head('C', name, pid, 0);
    put(im.line, R"("ts":)");
    put_us(im.line, im.ns(at));
    put(im.line, R"(,"args":{"value":)");
    put_double(im.line, value, true);
    put(im.line, "}}");
    im.flush_line();
    ++im.written[2];
}

uint64_t Tracer::events_written(char phase) const {
    const Impl& im = *m_impl;
    switch (phase) {
        case 'X':
            return im.written[0];
        case 'i':
            return im.written[1];
        case 'C':
            return im.written[2];
        default:
            return 0;
    }
}

}  // namespace tpu::sim
