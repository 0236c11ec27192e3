// SPDX-License-Identifier: Apache-2.0
// `tpusim config` end to end: the effective config, presets, overrides, exit codes and messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace {

using tpu::test::shell_quote;
using tpu::test::slurp;
using tpu::test::tmp;
using tpu::test::tpusim;

std::string preset(const std::string& name) {
    return shell_quote(tpu::test::source_dir() + "/configs/" + name);
}

TEST(CliConfig, PrintsTheDefaultsWhichEqualTheV38Preset) {
    const auto r = tpusim("config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(nlohmann::json::parse(r.out),
              nlohmann::json::parse(slurp(tpu::test::source_dir() + "/configs/v3-8.json")));
    // Loading the preset explicitly prints the same bytes.
    EXPECT_EQ(tpusim("config --config " + preset("v3-8.json")).out, r.out);
}

TEST(CliConfig, TinyPresetAndOverrides) {
    const auto t = tpusim("config --config " + preset("tiny.json"));
    ASSERT_EQ(t.code, 0) << t.err;
    const auto j = nlohmann::json::parse(t.out);
    EXPECT_EQ(j["name"], "tiny");
    EXPECT_EQ(j["chips"].get<int>() * j["cores_per_chip"].get<int>(), 2);
    EXPECT_EQ(j["core"]["mxu_rows"], 8);

    // --set applies after the file, in order, for every kind of field.
    const auto s = tpusim("config --config " + preset("tiny.json") +
                          " --set core.mxus=1 --set core.mxus=3 --set clock_mhz=500.5"
                          " --set sim.functional=false --set ici.switching=store-and-forward"
                          " --set " +
                          shell_quote("name=my board"));
    ASSERT_EQ(s.code, 0) << s.err;
    const auto k = nlohmann::json::parse(s.out);
    EXPECT_EQ(k["core"]["mxus"], 3);
    EXPECT_EQ(k["clock_mhz"], 500.5);
    EXPECT_EQ(k["sim"]["functional"], false);
    EXPECT_EQ(k["ici"]["switching"], "store-and-forward");
    EXPECT_EQ(k["name"], "my board");
    EXPECT_EQ(k["core"]["mxu_rows"], 8);  // still from the file
}

TEST(CliConfig, EffectiveConfigIsAValidPreset) {
    const auto a = tpusim("config --config " + preset("tiny.json") + " --set hbm.channels=4");
    ASSERT_EQ(a.code, 0) << a.err;
    const std::string path = tmp("effective.json");
    std::ofstream(path) << a.out;
    const auto b = tpusim("config --config " + shell_quote(path));
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(b.out, a.out);
    std::filesystem::remove(path);
}

TEST(CliConfig, DocIsTheCommittedReference) {
    const auto d = tpusim("config --doc");
    ASSERT_EQ(d.code, 0) << d.err;
    EXPECT_EQ(d.out, slurp(tpu::test::source_dir() + "/configs/README.md"))
        << "configs/README.md is stale: run `tpusim config --doc > configs/README.md`";
}

TEST(CliConfig, ImpossibleValueExitsTwoNamingTheKey) {
    const auto r = tpusim("config --set core.mxus=0");
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "tpusim: error: core.mxus must be >= 1 (got 0)\n");
    const auto p = tpusim("config --set hbm.bytes_per_core=3000000000");
    EXPECT_EQ(p.code, 2);
    EXPECT_EQ(p.err, "tpusim: error: hbm.bytes_per_core must be a power of two (got 3000000000)\n");
    const auto c = tpusim("config --set ici.topology=torus2d --set ici.torus_x=3");
    EXPECT_EQ(c.code, 2);
    EXPECT_EQ(c.err, "tpusim: error: ici.torus_x: 3 does not divide the 8 cores\n");
}

TEST(CliConfig, BadSetExitsTwo) {
    const auto u = tpusim("config --set core.mxu=1");
    EXPECT_EQ(u.code, 2);
    EXPECT_EQ(u.err,
              "tpusim: error: --set core.mxu=1: unknown key 'core.mxu' (did you mean "
              "'core.mxus'?)\n");
    const auto s = tpusim("config --set core.mxus");
    EXPECT_EQ(s.code, 2);
    EXPECT_EQ(s.err, "tpusim: error: --set core.mxus: expected key.path=value\n");
    const auto v = tpusim("config --set sim.functional=maybe");
    EXPECT_EQ(v.code, 2);
    EXPECT_EQ(v.err,
              "tpusim: error: --set sim.functional=maybe: expected true, false, 1 or 0, got "
              "'maybe'\n");
}

