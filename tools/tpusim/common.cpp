// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "hw/board.h"
#include "hw/board_config.h"
#include "sim/config_io.h"
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

void add_config_options(CLI::App& cmd, CommonOptions& o) {
    cmd.add_option("--config", o.config, "board config JSON (default: built-in v3-8-like)");
    // An empty list is no default worth showing in --help.
    cmd.add_option("--set", o.sets, "override a config field: key.path=value (repeatable)")
        ->default_str("");
}

void add_common_options(CLI::App& cmd, CommonOptions& o) {
    add_config_options(cmd, o);
    cmd.add_option("--trace", o.trace, "write a Chrome/Perfetto trace JSON to FILE");
    cmd.add_option("--trace-units", o.trace_units,
                   "trace only these tracks (prefixes, comma-separated)");
    cmd.add_option("--trace-window", o.trace_window, "trace only cycles START:END");
    cmd.add_option("--stats", o.stats, "write statistics to FILE (.json or .csv)");
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
