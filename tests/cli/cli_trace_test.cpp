// SPDX-License-Identifier: Apache-2.0
// Traces as Perfetto shows them: every slice kept, the window the trace covers and nothing else.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"
#include "tests/common/trace_check.h"

namespace tpu::test {
namespace {

using nlohmann::json;

/// Runs `tpusim ARGS --trace FILE` and returns the trace.
json traced(const std::string& args, const std::string& name) {
    const std::string path = tmp(name);
    const CliResult r = tpusim(args + " --trace " + shell_quote(path));
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    return r.code == 0 ? json::parse(slurp(path)) : json::object({{"traceEvents", json::array()}});
}

/// Every complete event survives Perfetto's nesting rule, and there are many of them.
void expect_no_drops(const json& trace, const std::string& what, uint64_t at_least) {
    const NestingReplay r = replay_perfetto_nesting(trace);
    EXPECT_GE(r.slices, at_least) << what;
    EXPECT_EQ(r.dropped, 0u) << what << ": " << r.dropped << " of " << r.slices
                             << " slices would be dropped, the first: " << r.first;
}

TEST(CliTrace, PerfettoKeepsEverySliceOfTheDemoAModelAndAMultiCoreGemm) {
    // The demo's command on fewer steps: an MLP on 8 cores in bf16-mixed, two steps traced.
    const json demo = traced(
        "train --model mlp --data synthetic --devices 8 --precision bf16-mixed --epochs 1 "
        "--trace-steps 2:2 --limit-train-batches 5 --limit-test-batches 1 --no-progress",
        "demo.json");
    expect_no_drops(demo, "demo", 5000);
    // The trace opens on the steps it recorded: no event before the window (the set-up's
    // uploads used to sit at cycle 0, leaving the timeline empty up to the traced steps).
    const uint64_t begin = demo["otherData"]["window"]["begin_cycle"].get<uint64_t>();
    EXPECT_GT(begin, 0u);
    for (const json& e : demo["traceEvents"]) {
        if (e.value("ph", "") != "X" && e.value("ph", "") != "i") continue;
        const json& args = e.at("args");
        const uint64_t last = args.value("end_cycle", args.value("begin_cycle", uint64_t(0)));
        ASSERT_LE(begin, last) << e;
    }

    expect_no_drops(traced("model resnet18", "resnet18.json"), "model resnet18", 20000);
    expect_no_drops(traced("gemm --m 1024 --k 1024 --n 1024 --num-cores 8", "gemm.json"),
                    "gemm on 8 cores", 400);
}

TEST(CliTrace, OverlappingWorkOfAUnitIsOnLanesOfThatUnit) {
    // resnet18's DMA queue keeps many transfers in flight: they are spread over lanes named
    // after the unit, and every lane's events are DMA instructions.
    const json t = traced("model resnet18", "lanes.json");
    std::map<std::pair<int, int>, std::string> thread;
    for (const auto& e : t["traceEvents"])
        if (e["ph"] == "M" && e["name"] == "thread_name")
            thread[{e["pid"], e["tid"]}] = e["args"]["name"];
    uint64_t on_lanes = 0;
    for (const auto& e : t["traceEvents"]) {
        if (e["ph"] != "X") continue;
        const std::string name = thread.at({e["pid"], e["tid"]});
        if (name.rfind("dma#", 0) != 0) continue;
        ++on_lanes;
        EXPECT_EQ(e["name"].get<std::string>().rfind("dma.", 0), 0u) << e;
    }
    EXPECT_GT(on_lanes, 1000u);
}

}  // namespace
}  // namespace tpu::test
