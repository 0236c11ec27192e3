// SPDX-License-Identifier: Apache-2.0
#include "sim/tracer.h"

#include <array>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace tpu::sim {

/// Writer state: the open file, the track table and the filters. Events go straight to a
/// buffered FILE*, so memory stays constant however long the run.
struct Tracer::Impl {
    std::FILE* file = nullptr;
    std::string path;
    double clock_mhz = 1000.0;
    std::vector<std::string> filters;
    uint64_t window_begin = 0, window_end = 0;
    std::map<std::string, int, std::less<>> pids;                  // process -> pid
    std::map<std::pair<int, std::string>, int, std::less<>> tids;  // (pid, thread) -> tid
    std::vector<std::pair<int, int>> tracks;                       // id -> (pid, tid)
    std::map<std::string, int, std::less<>> counter_pids;
    std::array<uint64_t, 3> written{};  // X, i, C
    bool first = true;

    void emit(const std::string& json) {
        std::fputs(first ? "\n" : ",\n", file);
        first = false;
        std::fputs(json.c_str(), file);
    }
    bool in_window(uint64_t begin, uint64_t end) const {
        if (end < window_begin) return false;
        return window_end == 0 || begin < window_end;
    }
    /// Microseconds at the configured clock, printed with fixed precision for byte-identical
    /// traces.
    std::string us(uint64_t cycles) const {
        return fmt::format("{:.6f}", double(cycles) / clock_mhz);
    }
    int pid_of(std::string_view process) {
        auto it = pids.find(process);
        if (it != pids.end()) return it->second;
        const int pid = static_cast<int>(pids.size());
        pids.emplace(std::string(process), pid);
        emit(fmt::format(
            R"({{"ph":"M","name":"process_name","pid":{},"tid":0,"args":{{"name":"{}"}}}})", pid,
            escape(process)));
        emit(fmt::format(
            R"({{"ph":"M","name":"process_sort_index","pid":{},"tid":0,"args":{{"sort_index":{}}}}})",
            pid, pid));
        return pid;
    }
    static std::string escape(std::string_view s) {
        std::string out;
        for (char c : s) {
            switch (c) {
                case '"':
                    out += "\\\"";
                    break;
                case '\\':
                    out += "\\\\";
                    break;
                case '\n':
                    out += "\\n";
                    break;
                case '\t':
                    out += "\\t";
                    break;
                default:
                    if (static_cast<unsigned char>(c) < 0x20)
                        out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
                    else
                        out += c;
            }
        }
        return out;
    }
    static std::string args_json(std::initializer_list<TraceArg> args, uint64_t b, uint64_t e,
                                 bool with_end) {
        std::string out = fmt::format(R"("begin_cycle":{})", b);
        if (with_end) out += fmt::format(R"(,"end_cycle":{})", e);
        for (const TraceArg& a : args) {
            out += fmt::format(R"(,"{}":)", escape(a.key));
            std::visit(
                [&](const auto& v) {
                    using T = std::decay_t<decltype(v)>;
                    if constexpr (std::is_same_v<T, std::string_view>)
                        out += "\"" + escape(v) + "\"";
                    else if constexpr (std::is_same_v<T, double>)
                        out += fmt::format("{:.6g}", v);
                    else
                        out += fmt::format("{}", v);
                },
                a.value);
        }
        return out;
    }
};

Tracer::Tracer() : m_impl(std::make_unique<Impl>()) {}
Tracer::~Tracer() {
    close();
}

void Tracer::open(const std::string& path, double clock_mhz, std::string_view unit_filter,
                  uint64_t window_begin, uint64_t window_end) {
    close();
    m_impl = std::make_unique<Impl>();
    Impl& im = *m_impl;
    im.file = std::fopen(path.c_str(), "wb");
    if (!im.file) throw std::runtime_error(fmt::format("cannot write trace file '{}'", path));
    im.path = path;
    im.clock_mhz = clock_mhz;
    im.window_begin = window_begin;
    im.window_end = window_end;
    for (size_t pos = 0; pos <= unit_filter.size();) {
        size_t comma = unit_filter.find(',', pos);
        if (comma == std::string_view::npos) comma = unit_filter.size();
        if (comma > pos) im.filters.emplace_back(unit_filter.substr(pos, comma - pos));
        pos = comma + 1;
    }
    std::fputs(R"({"displayTimeUnit":"ns","otherData":{"generator":"tpusim"},"traceEvents":[)",
               im.file);
    m_enabled = true;
}

void Tracer::close() {
    if (!m_impl || !m_impl->file) return;
    std::fputs("\n]}\n", m_impl->file);
    std::fclose(m_impl->file);
    m_impl->file = nullptr;
    m_enabled = false;
}

int Tracer::track(std::string_view process, std::string_view thread) {
    if (!m_enabled) return -1;
    Impl& im = *m_impl;
    const std::string full = fmt::format("{}.{}", process, thread);
    if (!im.filters.empty()) {
        bool keep = false;
        for (const auto& f : im.filters) keep |= full.compare(0, f.size(), f) == 0;
        if (!keep) return -1;
    }
    const int pid = im.pid_of(process);
    const auto key = std::make_pair(pid, std::string(thread));
    auto it = im.tids.find(key);
    int tid;
    if (it == im.tids.end()) {
        tid = static_cast<int>(im.tids.size()) + 1;
        im.tids.emplace(key, tid);
        im.emit(fmt::format(
            R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}})", pid,
            tid, Impl::escape(thread)));
    } else {
        tid = it->second;
    }
    im.tracks.emplace_back(pid, tid);
    return static_cast<int>(im.tracks.size()) - 1;
}

void Tracer::complete(int track, std::string_view name, uint64_t begin, uint64_t end,
                      std::initializer_list<TraceArg> args) {
    if (!m_enabled || track < 0) return;
    Impl& im = *m_impl;
    if (!im.in_window(begin, end)) return;
    const auto [pid, tid] = im.tracks.at(static_cast<size_t>(track));
    im.emit(
        fmt::format(R"({{"ph":"X","name":"{}","pid":{},"tid":{},"ts":{},"dur":{},"args":{{{}}}}})",
                    Impl::escape(name), pid, tid, im.us(begin), im.us(end - begin),
                    Impl::args_json(args, begin, end, true)));
    ++im.written[0];
}

void Tracer::instant(int track, std::string_view name, uint64_t at,
                     std::initializer_list<TraceArg> args) {
    if (!m_enabled || track < 0) return;
    Impl& im = *m_impl;
    if (!im.in_window(at, at)) return;
    const auto [pid, tid] = im.tracks.at(static_cast<size_t>(track));
    im.emit(
        fmt::format(R"({{"ph":"i","s":"t","name":"{}","pid":{},"tid":{},"ts":{},"args":{{{}}}}})",
                    Impl::escape(name), pid, tid, im.us(at), Impl::args_json(args, at, at, false)));
    ++im.written[1];
}

void Tracer::counter(std::string_view process, std::string_view name, uint64_t at, double value) {
    if (!m_enabled) return;
    Impl& im = *m_impl;
    if (!im.filters.empty()) {
        const std::string full = fmt::format("{}.{}", process, name);
        bool keep = false;
        for (const auto& f : im.filters) keep |= full.compare(0, f.size(), f) == 0;
        if (!keep) return;
    }
    if (!im.in_window(at, at)) return;
    const int pid = im.pid_of(process);
    im.emit(fmt::format(
        R"({{"ph":"C","name":"{}","pid":{},"tid":0,"ts":{},"args":{{"value":{:.6g}}}}})",
        Impl::escape(name), pid, im.us(at), value));
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
