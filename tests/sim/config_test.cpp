// SPDX-License-Identifier: Apache-2.0
// The config contract: defaults, presets, overrides and every error path with its exact message.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "hw/board_config.h"
#include "hw/ici/ici_network.h"
#include "hw/mem/hbm_generation.h"
#include "hw/mem/hbm_timing.h"
#include "sim/config_io.h"
#include "tests/common/paths.h"
#include "tests/common/scratch.h"

namespace tpu::hw {
namespace {

using test::slurp;

/// The message of the ConfigError that loading `text` as c.json and validating throws.
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

/// The message of the ConfigError that `--set ASSIGNMENT` on the defaults throws.
std::string error_of_set(const std::string& assignment) {
    try {
        BoardConfig::load("", {assignment});
    } catch (const sim::ConfigError& e) {
        return e.what();
    }
    return "no error";
}

/// The message of the ConfigError that validating CFG throws.
std::string error_of_validate(BoardConfig cfg) {
    try {
        cfg.validate();
    } catch (const sim::ConfigError& e) {
        return e.what();
    }
    return "no error";
}

/// A path private to this test process, removed at exit.
std::string tmp(const std::string& name) {
    return test::scratch("config-" + name);
}

// ---- defaults and presets ----

TEST(Config, DefaultsAreThePresetAndTheArchitectureTable) {
    BoardConfig cfg;
    EXPECT_EQ(nlohmann::json::parse(sim::dump_json(sim::root_of(cfg))),
              nlohmann::json::parse(slurp(test::source_dir() + "/configs/v3-8.json")));
    EXPECT_NO_THROW(cfg.validate());
    EXPECT_EQ(cfg.cores(), 8u);
    EXPECT_EQ(cfg.core.mxus, 2u);
    EXPECT_EQ(cfg.core.mxu_rows, 128u);
    EXPECT_EQ(cfg.core.vmem_bytes, 16u << 20);
    EXPECT_EQ(cfg.hbm.bytes_per_core, 16ull << 30);
    EXPECT_EQ(cfg.hbm.tck_ps, 1136u);
    EXPECT_EQ(cfg.ici.topology, "ring");
    EXPECT_EQ(cfg.period_ps(), 1064u);  // 1e6 / 940 = 1063.8 ps
    // 2 MXUs x 128 x 128 x 2 FLOPs x 940 MHz = 61.6 TFLOP/s per core, 493 per board.
    EXPECT_NEAR(cfg.peak_flops_per_core() / 1e12, 61.6, 0.01);
    EXPECT_NEAR(cfg.peak_flops_per_core() * cfg.cores() / 1e12, 492.8, 0.1);
}

TEST(Config, V38PresetLoadsToTheDefaults) {
    BoardConfig loaded = BoardConfig::load(test::source_dir() + "/configs/v3-8.json", {});
    BoardConfig defaults;
    EXPECT_EQ(sim::dump_json(sim::root_of(loaded)), sim::dump_json(sim::root_of(defaults)));
}

TEST(Config, TinyPresetLoads) {
    const BoardConfig cfg = BoardConfig::load(test::source_dir() + "/configs/tiny.json", {});
    EXPECT_EQ(cfg.name, "tiny");
    EXPECT_EQ(cfg.chips, 1u);
    EXPECT_EQ(cfg.cores(), 2u);
    EXPECT_EQ(cfg.core.mxu_rows, 8u);
    EXPECT_EQ(cfg.core.mxu_cols, 8u);
    EXPECT_EQ(cfg.core.vmem_bytes, 1u << 20);
    EXPECT_EQ(cfg.hbm.bytes_per_core, 64u << 20);
    // Fields the preset leaves out keep their defaults.
    EXPECT_EQ(cfg.core.mxus, 2u);
    EXPECT_EQ(cfg.hbm.timing.cl, 13u);
}

TEST(Config, PodSlicePresetsLoadWithTheirCoresHostsAndTorus) {
    // A chip's two cores are neighbours along x, so an X x Y chip torus is a 2X x Y core torus.
    struct Slice {
        const char* file;
        uint32_t chips, hosts, torus_x, torus_rows;
    };
    const Slice slices[] = {
        {"v3-32", 16, 4, 8, 4},
        {"v3-128", 64, 16, 16, 8},
        {"v3-512", 256, 64, 32, 16},
        {"v3-2048", 1024, 256, 64, 32}};  // the full pod: 32 x 32 chips, 2048 cores
    BoardConfig v38;
    for (const Slice& s : slices) {
        SCOPED_TRACE(s.file);
        BoardConfig cfg =
            BoardConfig::load(test::source_dir() + "/configs/" + s.file + ".json", {});
        EXPECT_EQ(cfg.name, s.file);
        EXPECT_EQ(cfg.chips, s.chips);
        EXPECT_EQ(cfg.cores_per_chip, 2u);
        EXPECT_EQ(cfg.cores(), 2 * s.chips);
        EXPECT_EQ(cfg.chips_per_host, 4u);
        EXPECT_EQ(cfg.hosts(), s.hosts);
        EXPECT_EQ(cfg.ici.topology, "torus2d");
        EXPECT_EQ(cfg.ici.torus_x, s.torus_x);
        EXPECT_EQ(cfg.cores() / cfg.ici.torus_x, s.torus_rows);
        // Every other field is v3-8's.
        cfg.name = v38.name;
        cfg.chips = v38.chips;
        cfg.ici.topology = v38.ici.topology;
        cfg.ici.torus_x = v38.ici.torus_x;
        EXPECT_EQ(sim::dump_json(sim::root_of(cfg)), sim::dump_json(sim::root_of(v38)));
    }
}

// The presets of other generations (configs/presets.md): each loads with the figures its
// sources publish, derived from its fields the way the model uses them.
TEST(Config, GenerationPresetsHaveTheirPublishedFigures) {
    // Per chip, as the spec sheets give them (configs/presets.md cites each): peak bf16
    // TFLOP/s, HBM GB/s and GiB, ICI links and one-way GB/s per link.
    struct Preset {
        const char* file;
        uint32_t cores, devices, mxus, array;
        double peak_tflops;
        double hbm_gb_per_s;
        uint64_t hbm_gib;
        const char* topology;
        uint32_t ici_links;  // 0: the model's count differs (checked below)
        double link_gb_per_s;
    };
    const Preset presets[] = {
        {"v2-8", 8, 8, 1, 128, 46, 700, 16, "torus2d", 0, 62},             // [CACM20]
        {"v3-8", 8, 8, 2, 128, 123, 900, 32, "ring", 0, 82},               // [CACM20]
        {"v3-2048", 2048, 2048, 2, 128, 123, 900, 32, "torus2d", 0, 82},   // [CACM20]
        {"v4-8", 8, 4, 4, 128, 275, 1200, 32, "torus3d", 6, 45},           // [ISCA23], [Book]
        {"v5e-8", 8, 8, 4, 128, 197, 819, 16, "torus2d", 4, 400.0 / 8},    // [Cloud]
        {"v6e-8", 8, 8, 4, 256, 918, 1640, 32, "torus2d", 4, 800.0 / 8}};  // [Cloud]
    for (const Preset& p : presets) {
        SCOPED_TRACE(p.file);
        const BoardConfig cfg =
            BoardConfig::load(test::source_dir() + "/configs/" + p.file + ".json", {});
        EXPECT_EQ(cfg.name.rfind(p.file, 0), 0u) << cfg.name;  // v3-8 is "v3-8-like"
        EXPECT_EQ(cfg.cores(), p.cores);
        EXPECT_EQ(cfg.devices(), p.devices);
        EXPECT_EQ(cfg.core.mxus, p.mxus);
        EXPECT_EQ(cfg.core.mxu_rows, p.array);
        EXPECT_EQ(cfg.core.mxu_cols, p.array);
        EXPECT_EQ(cfg.ici.topology, p.topology);
        // Within 0.5% (the clocks are whole MHz, the HBM clocks whole ps), as the model derives
        // them: the MXUs' peak, the HBM timing model's peak and the ICI network's link rate.
        const double hz = cfg.clock().hz();
        const double peak = cfg.peak_flops_per_core() * cfg.cores_per_chip / 1e12;
        EXPECT_NEAR(peak / p.peak_tflops, 1.0, 0.005) << peak;
        const double hbm =
            make_hbm_timing(cfg)->peak_bytes_per_cycle() * hz * cfg.cores_per_chip / 1e9;
        EXPECT_NEAR(hbm / p.hbm_gb_per_s, 1.0, 0.005) << hbm;
        EXPECT_EQ(cfg.hbm.bytes_per_core * cfg.cores_per_chip, p.hbm_gib << 30);
        const IciNetwork net(cfg);
        const double link = net.bytes_per_cycle() * hz / 1e9;
        // Within 3%: v3's 80 GB/s is ARCHITECTURE.md's round figure for 656 Gbit/s (82 GB/s).
        EXPECT_NEAR(link / p.link_gb_per_s, 1.0, 0.03) << link;
        // Links that leave chip 0 for another chip.
        uint32_t links = 0;
        for (uint32_t c = 0; c < cfg.cores_per_chip; ++c)
            for (uint32_t d = 0; d < IciNetwork::kDirs; ++d) {
                const uint32_t id = c * IciNetwork::kDirs + d;
                links += net.has_link(id) && net.link_target(id) >= cfg.cores_per_chip;
            }
        if (p.ici_links) {
            EXPECT_EQ(links, p.ici_links);
        } else if (cfg.ici.topology == "ring") {
            // [CACM20]: 4 links per v3 chip; ARCHITECTURE.md's v3-8 board is a ring of the 8
            // cores, so 2 leave a chip (one each way).
            EXPECT_EQ(links, 2u);
        } else {
            // Every core of a 2-core chip is a torus node with its own y links: 2 along x and
            // 2 x 2 along y leave the chip, where [CACM20] has 4.
            EXPECT_EQ(links, 6u);
        }
        // The timing block is the generation's set at the preset's HBM clock.
        const HbmGeneration* g = find_hbm_generation(cfg.hbm.generation);
        if (cfg.hbm.generation == "custom") continue;  // v3: its own calibrated block
        ASSERT_NE(g, nullptr);
        const auto fields = [](HbmTiming t) { return sim::dump_json(sim::root_of(t)); };
        EXPECT_EQ(fields(cfg.hbm.timing), fields(hbm_timing_at(*g, cfg.hbm.tck_ps)));
    }
}

TEST(Config, AnHbmGenerationGivesTimingDefaultsThatExplicitValuesOverride) {
    const std::string v4 = test::source_dir() + "/configs/v4-8.json";
    // hbm2: tRCD 12 ns = ceil(12000 / 853) = 15 tCK, tRFC 220 ns = 258 tCK.
    const BoardConfig a = BoardConfig::load(v4, {});
    EXPECT_EQ(a.hbm.timing.rcd, 15u);
    EXPECT_EQ(a.hbm.timing.rfc, 258u);
    EXPECT_EQ(a.hbm.timing.ccd_l, 3u);  // tCK, not scaled
    // A slower clock rescales the nanoseconds: ceil(12000 / 1706) = 8.
    EXPECT_EQ(BoardConfig::load(v4, {"hbm.tck_ps=1706"}).hbm.timing.rcd, 8u);
    // An explicit value wins over the set, and only that one.
    const BoardConfig b = BoardConfig::load(v4, {"hbm.timing.rcd=20"});
    EXPECT_EQ(b.hbm.timing.rcd, 20u);
    EXPECT_EQ(b.hbm.timing.rfc, 258u);
    // custom (the default) keeps the block as written.
    EXPECT_EQ(BoardConfig::load("", {"hbm.tck_ps=500"}).hbm.timing.rcd, 13u);
}

TEST(Config, HostsOfABoard) {
    BoardConfig cfg;
    EXPECT_EQ(cfg.hosts(), 1u);  // v3-8: one host drives all 4 chips
    cfg.chips = 16;
    EXPECT_EQ(cfg.hosts(), 4u);
    cfg.chips = 1;  // tiny.json: a board smaller than one host still has one
    EXPECT_EQ(cfg.hosts(), 1u);
    cfg.chips_per_host = 0xFFFFFFFF;  // no wrap-around in the rounding up
    EXPECT_EQ(cfg.hosts(), 1u);
}

TEST(Config, EffectiveConfigReloadsToItself) {
    BoardConfig cfg = BoardConfig::load(test::source_dir() + "/configs/tiny.json",
                                        {"ici.link_gb_per_s=12.5", "sim.max_cycles=0"});
    const std::string dumped = sim::dump_json(sim::root_of(cfg));
    BoardConfig again;
    sim::apply_json(sim::root_of(again), dumped, "effective.json");
    EXPECT_EQ(sim::dump_json(sim::root_of(again)), dumped);
}

TEST(Config, DumpKeepsDeclarationOrder) {
    BoardConfig cfg;
    const std::string dumped = sim::dump_json(sim::root_of(cfg));
    EXPECT_EQ(dumped.rfind("{\n  \"name\": \"v3-8-like\",\n  \"chips\": 4,\n", 0), 0u) << dumped;
    EXPECT_LT(dumped.find("\"core\""), dumped.find("\"hbm\""));
    EXPECT_LT(dumped.find("\"hbm\""), dumped.find("\"ici\""));
    EXPECT_EQ(dumped.back(), '\n');
}

TEST(Config, DumpOfANonUtf8NameDoesNotThrow) {
    // A --set value is arbitrary bytes; the effective-config dump must still succeed.
    BoardConfig cfg = BoardConfig::load("", {"name=a\xff"});
    const auto j = nlohmann::json::parse(sim::dump_json(sim::root_of(cfg)));
    EXPECT_EQ(j["name"], "a\xEF\xBF\xBD");  // U+FFFD replaces the bad byte
}

TEST(Config, ReferenceDocIsCurrent) {
    // Exactly what `tpusim config --doc` prints (tools/tpusim/cmd_config.cpp).
    BoardConfig cfg;
    const std::string expected =
        "# Board configuration reference\n\n"
        "Generated by `tpusim config --doc`; defaults are the v3-8-like board.\n"
        "Set any field with `--set key=value` or in a JSON file passed with `--config`.\n\n" +
        sim::doc_table(sim::root_of(cfg)) + "\n" +
        slurp(test::source_dir() + "/configs/presets.md");
    EXPECT_EQ(slurp(test::source_dir() + "/configs/README.md"), expected)
        << "configs/README.md is stale: run `tpusim config --doc > configs/README.md`";
}

TEST(Config, EveryFieldHasADocAndTheUnitItsNameSays) {
    // A field's name suffix and its declared unit must agree, so the docs never contradict
    // the key a user types.
    struct Walker : sim::Visitor {
        std::vector<std::string> bad;
        std::vector<std::string> path;
        void field(std::string_view key, sim::FieldRef, std::string_view unit, std::string_view doc,
                   const sim::Check&) override {
            std::string k;
            for (const auto& p : path) k += p + ".";
            k += key;
            if (doc.empty()) bad.push_back(k + ": no doc");
            const std::pair<std::string_view, std::string_view> suffixes[] = {
                {"_ns", "ns"},         {"_ps", "ps"},         {"_mhz", "MHz"},
                {"_gb_per_s", "GB/s"}, {"_cycles", "cycles"}, {"_bytes_per_cycle", "bytes/cycle"},
                {"_bytes", "bytes"},   {"_seconds", "s"}};
            for (const auto& [suffix, expected] : suffixes)
                if (key.ends_with(suffix)) {
                    if (unit != expected)
                        bad.push_back(
                            fmt::format("{}: unit '{}', expected '{}'", k, unit, expected));
                    break;
                }
        }
        void enter(std::string_view key, std::string_view) override { path.emplace_back(key); }
        void leave() override { path.pop_back(); }
    } w;
    BoardConfig cfg;
    cfg.visit(w);
    EXPECT_TRUE(w.bad.empty()) << fmt::format("{}", fmt::join(w.bad, "\n"));
}

TEST(Config, DocTableRows) {
    BoardConfig cfg;
    const std::string doc = sim::doc_table(sim::root_of(cfg));
    EXPECT_EQ(
        doc.rfind("| key | type | unit | default | description |\n|---|---|---|---|---|\n", 0), 0u);
    EXPECT_NE(
        doc.find("| `core.mxus` | unsigned 32-bit integer | – | `2` | matrix units per core |\n"),
        std::string::npos);
    EXPECT_NE(doc.find("| `clock_mhz` | number | MHz | `940` | core clock |\n"), std::string::npos);
    EXPECT_NE(doc.find("| `sim.functional` | boolean | – | `true` |"), std::string::npos);
    EXPECT_NE(doc.find("| `hbm.page_policy` | string | – | `open` | row buffer policy "
                       "(one of: open,closed) |\n"),
              std::string::npos);
    EXPECT_NE(doc.find("| `core.vmem_bytes` | unsigned 64-bit integer | bytes | `16777216` | "
                       "vector memory per core (power of two) |\n"),
              std::string::npos);
}

// ---- overrides ----

TEST(Config, OverridesOfEveryType) {
    const BoardConfig cfg = BoardConfig::load(
        "", {"core.mxus=1", "hbm.bytes_per_core=1073741824", "clock_mhz=700.5",
             "sim.functional=false", "hbm.page_policy=closed", "name=mine", "sim.max_cycles=0",
             "ici.link_gb_per_s=100", "sim.race_detector=1", "ici.switching=store-and-forward"});
    EXPECT_EQ(cfg.core.mxus, 1u);
    EXPECT_EQ(cfg.hbm.bytes_per_core, 1ull << 30);
    EXPECT_DOUBLE_EQ(cfg.clock_mhz, 700.5);
    EXPECT_FALSE(cfg.sim.functional);
    EXPECT_EQ(cfg.hbm.page_policy, "closed");
    EXPECT_EQ(cfg.name, "mine");
    EXPECT_EQ(cfg.sim.max_cycles, 0u);
    EXPECT_DOUBLE_EQ(cfg.ici.link_gb_per_s, 100.0);  // an integer is a valid double
    EXPECT_TRUE(cfg.sim.race_detector);
    EXPECT_EQ(cfg.ici.switching, "store-and-forward");
}

TEST(Config, OverrideValueSpellings) {
    EXPECT_TRUE(BoardConfig::load("", {"sim.functional=true"}).sim.functional);
    EXPECT_FALSE(BoardConfig::load("", {"sim.functional=0"}).sim.functional);
    // Everything after the first '=' is the value, so a string may contain '='.
    EXPECT_EQ(BoardConfig::load("", {"name=a=b"}).name, "a=b");
    EXPECT_EQ(BoardConfig::load("", {"name="}).name, "");
    EXPECT_EQ(BoardConfig::load("", {"sim.max_cycles=18446744073709551615"}).sim.max_cycles,
              std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(BoardConfig::load("", {"core.mxus=8"}).core.mxus, 8u);  // the max is inclusive
}

TEST(Config, LaterOverridesWinOverEarlierOnesAndTheFile) {
    EXPECT_EQ(BoardConfig::load("", {"core.mxus=1", "core.mxus=3"}).core.mxus, 3u);
    const BoardConfig cfg =
        BoardConfig::load(test::source_dir() + "/configs/tiny.json", {"core.mxu_rows=16"});
    EXPECT_EQ(cfg.name, "tiny");
    EXPECT_EQ(cfg.core.mxu_rows, 16u);
}

TEST(Config, OverridesAreValidatedOnlyAtTheEnd) {
    // An intermediate state may be inconsistent; only the final config is checked.
    const BoardConfig cfg =
        BoardConfig::load("", {"ici.topology=torus2d", "chips=2", "cores_per_chip=2"});
    EXPECT_EQ(cfg.cores(), 4u);
    EXPECT_EQ(cfg.ici.topology, "torus2d");
    EXPECT_NO_THROW(BoardConfig::load("", {"ici.topology=torus2d", "ici.torus_x=2"}));
    EXPECT_NO_THROW(BoardConfig::load("", {"ici.topology=torus2d", "ici.torus_x=8"}));
}

// ---- JSON errors ----

TEST(Config, MalformedJsonNamesLineAndColumn) {
    EXPECT_EQ(error_of_json("{\n  \"core\": {"),
              "c.json:2:12: malformed JSON: syntax error while parsing object key - unexpected "
              "end of input; expected string literal");
    EXPECT_EQ(error_of_json(R"({"core": x})"),
              "c.json:1:10: malformed JSON: syntax error while parsing value - invalid literal; "
              "last read: '\"core\": x'");
    EXPECT_EQ(error_of_json("{\"core\": {\"mxus\": 1,\n}}"),
              "c.json:2:1: malformed JSON: syntax error while parsing object key - unexpected "
              "'}'; expected string literal");
    EXPECT_EQ(error_of_json(""),
              "c.json:1:1: malformed JSON: syntax error while parsing value - unexpected end of "
              "input; expected '[', '{', or a literal");
    EXPECT_EQ(error_of_json(R"({"clock_mhz": 1e999})"),
              "c.json: malformed JSON: number overflow parsing '1e999'");
}

TEST(Config, DuplicateKeyIsRefusedNamingIt) {
    // nlohmann would keep the last value silently.
    EXPECT_EQ(error_of_json(R"({"clock_mhz": 940, "clock_mhz": 1000})"),
              "c.json: duplicate key 'clock_mhz'");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 1, "vmem_bytes": 1024, "mxus": 2}})"),
              "c.json: duplicate key 'core.mxus'");
    // The same key in two different objects is no duplicate.
    EXPECT_EQ(error_of_json(R"({"core": {"x": 1}, "hbm": {"x": 1}})").find("duplicate"),
              std::string::npos);
}

