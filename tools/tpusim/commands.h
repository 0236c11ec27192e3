// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace CLI {
class App;
class Validator;
}  // namespace CLI
namespace tpu::hw {
struct BoardConfig;
}

/// The tpusim command line: each command lives in its own cmd_*.cpp and registers itself.
namespace tpu::cli {

/// Bad input from the user (file, flag, value): printed as "tpusim: error: ...", exit 2.
class InputError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Bad input whose message already names its location ("FILE:LINE:COL: error: ..."), printed
/// as-is, exit 2.
class SourceError : public InputError {
public:
    using InputError::InputError;
};

/// A run that completed but failed (device fault, check mismatch): exit 1.
class RunError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Options every command takes.
struct CommonOptions {
    std::string config;             ///< --config FILE (JSON preset)
    std::vector<std::string> sets;  ///< --set key.path=value, repeatable
    std::string trace;              ///< --trace FILE (Chrome/Perfetto JSON)
    std::string trace_units;        ///< --trace-units PREFIX[,PREFIX]
    std::string trace_window;       ///< --trace-window START:END in cycles
    std::string stats;              ///< --stats FILE (.json or .csv)
    bool json = false;              ///< --json: machine-readable result on stdout

    /// Loads and validates the board config; config errors become InputError.
    hw::BoardConfig board_config() const;
};

/// Adds every common option to a subcommand that simulates (config, tracing, stats, --json).
void add_common_options(CLI::App& cmd, CommonOptions& opts);
/// Adds only --config and --set, for commands that read the config but do not simulate.
void add_config_options(CLI::App& cmd, CommonOptions& opts);

/// A CLI11 check for a whole number >= 1 that says so ("--m: expected a whole number >= 1, got
/// '0'") instead of printing the type's whole range.
CLI::Validator positive_number();

/// `--cores` parsed against the board (0, 0-3, 2,5 or all); errors become InputError naming
/// the flag.
std::vector<uint32_t> parse_cores_option(const std::string& text, uint32_t board_cores);
/// Refuses --check in the timing-only mode (sim.functional=false), which computes no values.
void check_needs_values(bool check, const hw::BoardConfig& cfg);

/// Adds the library GEMM command as subcommand `name` of `app` (tpusim gemm, tpusim op gemm).
void add_gemm_command(CLI::App& app, const std::string& name, const std::string& help);

void register_asm_commands(CLI::App& app);      ///< asm, disasm
void register_config_command(CLI::App& app);    ///< config
void register_run_command(CLI::App& app);       ///< run
void register_gemm_command(CLI::App& app);      ///< gemm
void register_train_command(CLI::App& app);     ///< train
void register_report_command(CLI::App& app);    ///< report
void register_bench_command(CLI::App& app);     ///< bench
void register_validate_command(CLI::App& app);  ///< validate
void register_op_command(CLI::App& app);        ///< op
void register_model_command(CLI::App& app);     ///< model

}  // namespace tpu::cli
