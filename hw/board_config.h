// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hw/core/core_config.h"
#include "hw/host/host_config.h"
#include "hw/ici/ici_config.h"
#include "hw/mem/hbm_config.h"
#include "sim/clock_domain.h"
#include "sim/reflect.h"

namespace tpu::hw {

/// Simulation controls that are not hardware.
struct SimConfig {
    bool functional = true;      ///< compute values (off: timing only, identical cycles)
    bool race_detector = false;  ///< report unordered overlapping accesses
    /// Pay each launch's doorbell, instruction fetch, first-instruction latency and completion
    /// (off: cores start at the launch cycle, for hand-derived unit timing).
    bool launch_costs = true;
    uint64_t max_cycles = 10'000'000'000;  ///< per launch: stop with a fault after this (0: none)
    double max_host_seconds = 600;         ///< per launch: stop after this much host time (0: none)
    std::string log_level = "warn";        ///< error, warn, info, debug
    uint64_t trace_counter_cycles = 1024;  ///< window of the trace's counter tracks

    void visit(sim::Visitor& v) {
        v("functional", functional, "compute values; off = timing only with identical cycles");
        v("race_detector", race_detector, "report unordered overlapping memory accesses");
        v("launch_costs", launch_costs,
          "pay each launch's doorbell, program fetch, first-instruction latency and completion "
          "(off: cores start at the launch cycle and the launch ends at the last halt)");
        v("max_cycles", max_cycles,
          "a launch running longer than this many cycles stops with a device fault, so a kernel "
          "that never halts cannot hang the simulator (0 = no limit)");
        v("max_host_seconds", max_host_seconds,
          "a launch taking longer than this many host (wall-clock) seconds stops with a state "
          "dump, like a deadlock; bounds a spinning kernel in host time, where max_cycles can "
          "mean hours (0 = no limit)",
          {.min = 0});
        v("log_level", log_level, "log verbosity", {.choices = "error,warn,info,debug"});
        v("trace_counter_cycles", trace_counter_cycles,
          "cycles per sample of the trace's counter tracks (MXU utilisation, HBM GB/s)",
          {.min = 1});
    }
};

/// The whole board. Defaults are the "v3-8-like" board of ARCHITECTURE.md and equal
/// configs/v3-8.json (tests/sim/config_test.cpp checks it).
struct BoardConfig {
    std::string name = "v3-8-like";  ///< preset name, informational
    uint32_t chips = 4;              ///< chips on the board
    uint32_t cores_per_chip = 2;     ///< TensorCores per chip
    double clock_mhz = 940.0;        ///< core clock
    CoreConfig core;                 ///< every TensorCore
    HbmConfig hbm;                   ///< every core's HBM
    IciConfig ici;                   ///< inter-core links
    HostLinkConfig host;             ///< host links
    SimConfig sim;                   ///< simulation controls

    void visit(sim::Visitor& v) {
        v("name", name, "preset name (informational)");
        v("chips", chips, "chips on the board", {.min = 1, .max = 256});
        v("cores_per_chip", cores_per_chip, "TensorCores per chip", {.min = 1, .max = 8});
        v("clock_mhz", clock_mhz, "core clock in MHz", {.min = 1, .max = 10000});
        v.section("core", core, "TensorCore");
        v.section("hbm", hbm, "HBM per core");
        v.section("ici", ici, "inter-core interconnect");
        v.section("host", host, "host link per chip");
        v.section("sim", sim, "simulation controls");
    }

    /// Number of TensorCores on the board.
    uint32_t cores() const { return chips * cores_per_chip; }
    /// The core clock: every ns <-> cycles <-> seconds conversion of the board.
    sim::ClockDomain clock() const { return sim::ClockDomain{clock_mhz}; }
    /// Core clock period in whole picoseconds (SystemC's time step; ClockDomain::sc_period_ps).
    uint64_t period_ps() const { return clock().sc_period_ps(); }
    /// Whole core cycles that cover `ns` nanoseconds (rounded up; ClockDomain::ns_to_cycles).
    uint64_t ns_to_cycles(double ns) const { return clock().ns_to_cycles(ns); }
    /// Peak bf16 FLOP/s of one core: 2 FLOPs per PE per cycle.
    double peak_flops_per_core() const {
        return 2.0 * core.mxus * core.mxu_rows * core.mxu_cols * clock().hz();
    }

    /// Field checks plus cross-field rules; throws sim::ConfigError naming the key.
    void validate();
    /// Defaults, then the JSON file (if non-empty), then each `key=value` override, validated.
    static BoardConfig load(const std::string& path, const std::vector<std::string>& overrides);
};

}  // namespace tpu::hw
