// SPDX-License-Identifier: Apache-2.0
// MXU GEMM cycles with operands already in VMEM, next to the closed form of an array that does
// not overlap weight loads with matmuls: folds x (2R + C + T - 2). Counters: cycles,
// closed_form, ratio, mxu_util; wall time is the host cost of simulating it.
//   build/bin/mxu_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <systemc>

#include <random>

#include "driver/kernels/vmem_gemm.h"
#include "hw/board_config.h"
#include "hw/core/core_model.h"
#include "hw/core/numerics.h"

namespace {

using tpu::hw::BoardConfig;

void run_gemm(benchmark::State& state, bool functional) {
    const auto M = static_cast<uint32_t>(state.range(0));
    const auto K = static_cast<uint32_t>(state.range(1));
    const auto N = static_cast<uint32_t>(state.range(2));
    const auto mxus = static_cast<uint32_t>(state.range(3));
    BoardConfig cfg;
    cfg.sim.functional = functional;
    const uint32_t R = cfg.core.mxu_rows, C = cfg.core.mxu_cols;
    tpu::driver::VmemGemm g{M, K, N, 0, 0, 0, mxus, 0};
    const auto bytes = tpu::driver::vmem_gemm_bytes(g, R, C);
    g.w_addr = static_cast<uint32_t>(bytes.a);
    g.c_addr = static_cast<uint32_t>(bytes.a + bytes.w);
    const auto prog = tpu::driver::vmem_gemm_program(g, R, C);

    tpu::hw::SparseMemory hbm("hbm", cfg.hbm.bytes_per_core), vmem("vmem", cfg.core.vmem_bytes);
    std::mt19937 rng(1);
    std::vector<uint16_t> a(bytes.a / 2), w(bytes.w / 2);
    for (auto& x : a) x = tpu::hw::f32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    for (auto& x : w) x = tpu::hw::f32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    vmem.write(0, {reinterpret_cast<uint8_t*>(a.data()), bytes.a});
    vmem.write(g.w_addr, {reinterpret_cast<uint8_t*>(w.data()), bytes.w});

    uint64_t cycles = 0;
    for (auto _ : state) {
        tpu::hw::CoreModel core(0, cfg, hbm, vmem, nullptr);
        core.load(prog);
        core.start(0, {});
        cycles = core.run_alone().cycle;
    }
    const uint64_t folds = uint64_t((K + R - 1) / R) * ((N + C - 1) / C);
    const double closed = double(folds) * (2.0 * R + C + M - 2);
    state.counters["cycles"] = double(cycles);
    state.counters["closed_form"] = closed;
    state.counters["ratio"] = double(cycles) / closed;
    state.counters["mxu_util"] = double(M) * K * N / (double(mxus) * R * C * double(cycles));
}

void Gemm(benchmark::State& s) {
    run_gemm(s, true);
}
void GemmTimingOnly(benchmark::State& s) {
    run_gemm(s, false);
}

// {M, K, N, MXUs}: the shapes of the closing note of the TensorCore issue.
BENCHMARK(Gemm)
    ->ArgNames({"M", "K", "N", "mxus"})
    ->Args({128, 128, 128, 1})
    ->Args({256, 256, 256, 1})
    ->Args({512, 512, 512, 1})
    ->Args({1024, 1024, 1024, 1})
    ->Args({1, 128, 128, 1})
    ->Args({8, 128, 128, 1})
    ->Args({37, 300, 129, 1})
    ->Args({1024, 1024, 1024, 2})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(GemmTimingOnly)
    ->ArgNames({"M", "K", "N", "mxus"})
    ->Args({1024, 1024, 1024, 2})
    ->Unit(benchmark::kMillisecond);

}  // namespace

// libsystemc provides main() and calls sc_main.
int sc_main(int argc, char* argv[]) {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