TEST(Config, DeepNestingIsRefusedAsItIsParsed) {
    // Issue #30, class 6: the duplicate-key check kept a full dotted path per open object, so a
    // 450 KB file of nested objects needed about 6 GB. No config value nests deeper than its
    // deepest section (plus a leaf's array), so the parser stops at the first level past it.
    std::string deep;
    for (int i = 0; i < 75000; ++i) deep += "{\"a\":";
    deep += "1" + std::string(75000, '}');
    const std::string e = error_of_json(deep);
    EXPECT_EQ(e.rfind("c.json: key 'a.a.a", 0), 0u) << e.substr(0, 200);
    EXPECT_NE(e.find(" levels deep; no config value is nested more than "), std::string::npos)
        << e.substr(0, 200);
    EXPECT_LT(e.size(), 200u);
    // Arrays count too: printing such a value in a type error would recurse through it.
    const std::string arrays =
        "{\"clock_mhz\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    EXPECT_NE(error_of_json(arrays).find("c.json: key 'clock_mhz': nested "), std::string::npos);
    // A leaf given an array or an object still gets its type error.
    EXPECT_EQ(error_of_json(R"({"clock_mhz": [1]})"),
              "c.json: key 'clock_mhz': expected a number, got [1]");
}

TEST(Config, AnEndlessConfigFileIsRefusedAtItsBound) {
    // Issue #30, class 5: /dev/zero as --config grew until the process was killed.
    try {
        BoardConfig::load("/dev/zero", {});
        ADD_FAILURE() << "/dev/zero loaded";
    } catch (const sim::ConfigError& e) {
        EXPECT_STREQ(e.what(),
                     "cannot read '/dev/zero': longer than 16 MiB (the most this input may hold)");
    }
}

