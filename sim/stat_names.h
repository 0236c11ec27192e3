// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>

/// Names of the groups and statistics in stats.json that other code reads back (the HTML report,
/// tests): the blocks register them under these names and readers look them up by them, so a
/// rename is one edit here.
namespace tpu::sim::stat_names {

// Groups, from the root: board.{coreN.{dma,vpu,ici,mxuN,hbm}, ici.<link>, host.chipN, kernels}.
inline constexpr std::string_view kBoard = "board";      ///< the root group
inline constexpr std::string_view kCorePrefix = "core";  ///< "core3": one TensorCore
inline constexpr std::string_view kMxuPrefix = "mxu";    ///< "mxu1": one MXU of a core
inline constexpr std::string_view kDma = "dma";          ///< a core's DMA engine
inline constexpr std::string_view kVpu = "vpu";          ///< a core's VPU
inline constexpr std::string_view kIci = "ici";          ///< a core's ICI engine; the network
inline constexpr std::string_view kHbm = "hbm";          ///< a core's HBM
inline constexpr std::string_view kHost = "host";        ///< the host links, one per chip
inline constexpr std::string_view kKernels = "kernels";  ///< per-kernel totals (driver)

// Statistics.
inline constexpr std::string_view kCycles = "cycles";                   ///< board: cycles so far
inline constexpr std::string_view kInstructions = "instructions";       ///< core: issued
inline constexpr std::string_view kHbmReadBytes = "hbm_read_bytes";     ///< dma, kernels
inline constexpr std::string_view kHbmWriteBytes = "hbm_write_bytes";   ///< dma, kernels
inline constexpr std::string_view kFlops = "flops";                     ///< mxuN, vpu, kernels
inline constexpr std::string_view kMxuFlops = "mxu_flops";              ///< kernels
inline constexpr std::string_view kVpuFlops = "vpu_flops";              ///< kernels
inline constexpr std::string_view kIciBytes = "ici_bytes";              ///< kernels
inline constexpr std::string_view kLaunches = "launches";               ///< kernels
inline constexpr std::string_view kCoreCycles = "core_cycles";          ///< kernels
inline constexpr std::string_view kMxuUtilization = "mxu_utilization";  ///< kernels
inline constexpr std::string_view kBursts = "bursts";                   ///< hbm
inline constexpr std::string_view kRowHits = "row_hits";                ///< hbm
inline constexpr std::string_view kRowMisses = "row_misses";            ///< hbm
inline constexpr std::string_view kActivates = "activates";             ///< hbm
inline constexpr std::string_view kRowConflicts = "row_conflicts";      ///< hbm
inline constexpr std::string_view kRefreshes = "refreshes";             ///< hbm
inline constexpr std::string_view kBytes = "bytes";                     ///< ici links
inline constexpr std::string_view kUtilization = "utilization";         ///< ici links

// The energy estimate and a command's result, groups and statistics.
inline constexpr std::string_view kEnergy = "energy";  ///< group: the power and energy estimate
inline constexpr std::string_view kResult = "result";  ///< group: what a command reports
inline constexpr std::string_view kMacs = "macs";      ///< mxuN
inline constexpr std::string_view kToDeviceBytes = "to_device_bytes";      ///< host links
inline constexpr std::string_view kToHostBytes = "to_host_bytes";          ///< host links
inline constexpr std::string_view kEnergyJ = "energy_j";                   ///< kernels, energy.*
inline constexpr std::string_view kTotalJ = "total_j";                     ///< energy
inline constexpr std::string_view kStaticJ = "static_j";                   ///< energy.*
inline constexpr std::string_view kDynamicJ = "dynamic_j";                 ///< energy.*
inline constexpr std::string_view kAveragePowerW = "average_power_w";      ///< energy
inline constexpr std::string_view kIdlePowerW = "idle_power_w";            ///< energy
inline constexpr std::string_view kOutsideKernelsJ = "outside_kernels_j";  ///< energy
inline constexpr std::string_view kSteps = "steps";                        ///< result
inline constexpr std::string_view kWallCycles = "wall_cycles_estimate";    ///< result

}  // namespace tpu::sim::stat_names
