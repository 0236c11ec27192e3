// SPDX-License-Identifier: Apache-2.0
#include <limits>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "driver/device.h"
#include "hw/board.h"
#include "hw/board_config.h"
#include "sim/config_io.h"
#include "sim/file_io.h"
#include "sim/log.h"
#include "tools/tpusim/commands.h"

namespace tpu::cli {

hw::BoardConfig CommonOptions::board_config() const {
    try {
        hw::BoardConfig cfg = hw::BoardConfig::load(config, sets);
        sim::set_log_level(sim::parse_log_level(cfg.sim.log_level));
        return cfg;
    } catch (const sim::ConfigError& e) {
        throw InputError(e.what());
    }
}

CLI::Validator positive_number() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            const bool digits =
                !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
            if (!digits || text.find_first_not_of('0') == std::string::npos)
                return fmt::format("expected a whole number >= 1, got '{}'", text);
            return {};
        },
        "N>=1");
}

CLI::Validator output_path() {
    return CLI::Validator(
        [](std::string& path) -> std::string {
            try {
                sim::check_output_path(path);
            } catch (const sim::OutputError& e) {
                return e.what();
            }
            return {};
        },
        "FILE");
}

CLI::Validator whole_number() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
                return fmt::format("expected a whole number >= 0, got '{}'", text);
            return {};
        },
        "N>=0");
}

SizeName option_names() {
    return [](std::string_view key, uint64_t value) { return fmt::format("--{} {}", key, value); };
}

SizeName field_names() {
    return [](std::string_view key, uint64_t value) { return fmt::format("{}={}", key, value); };
}

uint64_t product(std::initializer_list<uint64_t> factors) {
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    uint64_t p = 1;
    for (const uint64_t f : factors) {
        if (f == 0) return 0;
        p = p > kMax / f ? kMax : p * f;
    }
    return p;
}

std::string size_text(uint64_t bytes) {
    if (bytes == std::numeric_limits<uint64_t>::max()) return "over 16 EiB";
    constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) return fmt::format("{} bytes", bytes);
    double v = double(bytes) / 1024;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, ++u;
    return fmt::format("{:.1f} {}", v, kUnits[u]);
}

void check_core_bytes(const hw::BoardConfig& cfg, const std::string& inputs, std::string_view what,
                      uint64_t bytes) {
    const uint64_t window = driver::Device::window_bytes(cfg);
    if (bytes > window)
        throw InputError(
            fmt::format("{}: {} is {}, more than the {} of HBM a core's kernels address", inputs,
                        what, size_text(bytes), size_text(window)));
}

void add_config_options(CLI::App& cmd, CommonOptions& o) {
    cmd.add_option("--config", o.config, "board config JSON (default: built-in v3-8-like)");
    // An empty list is no default worth showing in --help.
    cmd.add_option("--set", o.sets, "override a config field: key.path=value (repeatable)")
        ->default_str("");
}

void add_common_options(CLI::App& cmd, CommonOptions& o) {
    add_config_options(cmd, o);
    cmd.add_option("--trace", o.trace, "write a Chrome/Perfetto trace JSON to FILE")
        ->check(output_path());
    cmd.add_option("--trace-units", o.trace_units,
                   "trace only these tracks (prefixes, comma-separated)");
    cmd.add_option("--trace-window", o.trace_window, "trace only cycles START:END");
    cmd.add_option("--stats", o.stats, "write statistics to FILE (.json or .csv)")
        ->check(output_path());
    cmd.add_flag("--json", o.json, "print a machine-readable result on stdout");
}

std::vector<uint32_t> parse_cores_option(const std::string& text, uint32_t board_cores) {
    try {
        return hw::parse_core_set(text, board_cores);
    } catch (const std::invalid_argument& e) {
        throw InputError(fmt::format("--cores: {}", e.what()));
    }
}

void check_needs_values(bool check, const hw::BoardConfig& cfg) {
    if (check && !cfg.sim.functional)
        throw InputError(
            "--check needs computed results, but sim.functional=false (the timing-only mode) "
            "skips the arithmetic");
}

}  // namespace tpu::cli