TEST(Config, TopLevelMustBeAnObject) {
    EXPECT_EQ(error_of_json("[1]"), "c.json: expected a JSON object at the top level");
    EXPECT_EQ(error_of_json("null"), "c.json: expected a JSON object at the top level");
    EXPECT_EQ(error_of_json("\"core\""), "c.json: expected a JSON object at the top level");
    EXPECT_EQ(error_of_json("{}"), "no error");
}

TEST(Config, UnknownKeys) {
    EXPECT_EQ(error_of_json(R"({"core": {"mxu": 1}})"),
              "c.json: unknown key 'core.mxu' (did you mean 'core.mxus'?)");
    EXPECT_EQ(error_of_json(R"({"cores": {"mxus": 1}})"),
              "c.json: unknown key 'cores' (did you mean 'core'?)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"timing": {"tcl": 1}}})"),
              "c.json: unknown key 'hbm.timing.tcl' (did you mean 'hbm.timing.cl'?)");
    EXPECT_EQ(error_of_json(R"({"zzz": 1})"), "c.json: unknown key 'zzz'");
    EXPECT_EQ(error_of_json(R"({"core": {"frobnicator": 1}})"),
              "c.json: unknown key 'core.frobnicator'");
}

TEST(Config, WrongTypeForEachKind) {
    // unsigned 32-bit
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": "two"}})"),
              "c.json: key 'core.mxus': expected an unsigned 32-bit integer, got \"two\"");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 1.5}})"),
              "c.json: key 'core.mxus': expected an unsigned 32-bit integer, got 1.5");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": -1}})"),
              "c.json: key 'core.mxus': must not be negative (got -1)");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 4294967296}})"),
              "c.json: key 'core.mxus': 4294967296 does not fit an unsigned 32-bit integer");
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": null}})"),
              "c.json: key 'core.mxus': expected an unsigned 32-bit integer, got null");
    // unsigned 64-bit
    EXPECT_EQ(error_of_json(R"({"sim": {"max_cycles": true}})"),
              "c.json: key 'sim.max_cycles': expected an unsigned 64-bit integer, got true");
    EXPECT_EQ(error_of_json(R"({"sim": {"max_cycles": -5}})"),
              "c.json: key 'sim.max_cycles': must not be negative (got -5)");
    EXPECT_EQ(error_of_json(R"({"sim": {"max_cycles": 18446744073709551616}})"),
              "c.json: key 'sim.max_cycles': expected an unsigned 64-bit integer, got "
              "1.8446744073709552e+19");
    // bool
    EXPECT_EQ(error_of_json(R"({"sim": {"functional": 1}})"),
              "c.json: key 'sim.functional': expected a boolean, got 1");
    EXPECT_EQ(error_of_json(R"({"sim": {"functional": "true"}})"),
              "c.json: key 'sim.functional': expected a boolean, got \"true\"");
    // string
    EXPECT_EQ(error_of_json(R"({"name": 3})"), "c.json: key 'name': expected a string, got 3");
    EXPECT_EQ(error_of_json(R"({"hbm": {"model": ["simple"]}})"),
              "c.json: key 'hbm.model': expected a string, got [\"simple\"]");
    // double
    EXPECT_EQ(error_of_json(R"({"clock_mhz": "fast"})"),
              "c.json: key 'clock_mhz': expected a number, got \"fast\"");
    EXPECT_EQ(error_of_json(R"({"clock_mhz": false})"),
              "c.json: key 'clock_mhz': expected a number, got false");
    // section
    EXPECT_EQ(error_of_json(R"({"core": 5})"),
              "c.json: key 'core': expected an object (a section), got 5");
    EXPECT_EQ(error_of_json(R"({"hbm": {"timing": []}})"),
              "c.json: key 'hbm.timing': expected an object (a section), got []");
    // a leaf given as an object
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": {"n": 1}}})"),
              "c.json: key 'core.mxus': expected an unsigned 32-bit integer, got {\"n\":1}");
}

