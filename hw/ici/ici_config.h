// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "sim/reflect.h"

namespace tpu::hw {

/// Inter-core interconnect: topology, link bandwidth and latency.
struct IciConfig {
    std::string topology = "ring";          ///< "ring" (bidirectional) or "torus2d"
    uint32_t torus_x = 0;                   ///< torus2d: cores along x (0: derive a square)
    double link_gb_per_s = 80.0;            ///< bandwidth per link per direction, GB/s (1e9 B/s)
    uint32_t hop_latency_ns = 1000;         ///< latency per hop
    std::string switching = "cut-through";  ///< "cut-through" or "store-and-forward"

    void visit(sim::Visitor& v) {
        v("topology", topology, "link topology", {.choices = "ring,torus2d"});
        v("torus_x", torus_x, "torus2d: cores along x (0 = square)", {.min = 0});
        v("link_gb_per_s", link_gb_per_s, "bandwidth per link and direction in GB/s",
          {.min = 0.001});
        v("hop_latency_ns", hop_latency_ns, "latency per hop in ns", {.min = 0});
        v("switching", switching, "how a transfer crosses intermediate cores",
          {.choices = "cut-through,store-and-forward"});
    }
};

}  // namespace tpu::hw
