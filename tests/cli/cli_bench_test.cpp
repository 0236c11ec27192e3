// SPDX-License-Identifier: Apache-2.0
// tpusim bench end to end: the --json schema, values that agree with each other and with
// `tpusim gemm`, --filter and its error. No assertion on host speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace {

using Result = tpu::test::CliResult;
using tpu::test::tpusim;

/// Relative difference, for values that went through the same doubles in another order.
double rel(double a, double b) {
    return std::abs(a - b) / std::max(std::abs(b), 1e-300);
}

TEST(CliBench, QuickJsonHasTheSchemaAndConsistentValues) {
    const Result r = tpusim("bench --quick --json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("cases") && j["cases"].is_array());

    const std::set<std::string> keys = {"name",
                                        "cycles",
                                        "host_seconds",
                                        "cycles_per_host_second",
                                        "host_seconds_per_simulated_second",
                                        "eigen_host_seconds",
                                        "ratio_to_eigen",
                                        "functional",
                                        "launch_host_seconds"};
    std::map<std::string, uint64_t> cycles;
    for (const auto& c : j["cases"]) {
        const std::string name = c.at("name").get<std::string>();
        SCOPED_TRACE(name);
        std::set<std::string> got;
        for (const auto& [k, v] : c.items()) got.insert(k);
        EXPECT_EQ(got, keys);
        ASSERT_TRUE(c["cycles"].is_number_unsigned());
        const auto cyc = c["cycles"].get<uint64_t>();
        const double host = c["host_seconds"].get<double>();
        EXPECT_GT(cyc, 0u);
        EXPECT_GT(host, 0.0);
        EXPECT_LT(rel(c["cycles_per_host_second"].get<double>(), double(cyc) / host), 1e-12);
        // The default board's 940 MHz clock (configs/README.md): a cycle is 1 / 940e6 s.
        EXPECT_LT(rel(c["host_seconds_per_simulated_second"].get<double>(),
                      host / (double(cyc) / 940e6)),
                  1e-9);
        // Simulating the launches is part of the case's wall time.
        EXPECT_GT(c["launch_host_seconds"].get<double>(), 0.0);
        EXPECT_LE(c["launch_host_seconds"].get<double>(), host);
        const bool functional = name.ends_with("/functional");
        EXPECT_TRUE(functional || name.ends_with("/timing"));
        EXPECT_EQ(c["functional"].get<bool>(), functional);
        if (name.starts_with("gemm_")) {
            const double eigen = c["eigen_host_seconds"].get<double>();
            EXPECT_GT(eigen, 0.0);
            EXPECT_LT(rel(c["ratio_to_eigen"].get<double>(), host / eigen), 1e-12);
        } else {
            EXPECT_TRUE(c["eigen_host_seconds"].is_null());
            EXPECT_TRUE(c["ratio_to_eigen"].is_null());
        }
        cycles[name] = cyc;
    }
    // --quick drops GEMM 4096^3 and the functional 64 MiB all-reduce, and keeps the rest.
    const std::set<std::string> want = {"gemm_256/functional",
                                        "gemm_256/timing",
                                        "gemm_1024/functional",
                                        "gemm_1024/timing",
                                        "vpu_chain_4M/functional",
                                        "vpu_chain_4M/timing",
                                        "allreduce_64MiB_8core/timing",
                                        "train_step/functional",
                                        "train_step/timing"};
    std::set<std::string> names;
    for (const auto& [n, c] : cycles) names.insert(n);
    EXPECT_EQ(names, want);
    // Timing-only runs take exactly the cycles of functional ones (the sim.functional contract).
    for (const char* kind : {"gemm_256", "gemm_1024", "vpu_chain_4M", "train_step"})
        EXPECT_EQ(cycles[std::string(kind) + "/functional"], cycles[std::string(kind) + "/timing"])
            << kind;
    // 1024^3 MACs on one core cannot beat 2 MXUs x 128 x 128 MACs per cycle: 32768 cycles.
    EXPECT_GE(cycles["gemm_1024/timing"], 32768u);
}

TEST(CliBench, GemmCyclesEqualTpusimGemm) {
    // The bench case is the library GEMM of `tpusim gemm`: same shape, core and precision.
    const Result b = tpusim("bench --json --filter gemm_256/timing");
    ASSERT_EQ(b.code, 0) << b.err;
    const auto bj = nlohmann::json::parse(b.out);
    ASSERT_EQ(bj["cases"].size(), 1u);
    EXPECT_EQ(bj["cases"][0]["name"], "gemm_256/timing");
    EXPECT_EQ(bj["cases"][0]["functional"], false);
    const Result g = tpusim("gemm --m 256 --k 256 --n 256 --num-cores 1 --precision bf16 --json");
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(bj["cases"][0]["cycles"], nlohmann::json::parse(g.out)["cycles"]);
}

TEST(CliBench, TextTableHasOneRowPerCase) {
    const Result r = tpusim("bench --filter vpu_chain_4M/timing");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(r.out.starts_with("case ")) << r.out;
    EXPECT_NE(r.out.find("\nvpu_chain_4M/timing "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("gemm_"), std::string::npos) << r.out;
}

TEST(CliBench, ErrorsOfACaseComeBackNamedAfterTheCase) {
    // The case's DeviceError (here OutOfMemory: A alone needs 2 MiB of bf16) keeps its kind and
    // message behind the case's name, and OutOfMemory is bad input.
    const Result r =
        tpusim("bench --json --filter gemm_1024/timing --set hbm.bytes_per_core=1048576");
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err,
              "tpusim: error: gemm_1024/timing: out of HBM on core 0: requested 2.00 MiB "
              "(2097152 bytes), 1.00 MiB free (1048576 bytes), largest free block 1048576 "
              "bytes\n");
}

TEST(CliBench, HelpListsEveryCaseOnceAndMarksTimingOnlyOnes) {
    const Result r = tpusim("bench --help");
    ASSERT_EQ(r.code, 0) << r.err;
    for (const char* name :
         {"gemm_256", "gemm_1024", "gemm_4096", "gemm_4096_8core", "vpu_chain_4M",
          "allreduce_64MiB_8core", "train_step", "resnet50_step_8core", "resnet50_compiled_8x8",
          "resnet50_compiled_128x8"}) {
        const std::string line = fmt::format("\n  {:<24} ", name);
        const size_t at = r.out.find(line);
        ASSERT_NE(at, std::string::npos) << name << "\n" << r.out;
        EXPECT_EQ(r.out.find(line, at + 1), std::string::npos) << name << " listed twice";
    }
    EXPECT_NE(r.out.find("split over 8 cores, host arrays in and out (timing only)\n"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("on 1 core, host arrays in and out (timing only)"), std::string::npos);
}

TEST(CliBench, FilterMatchingNothingIsAUsageError) {
    const Result r = tpusim("bench --quick --filter nosuch");
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err,
              "tpusim: error: --filter: no benchmark case of --quick contains 'nosuch' (cases: "
              "gemm_256/functional, gemm_256/timing, gemm_1024/functional, gemm_1024/timing, "
              "vpu_chain_4M/functional, vpu_chain_4M/timing, allreduce_64MiB_8core/timing, "
              "train_step/functional, train_step/timing)\n");
}

}  // namespace