TEST(CliConfig, BadConfigFileExitsTwo) {
    const auto m = tpusim("config --config /nonexistent.json");
    EXPECT_EQ(m.code, 2);
    EXPECT_EQ(m.out, "");
    EXPECT_EQ(m.err, "tpusim: error: /nonexistent.json: cannot open config file\n");

    const std::string path = tmp("bad.json");
    // A missing comma; the column is where the parser stops, at the end of "hbm".
    std::ofstream(path) << "{\"core\": {\"mxus\": 2}\n\"hbm\": {}}\n";
    const auto b = tpusim("config --config " + shell_quote(path));
    EXPECT_EQ(b.code, 2);
    EXPECT_EQ(b.err, "tpusim: error: " + path +
                         ":2:5: malformed JSON: syntax error while parsing object - unexpected "
                         "string literal; expected '}'\n");

    std::ofstream(path) << R"({"hbm": {"page_policy": 1}})";
    const auto t = tpusim("config --config " + shell_quote(path));
    EXPECT_EQ(t.code, 2);
    EXPECT_EQ(t.err,
              "tpusim: error: " + path + ": key 'hbm.page_policy': expected a string, got 1\n");

    // A field set twice is ambiguous, not "the last one wins".
    std::ofstream(path) << "{\"hbm\": {\"page_policy\": \"open\",\n \"page_policy\": \"closed\"}}";
    const auto d = tpusim("config --config " + shell_quote(path));
    EXPECT_EQ(d.code, 2);
    EXPECT_EQ(d.out, "");
    EXPECT_EQ(d.err, "tpusim: error: " + path + ": duplicate key 'hbm.page_policy'\n");
    std::filesystem::remove(path);
}

TEST(CliConfig, UnknownCommandAndOptionExitTwo) {
    const auto u = tpusim("frobnicate");
    EXPECT_EQ(u.code, 2);
    EXPECT_EQ(u.out, "");
    // The list of commands grows; check the message's shape and that it names them.
    const std::string prefix = "tpusim: error: unknown command 'frobnicate' (commands: asm, ";
    EXPECT_EQ(u.err.substr(0, prefix.size()), prefix);
    EXPECT_EQ(u.err.substr(u.err.size() - 2), ")\n");
    for (const char* cmd : {"disasm", "config", "run", "gemm"})
        EXPECT_NE(u.err.find(std::string(", ") + cmd), std::string::npos) << cmd;
    const auto o = tpusim("config --bogus");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("--bogus"), std::string::npos) << o.err;
    const auto n = tpusim("");
    EXPECT_EQ(n.code, 2);
    EXPECT_NE(n.err.find("subcommand"), std::string::npos) << n.err;
}

TEST(CliConfig, HelpAndVersion) {
    const auto h = tpusim("--help");
    EXPECT_EQ(h.code, 0) << h.err;
    for (const char* cmd : {"asm", "disasm", "run", "gemm", "config"})
        EXPECT_NE(h.out.find(cmd), std::string::npos) << cmd;
    const auto c = tpusim("config --help");
    EXPECT_EQ(c.code, 0) << c.err;
    for (const char* opt : {"--config", "--set", "--doc"})
        EXPECT_NE(c.out.find(opt), std::string::npos) << opt;
    // Every option's help line shows its default.
    const auto g = tpusim("gemm --help");
    EXPECT_EQ(g.code, 0) << g.err;
    EXPECT_NE(g.out.find("--precision TEXT=bf16 "), std::string::npos) << g.out;
    EXPECT_NE(g.out.find("--cores TEXT=0 "), std::string::npos) << g.out;
    EXPECT_NE(g.out.find("--m UINT:N>=1=1024 "), std::string::npos) << g.out;
    // ... and none is an empty list.
    EXPECT_EQ(g.out.find("=[]"), std::string::npos) << g.out;
    const auto v = tpusim("--version");
    EXPECT_EQ(v.code, 0);
    EXPECT_EQ(v.out, "tpusim 0.1.0\n");
}

}  // namespace
