// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hw/core/core_config.h"
#include "hw/host/host_config.h"
#include "hw/host/runtime_config.h"
#include "hw/ici/ici_config.h"
#include "hw/mem/hbm_config.h"
#include "hw/power/power_config.h"
#include "sim/clock_domain.h"
#include "sim/reflect.h"

namespace tpu::hw {

#define TPU_SIM_FIELDS(F, S)                                                                    \
    F(bool, functional, true, "", "compute values; false = timing only, with identical cycles") \
    F(bool, race_detector, false, "", "report unordered overlapping memory accesses")           \
    F(bool, launch_costs, true, "",                                                             \
      "pay each launch's doorbell, program fetch, first-instruction latency and completion "    \
      "(false: cores start at the launch cycle and the launch ends at the last halt, for "      \
      "hand-derived unit timing)")                                                              \
    F(uint64_t, max_cycles, 10'000'000'000, "cycles",                                           \
      "a launch running longer than this stops with a device fault, so a kernel that never "    \
      "halts cannot hang the simulator (0 = no limit)")                                         \
    F(double, max_host_seconds, 600, "s",                                                       \
      "a launch taking longer than this much host (wall-clock) time stops with a state dump, "  \
      "like a deadlock; bounds a spinning kernel in host time, where max_cycles can mean "      \
      "hours (0 = no limit)",                                                                   \
      .min = 0)                                                                                 \
    F(bool, share_hbm_timing, true, "",                                                         \
      "serve the HBM timing of cores whose requests are identical so far once (host time "      \
      "only: every cycle and statistic is the same; hw/README.md, \"Replicas share their HBM "  \
      "timing\")")                                                                              \
    F(std::string, log_level, "warn", "", "log verbosity", .choices = "error,warn,info,debug")  \
    F(uint64_t, trace_counter_cycles, 1024, "cycles",                                           \
      "window of the trace's counter tracks (MXU utilisation, HBM GB/s)", .min = 1)

/// Simulation controls that are not hardware.
struct SimConfig {
    TPU_REFLECT(TPU_SIM_FIELDS)
};

// The defaults are the "v3-8-like" board of ARCHITECTURE.md and equal configs/v3-8.json
// (tests/sim/config_test.cpp checks it).
#define TPU_BOARD_FIELDS(F, S)                                                          \
    F(std::string, name, "v3-8-like", "", "preset name (informational)")                \
    F(uint32_t, chips, 4, "", "chips on the board", .min = 1, .max = 4096)              \
    F(uint32_t, cores_per_chip, 2, "", "TensorCores per chip", .min = 1, .max = 8)      \
    F(uint32_t, chips_per_host, 4, "",                                                  \
      "chips driven by one TPU host (one process per host group under MPI)", .min = 1)  \
    F(double, clock_mhz, 940.0, "MHz", "core clock", .min = 1, .max = 10000)            \
    F(bool, megacore, false, "",                                                        \
      "the TensorCores of a chip form one device (TPU v4): the trainer counts devices " \
      "in chips and splits each device's batch over the chip's cores, as XLA splits a " \
      "program over both cores of a megacore")                                          \
    S(CoreConfig, core, "every TensorCore")                                             \
    S(HbmConfig, hbm, "every core's HBM")                                               \
    S(IciConfig, ici, "inter-core interconnect")                                        \
    S(HostLinkConfig, host, "host link per chip")                                       \
    S(PowerConfig, power, "power and energy estimate")                                  \
    S(RuntimeConfig, runtime, "host costs of a training step (wall-clock estimate)")    \
    S(SimConfig, sim, "simulation controls")

/// The whole board.
struct BoardConfig {
    TPU_REFLECT(TPU_BOARD_FIELDS)

    /// Number of TensorCores on the board.
    uint32_t cores() const { return chips * cores_per_chip; }
    /// TensorCores one device holds: the chip's with `megacore`, else 1.
    uint32_t cores_per_device() const { return megacore ? cores_per_chip : 1; }
    /// Devices a framework sees (Lightning's `devices`): chips with `megacore`, else cores.
    uint32_t devices() const { return cores() / cores_per_device(); }
    /// Number of TPU hosts: a board smaller than one host (tiny.json) still has one.
    uint32_t hosts() const { return chips / chips_per_host + (chips % chips_per_host != 0); }
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
