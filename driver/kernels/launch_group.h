// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "driver/device.h"

/// Helpers of library kernels that launch one program per group of cores at once.
namespace tpu::driver {

/// Waits for launches queued together on disjoint cores and returns one Event spanning them:
/// the earliest start, the latest end, every core with its cycles (ascending), the longest
/// host time.
Event wait_all(Device& dev, const std::vector<LaunchHandle>& handles);

/// Bytes every kernel's DMAs have moved between HBM and VMEM so far (kernel_stats totals); the
/// difference across a call is that call's traffic.
uint64_t kernel_hbm_bytes(const Device& dev);

}  // namespace tpu::driver
