// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace {

using tpu::test::slurp;
using tpu::test::tpusim;

TEST(CliConfig, PrintsTheEffectiveConfig) {
    const auto r = tpusim("config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out),
              nlohmann::json::parse(slurp(tpu::test::source_dir() + "/configs/v3-8.json")));
    const auto t = tpusim("config --config " + tpu::test::source_dir() +
                          "/configs/tiny.json --set core.mxus=1");
    ASSERT_EQ(t.code, 0) << t.err;
    const auto j = nlohmann::json::parse(t.out);
    EXPECT_EQ(j["name"], "tiny");
    EXPECT_EQ(j["core"]["mxus"], 1);
    EXPECT_EQ(tpusim("config --doc").out, slurp(tpu::test::source_dir() + "/configs/README.md"));
}

TEST(CliConfig, BadInputExitsTwoNamingTheKey) {
    const auto r = tpusim("config --set core.mxus=0");
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "tpusim: error: core.mxus must be >= 1 (got 0)\n");
    const auto m = tpusim("config --config /nonexistent.json");
    EXPECT_EQ(m.code, 2);
    EXPECT_EQ(m.err, "tpusim: error: /nonexistent.json: cannot open config file\n");
    const auto u = tpusim("frobnicate");
    EXPECT_EQ(u.code, 2);
    EXPECT_EQ(u.err,
              "tpusim: error: unknown command 'frobnicate' (commands: asm, disasm, config, "
              "run, gemm)\n");
}

TEST(CliConfig, HelpAndVersion) {
    const auto h = tpusim("--help");
    EXPECT_EQ(h.code, 0);
    for (const char* cmd : {"asm", "disasm", "run", "gemm", "config"})
        EXPECT_NE(h.out.find(cmd), std::string::npos) << cmd;
    EXPECT_EQ(tpusim("--version").out, "tpusim 0.1.0\n");
}

}  // namespace
