// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <unistd.h>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "sim/tracer.h"
#include "tests/common/paths.h"

namespace tpu::sim {
namespace {

using test::slurp;

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

TEST(Tracer, WritesChromeTraceEventsWithCyclesInArgs) {
    const std::string p =
        ::testing::TempDir() + "/tracer-" + std::to_string(getpid()) + "-trace.json";
    write_sample(p);
    const auto j = nlohmann::json::parse(slurp(p));
    int meta = 0, x = 0;
    for (const auto& e : j["traceEvents"]) {
        ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid")) << e;
        if (e["ph"] == "M") ++meta;
        if (e["ph"] == "X") {
            ++x;
            ASSERT_TRUE(e.contains("ts") && e.contains("dur"));
        }
    }
    EXPECT_EQ(meta, 7);  // 2 processes x (name, sort index) + 3 threads
    EXPECT_EQ(x, 3);
    const auto& mm = j["traceEvents"][7];  // after the 7 metadata events
    EXPECT_EQ(mm["name"], "mxu.mm");
    EXPECT_DOUBLE_EQ(mm["ts"].get<double>(), 0.1);  // 100 cycles at 1000 MHz
    EXPECT_DOUBLE_EQ(mm["dur"].get<double>(), 0.382);
    EXPECT_EQ(mm["args"]["begin_cycle"], 100);
    EXPECT_EQ(mm["args"]["end_cycle"], 482);
    EXPECT_EQ(mm["args"]["op"], "a\"b");
}

TEST(Tracer, FiltersByUnitPrefixAndWindowAndIsDeterministic) {
    const std::string a = ::testing::TempDir() + "/tracer-" + std::to_string(getpid()) + "-a.json",
                      b = ::testing::TempDir() + "/tracer-" + std::to_string(getpid()) + "-b.json";
    write_sample(a);
    write_sample(b);
    EXPECT_EQ(slurp(a), slurp(b));

    const std::string f = ::testing::TempDir() + "/tracer-" + std::to_string(getpid()) + "-f.json";
    write_sample(f, "core3.mxu,host", 200, 2000);
    const auto j = nlohmann::json::parse(slurp(f));
    std::vector<std::string> names;
    for (const auto& e : j["traceEvents"])
        if (e["ph"] != "M") names.push_back(e["name"]);
    // dma is filtered out by unit; the counter at 250 has process.name core3.mxu_util (kept);
    // the host write at 1000..3000 overlaps the window.
    EXPECT_EQ(names, (std::vector<std::string>{"mxu.mm", "halt", "mxu_util", "write"}));
}

TEST(Tracer, DisabledTracerAndBadPath) {
    Tracer t;
    EXPECT_FALSE(t.enabled());
    EXPECT_EQ(t.track("core0", "seq"), -1);
    t.complete(-1, "x", 0, 1);
    try {
        t.open("/nonexistent/dir/t.json", 940.0);
        ADD_FAILURE();
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "cannot write trace file '/nonexistent/dir/t.json'");
    }
}

}  // namespace
}  // namespace tpu::sim
