// SPDX-License-Identifier: Apache-2.0
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "sim/file_io.h"
#include "tools/tpusim/commands.h"
#include "traces/report.h"

namespace tpu::cli {
namespace {

struct ReportOptions {
    std::string trace;   ///< TRACE.json (positional)
    std::string stats;   ///< --stats STATS.json
    std::string output;  ///< -o FILE (default: TRACE with .html)
    std::string title;   ///< --title (default: from the trace's file name)
};

/// The largest trace or stats file read: the page embeds what it plots, and a page made from
/// more than this would not open in a browser; --trace-window or --trace-steps cut a run's
/// trace down.
constexpr uint64_t kMaxReportInputBytes = uint64_t(256) << 20;

std::string read_input(const std::string& path) {
    try {
        return sim::read_input_file(path, kMaxReportInputBytes);
    } catch (const sim::InputFileError& e) {
        throw InputError(e.what());
    }
}

void run_report(const ReportOptions& o) {
    const std::string trace = read_input(o.trace);
    const std::string stats = o.stats.empty() ? std::string{} : read_input(o.stats);
    // `--stats FILE` writes the effective config beside it; the roof comes from there.
    const std::string config_path = o.stats.empty() ? std::string{} : o.stats + ".config.json";
    std::error_code ec;
    const std::string config =
        !config_path.empty() && std::filesystem::is_regular_file(config_path, ec)
            ? read_input(config_path)
            : std::string{};
    const std::string title =
        o.title.empty()
            ? fmt::format("tpusim report: {}", std::filesystem::path(o.trace).filename().string())
            : o.title;
    std::string html;
    try {
        html = traces::render_report(trace, stats, title, config);
    } catch (const traces::ReportError& e) {
        using Input = traces::ReportError::Input;
        const std::string& file = e.input() == Input::Trace   ? o.trace
                                  : e.input() == Input::Stats ? o.stats
                                                              : config_path;
        throw InputError(fmt::format("{}: {}", file, e.problem()));
    }
    const std::string out = o.output.empty()
                                ? std::filesystem::path(o.trace).replace_extension(".html").string()
                                : o.output;
    try {
        sim::write_output_file(out, html);
    } catch (const sim::OutputError& e) {
        throw InputError(e.what());
    }
    fmt::print("wrote {}\n", out);
}

}  // namespace

void register_report_command(CLI::App& app) {
    auto o = std::make_shared<ReportOptions>();
    auto* cmd = app.add_subcommand(
        "report", "turn a trace (and stats) into one self-contained HTML page with plots");
    cmd->add_option("trace", o->trace, "trace JSON written by --trace")->required();
    cmd->add_option("--stats", o->stats,
                    "stats JSON written by --stats (its .config.json sets the roof)");
    cmd->add_option("-o,--output", o->output, "HTML file to write (default: TRACE with .html)")
        ->check(output_path());
    cmd->add_option("--title", o->title, "page title (default: from the trace's file name)");
    cmd->callback([o] { run_report(*o); });
}

}  // namespace tpu::cli
