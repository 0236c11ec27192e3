// SPDX-License-Identifier: Apache-2.0
// Checks of a written trace as a viewer sees it: Perfetto's rule for complete events.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpu::test {

/// What a replay of Perfetto's slice nesting found.
struct NestingReplay {
    uint64_t slices = 0;   ///< complete events seen
    uint64_t dropped = 0;  ///< complete events Perfetto would drop
    std::string first;     ///< the first dropped event (JSON), for the failure message
};

/// Replays how Perfetto's importer nests complete ('X') events on a thread (trace_processor,
/// SliceTracker: slices sorted by start; a slice that starts inside the open slice and ends
/// after it is dropped with the stat slice_drop_overlapping_complete_event). Timestamps are
/// read as Perfetto does: llround(ts x 1000) nanoseconds, end = ts + dur.
inline NestingReplay replay_perfetto_nesting(const nlohmann::json& trace) {
    struct Slice {
        int64_t ts, dur;
        size_t index;
    };
    const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
    std::map<std::pair<int64_t, int64_t>, std::vector<Slice>> threads;
    auto ns = [](const nlohmann::json& us) { return std::llround(us.get<double>() * 1000.0); };
    for (size_t i = 0; i < events.size(); ++i) {
        const nlohmann::json& e = events[i];
        if (e.value("ph", "") != "X") continue;
        threads[{e.at("pid").get<int64_t>(), e.at("tid").get<int64_t>()}].push_back(
            {ns(e.at("ts")), ns(e.at("dur")), i});
    }
    NestingReplay r;
    for (auto& [thread, slices] : threads) {
        // Perfetto's sorter orders by timestamp and keeps file order among equal ones.
        std::stable_sort(slices.begin(), slices.end(),
                         [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
        std::vector<Slice> open;
        for (const Slice& s : slices) {
            ++r.slices;
            // Slices are closed on the left and open on the right: one that ended by the new
            // start is closed (two zero-length slices at one instant stack instead).
            while (!open.empty()) {
                const Slice& top = open.back();
                const int64_t end = top.ts + top.dur;
                if (end < s.ts || (end == s.ts && !(top.dur == 0 && s.dur == 0)))
                    open.pop_back();
                else
                    break;
            }
            if (!open.empty()) {
                const int64_t end = open.back().ts + open.back().dur;
                if (s.ts < end && s.ts + s.dur > end) {
                    if (r.dropped++ == 0) r.first = events[s.index].dump();
                    continue;
                }
            }
            open.push_back(s);
        }
    }
    return r;
}

/// The unit a trace thread belongs to: "dma#2" (a lane of overlapping events) -> "dma".
inline std::string unit_of_thread(const std::string& thread) {
    return thread.substr(0, thread.find('#'));
}

}  // namespace tpu::test
