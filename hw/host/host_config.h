// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "sim/reflect.h"

namespace tpu::hw {

/// Host link (PCIe-like), one per chip, shared by the chip's cores.
struct HostLinkConfig {
    double link_gb_per_s = 12.0;  ///< effective bandwidth per chip, GB/s (1e9 B/s)
    uint32_t setup_ns = 2000;     ///< fixed cost per transfer (descriptor, doorbell, completion)
    /// Launch doorbell: the host's posted MMIO write reaching the chip plus the command
    /// processor reading the launch descriptor (hw/README.md, "Launch timing").
    uint32_t doorbell_ns = 650;
    /// Launch completion: the completion record written to host memory plus the MSI interrupt
    /// that tells the host runtime (hw/README.md, "Launch timing").
    uint32_t completion_ns = 650;

    void visit(sim::Visitor& v) {
        v("link_gb_per_s", link_gb_per_s, "effective host-link bandwidth per chip in GB/s",
          {.min = 0.001});
        v("setup_ns", setup_ns, "set-up latency per host transfer in ns", {.min = 0});
        v("doorbell_ns", doorbell_ns,
          "launch doorbell: MMIO write over the host link plus the launch-descriptor read, in ns",
          {.min = 0});
        v("completion_ns", completion_ns,
          "launch completion: completion write to host memory plus the interrupt, in ns",
          {.min = 0});
    }
};

}  // namespace tpu::hw
