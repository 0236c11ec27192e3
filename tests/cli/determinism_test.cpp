// SPDX-License-Identifier: Apache-2.0
// The same command writes the same trace, stats and config bytes (issue 8): nothing in those
// files depends on host time, addresses or iteration order of unordered containers.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/cli_runner.h"

namespace {

using tpu::test::shell_quote;
using tpu::test::slurp;
using tpu::test::tmp;
using tpu::test::tpusim;

/// Runs `args` twice with --trace/--stats (extension `ext` for the stats) and expects the two
/// runs' files to be identical and non-empty.
void expect_deterministic(const std::string& tag, const std::string& args,
                          const std::string& ext = ".json") {
    for (const char* run : {"1", "2"}) {
        const std::string base = tmp(tag + run);
        const auto r = tpusim(args + " --trace " + shell_quote(base + ".trace.json") + " --stats " +
                              shell_quote(base + ".stats" + ext));
        ASSERT_EQ(r.code, 0) << args << "\n" << r.err;
    }
    const std::string a = tmp(tag + "1"), b = tmp(tag + "2");
    for (const std::string& suffix :
         {std::string(".trace.json"), ".stats" + ext, ".stats" + ext + ".config.json"}) {
        const std::string first = slurp(a + suffix);
        EXPECT_FALSE(first.empty()) << tag << suffix;
        EXPECT_EQ(first, slurp(b + suffix)) << tag << suffix << " differs between two runs";
    }
    // Host time belongs on stdout (--json), never in the stats file.
    const std::string stats = slurp(a + ".stats" + ext);
    EXPECT_EQ(stats.find("host_seconds"), std::string::npos) << stats;
    EXPECT_EQ(stats.find("seconds"), std::string::npos) << stats;
}

std::string source(const std::string& path) {
    return shell_quote(tpu::test::source_dir() + "/" + path);
}

TEST(Determinism, RunWritesIdenticalTraceAndStats) {
    expect_deterministic("run", "run " + source("isa/examples/vpu_chain.s"));
}

TEST(Determinism, MultiCoreRunWithIciWritesIdenticalFiles) {
    const std::string args = "run " + source("traces/golden/mix2.s") + " --cores 0,1 --config " +
                             source("configs/tiny.json") +
                             " --load 0-1:0x0=" + source("traces/golden/a.bin") +
                             " --load 0-1:0x100=" + source("traces/golden/w.bin");
    expect_deterministic("mix", args);
    expect_deterministic("mixcsv", args, ".csv");
}

TEST(Determinism, GemmWritesIdenticalTraceAndStats) {
    expect_deterministic("gemm", "gemm --m 100 --k 200 --n 130 --cores 0-3 --precision fp32-3pass");
    expect_deterministic("gemmcsv", "gemm --m 64 --k 64 --n 64 --num-cores 2", ".csv");
}

TEST(Determinism, SharedHbmTimingChangesNoCycleOrStatistic) {
    // sim.share_hbm_timing serves the HBM timing of cores with identical requests once
    // (hw/README.md, "Replicas share their HBM timing"): the stats and the trace's units equal
    // the unshared run's. The MLP step's cores agree up to their gradient all-reduce and then
    // part; the GEMM splits one problem over four cores (different addresses from the start);
    // the single-core run leaves seven stacks idle.
    const std::string mlp = "model mlp --cores all --batch 64 --train-step --engine compiled";
    for (const std::string& args : {mlp, std::string("gemm --m 256 --k 512 --n 384 --cores 0-3"),
                                    std::string("gemm --m 128 --k 128 --n 128")}) {
        std::string stats[2], trace[2];
        for (const int share : {0, 1}) {
            const std::string base = tmp("share" + std::to_string(share));
            const auto r =
                tpusim(args + " --set sim.share_hbm_timing=" + (share ? "true" : "false") +
                       " --stats " + shell_quote(base + ".stats.json") + " --trace " +
                       shell_quote(base + ".trace.json"));
            ASSERT_EQ(r.code, 0) << args << "\n" << r.err;
            stats[share] = slurp(base + ".stats.json");
            // The trace's metadata repeats the configuration; its events must not differ.
            const auto t = nlohmann::json::parse(slurp(base + ".trace.json"));
            trace[share] = t.at("traceEvents").dump();
        }
        EXPECT_NE(stats[0].find("row_hits"), std::string::npos) << args;
        // Compared as booleans: a failure names the command rather than print two large files.
        EXPECT_TRUE(stats[0] == stats[1]) << args << ": the stats differ";
        EXPECT_TRUE(trace[0] == trace[1]) << args << ": the trace events differ";
    }
}

TEST(Determinism, ReportOfTheSameRunIsIdentical) {
    const std::string base = tmp("rep");
    ASSERT_EQ(
        tpusim("gemm --m 64 --k 128 --n 64 --num-cores 2 --trace " +
               shell_quote(base + ".trace.json") + " --stats " + shell_quote(base + ".stats.json"))
            .code,
        0);
    for (const char* n : {"1", "2"})
        ASSERT_EQ(
            tpusim("report " + shell_quote(base + ".trace.json") + " --stats " +
                   shell_quote(base + ".stats.json") + " -o " + shell_quote(base + n + ".html"))
                .code,
            0);
    EXPECT_EQ(slurp(base + "1.html"), slurp(base + "2.html"));
}

}  // namespace