// ---- field checks ----

TEST(Config, BelowMin) {
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 0}})"), "core.mxus must be >= 1 (got 0)");
    EXPECT_EQ(error_of_json(R"({"chips": 0})"), "chips must be >= 1 (got 0)");
    EXPECT_EQ(error_of_json(R"({"chips_per_host": 0})"), "chips_per_host must be >= 1 (got 0)");
    EXPECT_EQ(error_of_json(R"({"clock_mhz": 0.5})"), "clock_mhz must be >= 1 (got 0.5)");
    EXPECT_EQ(error_of_json(R"({"ici": {"link_gb_per_s": 0}})"),
              "ici.link_gb_per_s must be >= 0.001 (got 0)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"bytes_per_core": 0}})"),
              "hbm.bytes_per_core must be >= 1048576 (got 0)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"timing": {"cl": 0}}})"),
              "hbm.timing.cl must be >= 1 (got 0)");
    EXPECT_EQ(error_of_json(R"({"sim": {"trace_counter_cycles": 0}})"),
              "sim.trace_counter_cycles must be >= 1 (got 0)");
}

TEST(Config, AboveMax) {
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 9}})"), "core.mxus must be <= 8 (got 9)");
    EXPECT_EQ(error_of_json(R"({"chips": 4097})"), "chips must be <= 4096 (got 4097)");
    EXPECT_EQ(error_of_json(R"({"clock_mhz": 20000.25})"),
              "clock_mhz must be <= 10000 (got 20000.25)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"pseudo_channels": 4}})"),
              "hbm.pseudo_channels must be <= 2 (got 4)");
}

