// SPDX-License-Identifier: Apache-2.0
// The config contract: defaults, presets, overrides and every error path with its message.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hw/board_config.h"
#include "sim/config_io.h"
#include "tests/common/paths.h"

namespace tpu::hw {
namespace {

using test::slurp;

std::string error_of_json(const std::string& text) {
    BoardConfig cfg;
    try {
        sim::apply_json(sim::root_of(cfg), text, "c.json");
        cfg.validate();
    } catch (const sim::ConfigError& e) {
        return e.what();
    }
    return "no error";
}

std::string error_of_set(const std::string& assignment) {
    try {
        BoardConfig::load("", {assignment});
    } catch (const sim::ConfigError& e) {
        return e.what();
    }
    return "no error";
}

TEST(Config, DefaultsAreThePresetAndTheArchitectureTable) {
    BoardConfig cfg;
    EXPECT_EQ(nlohmann::json::parse(sim::dump_json(sim::root_of(cfg))),
              nlohmann::json::parse(slurp(test::source_dir() + "/configs/v3-8.json")));
    EXPECT_EQ(cfg.cores(), 8u);
    EXPECT_EQ(cfg.core.mxus, 2u);
    EXPECT_EQ(cfg.core.vmem_bytes, 16u << 20);
    EXPECT_EQ(cfg.hbm.bytes_per_core, 16ull << 30);
    EXPECT_EQ(cfg.period_ps(), 1064u);
    // 2 MXUs x 128 x 128 x 2 FLOPs x 940 MHz = 61.6 TFLOP/s per core, 493 per board.
    EXPECT_NEAR(cfg.peak_flops_per_core() / 1e12, 61.6, 0.01);
    EXPECT_NEAR(cfg.peak_flops_per_core() * cfg.cores() / 1e12, 492.8, 0.1);
}

TEST(Config, TinyPresetLoads) {
    const BoardConfig cfg = BoardConfig::load(test::source_dir() + "/configs/tiny.json", {});
    EXPECT_EQ(cfg.name, "tiny");
    EXPECT_EQ(cfg.cores(), 2u);
    EXPECT_EQ(cfg.core.mxu_rows, 8u);
    EXPECT_EQ(cfg.core.vmem_bytes, 1u << 20);
}

TEST(Config, ReferenceDocIsCurrent) {
    BoardConfig cfg;
    const std::string doc = slurp(test::source_dir() + "/configs/README.md");
    EXPECT_NE(doc.find(sim::doc_table(sim::root_of(cfg))), std::string::npos)
        << "configs/README.md is stale: run `tpusim config --doc > configs/README.md`";
}

TEST(Config, OverridesOfEveryType) {
    const BoardConfig cfg =
        BoardConfig::load("", {"core.mxus=1", "hbm.bytes_per_core=1073741824", "clock_mhz=700.5",
                               "sim.functional=false", "hbm.page_policy=closed", "name=mine"});
    EXPECT_EQ(cfg.core.mxus, 1u);
    EXPECT_EQ(cfg.hbm.bytes_per_core, 1ull << 30);
    EXPECT_DOUBLE_EQ(cfg.clock_mhz, 700.5);
    EXPECT_FALSE(cfg.sim.functional);
    EXPECT_EQ(cfg.hbm.page_policy, "closed");
    EXPECT_EQ(cfg.name, "mine");
    // Later overrides win; a JSON file is applied before the overrides.
    EXPECT_EQ(BoardConfig::load("", {"core.mxus=1", "core.mxus=3"}).core.mxus, 3u);
}

TEST(Config, JsonErrorsNameFileAndKey) {
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 0}})"), "core.mxus must be >= 1 (got 0)");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 9}})"), "core.mxus must be <= 8 (got 9)");
    EXPECT_EQ(error_of_json(R"({"core": {"vmem_bytes": 5000}})"),
              "core.vmem_bytes must be a power of two (got 5000)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"page_policy": "lru"}})"),
              "hbm.page_policy must be one of open,closed (got 'lru')");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": "two"}})"),
              "c.json: key 'core.mxus': expected an unsigned 32-bit integer, got \"two\"");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 1.5}})"),
              "c.json: key 'core.mxus': expected an unsigned 32-bit integer, got 1.5");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": -1}})"),
              "c.json: key 'core.mxus': must not be negative (got -1)");
    EXPECT_EQ(error_of_json(R"({"sim": {"functional": 1}})"),
              "c.json: key 'sim.functional': expected a boolean, got 1");
    EXPECT_EQ(error_of_json(R"({"name": 3})"), "c.json: key 'name': expected a string, got 3");
    EXPECT_EQ(error_of_json(R"({"clock_mhz": "fast"})"),
              "c.json: key 'clock_mhz': expected a number, got \"fast\"");
    EXPECT_EQ(error_of_json(R"({"core": 5})"),
              "c.json: key 'core': expected an object (a section), got 5");
    EXPECT_EQ(error_of_json(R"({"core": {"mxu": 1}})"),
              "c.json: unknown key 'core.mxu' (did you mean 'core.mxus'?)");
    EXPECT_EQ(error_of_json(R"({"zzz": 1})"), "c.json: unknown key 'zzz'");
    EXPECT_EQ(error_of_json("[1]"), "c.json: expected a JSON object at the top level");
    EXPECT_EQ(error_of_json("{\n  \"core\": {"),
              "c.json:2:12: malformed JSON: syntax error while parsing object key - unexpected "
              "end of input; expected string literal");
    EXPECT_EQ(error_of_json(R"({"clock_mhz": 1e999})"),
              "c.json: malformed JSON: number overflow parsing '1e999'");
}

TEST(Config, CrossFieldRules) {
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus2d"}})"),
              "ici.torus_x: 8 cores are not a square; set ici.torus_x to the torus width");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus2d", "torus_x": 3}})"),
              "ici.torus_x: 3 does not divide the 8 cores");
    EXPECT_EQ(error_of_json(R"({"hbm": {"bytes_per_core": 1048576, "row_bytes": 65536}})"),
              "hbm.bytes_per_core: 1048576 bytes cannot hold one row in every bank of every "
              "channel");
}

TEST(Config, OverrideErrors) {
    EXPECT_EQ(error_of_set("core.mxus"), "--set core.mxus: expected key.path=value");
    EXPECT_EQ(error_of_set("=3"), "--set =3: the key before '=' is empty");
    EXPECT_EQ(error_of_set("core=3"), "--set core=3: 'core' is a section; set one of its fields");
    EXPECT_EQ(error_of_set("core.mxus=abc"),
              "--set core.mxus=abc: expected an unsigned 32-bit integer, got 'abc'");
    EXPECT_EQ(error_of_set("sim.functional=maybe"),
              "--set sim.functional=maybe: expected true, false, 1 or 0, got 'maybe'");
    EXPECT_EQ(error_of_set("core.mxus=1e999"),
              "--set core.mxus=1e999: expected an unsigned 32-bit integer, got '1e999'");
    EXPECT_EQ(error_of_set("core.mxuss=1"),
              "--set core.mxuss=1: unknown key 'core.mxuss' (did you mean 'core.mxus'?)");
    EXPECT_EQ(error_of_set("clock_mhz=0.5"), "clock_mhz must be >= 1 (got 0.5)");
}

TEST(Config, MissingFile) {
    try {
        BoardConfig::load("/nonexistent.json", {});
        ADD_FAILURE();
    } catch (const sim::ConfigError& e) {
        EXPECT_STREQ(e.what(), "/nonexistent.json: cannot open config file");
    }
}

}  // namespace
}  // namespace tpu::hw
