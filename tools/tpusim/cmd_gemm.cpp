// SPDX-License-Identifier: Apache-2.0
// tpusim gemm: the library GEMM on a set of cores, with cycles, utilisation and a check.
#include <chrono>
#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "driver/kernels/gemm.h"
#include "hw/board.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/op_runs.h"
#include "tools/tpusim/random_fill.h"
#include "tools/tpusim/run_output.h"

namespace tpu::cli {

void add_gemm_command(CLI::App& app, const std::string& name, const std::string& help) {
    struct Opts {
        CommonOptions common;
        uint32_t m = 1024, k = 1024, n = 1024;
        std::string cores = "0";
        uint32_t num_cores = 0;
        std::string precision = "bf16";
        bool check = false;
        uint32_t seed = 1;
    };
    auto o = std::make_shared<Opts>();
    auto* cmd = app.add_subcommand(name, help);
    cmd->add_option("--m", o->m, "rows of A and C")->check(positive_number());
    cmd->add_option("--k", o->k, "columns of A, rows of W")->check(positive_number());
    cmd->add_option("--n", o->n, "columns of W and C")->check(positive_number());
    auto* list = cmd->add_option("--cores", o->cores,
                                 "cores to split the GEMM over, as in run: 3, 0-3, 2,5 or all");
    cmd->add_option("--num-cores", o->num_cores, "split over cores 0..N-1")
        ->check(positive_number())
        ->default_str("")
        ->excludes(list);
    cmd->add_option("--precision", o->precision, "bf16 | fp32-3pass | fp32-6pass");
    cmd->add_flag("--check", o->check,
                  "compare with a host reference of the same numerics (bit-exact) and with fp64");
    cmd->add_option("--seed", o->seed, "seed of the random inputs")->check(whole_number());
    add_common_options(*cmd, o->common);
    cmd->callback([o] {
        const hw::BoardConfig cfg = o->common.board_config();
        driver::Precision precision;
        try {
            precision = driver::parse_precision(o->precision);
        } catch (const driver::DeviceError& e) {
            throw InputError(fmt::format("--precision: {}", e.what()));
        }
        std::vector<uint32_t> cores;
        if (o->num_cores > cfg.cores())
            throw InputError(
                fmt::format("--num-cores {}: the board has {} cores", o->num_cores, cfg.cores()));
        for (uint32_t i = 0; i < o->num_cores; ++i) cores.push_back(i);
        if (o->num_cores == 0) cores = parse_cores_option(o->cores, cfg.cores());
        check_needs_values(o->check, cfg);
        const uint32_t M = o->m, K = o->k, N = o->n;
        check_gemm(cfg, cores.size(), M, K, N, precision, option_names());
        std::vector<float> a(size_t(M) * K), w(size_t(K) * N);
        fill_uniform(a, o->seed);
        fill_uniform(w, o->seed ^ 0x80000000u);

        auto dev = driver::Device::open(cfg);
        RunTrace trace(o->common, cfg);
        dev->set_tracer(trace.get());
        driver::ProgramCache cache;
        driver::GemmResult r;
        try {
            r = driver::gemm(*dev, cache, a, w, M, K, N, precision, cores);
        } catch (const driver::DeviceError& e) {
            throw_as_cli_error(e);
        }
        const uint64_t cycles = r.event.end_cycle - r.event.start_cycle;
        const double seconds = cfg.clock().seconds(double(cycles));
        nlohmann::ordered_json j = gemm_json(r, M, K, N, cores.size(), precision, cfg);
        if (o->check) {
            const auto want = driver::gemm_reference(a, w, M, K, N, precision, cfg.core.mxu_rows);
            j["bitexact"] = std::memcmp(want.data(), r.c.data(), want.size() * 4) == 0;
            using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
            const Mat A =
                Eigen::Map<
                    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                    a.data(), M, K)
                    .cast<double>();
            const Mat W =
                Eigen::Map<
                    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                    w.data(), K, N)
                    .cast<double>();
            const Mat ref = A * W;
            const Mat got =
                Eigen::Map<
                    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                    r.c.data(), M, N)
                    .cast<double>();
            j["rel_error"] = (got - ref).norm() / std::max(ref.norm(), 1e-300);
        }
        if (o->common.json) {
            fmt::print("{}\n", j.dump());
        } else {
            fmt::print("gemm {}x{}x{} {} on {} core{}: {} cycles = {:.3f} us at {} MHz\n", M, K, N,
                       driver::precision_name(precision), cores.size(),
                       cores.size() == 1 ? "" : "s", cycles, seconds * 1e6, cfg.clock_mhz);
            fmt::print("MXU utilisation {:.1f}%, {:.2f} TFLOP/s (peak {:.1f}), host {:.3f} s\n",
                       100.0 * r.mxu_utilization, j["tflops"].get<double>(),
                       cfg.peak_flops_per_core() * double(cores.size()) / 1e12,
                       r.event.host_seconds);
            fmt::print("plan: {} x {} cores (rows x columns), blocks of {} rows, A {}\n",
                       r.split.gm, r.split.gn, r.tiling.block_rows,
                       r.tiling.a_stream ? "streamed per column group" : "kept per block");
            fmt::print(
                "roofline bound {:.0f} cycles ({:.1f}% of it reached); HBM {} bytes, "
                "{:.2f}x the minimum\n",
                r.roofline_cycles, 100.0 * r.roofline_cycles / double(cycles), r.hbm_bytes,
                double(r.hbm_bytes) / double(r.min_hbm_bytes));
            if (o->check)
                fmt::print("check: bit-exact vs reference: {}; relative error vs fp64: {:.3e}\n",
                           j["bitexact"].get<bool>() ? "yes" : "NO", j["rel_error"].get<double>());
        }
        write_stats_file(o->common, dev->board(), dev->kernel_stats());
        dev->set_tracer(nullptr);
        trace.finish();
        if (o->check && !j["bitexact"].get<bool>())
            throw RunError("gemm: the device result differs from the bit-exact reference");
    });
}

void register_gemm_command(CLI::App& app) {
    add_gemm_command(app, "gemm", "run the library GEMM C = A x W on random inputs");
}

}  // namespace tpu::cli