TEST(Config, NonPowerOfTwo) {
    EXPECT_EQ(error_of_json(R"({"core": {"vmem_bytes": 5000}})"),
              "core.vmem_bytes must be a power of two (got 5000)");
    EXPECT_EQ(error_of_json(R"({"core": {"smem_bytes": 100}})"),
              "core.smem_bytes must be a power of two (got 100)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"bytes_per_core": 17179869185}})"),
              "hbm.bytes_per_core must be a power of two (got 17179869185)");
    EXPECT_EQ(error_of_json(R"({"hbm": {"channels": 3}})"),
              "hbm.channels must be a power of two (got 3)");
}

TEST(Config, InvalidChoice) {
    EXPECT_EQ(error_of_json(R"({"hbm": {"page_policy": "lru"}})"),
              "hbm.page_policy must be one of open,closed (got 'lru')");
    EXPECT_EQ(error_of_json(R"({"hbm": {"model": "ddr4"}})"),
              "hbm.model must be one of hbm2,simple (got 'ddr4')");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "mesh"}})"),
              "ici.topology must be one of ring,torus2d,torus3d (got 'mesh')");
    EXPECT_EQ(error_of_json(R"({"ici": {"switching": "cut"}})"),
              "ici.switching must be one of cut-through,store-and-forward (got 'cut')");
    EXPECT_EQ(error_of_json(R"({"sim": {"log_level": "WARN"}})"),
              "sim.log_level must be one of error,warn,info,debug (got 'WARN')");
    EXPECT_EQ(error_of_json(R"({"sim": {"log_level": ""}})"),
              "sim.log_level must be one of error,warn,info,debug (got '')");
    EXPECT_EQ(error_of_json(R"({"sim": {"log_level": "debug"}})"), "no error");
}

