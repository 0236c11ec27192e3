// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
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

/// The largest kernel file (assembly text or program image) `run`, `asm` and `disasm` read:
/// a program that fills the largest instruction memory (core.imem_bytes, 2 GiB / 32 B) is not
/// written by hand, and an endless input (/dev/zero) must end in an error.
inline constexpr uint64_t kMaxKernelFileBytes = uint64_t(64) << 20;
/// The largest CSV `validate` reads (the published rows are a few KB).
inline constexpr uint64_t kMaxCsvBytes = uint64_t(64) << 20;

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

/// A CLI11 check for an output file name: refuses what sim::OutputFile would refuse at the
/// end of a run ("-" is no file here), before the run.
CLI::Validator output_path();

/// A CLI11 check for a whole number >= 0: "-1" is refused in those words rather than read
/// as 2^32 - 1.
CLI::Validator whole_number();

/// How a size error names one input: an option ("--batch 65537") or a CSV field
/// ("batch=65537"), so `op` and `validate` share one check.
using SizeName = std::function<std::string(std::string_view key, uint64_t value)>;
/// "--key value".
SizeName option_names();
/// "key=value".
SizeName field_names();
/// The product of `factors` in 64 bits, saturated at UINT64_MAX instead of wrapping, so a size
/// computed from user input compares correctly with a limit.
uint64_t product(std::initializer_list<uint64_t> factors);
/// Throws InputError unless `bytes` (what one core holds of `what`) fit the HBM a core's
/// kernels address (driver::Device::window_bytes): "--rows 2147483648 x --cols 2048: each
/// core's share of the input is 16.0 GiB, more than the 4.0 GiB of HBM a core's kernels
/// address". `inputs` names the sizes it came from. Called before anything is allocated.
void check_core_bytes(const hw::BoardConfig& cfg, const std::string& inputs, std::string_view what,
                      uint64_t bytes);
/// "1.5 GiB", "300 bytes", "over 16 EiB" (a saturated product).
std::string size_text(uint64_t bytes);

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
