// SPDX-License-Identifier: Apache-2.0
// The `tpusim bench` cases (tools/tpusim/bench_cases.h) as Google Benchmark benchmarks. Each
// iteration simulates the case on a fresh board; the reported time is the case's own host
// seconds (manual time), not building and tearing down the board.
// Counters: cycles, cycles_per_second (simulated cycles per host second) and, for GEMMs, the
// Eigen fp32 GEMM of the same shape measured in this run and the ratio to it.
//   build/bin/sim_bench --benchmark_counters_tabular=true [--benchmark_filter=gemm_1024]
#include <benchmark/benchmark.h>
#include <systemc>

#include <cstdio>

#include "hw/board_config.h"
#include "tools/tpusim/bench_cases.h"

namespace {

namespace tb = tpu::bench;

void run_case(benchmark::State& state, const tb::BenchCase& c) {
    static const tpu::hw::BoardConfig cfg;
    static tb::EigenYardstick eigen;
    tb::CaseRun run;
    double host_seconds = 0;
    int64_t iterations = 0;
    for (auto _ : state) {
        try {
            run = tb::run_case(cfg, c);
        } catch (const std::exception& e) {
            state.SkipWithError(e.what());
            return;
        }
        state.SetIterationTime(run.host_seconds);
        host_seconds += run.host_seconds;
        ++iterations;
    }
    const double mean = host_seconds / double(iterations);
    state.counters["cycles"] = double(run.cycles);
    state.counters["cycles_per_second"] = double(run.cycles) / mean;
    if (c.eigen) {
        const double e = eigen.seconds(*c.eigen);
        state.counters["eigen_seconds"] = e;
        state.counters["ratio_to_eigen"] = mean / e;
    }
}

}  // namespace

int sc_main(int argc, char* argv[]) {
    for (const auto& c : tb::bench_cases()) {
        // Slow cases run once: a 4096^3 GEMM with values costs 20-50 host seconds.
        benchmark::RegisterBenchmark(c.name.c_str(), [c](benchmark::State& s) { run_case(s, c); })
            ->UseManualTime()
            ->Iterations(c.quick ? 3 : 1)
            ->Unit(benchmark::kMillisecond);
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