TEST(Config, NonFiniteNumbers) {
    // JSON cannot spell inf or nan, but code can set them before validate().
    BoardConfig inf;
    inf.clock_mhz = std::numeric_limits<double>::infinity();
    EXPECT_EQ(error_of_validate(inf), "clock_mhz must be a finite number (got inf)");
    BoardConfig nan;
    nan.ici.link_gb_per_s = std::nan("");
    EXPECT_EQ(error_of_validate(nan), "ici.link_gb_per_s must be a finite number (got nan)");
}

TEST(Config, FirstBadFieldInDeclarationOrderIsReported) {
    EXPECT_EQ(error_of_json(R"({"core": {"mxus": 0}, "chips": 0})"), "chips must be >= 1 (got 0)");
}

// ---- cross-field rules (BoardConfig::validate) ----

TEST(Config, CrossFieldRules) {
    EXPECT_EQ(error_of_json(R"({"hbm": {"model": "hbm2"}})"), "no error");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus2d"}})"),
              "ici.torus_x: 8 cores are not a square; set ici.torus_x to the torus width");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus2d", "torus_x": 3}})"),
              "ici.torus_x: 3 does not divide the 8 cores");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus2d", "torus_x": 16}})"),
              "ici.torus_x: 16 does not divide the 8 cores");
    // torus_x only matters for the torus.
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "ring", "torus_x": 3}})"), "no error");
    // A 3-D torus: both widths or neither (a cube); 8 cores are 2 x 2 x 2.
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus3d"}})"), "no error");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus3d", "torus_x": 4, "torus_y": 2}})"),
              "no error");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus3d", "torus_x": 4}})"),
              "ici.torus_y: a 3-D torus needs both torus_x and torus_y (or neither, for a cube)");
    EXPECT_EQ(error_of_json(R"({"ici": {"topology": "torus3d", "torus_x": 2, "torus_y": 3}})"),
              "ici.torus_y: 3 does not divide the 4 cores of a plane (8 cores / torus_x 2)");
    EXPECT_EQ(error_of_json(R"({"chips": 6, "chips_per_host": 6, "ici": {"topology": "torus3d"}})"),
              "ici.torus_x: 12 cores are not a cube; set ici.torus_x and ici.torus_y");
    EXPECT_EQ(error_of_json(R"({"chips": 16, "chips_per_host": 3})"),
              "chips_per_host: 3 chips per host do not divide 16 chips");
    EXPECT_EQ(error_of_json(R"({"chips": 16, "chips_per_host": 8})"), "no error");
    EXPECT_EQ(error_of_json(R"({"chips": 16, "chips_per_host": 16})"), "no error");
    // A board with fewer chips than one host drives is one host that is not full.
    EXPECT_EQ(error_of_json(R"({"chips": 3, "chips_per_host": 4})"), "no error");
    // 1 MiB over 16 channels x 2 pseudo-channels = 32 KiB, but 16 banks x 64 KiB rows = 1 MiB.
    EXPECT_EQ(error_of_json(R"({"hbm": {"bytes_per_core": 1048576, "row_bytes": 65536}})"),
              "hbm.bytes_per_core: 1048576 bytes cannot hold one row in every bank of every "
              "channel");
    // Exactly one row per bank fits: 1 MiB / 32 pseudo-channels = 32 KiB = 16 banks x 2 KiB.
    EXPECT_EQ(error_of_json(R"({"hbm": {"bytes_per_core": 1048576, "row_bytes": 2048}})"),
              "no error");
    // More channels than bytes: each pseudo-channel gets 0 bytes.
    EXPECT_EQ(error_of_json(R"({"hbm": {"bytes_per_core": 1048576, "channels": 2147483648}})"),
              "hbm.bytes_per_core: 1048576 bytes cannot hold one row in every bank of every "
              "channel");
}

