// SPDX-License-Identifier: Apache-2.0
// Ring all-reduce over the 8-core ICI ring: simulated cycles against the bandwidth-latency
// formula 2(N-1)/N * S / (2 link_bw) + 2(N-1) hop, timing-only (values are tested elsewhere).
//   build/bin/allreduce_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <systemc>

#include "driver/kernels/allreduce.h"
#include "hw/board.h"

namespace {

tpu::driver::Device& device() {
    // SystemC elaborates one design per process: every benchmark shares this board.
    static auto dev = [] {
        tpu::hw::BoardConfig cfg;
        cfg.sim.functional = false;
        return tpu::driver::Device::open(cfg);
    }();
    return *dev;
}

void AllReduce8(benchmark::State& state) {
    const auto bytes = static_cast<uint32_t>(state.range(0));
    const uint32_t n = bytes / 4;
    auto& dev = device();
    const std::vector<uint32_t> cores{0, 1, 2, 3, 4, 5, 6, 7};
    const std::vector<std::vector<float>> data(8, std::vector<float>(n));
    uint64_t cycles = 0;
    for (auto _ : state) {
        const auto r = tpu::driver::allreduce(dev, cores, data);
        cycles = r.event.end_cycle - r.event.start_cycle;
    }
    const auto& cfg = dev.config();
    const double bw = cfg.ici.link_gb_per_s * 1e9 / (cfg.clock_mhz * 1e6);
    const double hop = std::ceil(cfg.ici.hop_latency_ns * cfg.clock_mhz / 1000.0);
    const double formula = 2.0 * 7 / 8 * bytes / (2 * bw) + 2 * 7 * hop;
    state.counters["cycles"] = double(cycles);
    state.counters["formula"] = formula;
    state.counters["ratio"] = double(cycles) / formula;
    state.counters["us"] = double(cycles) / cfg.clock_mhz;
}
BENCHMARK(AllReduce8)
    ->ArgName("bytes")
    ->RangeMultiplier(4)
    ->Range(4 << 10, 4 << 20)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int sc_main(int argc, char* argv[]) {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
