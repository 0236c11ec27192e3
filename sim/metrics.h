// SPDX-License-Identifier: Apache-2.0
#pragma once

/// Figures derived from counters, each written once and used by the driver, the command line and
/// the report.
namespace tpu::sim {

/// Multiply-accumulates that `cores` cores of `pes` MXU processing elements each (MXUs x rows x
/// cols) can do in `cycles` cycles: one per PE per cycle.
constexpr double mxu_capacity(double pes, double cycles, double cores = 1) {
    return pes * cycles * cores;
}

/// MXU utilisation: useful multiply-accumulates over the capacity (0..1; 0 with no capacity).
/// A FLOP count gives macs = flops / 2.
constexpr double mxu_utilization(double macs, double capacity) {
    return capacity > 0 ? macs / capacity : 0.0;
}

}  // namespace tpu::sim
