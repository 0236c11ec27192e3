// SPDX-License-Identifier: Apache-2.0
// Golden trace and stats of a small two-core kernel (traces/golden/), diffed byte for byte, and
// the trace's event totals checked against the stats counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace {

using tpu::test::shell_quote;
using tpu::test::slurp;
using tpu::test::tmp;
using tpu::test::tpusim;

std::string golden_dir() {
    return tpu::test::source_dir() + "/traces/golden/";
}

/// The command of traces/golden/README.md, writing its trace and stats to `trace`, `stats`.
tpu::test::CliResult run_golden(const std::string& trace, const std::string& stats) {
    const std::string g = golden_dir();
    return tpusim("run " + shell_quote(g + "mix2.s") + " --cores 0,1 --config " +
                  shell_quote(tpu::test::source_dir() + "/configs/tiny.json") + " --load 0-1:0x0=" +
                  shell_quote(g + "a.bin") + " --load 0-1:0x100=" + shell_quote(g + "w.bin") +
                  " --trace " + shell_quote(trace) + " --stats " + shell_quote(stats));
}

/// "" when equal, else where the first difference is and how to regenerate.
std::string compare(const std::string& name, const std::string& got) {
    const std::string want = slurp(golden_dir() + name);
    if (want == got) return {};
    size_t at = 0;
    while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
    const size_t line = 1 + size_t(std::count(got.begin(), got.begin() + long(at), '\n'));
    return "traces/golden/" + name + " differs from this build's output at byte " +
           std::to_string(at) + " (line " + std::to_string(line) + "; golden " +
           std::to_string(want.size()) + " bytes, now " + std::to_string(got.size()) +
           " bytes).\nIf the change is intended, regenerate the golden files and review their "
           "diff:\n  TPUSIM_UPDATE_GOLDEN=1 ctest --test-dir BUILD -R Golden\n";
}

TEST(Golden, TraceAndStatsMatchByteForByte) {
    const std::string trace = tmp("golden.trace.json"), stats = tmp("golden.stats.json");
    const auto r = run_golden(trace, stats);
    ASSERT_EQ(r.code, 0) << r.err;
    const char* update = std::getenv("TPUSIM_UPDATE_GOLDEN");
    if (update != nullptr && std::string(update) == "1") {
        std::filesystem::copy_file(trace, golden_dir() + "mix2.trace.json",
                                   std::filesystem::copy_options::overwrite_existing);
        std::filesystem::copy_file(stats, golden_dir() + "mix2.stats.json",
                                   std::filesystem::copy_options::overwrite_existing);
        GTEST_SKIP() << "TPUSIM_UPDATE_GOLDEN=1: rewrote traces/golden/mix2.{trace,stats}.json";
    }
    EXPECT_EQ(compare("mix2.trace.json", slurp(trace)), "");
    EXPECT_EQ(compare("mix2.stats.json", slurp(stats)), "");
}

