// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "sim/reflect.h"

namespace tpu::hw {

#define TPU_ICI_FIELDS(F, S)                                                                   \
    F(std::string, topology, "ring", "", "link topology: a bidirectional ring or a 2-D torus", \
      .choices = "ring,torus2d")                                                               \
    F(uint32_t, torus_x, 0, "cores", "torus2d: cores along x (0 = a square)", .min = 0)        \
    F(double, link_gb_per_s, 80.0, "GB/s", "bandwidth per link and direction (1 GB = 1e9 B)",  \
      .min = 0.001)                                                                            \
    F(uint32_t, hop_latency_ns, 1000, "ns", "latency per hop", .min = 0)                       \
    F(std::string, switching, "cut-through", "", "how a transfer crosses intermediate cores",  \
      .choices = "cut-through,store-and-forward")

/// Inter-core interconnect: topology, link bandwidth and latency.
struct IciConfig {
    TPU_REFLECT(TPU_ICI_FIELDS)
};

}  // namespace tpu::hw
