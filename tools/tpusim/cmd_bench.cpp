// SPDX-License-Identifier: Apache-2.0
// tpusim bench: the simulator's own speed (simulated cycles per host second) on the cases of
// bench_cases.h, with Eigen's fp32 GEMM of the same shape as the yardstick.
#include <algorithm>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "driver/device.h"
#include "hw/board_config.h"
#include "sim/cluster.h"
#include "sim/interrupt.h"
#include "tools/tpusim/bench_cases.h"
#include "tools/tpusim/commands.h"

namespace tpu::cli {
namespace {

/// 3 significant digits with an SI prefix: 146 k, 3.09 M.
std::string si(double x) {
    static constexpr const char* kPrefix[] = {"", " k", " M", " G", " T"};
    int p = 0;
    while (x >= 999.5 && p < 4) {
        x /= 1000;
        ++p;
    }
    return fmt::format("{:.3g}{}", x, kPrefix[p]);
}

nlohmann::ordered_json row_json(const bench::BenchRow& r) {
    nlohmann::ordered_json j;
    j["name"] = r.name;
    j["cycles"] = r.run.cycles;
    j["host_seconds"] = r.run.host_seconds;
    j["cycles_per_host_second"] = r.cycles_per_host_second;
    j["host_seconds_per_simulated_second"] = r.host_per_simulated_second;
    j["eigen_host_seconds"] =
        r.eigen_host_seconds ? nlohmann::json(*r.eigen_host_seconds) : nlohmann::json(nullptr);
    j["ratio_to_eigen"] =
        r.ratio_to_eigen ? nlohmann::json(*r.ratio_to_eigen) : nlohmann::json(nullptr);
    j["functional"] = r.functional;
    j["launch_host_seconds"] = r.run.launch_host_seconds;
    return j;
}

constexpr const char* kRowFormat = "{:<30} {:>10} {:>10} {:>14} {:>9} {:>10} {:>8}\n";

void print_row(const bench::BenchRow& r) {
    fmt::print(kRowFormat, r.name, r.run.cycles, fmt::format("{:.4f}", r.run.host_seconds),
               si(r.cycles_per_host_second), si(r.host_per_simulated_second),
               r.eigen_host_seconds ? fmt::format("{:.4f}", *r.eigen_host_seconds) : "-",
               r.ratio_to_eigen ? fmt::format("{:.2f}", *r.ratio_to_eigen) : "-");
    std::fflush(stdout);  // a full run takes a minute: show each row as it finishes
}

}  // namespace

void register_bench_command(CLI::App& app) {
    struct Opts {
        CommonOptions common;
        bool quick = false;
        std::string filter;
    };
    auto o = std::make_shared<Opts>();
    auto* cmd = app.add_subcommand(
        "bench", "measure simulator speed (cycles per host second) against Eigen's fp32 GEMM");
    cmd->add_flag("--quick", o->quick, "skip the slow cases (GEMM 4096^3 and any case > ~3 s)");
    cmd->add_option("--filter", o->filter, "run only cases whose name contains SUBSTR")
        ->option_text("SUBSTR");
    cmd->add_flag("--json", o->common.json, "print a machine-readable result on stdout");
    add_config_options(*cmd, o->common);
    std::string footer =
        "Each case runs on a fresh board (cycle 0, empty HBM) with sim.functional set by the "
        "case. Host seconds are wall time, so other load on the machine shows up in them."
        "\n\nCases (NAME/functional computes values, NAME/timing only times them):\n";
    // One line per case name; a case with no functional run (gemm_4096_8core) says so.
    std::vector<std::string> listed;
    const auto all = bench::bench_cases();
    for (const auto& c : all) {
        const std::string base = c.name.substr(0, c.name.find('/'));
        if (std::find(listed.begin(), listed.end(), base) != listed.end()) continue;
        listed.push_back(base);
        const bool functional = std::any_of(all.begin(), all.end(), [&](const auto& o) {
            return o.functional && o.name.substr(0, o.name.find('/')) == base;
        });
        footer += fmt::format("  {:<24} {}{}\n", base, c.what, functional ? "" : " (timing only)");
    }
    cmd->footer(footer);
    cmd->callback([o] {
        // A pod slice would split each case's board over the ranks: its host seconds would
        // measure MPI as much as the simulator, and the rows are not comparable with others.
        if (sim::Cluster::distributed())
            throw InputError("bench measures the simulator in one process; run it without mpirun");
        const hw::BoardConfig cfg = o->common.board_config();
        std::vector<bench::BenchCase> cases;
        try {
            cases = bench::select_cases(o->quick, o->filter);
        } catch (const driver::DeviceError& e) {
            throw InputError(fmt::format("--filter: {}", e.what()));
        }
        const bool text = !o->common.json;
        if (text) {
            fmt::print(kRowFormat, "case", "cycles", "host s", "cycles/host s", "host/sim",
                       "Eigen s", "ratio");
            std::fflush(stdout);
        }
        bench::EigenYardstick eigen;
        nlohmann::ordered_json rows = nlohmann::ordered_json::array();
        for (const auto& c : cases) {
            bench::BenchRow r;
            try {
                r = bench::run_row(cfg, c, eigen);
            } catch (const driver::DeviceError& e) {
                if (e.kind() == driver::ErrorKind::Usage ||
                    e.kind() == driver::ErrorKind::OutOfMemory)
                    throw InputError(e.what());
                throw RunError(e.what());
            }
            // Interrupted in the parent's Eigen yardstick: the row is incomplete; main()
            // reports the interruption (exit 130).
            if (sim::interrupt_requested()) return;
            if (text) print_row(r);
            rows.push_back(row_json(r));
        }
        const unsigned threads = std::thread::hardware_concurrency();
        if (text) {
            fmt::print(
                "\ncycles: simulated board cycles of the case's launches; host s: wall time "
                "of the case;\nhost/sim: host s per simulated second of those cycles;\nratio: "
                "host s / Eigen s (Eigen {}, single-threaded, {}; "
                "host has {} hardware threads)\n",
                fmt::format("{}.{}.{}", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
                            EIGEN_MINOR_VERSION),
                Eigen::SimdInstructionSetsInUse(), threads);
        } else {
            nlohmann::ordered_json j;
            j["cases"] = rows;
            j["eigen_simd"] = Eigen::SimdInstructionSetsInUse();
            j["host_threads"] = threads;
            fmt::print("{}\n", j.dump());
        }
    });
}

}  // namespace tpu::cli
