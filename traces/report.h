// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <stdexcept>
#include <string>

/// Offline analysis of tpusim traces and statistics (no SystemC).
namespace tpu::traces {

/// A report input that cannot be used: malformed JSON, or JSON that is not what it should be.
/// `what()` is "<input>: <problem>" (e.g. "trace: malformed JSON at byte 17"); callers that know
/// the file name print "<file>: <problem>" instead.
class ReportError : public std::invalid_argument {
public:
    /// Which of the report's inputs is at fault.
    enum class Input { Trace, Stats, Config };

    ReportError(Input input, const std::string& problem);

    /// The input at fault.
    Input input() const { return m_input; }
    /// The problem without the input's name.
    const std::string& problem() const { return m_problem; }
    /// "trace", "stats" or "config".
    static const char* input_name(Input input);

private:
    Input m_input;
    std::string m_problem;
};

/// Renders one self-contained HTML page (inline CSS and SVG, no scripts, no network) from a
/// Chrome trace written by `--trace`: a summary table, MXU utilisation and HBM GB/s over time per
/// core, per-unit busy time and a roofline. `stats_json` (from `--stats`, may be empty) supplies
/// exact instruction, FLOP and byte counts; `config_json` (the stats' `.config.json`, may be
/// empty) supplies the clock, MXU and HBM geometry for the roof. The same inputs give
/// byte-identical output. Throws ReportError (a std::invalid_argument) for unusable inputs.
std::string render_report(const std::string& trace_json, const std::string& stats_json,
                          const std::string& title, const std::string& config_json = {});

}  // namespace tpu::traces
