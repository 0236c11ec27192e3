// SPDX-License-Identifier: Apache-2.0
// Ring all-reduce over the 8-core ICI ring: simulated cycles against the bandwidth-latency
// formula 2(N-1)/N * S / (2 link_bw) + 2(N-1) hop, S bytes per core.
//   AllReduceHbm           the library all-reduce of a tensor in HBM, 4 KiB to 256 MiB
//   AllReduceHbmPipelined  the same kernel forced to its pipelined schedule
//   AllReduceVmem          the VMEM-resident kernel (data already in VMEM)
// Timing-only and without launch costs by default (values are tested in tests/driver/allreduce_test.cpp); `--set KEY=V`
// overrides a config field, e.g. `--set sim.functional=true` for host seconds with real data.
// Prints a table of the HBM runs at the end.
//   build/bin/allreduce_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <systemc>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "driver/kernels/allreduce.h"
#include "hw/board.h"

namespace {

using tpu::driver::AllReduceSchedule;

std::vector<std::string>& overrides() {
    // The formula is the collective's own: the launch's start and end costs (hw/README.md,
    // "Launch timing", about 1.3 us per launch) are left out.
    static std::vector<std::string> sets{"sim.functional=false", "sim.launch_costs=false"};
    return sets;
}

tpu::driver::Device& device() {
    // Opened once; every benchmark shares this board.
    static auto dev = tpu::driver::Device::open(tpu::hw::BoardConfig::load("", overrides()));
    return *dev;
}

/// One row of the closing table.
struct Row {
    std::string name;
    uint64_t bytes = 0;
    uint64_t cycles = 0;
    double formula = 0;
    double host_seconds = 0;
};
std::vector<Row>& rows() {
    static std::vector<Row> r;
    return r;
}

double formula_cycles(uint64_t bytes) {
    const auto& cfg = device().config();
    const double bw = cfg.ici.link_gb_per_s * 1e9 / (cfg.clock_mhz * 1e6);
    const double hop = double(cfg.ns_to_cycles(cfg.ici.hop_latency_ns));
    return 2.0 * 7 / 8 * double(bytes) / (2 * bw) + 2 * 7 * hop;
}

void report(benchmark::State& state, uint64_t bytes, uint64_t cycles) {
    const double formula = formula_cycles(bytes);
    state.counters["cycles"] = double(cycles);
    state.counters["formula"] = formula;
    state.counters["ratio"] = double(cycles) / formula;
    state.counters["us"] = double(cycles) / device().config().clock_mhz;
}

void hbm(benchmark::State& state, AllReduceSchedule schedule, const char* name) {
    const uint64_t bytes = uint64_t(state.range(0));
    auto& dev = device();
    static tpu::driver::ProgramCache cache;
    const std::vector<uint32_t> cores{0, 1, 2, 3, 4, 5, 6, 7};
    tpu::driver::Tensor t = tpu::driver::alloc_tensor(dev, cores, 1, uint32_t(bytes / 4));
    if (dev.config().sim.functional)  // real data (not timed); timing-only never reads it
        for (size_t i = 0; i < cores.size(); ++i)
            tpu::driver::write_tensor(dev, t, i, std::vector<float>(bytes / 4, float(i + 1)));
    tpu::driver::Event e;
    for (auto _ : state) e = tpu::driver::allreduce(dev, cache, t, 1.0f, schedule);
    tpu::driver::free_tensor(dev, t);
    const uint64_t cycles = e.end_cycle - e.start_cycle;
    report(state, bytes, cycles);
    rows().push_back({name, bytes, cycles, formula_cycles(bytes), e.host_seconds});
}

void AllReduceHbm(benchmark::State& state) {
    hbm(state, AllReduceSchedule::Auto, "auto");
}
BENCHMARK(AllReduceHbm)
    ->ArgName("bytes")
    ->RangeMultiplier(4)
    ->Range(4 << 10, 256 << 20)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void AllReduceHbmPipelined(benchmark::State& state) {
    hbm(state, AllReduceSchedule::Pipelined, "pipelined");
}
BENCHMARK(AllReduceHbmPipelined)
    ->ArgName("bytes")
    ->RangeMultiplier(4)
    ->Range(4 << 10, 256 << 20)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void AllReduceVmem(benchmark::State& state) {
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
    report(state, bytes, cycles);
}
BENCHMARK(AllReduceVmem)
    ->ArgName("bytes")
    ->RangeMultiplier(4)
    ->Range(4 << 10, 4 << 20)
    ->Unit(benchmark::kMillisecond);

std::string size_text(uint64_t bytes) {
    return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + " MiB"
                               : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int sc_main(int argc, char* argv[]) {
    // Take `--set KEY=VALUE` out before the benchmark library parses the rest.
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (std::strcmp(argv[i], "--set") == 0 && i + 1 < argc)
            overrides().push_back(argv[++i]);
        else
            args.push_back(argv[i]);
    }
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (!rows().empty()) {
        std::printf("\n| S per core | schedule | cycles | formula | ratio | host s |\n");
        std::printf("|---|---|---|---|---|---|\n");
        for (const Row& r : rows())
            std::printf("| %s | %s | %llu | %.0f | %.3f | %.3f |\n", size_text(r.bytes).c_str(),
                        r.name.c_str(), static_cast<unsigned long long>(r.cycles), r.formula,
                        double(r.cycles) / r.formula, r.host_seconds);
    }
    return 0;
}
