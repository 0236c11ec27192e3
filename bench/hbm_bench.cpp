// SPDX-License-Identifier: Apache-2.0
// The hbm2 timing model (hw/mem/hbm2.h) under the DMA engine's traffic. Counters: pct_of_peak
// (achieved / peak bandwidth), GBps, avg_latency (core cycles from arrival to data), row_hit
// (share of bursts that found their row open); wall time is the host cost of the model.
//   build/bin/hbm_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <systemc>

#include <algorithm>
#include <random>

#include "hw/board_config.h"
#include "hw/mem/hbm2.h"

namespace {

using tpu::hw::BoardConfig;
using tpu::hw::Hbm2Timing;

constexpr uint64_t kChunk = 512;  // core.dma_chunk_bytes: one request per core cycle

BoardConfig config(bool closed_page) {
    BoardConfig cfg;
    cfg.hbm.model = "hbm2";
    if (closed_page) cfg.hbm.page_policy = "closed";
    cfg.validate();
    return cfg;
}

void report(benchmark::State& s, const BoardConfig& cfg, const Hbm2Timing& m, uint64_t bytes,
            uint64_t cycles) {
    const double bpc = double(bytes) / double(cycles);
    s.counters["pct_of_peak"] = 100.0 * bpc / m.peak_bytes_per_cycle();
    s.counters["GBps"] = bpc * cfg.clock_mhz / 1000.0;
    const auto c = m.counters();
    s.counters["row_hit"] = double(c.row_hits) / double(c.bursts);
    s.counters["cycles"] = double(cycles);
}

/// 64 MiB of sequential reads in 512 B requests, one per core cycle (512 B/cycle).
void HbmStream(benchmark::State& s) {
    const BoardConfig cfg = config(s.range(0) != 0);
    const uint64_t bytes = 64ull << 20;
    for (auto _ : s) {
        Hbm2Timing m(cfg);
        uint64_t done = 0;
        for (uint64_t a = 0; a < bytes; a += kChunk)
            done = std::max(done, m.access(a / kChunk, a, kChunk, false));
        report(s, cfg, m, bytes, done);
    }
    s.SetItemsProcessed(int64_t(s.iterations()) * int64_t(bytes / kChunk));
}

/// 1 Mi random 64 B reads: one per core cycle (loaded), or each after the previous completed
/// (a dependent chain: the idle latency of a row miss).
void HbmRandom64(benchmark::State& s) {
    const BoardConfig cfg = config(false);
    const bool chain = s.range(0) != 0;
    const uint64_t n = 1u << 20;
    for (auto _ : s) {
        Hbm2Timing m(cfg);
        std::mt19937_64 rng(7);
        std::uniform_int_distribution<uint64_t> addr(0, cfg.hbm.bytes_per_core / 64 - 1);
        uint64_t done = 0, t = 0, latency = 0;
        for (uint64_t i = 0; i < n; ++i) {
            const uint64_t d = m.access(t, addr(rng) * 64, 64, false);
            latency += d - t;
            done = std::max(done, d);
            t = chain ? d : t + 1;
        }
        s.counters["avg_latency"] = double(latency) / double(n);
        report(s, cfg, m, n * 64, done);
    }
    s.SetItemsProcessed(int64_t(s.iterations()) * int64_t(n));
}

/// Two requesters each stream 32 MiB from their own region of the same HBM at 512 B/cycle,
/// their requests interleaved: each should get about half the bandwidth. B's region starts at
/// 1 GiB, plus 256 KiB (two banks further in every pseudo-channel) when bank_offset is set;
/// without it both streams want different rows of the same banks at the same time.
void HbmTwoRequesters(benchmark::State& s) {
    const BoardConfig cfg = config(false);
    const uint64_t bytes = 32ull << 20;
    const uint64_t base_b = (1ull << 30) + (s.range(0) != 0 ? 256ull << 10 : 0);
    for (auto _ : s) {
        Hbm2Timing m(cfg);
        uint64_t done_a = 0, done_b = 0;
        for (uint64_t a = 0; a < bytes; a += kChunk) {
            done_a = std::max(done_a, m.access(a / kChunk, a, kChunk, false));
            done_b = std::max(done_b, m.access(a / kChunk, base_b + a, kChunk, false));
        }
        const double peak = m.peak_bytes_per_cycle();
        s.counters["a_pct_of_peak"] = 100.0 * double(bytes) / double(done_a) / peak;
        s.counters["b_pct_of_peak"] = 100.0 * double(bytes) / double(done_b) / peak;
        report(s, cfg, m, 2 * bytes, std::max(done_a, done_b));
    }
    s.SetItemsProcessed(int64_t(s.iterations()) * int64_t(2 * bytes / kChunk));
}

BENCHMARK(HbmStream)->ArgName("closed_page")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(HbmRandom64)->ArgName("chain")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(HbmTwoRequesters)->ArgName("bank_offset")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

}  // namespace

// libsystemc provides main() and calls sc_main.
int sc_main(int argc, char* argv[]) {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