TEST(Config, RowRuleDoesNotOverflow) {
    // 2^31-byte rows x 2^31 bank groups x 4 banks = 2^64 bytes, which wraps to 0 in 64 bits.
    EXPECT_EQ(error_of_json(R"({"hbm": {"row_bytes": 2147483648, "bank_groups": 2147483648,
                                        "banks_per_group": 4}})"),
              "hbm.bytes_per_core: 17179869184 bytes cannot hold one row in every bank of every "
              "channel");
}

// ---- --set errors ----

TEST(Config, OverrideSyntaxErrors) {
    EXPECT_EQ(error_of_set("core.mxus"), "--set core.mxus: expected key.path=value");
    EXPECT_EQ(error_of_set(""), "--set : expected key.path=value");
    EXPECT_EQ(error_of_set("=3"), "--set =3: the key before '=' is empty");
    EXPECT_EQ(error_of_set("core=3"), "--set core=3: 'core' is a section; set one of its fields");
    EXPECT_EQ(error_of_set("hbm.timing=3"),
              "--set hbm.timing=3: 'hbm.timing' is a section; set one of its fields");
}

TEST(Config, OverrideUnknownKey) {
    EXPECT_EQ(error_of_set("core.mxuss=1"),
              "--set core.mxuss=1: unknown key 'core.mxuss' (did you mean 'core.mxus'?)");
    EXPECT_EQ(error_of_set("Clock_mhz=1"),
              "--set Clock_mhz=1: unknown key 'Clock_mhz' (did you mean 'clock_mhz'?)");
    EXPECT_EQ(error_of_set("zzz=1"), "--set zzz=1: unknown key 'zzz'");
}

TEST(Config, OverrideBadValues) {
    EXPECT_EQ(error_of_set("core.mxus=abc"),
              "--set core.mxus=abc: expected an unsigned 32-bit integer, got 'abc'");
    EXPECT_EQ(error_of_set("core.mxus="),
              "--set core.mxus=: expected an unsigned 32-bit integer, got ''");
    EXPECT_EQ(error_of_set("core.mxus=true"),
              "--set core.mxus=true: expected an unsigned 32-bit integer, got 'true'");
    EXPECT_EQ(error_of_set("core.mxus=1e999"),
              "--set core.mxus=1e999: expected an unsigned 32-bit integer, got '1e999'");
    EXPECT_EQ(error_of_set("core.mxus=1.5"),
              "--set core.mxus=1.5: expected an unsigned 32-bit integer, got 1.5");
    EXPECT_EQ(error_of_set("core.mxus=-1"), "--set core.mxus=-1: must not be negative (got -1)");
    EXPECT_EQ(error_of_set("core.mxus=4294967296"),
              "--set core.mxus=4294967296: 4294967296 does not fit an unsigned 32-bit integer");
    EXPECT_EQ(error_of_set("sim.max_cycles=0x10"),
              "--set sim.max_cycles=0x10: expected an unsigned 64-bit integer, got '0x10'");
    EXPECT_EQ(error_of_set("sim.functional=maybe"),
              "--set sim.functional=maybe: expected true, false, 1 or 0, got 'maybe'");
    EXPECT_EQ(error_of_set("sim.functional=TRUE"),
              "--set sim.functional=TRUE: expected true, false, 1 or 0, got 'TRUE'");
    EXPECT_EQ(error_of_set("clock_mhz=fast"),
              "--set clock_mhz=fast: expected a number, got 'fast'");
    EXPECT_EQ(error_of_set("clock_mhz=1e999"),
              "--set clock_mhz=1e999: expected a number, got '1e999'");
    // Values that parse but break a check are reported by validation, naming the key.
    EXPECT_EQ(error_of_set("clock_mhz=0.5"), "clock_mhz must be >= 1 (got 0.5)");
    EXPECT_EQ(error_of_set("core.mxus=0"), "core.mxus must be >= 1 (got 0)");
    EXPECT_EQ(error_of_set("core.vmem_bytes=3000000"),
              "core.vmem_bytes must be a power of two (got 3000000)");
    EXPECT_EQ(error_of_set("hbm.page_policy=lru"),
              "hbm.page_policy must be one of open,closed (got 'lru')");
}

