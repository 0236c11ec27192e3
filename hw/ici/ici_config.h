// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "sim/reflect.h"

namespace tpu::hw {

#define TPU_ICI_FIELDS(F, S)                                                                    \
    F(std::string, topology, "ring", "",                                                        \
      "link topology: a bidirectional ring, a 2-D torus (TPU v2, v3, v5e, v6e) or a 3-D torus " \
      "(TPU v4)",                                                                               \
      .choices = "ring,torus2d,torus3d")                                                        \
    F(uint32_t, torus_x, 0, "cores",                                                            \
      "torus2d, torus3d: cores along x (0 = a square, or with torus_y 0 a cube)", .min = 0)     \
    F(uint32_t, torus_y, 0, "cores",                                                            \
      "torus3d: cores along y; z holds the rest (0 with torus_x 0: a cube)", .min = 0)          \
    F(double, link_gb_per_s, 80.0, "GB/s", "bandwidth per link and direction (1 GB = 1e9 B)",   \
      .min = 0.001)                                                                             \
    F(uint32_t, hop_latency_ns, 1000, "ns", "latency per hop", .min = 0)                        \
    F(std::string, switching, "cut-through", "", "how a transfer crosses intermediate cores",   \
      .choices = "cut-through,store-and-forward")

/// Inter-core interconnect: topology, link bandwidth and latency.
struct IciConfig {
    TPU_REFLECT(TPU_ICI_FIELDS)
};

/// Cores along each dimension of the network: a ring is x wide (y = z = 1), a 2-D torus has
/// z = 1. x * y * z is the number of cores; core c sits at (c mod x, (c / x) mod y, c / (x y)).
struct TorusShape {
    uint32_t x = 1;  ///< cores along x
    uint32_t y = 1;  ///< cores along y
    uint32_t z = 1;  ///< cores along z
    /// Dimensions with more than one core (0 for a single core).
    uint32_t dims() const { return (x > 1) + (y > 1) + (z > 1); }
};

/// The shape of `ici` over `cores` cores: the one place that reads topology, torus_x and
/// torus_y. Throws sim::ConfigError naming the key when the widths do not tile the cores.
TorusShape torus_shape(const IciConfig& ici, uint32_t cores);

}  // namespace tpu::hw
