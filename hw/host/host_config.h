// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "sim/reflect.h"

namespace tpu::hw {

// Launch doorbell and completion: see hw/README.md, "Launch timing".
#define TPU_HOST_LINK_FIELDS(F, S)                                                        \
    F(double, link_gb_per_s, 12.0, "GB/s",                                                \
      "effective host-link bandwidth per chip (1 GB = 1e9 B)", .min = 0.001)              \
    F(uint32_t, setup_ns, 2000, "ns",                                                     \
      "fixed cost per host transfer: descriptor, doorbell and completion", .min = 0)      \
    F(uint32_t, doorbell_ns, 650, "ns",                                                   \
      "launch doorbell: the host's posted MMIO write reaching the chip plus the command " \
      "processor reading the launch descriptor",                                          \
      .min = 0)                                                                           \
    F(uint32_t, completion_ns, 650, "ns",                                                 \
      "launch completion: the completion record written to host memory plus the MSI "     \
      "interrupt that tells the host runtime",                                            \
      .min = 0)

/// Host link (PCIe-like), one per chip, shared by the chip's cores.
struct HostLinkConfig {
    TPU_REFLECT(TPU_HOST_LINK_FIELDS)
};

}  // namespace tpu::hw
