// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/tracer.h"
#include "tests/common/paths.h"
#include "tests/common/scratch.h"

namespace tpu::sim {
namespace {

using nlohmann::json;
using test::slurp;

/// A per-process temp file, so parallel ctest processes never share one.
std::string tmp(const std::string& name) {
    return test::scratch("tracer-" + name);
}

void write_sample(const std::string& path, std::string_view filter = {}, uint64_t b = 0,
                  uint64_t e = 0) {
    Tracer t;
    t.open(path, 1000.0, filter, b, e);
    const int mxu = t.track("core3", "mxu0");
    const int dma = t.track("core3", "dma");
    const int host = t.track("host", "runtime");
    t.complete(mxu, "mxu.mm", 100, 482, {{"pc", uint64_t(7)}, {"op", std::string_view("a\"b")}});
    t.complete(dma, "dma.hv", 0, 164, {{"bytes", uint64_t(32768)}});
    t.instant(mxu, "halt", 500);
    t.counter("core3", "mxu_util", 250, 0.5);
    t.complete(host, "write", 1000, 3000);
}

std::vector<json> events_of(const std::string& path, const std::string& phase) {
    const json trace = json::parse(slurp(path));
    std::vector<json> out;
    for (const auto& e : trace["traceEvents"])
        if (e["ph"] == phase) out.push_back(e);
    return out;
}

/// A microsecond value as written (three decimals) back to integer nanoseconds, as Perfetto's
/// JSON importer reads it (llround of ts x 1000).
int64_t ns(const json& us) {
    return std::llround(us.get<double>() * 1e3);
}

TEST(Tracer, WritesChromeTraceEventsWithCyclesInArgs) {
    const std::string p = tmp("trace.json");
    write_sample(p);
    const auto j = json::parse(slurp(p));
    EXPECT_EQ(j["displayTimeUnit"], "ns");
    ASSERT_TRUE(j["traceEvents"].is_array());
    int meta = 0, x = 0;
    for (const auto& e : j["traceEvents"]) {
        ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid")) << e;
        ASSERT_TRUE(e.contains("name")) << e;
        if (e["ph"] == "M") ++meta;
        if (e["ph"] == "X") {
            ++x;
            ASSERT_TRUE(e.contains("ts") && e.contains("dur")) << e;
            EXPECT_TRUE(e["args"].contains("begin_cycle") && e["args"].contains("end_cycle"));
        }
    }
    EXPECT_EQ(meta, 10);  // (2 processes + 3 threads) x (name, sort index)
    EXPECT_EQ(x, 3);

    const auto xs = events_of(p, "X");
    const auto& mm = xs[0];
    EXPECT_EQ(mm["name"], "mxu.mm");
    EXPECT_EQ(mm["pid"], 1);                        // core3: first process used
    EXPECT_EQ(mm["tid"], 1);                        // mxu0: first thread used
    EXPECT_DOUBLE_EQ(mm["ts"].get<double>(), 0.1);  // 100 cycles at 1000 MHz
    EXPECT_DOUBLE_EQ(mm["dur"].get<double>(), 0.382);
    EXPECT_EQ(mm["args"]["begin_cycle"], 100);
    EXPECT_EQ(mm["args"]["end_cycle"], 482);
    EXPECT_EQ(mm["args"]["pc"], 7);
    EXPECT_EQ(mm["args"]["op"], "a\"b");
    EXPECT_EQ(xs[1]["pid"], 1);
    EXPECT_EQ(xs[1]["tid"], 2);  // core3.dma
    EXPECT_EQ(xs[1]["args"]["bytes"], 32768);
    EXPECT_EQ(xs[2]["pid"], 2);  // host
    EXPECT_EQ(xs[2]["tid"], 3);
    EXPECT_DOUBLE_EQ(xs[2]["dur"].get<double>(), 2.0);

    const auto is = events_of(p, "i");
    ASSERT_EQ(is.size(), 1u);
    EXPECT_EQ(is[0]["name"], "halt");
    EXPECT_DOUBLE_EQ(is[0]["ts"].get<double>(), 0.5);
    EXPECT_EQ(is[0]["s"], "t");
    EXPECT_EQ(is[0]["args"]["begin_cycle"], 500);

    const auto cs = events_of(p, "C");
    ASSERT_EQ(cs.size(), 1u);
    EXPECT_EQ(cs[0]["pid"], 1);
    EXPECT_EQ(cs[0]["name"], "mxu_util");
    EXPECT_DOUBLE_EQ(cs[0]["args"]["value"].get<double>(), 0.5);
    EXPECT_DOUBLE_EQ(cs[0]["ts"].get<double>(), 0.25);

    const auto ms = events_of(p, "M");
    EXPECT_EQ(ms[0]["name"], "process_name");
    EXPECT_EQ(ms[0]["args"]["name"], "core3");
}

TEST(Tracer, MetadataOncePerTrackAndStableIds) {
    const std::string p = tmp("meta.json");
    {
        Tracer t;
        t.open(p, 940.0);
        const int a = t.track("core0", "seq");
        const int b = t.track("core1", "seq");
        EXPECT_NE(a, b);
        // Models re-attach tracers between launches; that must not add tracks or metadata.
        for (int i = 0; i < 100; ++i) EXPECT_EQ(t.track("core0", "seq"), a);
        EXPECT_EQ(t.track("core1", "seq"), b);
        t.complete(a, "x", 0, 1);
        t.complete(b, "y", 0, 1);
        t.counter("core0", "util", 0, 1.0);  // process already named: no new metadata
        EXPECT_EQ(t.events_written('X'), 2u);
        EXPECT_EQ(t.events_written('C'), 1u);
        EXPECT_EQ(t.events_written('i'), 0u);
        EXPECT_EQ(t.events_written('?'), 0u);
    }
    int process_names = 0, thread_names = 0;
    std::vector<int> tids;
    for (const auto& e : events_of(p, "M")) {
        if (e["name"] == "process_name") ++process_names;
        if (e["name"] == "thread_name") {
            ++thread_names;
            tids.push_back(e["tid"]);
        }
    }
    EXPECT_EQ(process_names, 2);
    EXPECT_EQ(thread_names, 2);
    EXPECT_EQ(tids, (std::vector<int>{1, 2}));  // same thread name, distinct tracks
}

TEST(Tracer, TimesAreIntegerNanosecondsAndAbut) {
    const std::string p = tmp("times.json");
    {
        Tracer t;
        t.open(p, 940.0);
        const int k = t.track("core0", "vpu");
        // 3 cycles at 940 MHz = 3.191489... ns; back-to-back events must share the boundary.
        for (uint64_t c = 0; c < 30; c += 3) t.complete(k, "op", c, c + 3);
        t.complete(k, "long", 100, 10'000'000'000ull);  // 10^10 cycles
    }
    const std::string text = slurp(p);
    // 3 cycles = 3.19 ns -> 3 ns; 6 cycles = 6.38 ns -> 6 ns: the second event is 0.003 us long.
    EXPECT_NE(text.find(R"("ts":0.003,"dur":0.003)"), std::string::npos) << text;
    const auto xs = events_of(p, "X");
    ASSERT_EQ(xs.size(), 11u);
    for (size_t i = 0; i + 2 < xs.size(); ++i)
        EXPECT_EQ(ns(xs[i]["ts"]) + ns(xs[i]["dur"]), ns(xs[i + 1]["ts"])) << i;
    // 10^10 cycles at 940 MHz end at 10638297872.34 ns -> 10638297872; minus the start 106 ns.
    EXPECT_NE(text.find(R"("ts":0.106,"dur":10638297.766)"), std::string::npos) << text;
}

TEST(Tracer, OverlappingEventsOfATrackGoToLanesThatNeverOverlap) {
    const std::string p = tmp("lanes.json");
    {
        Tracer t;
        t.open(p, 1000.0);
        const int dma = t.track("core0", "dma");
        // Emitted in completion order, as a unit queue does: B [10, 50) finishes before A.
        t.complete(dma, "B", 10, 50);
        t.complete(dma, "C", 20, 60);  // overlaps B: lane 1
        t.complete(dma, "A", 0, 100);  // overlaps both: lane 2
        t.complete(dma, "D", 50, 70);  // starts where B ended: lane 0 again
        t.complete(dma, "E", 100, 110);
        t.instant(dma, "halt", 105);  // instants stay on the track's own thread
        t.complete(t.track("core0", "seq"), "S", 0, 5);
    }
    std::map<int, std::string> thread;
    std::map<int, int64_t> sort_index;
    for (const auto& e : events_of(p, "M")) {
        if (e["name"] == "thread_name") thread[e["tid"]] = e["args"]["name"];
        if (e["name"] == "thread_sort_index") sort_index[e["tid"]] = e["args"]["sort_index"];
    }
    std::map<std::string, std::string> lane_of;
    for (const auto& e : events_of(p, "X")) lane_of[e["name"]] = thread.at(e["tid"]);
    EXPECT_EQ(lane_of["B"], "dma");
    EXPECT_EQ(lane_of["C"], "dma#1");
    EXPECT_EQ(lane_of["A"], "dma#2");
    EXPECT_EQ(lane_of["D"], "dma");
    EXPECT_EQ(lane_of["E"], "dma");
    EXPECT_EQ(lane_of["S"], "seq");
    EXPECT_EQ(thread.at(events_of(p, "i")[0]["tid"]), "dma");
    // Lanes sort right after their track, before the next track (seq).
    std::vector<std::string> order;
    std::vector<std::pair<int64_t, std::string>> by_index;
    for (const auto& [tid, name] : thread) by_index.emplace_back(sort_index.at(tid), name);
    std::sort(by_index.begin(), by_index.end());
    for (const auto& [i, name] : by_index) order.push_back(name);
    EXPECT_EQ(order, (std::vector<std::string>{"dma", "dma#1", "dma#2", "seq"}));
}

TEST(Tracer, FiltersByUnitPrefixAndWindowAndIsDeterministic) {
    const std::string a = tmp("a.json"), b = tmp("b.json");
    write_sample(a);
    write_sample(b);
    EXPECT_EQ(slurp(a), slurp(b));
    EXPECT_FALSE(slurp(a).empty());

    const std::string f = tmp("f.json");
    write_sample(f, "core3.mxu, host", 200, 2000);
    const json filtered = json::parse(slurp(f));
    std::vector<std::string> names;
    for (const auto& e : filtered["traceEvents"])
        if (e["ph"] != "M") names.push_back(e["name"]);
    // dma is filtered out by unit; the counter at 250 has process.name core3.mxu_util (kept);
    // mxu.mm at 100..482 and the host write at 1000..3000 overlap the window.
    EXPECT_EQ(names, (std::vector<std::string>{"mxu.mm", "halt", "mxu_util", "write"}));
    for (const auto& e : events_of(f, "M"))
        EXPECT_NE(e["args"].value("name", ""), "dma") << "filtered track named";
}

TEST(Tracer, WindowIsHalfOpenAndFilteredTracksAreMinusOne) {
    const std::string p = tmp("window.json");
    {
        Tracer t;
        t.open(p, 1000.0, "core0", 100, 200);
        EXPECT_EQ(t.track("core1", "seq"), -1);
        EXPECT_EQ(t.track("host", "runtime"), -1);
        const int k = t.track("core0", "seq");
        ASSERT_GE(k, 0);
        t.complete(k, "ends_at_begin", 50, 100);  // [50,100) does not reach 100: dropped
        t.complete(k, "ends_after_begin", 50, 101);
        t.complete(k, "starts_at_end", 200, 300);  // dropped
        t.complete(k, "last_inside", 199, 300);
        t.complete(k, "zero_at_begin", 100, 100);
        t.instant(k, "at_end", 200);  // dropped
        t.instant(k, "before", 99);   // dropped
        t.counter("core0", "q", 150, 2.0);
        t.counter("core1", "q", 150, 2.0);  // filtered by unit
        t.counter("core0", "q", 250, 2.0);  // outside
        t.complete(-1, "filtered", 150, 160);
        t.instant(-1, "filtered", 150);
        EXPECT_EQ(t.events_written('X'), 3u);
        EXPECT_EQ(t.events_written('i'), 0u);
        EXPECT_EQ(t.events_written('C'), 1u);
    }
    const json trace = json::parse(slurp(p));
    std::vector<std::string> names;
    for (const auto& e : trace["traceEvents"])
        if (e["ph"] != "M") names.push_back(e["name"]);
    EXPECT_EQ(names,
              (std::vector<std::string>{"ends_after_begin", "last_inside", "zero_at_begin", "q"}));
    // Window events keep their true cycles rather than being clipped.
    EXPECT_EQ(events_of(p, "X")[1]["args"]["end_cycle"], 300);
}

TEST(Tracer, RecordsTheWindowItCovers) {
    // write_sample's events end at cycle 3000 (the host write), the end of the "run".
    const std::string all = tmp("all.json"), part = tmp("part.json"), late = tmp("late.json");
    write_sample(all);
    write_sample(part, {}, 200, 2000);
    write_sample(late, {}, 400, 0);  // open end: the last cycle of any event offered
    auto window = [](const std::string& p) { return json::parse(slurp(p))["otherData"]["window"]; };
    EXPECT_EQ(window(all), json::parse(R"({"begin_cycle":0,"end_cycle":3000})"));
    EXPECT_EQ(window(part), json::parse(R"({"begin_cycle":200,"end_cycle":2000})"));
    EXPECT_EQ(window(late), json::parse(R"({"begin_cycle":400,"end_cycle":3000})"));
    // A window past the end of the run covers nothing; a window moved while running (the
    // trainer tracing a few steps) is recorded as it was at the end.
    const std::string none = tmp("none.json"), moved = tmp("moved.json");
    write_sample(none, {}, 5000, 0);
    EXPECT_EQ(window(none), json::parse(R"({"begin_cycle":3000,"end_cycle":3000})"));
    {
        Tracer t;
        t.open(moved, 1000.0);
        t.set_window(UINT64_MAX, 0);
        t.set_window(100, 0);
        t.set_window(100, 700);
        t.complete(t.track("core0", "seq"), "x", 0, 900);
    }
    EXPECT_EQ(window(moved), json::parse(R"({"begin_cycle":100,"end_cycle":700})"));
    EXPECT_EQ(json::parse(slurp(moved))["otherData"]["generator"], "tpusim");
}

TEST(Tracer, EscapesStringsAndWritesNonFiniteAsNull) {
    const std::string p = tmp("escape.json");
    const std::string nasty = std::string("q\"b\\s\nn\tt\r\x01") + "\xc3\xa9";  // é in UTF-8
    {
        Tracer t;
        t.open(p, 1000.0);
        const int k = t.track(nasty, nasty);
        t.complete(k, nasty, 0, 10,
                   {{nasty, std::string_view(nasty)},
                    {"nan", std::numeric_limits<double>::quiet_NaN()},
                    {"inf", std::numeric_limits<double>::infinity()},
                    {"d", 0.1},
                    {"neg", int64_t(-5)}});
        t.counter(nasty, "c", 1, std::numeric_limits<double>::infinity());
    }
    const auto x = events_of(p, "X");
    ASSERT_EQ(x.size(), 1u);
    EXPECT_EQ(x[0]["name"], nasty);
    EXPECT_EQ(x[0]["args"][nasty], nasty);
    EXPECT_TRUE(x[0]["args"]["nan"].is_null());
    EXPECT_TRUE(x[0]["args"]["inf"].is_null());
    EXPECT_DOUBLE_EQ(x[0]["args"]["d"].get<double>(), 0.1);
    EXPECT_EQ(x[0]["args"]["neg"], -5);
    EXPECT_TRUE(events_of(p, "C")[0]["args"]["value"].is_null());
    EXPECT_EQ(events_of(p, "M")[0]["args"]["name"], nasty);
}

TEST(Tracer, StreamsToDiskWhileOpen) {
    const std::string p = tmp("stream.json");
    Tracer t;
    t.open(p, 1000.0);
    const int k = t.track("core0", "seq");
    constexpr uint64_t kEvents = 50'000;
    for (uint64_t i = 0; i < kEvents; ++i) t.complete(k, "op", i, i + 1, {{"pc", i}});
    // Each event is ~100 bytes; all but the last buffer-full must already be on disk, in the
    // temporary file beside the trace (the trace itself appears complete, at close).
    EXPECT_FALSE(std::filesystem::exists(p));
    uintmax_t on_disk = 0;
    const std::string stem = "." + std::filesystem::path(p).filename().string() + ".tmp";
    for (const auto& e :
         std::filesystem::directory_iterator(std::filesystem::path(p).parent_path()))
        if (e.path().filename().string().rfind(stem, 0) == 0) on_disk = e.file_size();
    EXPECT_GT(on_disk, kEvents * 80);
    t.close();
    EXPECT_FALSE(t.enabled());
    EXPECT_EQ(json::parse(slurp(p))["traceEvents"].size(), kEvents + 4);  // + 4 metadata
    t.close();                                                            // idempotent
    t.complete(k, "after", 0, 1);  // a closed tracer ignores events
    EXPECT_EQ(json::parse(slurp(p))["traceEvents"].size(), kEvents + 4);
}

TEST(Tracer, ReopenStartsAFreshFile) {
    const std::string a = tmp("first.json"), b = tmp("second.json");
    Tracer t;
    t.open(a, 1000.0);
    t.complete(t.track("core0", "seq"), "a", 0, 1);
    t.open(b, 1000.0);  // finishes the first file
    t.complete(t.track("core5", "dma"), "b", 0, 1);
    t.close();
    EXPECT_EQ(events_of(a, "X").size(), 1u);
    const auto xs = events_of(b, "X");
    ASSERT_EQ(xs.size(), 1u);
    EXPECT_EQ(xs[0]["pid"], 1);  // ids restart with the file
    EXPECT_EQ(xs[0]["tid"], 1);
}

TEST(Tracer, DisabledTracerAndBadArguments) {
    Tracer t;
    EXPECT_FALSE(t.enabled());
    EXPECT_EQ(t.track("core0", "seq"), -1);
    t.complete(-1, "x", 0, 1);
    t.counter("core0", "c", 0, 1.0);
    EXPECT_EQ(t.events_written('X'), 0u);
    try {
        t.open("/nonexistent/dir/t.json", 940.0);
        ADD_FAILURE();
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "cannot write '/nonexistent/dir/t.json': No such file or directory");
    }
    EXPECT_FALSE(t.enabled());
    EXPECT_THROW(t.open(tmp("clock.json"), 0.0), std::invalid_argument);
    EXPECT_THROW(t.open(tmp("clock.json"), std::nan("")), std::invalid_argument);
    EXPECT_FALSE(t.enabled());
}

}  // namespace
}  // namespace tpu::sim