TEST(Golden, TraceEventTotalsEqualTheStatsCounters) {
    const std::string trace = tmp("totals.trace.json"), stats = tmp("totals.stats.json");
    const auto r = run_golden(trace, stats);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto t = nlohmann::json::parse(slurp(trace));
    const auto s = nlohmann::json::parse(slurp(stats))["board"]["children"];

    // pid -> process name, (pid, tid) -> thread name, from the metadata events.
    std::map<int, std::string> process;
    std::map<std::pair<int, int>, std::string> thread;
    struct Totals {
        uint64_t unit_events = 0, hv_bytes = 0, vh_bytes = 0, elements = 0, ici = 0, mxu = 0;
        uint64_t halts = 0;
    };
    std::map<std::string, Totals> per_core;
    uint64_t host_launches = 0, link_bytes = 0;
    for (const auto& e : t["traceEvents"]) {
        ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
        const std::string ph = e["ph"];
        if (ph == "M") {
            if (e["name"] == "process_name") process[e["pid"]] = e["args"]["name"];
            if (e["name"] == "thread_name") thread[{e["pid"], e["tid"]}] = e["args"]["name"];
            continue;
        }
        ASSERT_TRUE(e.contains("ts")) << e.dump();
        if (ph == "C") continue;
        const std::string core = process.at(e["pid"]);
        // Overlapping events of a unit sit on lanes "vpu#1", ...: count them with the unit.
        std::string unit = thread.at({e["pid"], e["tid"]});
        unit = unit.substr(0, unit.find('#'));
        if (core == "ici") {
            // One span per link a transfer occupies.
            EXPECT_EQ(e["name"], "transfer") << e.dump();
            link_bytes += e["args"]["bytes"].get<uint64_t>();
            continue;
        }
        if (core == "host") {
            // The host process holds one span per launch, named after its kernel.
            EXPECT_EQ(unit, "kernels") << e.dump();
            ++host_launches;
            continue;
        }
        Totals& c = per_core[core];
        if (ph == "i") {
            EXPECT_EQ(e["name"], "halt");
            ++c.halts;
            continue;
        }
        ASSERT_EQ(ph, "X") << e.dump();
        ASSERT_TRUE(e.contains("dur")) << e.dump();
        EXPECT_GE(e["args"]["end_cycle"].get<uint64_t>(), e["args"]["begin_cycle"].get<uint64_t>());
        ++c.unit_events;
        const std::string name = e["name"];
        if (name == "dma.hv") c.hv_bytes += e["args"]["bytes"].get<uint64_t>();
        if (name == "dma.vh") c.vh_bytes += e["args"]["bytes"].get<uint64_t>();
        if (unit == "vpu") c.elements += e["args"]["elements"].get<uint64_t>();
        if (unit == "ici") ++c.ici;
        if (unit.rfind("mxu", 0) == 0) ++c.mxu;
    }
    ASSERT_EQ(per_core.size(), 2u);
    EXPECT_EQ(host_launches, 1u);
    uint64_t hbm = 0, flops = 0;
    for (const auto& [core, c] : per_core) {
        // "dma.ops": counter ops of the core's dma group; "instructions": the core's own.
        auto v = [&](const std::string& key) {
            const size_t dot = key.find('.');
            const auto& g =
                dot == std::string::npos ? s[core] : s[core]["children"][key.substr(0, dot)];
            return g["counters"][key.substr(dot == std::string::npos ? 0 : dot + 1)]["value"]
                .get<uint64_t>();
        };
        // One X event per unit instruction (scalar instructions run inline in the sequencer).
        EXPECT_EQ(c.unit_events, v("dma.ops") + v("vpu.ops") + v("ici.ops") + v("mxu_ops")) << core;
        EXPECT_EQ(c.hv_bytes, v("dma.hbm_read_bytes")) << core;
        EXPECT_EQ(c.vh_bytes, v("dma.hbm_write_bytes")) << core;
        EXPECT_EQ(c.elements, v("vpu.flops")) << core;
        EXPECT_EQ(c.ici, v("ici.ops")) << core;
        EXPECT_EQ(c.mxu, v("mxu_ops")) << core;
        EXPECT_EQ(c.halts, 1u) << core;
        // 18 instructions: coreid, xor, 2 dma.hv, wait, mxu.lw, wait, mxu.mm, wait, v.maxs,
        // wait, ici.v, dma.vh, wait, dma.vh, 2 waits, halt.
        EXPECT_EQ(v("instructions"), 18u) << core;
        hbm += v("dma.hbm_read_bytes") + v("dma.hbm_write_bytes");
        flops += v("mxu0.flops") + v("mxu1.flops") + v("vpu.flops");
    }
    // The kernel's totals are the two cores' counters.
    const auto& k = s["kernels"]["children"]["mix2"]["counters"];
    EXPECT_EQ(k["launches"]["value"], 1);
    EXPECT_EQ(k["hbm_read_bytes"]["value"].get<uint64_t>() +
                  k["hbm_write_bytes"]["value"].get<uint64_t>(),
              hbm);
    // Per core: 2 x 128 B in, 2 x 256 B out; 8 x 8 x 8 MACs; 64 VPU flops; 256 ICI bytes.
    EXPECT_EQ(hbm, 2u * (256 + 512));
    EXPECT_EQ(k["flops"]["value"].get<uint64_t>(), flops);
    EXPECT_EQ(flops, 2u * (2 * 512 + 64));
    EXPECT_EQ(k["ici_bytes"]["value"], 512);
    // On the 2-core ring every transfer crosses one link: the ici process carries the same bytes.
    EXPECT_EQ(link_bytes, 512u);
    EXPECT_EQ(k["instructions"]["value"], 36);
}

}  // namespace
