// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "sim/reflect.h"

namespace tpu::hw {

/// Host link (PCIe-like), one per chip, shared by the chip's cores.
struct HostLinkConfig {
    double link_gb_per_s = 12.0;  ///< effective bandwidth per chip, GB/s (1e9 B/s)
    uint32_t setup_ns = 2000;     ///< fixed cost per transfer (descriptor, doorbell, completion)

    void visit(sim::Visitor& v) {
        v("link_gb_per_s", link_gb_per_s, "effective host-link bandwidth per chip in GB/s",
          {.min = 0.001});
        v("setup_ns", setup_ns, "set-up latency per host transfer in ns", {.min = 0});
    }
};

}  // namespace tpu::hw
