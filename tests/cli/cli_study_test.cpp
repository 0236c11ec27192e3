// SPDX-License-Identifier: Apache-2.0
// What a study looks at: labelled totals that agree between stdout, --json, stats and the
// report, and the energy estimate's attribution and range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hw/board_config.h"
#include "hw/power/power_model.h"
#include "tests/cli/cli_runner.h"

namespace tpu::test {
namespace {

using nlohmann::json;

/// A statistic's value by dotted path below "board" ("result.cycles", "kernels.gemm.energy_j").
double stat(const json& stats, const std::string& path) {
    const json* g = &stats.at("board");
    std::string rest = path;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
        g = &g->at("children").at(rest.substr(0, dot));
    return g->at("counters").at(rest).at("value").get<double>();
}

/// 1234567 as the report prints it: "1,234,567".
std::string grouped(double v) {
    const std::string digits = fmt::format("{:.0f}", v);
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

constexpr double kClockHz = 940e6;  // the default board

TEST(CliTotals, TrainingLabelsItsStepsAndTheWholeRunAlikeEverywhere) {
    // The demo's run on fewer steps: the device time of training is the steps'; the whole run
    // (set-up, uploads, evaluation) is labelled as such.
    const std::string args =
        "train --model mlp --data synthetic --devices 8 --precision bf16-mixed --epochs 1 "
        "--limit-train-batches 6 --limit-test-batches 2 --no-progress";
    const std::string trace = tmp("t.json"), stats_file = tmp("s.json"), page = tmp("r.html");
    const CliResult text =
        tpusim(args + " --trace-steps 2:2 --trace " + trace + " --stats " + stats_file);
    ASSERT_EQ(text.code, 0) << text.err;
    const json j = tpusim_json(args);
    const json stats = json::parse(slurp(stats_file));

    // stats: result.cycles is the steps' device time, board.cycles the whole run.
    const double step_cycles = stat(stats, "result.cycles");
    const double run_cycles = stat(stats, "cycles");
    EXPECT_EQ(stat(stats, "result.steps"), 6);
    EXPECT_LT(step_cycles, run_cycles);
    // --json: the same two totals, in seconds.
    EXPECT_DOUBLE_EQ(j["simulated_seconds"].get<double>(), step_cycles / kClockHz);
    EXPECT_DOUBLE_EQ(j["simulated_seconds_per_step"].get<double>(), step_cycles / kClockHz / 6);
    EXPECT_DOUBLE_EQ(j["run_simulated_seconds"].get<double>(), run_cycles / kClockHz);
    EXPECT_DOUBLE_EQ(j["wall_seconds_estimate"].get<double>(),
                     stat(stats, "result.wall_cycles_estimate") / kClockHz);
    EXPECT_GT(j["wall_seconds_estimate"].get<double>(), j["simulated_seconds"].get<double>());
    // stdout: the same numbers, each saying what it counts.
    EXPECT_NE(text.out.find(fmt::format("device time of the 6 training steps: {:.3f} ms",
                                        step_cycles / kClockHz * 1e3)),
              std::string::npos)
        << text.out;
    EXPECT_NE(text.out.find(fmt::format("whole run {:.3f} ms (set-up, uploads and evaluation "
                                        "included)",
                                        run_cycles / kClockHz * 1e3)),
              std::string::npos)
        << text.out;
    EXPECT_NE(text.out.find(fmt::format("estimated wall clock of the steps: {:.3f} ms",
                                        j["wall_seconds_estimate"].get<double>() * 1e3)),
              std::string::npos)
        << text.out;
    // The report: the result with its label, then the whole run.
    const CliResult r = tpusim("report " + trace + " --stats " + stats_file + " -o " + page);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string html = slurp(page);
    EXPECT_NE(html.find("<tr><th>result: device time</th><td>" + grouped(step_cycles) + " cycles"),
              std::string::npos)
        << html;
    EXPECT_NE(html.find("device cycles of the 6 training steps"), std::string::npos);
    EXPECT_NE(html.find("<tr><th>whole run: total cycles (board, from stats)</th><td>" +
                        grouped(run_cycles) + " = "),
              std::string::npos);
}

TEST(CliTotals, AModelReportsItsInferenceAloneAndItsReportAgrees) {
    const std::string trace = tmp("m.json"), stats_file = tmp("ms.json"), page = tmp("m.html");
    const CliResult text = tpusim("model mlp --trace " + trace + " --stats " + stats_file);
    ASSERT_EQ(text.code, 0) << text.err;
    const json j = tpusim_json("model mlp");
    const json stats = json::parse(slurp(stats_file));
    const double cycles = j["cycles"].get<double>();
    EXPECT_EQ(stat(stats, "result.cycles"), cycles);
    EXPECT_EQ(stat(stats, "cycles"), j["run_cycles"].get<double>());
    EXPECT_LT(cycles, j["run_cycles"].get<double>());  // the weights' upload is not in it
    EXPECT_NE(text.out.find(fmt::format(": {} cycles = ", cycles)), std::string::npos) << text.out;
    EXPECT_NE(text.out.find(fmt::format("whole run {} cycles", j["run_cycles"].get<uint64_t>())),
              std::string::npos)
        << text.out;
    ASSERT_EQ(tpusim("report " + trace + " --stats " + stats_file + " -o " + page).code, 0);
    const std::string html = slurp(page);
    EXPECT_NE(html.find("<tr><th>result: device time</th><td>" + grouped(cycles) + " cycles"),
              std::string::npos)
        << html;
    // One core ran: the page shows one core, not the board's eight.
    EXPECT_NE(html.find("<tr><th>cores</th><td>1 (7 idle cores not shown)</td></tr>"),
              std::string::npos);
    // The trace alone gives the same headline (the host "model" track).
    ASSERT_EQ(tpusim("report " + trace + " -o " + page).code, 0);
    EXPECT_NE(slurp(page).find("<tr><th>result: inference (trace)</th><td>" + grouped(cycles) +
                               " cycles"),
              std::string::npos);
}

TEST(CliEnergy, KernelEnergiesAndTheRestAddUpToTheTotal) {
    // A training step on 8 cores: GEMMs, vector kernels, the all-reduce and Adam. Every MAC, VPU
    // op, HBM and ICI byte of the cores happens inside some kernel, so the kernels' energies and
    // what runs outside them (every block's static power while no kernel holds it, and the host
    // links' transfers), computed here from the stats alone, make up the board's total.
    const std::string stats_file = tmp("e.json");
    ASSERT_EQ(tpusim("model mlp --train-step --cores 0-7 --stats " + stats_file).code, 0);
    const json stats = json::parse(slurp(stats_file));
    const hw::BoardConfig cfg;
    const hw::PowerModel p(cfg);
    double kernels = 0, core_cycles = 0;
    for (const auto& [name, k] : stats["board"]["children"]["kernels"]["children"].items()) {
        kernels += k["counters"]["energy_j"]["value"].get<double>();
        core_cycles += k["counters"]["core_cycles"]["value"].get<double>();
    }
    const double cycles = stat(stats, "cycles");
    hw::Activity host;
    for (uint32_t chip = 0; chip < cfg.chips; ++chip)
        host.host_bytes += stat(stats, fmt::format("host.chip{}.to_device_bytes", chip)) +
                           stat(stats, fmt::format("host.chip{}.to_host_bytes", chip));
    hw::Energy outside = p.static_energy(cycles * cfg.cores() - core_cycles,
                                         cycles * cfg.chips - core_cycles / cfg.cores_per_chip);
    outside += p.dynamic(host);
    const double total = stat(stats, "energy.total_j");
    EXPECT_GT(kernels, 0.0);
    EXPECT_NEAR(kernels + outside.total(), total, 1e-9 * total);
    EXPECT_NEAR(stat(stats, "energy.outside_kernels_j"), outside.total(), 1e-9 * total);
    // The blocks make up the total too.
    double blocks = 0;
    for (const char* kind : {"mxu", "vpu", "vmem", "hbm", "ici", "host_link", "other"})
        blocks += stat(stats, fmt::format("energy.{}.energy_j", kind));
    EXPECT_NEAR(blocks, total, 1e-9 * total);
}

TEST(CliEnergy, ABusyGemmLandsInsideTheMeasuredChipPower) {
    // A 4096^3 GEMM on all 8 cores keeps the MXUs busy; while it runs each chip draws its static
    // 123 W plus its MXUs', VMEM's and HBM's activity. Cloud TPU v3 publishes 123 / 220 / 262 W
    // as the measured min / mean / max chip power.
    const std::string stats_file = tmp("g.json");
    ASSERT_EQ(tpusim("gemm --m 4096 --k 4096 --n 4096 --num-cores 8 --set sim.functional=false "
                     "--stats " +
                     stats_file)
                  .code,
              0);
    const json stats = json::parse(slurp(stats_file));
    const double joules = stat(stats, "kernels.gemm.energy_j");
    const double seconds = stat(stats, "kernels.gemm.cycles") / kClockHz;
    const double per_chip = joules / seconds / 4;
    EXPECT_GT(stat(stats, "kernels.gemm.mxu_utilization"), 0.8);
    EXPECT_GE(per_chip, 123.0);
    EXPECT_LE(per_chip, 262.0);
    // The idle board draws the static power alone: 123 W per chip, inside the measured range.
    EXPECT_NEAR(stat(stats, "energy.idle_power_w") / 4, 123.0, 1e-6);
}

}  // namespace
}  // namespace tpu::test