// ---- files ----

TEST(Config, MissingFile) {
    try {
        BoardConfig::load("/nonexistent.json", {});
        ADD_FAILURE() << "no error";
    } catch (const sim::ConfigError& e) {
        EXPECT_STREQ(e.what(), "/nonexistent.json: cannot open config file");
    }
}

TEST(Config, DirectoryIsNotAConfigFile) {
    const std::string dir = tmp("dir");
    std::filesystem::create_directories(dir);
    try {
        BoardConfig::load(dir, {});
        ADD_FAILURE() << "no error";
    } catch (const sim::ConfigError& e) {
        EXPECT_EQ(std::string(e.what()), dir + ": is a directory, not a config file");
    }
    std::filesystem::remove_all(dir);
}

TEST(Config, FileErrorsNameThePath) {
    const std::string path = tmp("bad.json");
    std::ofstream(path) << "{\n  \"core\": {\n    \"mxus\": 2,,\n  }\n}\n";
    try {
        BoardConfig::load(path, {});
        ADD_FAILURE() << "no error";
    } catch (const sim::ConfigError& e) {
        EXPECT_EQ(std::string(e.what()),
                  path +
                      ":3:15: malformed JSON: syntax error while parsing object key - "
                      "unexpected ','; expected string literal");
    }
    std::ofstream(path) << R"({"core": {"mxu": 2}})";
    try {
        BoardConfig::load(path, {});
        ADD_FAILURE() << "no error";
    } catch (const sim::ConfigError& e) {
        EXPECT_EQ(std::string(e.what()),
                  path + ": unknown key 'core.mxu' (did you mean 'core.mxus'?)");
    }
    std::filesystem::remove(path);
}

// ---- the reflection machinery on its own (covers the field kinds the board does not use) ----

#define PROBE_FIELDS(F, S)                                             \
    F(int64_t, offset, -3, "", "signed offset", .min = -10, .max = 10) \
    F(uint64_t, size, 64, "bytes", "a size", .min = 1, .pow2 = true)   \
    F(std::string, mode, "a", "", "mode", .choices = "a,bc")           \
    S(ProbeSection, inner, "a nested section")
#define PROBE_SECTION_FIELDS(F, S) F(bool, flag, false, "", "a flag")

struct ProbeSection {
    TPU_REFLECT(PROBE_SECTION_FIELDS)
};
struct Probe {
    TPU_REFLECT(PROBE_FIELDS)
};

std::string probe_error(const std::string& text) {
    Probe p;
    try {
        sim::apply_json(sim::root_of(p), text, "p.json");
        sim::validate_fields(sim::root_of(p));
    } catch (const sim::ConfigError& e) {
        return e.what();
    }
    return "no error";
}

TEST(ConfigReflect, SignedIntegers) {
    Probe p;
    sim::apply_json(sim::root_of(p), R"({"offset": -7})", "p.json");
    EXPECT_EQ(p.offset, -7);
    sim::apply_override(sim::root_of(p), "offset=9");
    EXPECT_EQ(p.offset, 9);
    EXPECT_EQ(probe_error(R"({"offset": 1.5})"),
              "p.json: key 'offset': expected an integer, got 1.5");
    EXPECT_EQ(probe_error(R"({"offset": 9223372036854775808})"),
              "p.json: key 'offset': expected an integer, got 9223372036854775808");
    EXPECT_EQ(probe_error(R"({"offset": -11})"), "offset must be >= -10 (got -11)");
    EXPECT_EQ(probe_error(R"({"offset": 11})"), "offset must be <= 10 (got 11)");
}

TEST(ConfigReflect, ChoicesMatchWholeEntriesOnly) {
    EXPECT_EQ(probe_error(R"({"mode": "bc"})"), "no error");
    EXPECT_EQ(probe_error(R"({"mode": "b"})"), "mode must be one of a,bc (got 'b')");
    EXPECT_EQ(probe_error(R"({"mode": "a,bc"})"), "mode must be one of a,bc (got 'a,bc')");
}

TEST(ConfigReflect, PowerOfTwoAndDumpAndDoc) {
    EXPECT_EQ(probe_error(R"({"size": 96})"), "size must be a power of two (got 96)");
    Probe p;
    EXPECT_EQ(sim::dump_json(sim::root_of(p)),
              "{\n  \"offset\": -3,\n  \"size\": 64,\n  \"mode\": \"a\",\n"
              "  \"inner\": {\n    \"flag\": false\n  }\n}\n");
    EXPECT_EQ(sim::doc_table(sim::root_of(p)),
              "| key | type | unit | default | description |\n"
              "|---|---|---|---|---|\n"
              "| `offset` | integer | – | `-3` | signed offset |\n"
              "| `size` | unsigned 64-bit integer | bytes | `64` | a size (power of two) |\n"
              "| `mode` | string | – | `a` | mode (one of: a,bc) |\n"
              "| `inner.flag` | boolean | – | `false` | a flag |\n");
}

}  // namespace
}  // namespace tpu::hw
