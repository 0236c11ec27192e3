// SPDX-License-Identifier: Apache-2.0
#include "hw/ici/ici_config.h"

#include <fmt/format.h>

#include "sim/config_io.h"

namespace tpu::hw {
namespace {

/// The largest r with r^k <= n (k = 2 or 3).
uint32_t root(uint32_t n, uint32_t k) {
    uint32_t r = 1;
    auto pow = [k](uint64_t v) { return k == 2 ? v * v : v * v * v; };
    while (pow(r + 1) <= n) ++r;
    return r;
}

}  // namespace

TorusShape torus_shape(const IciConfig& ici, uint32_t cores) {
    using sim::ConfigError;
    TorusShape s;
    if (ici.topology == "ring") {
        s.x = cores;
    } else if (ici.topology == "torus2d") {
        s.x = ici.torus_x;
        if (s.x == 0) {
            s.x = root(cores, 2);
            if (s.x * s.x != cores)
                throw ConfigError(fmt::format(
                    "ici.torus_x: {} cores are not a square; set ici.torus_x to the torus width",
                    cores));
        }
        if (cores % s.x != 0)
            throw ConfigError(
                fmt::format("ici.torus_x: {} does not divide the {} cores", s.x, cores));
        s.y = cores / s.x;
    } else if (ici.topology == "torus3d") {
        if ((ici.torus_x == 0) != (ici.torus_y == 0))
            throw ConfigError(fmt::format(
                "ici.torus_{}: a 3-D torus needs both torus_x and torus_y (or neither, for a cube)",
                ici.torus_x == 0 ? "x" : "y"));
        s.x = ici.torus_x;
        s.y = ici.torus_y;
        if (s.x == 0) {
            s.x = s.y = root(cores, 3);
            if (uint64_t(s.x) * s.x * s.x != cores)
                throw ConfigError(fmt::format(
                    "ici.torus_x: {} cores are not a cube; set ici.torus_x and ici.torus_y",
                    cores));
        }
        if (cores % s.x != 0)
            throw ConfigError(
                fmt::format("ici.torus_x: {} does not divide the {} cores", s.x, cores));
        if ((cores / s.x) % s.y != 0)
            throw ConfigError(
                fmt::format("ici.torus_y: {} does not divide the {} cores of a plane "
                            "({} cores / torus_x {})",
                            s.y, cores / s.x, cores, s.x));
        s.z = cores / s.x / s.y;
    } else {
        throw ConfigError(
            fmt::format("ici.topology: '{}' is not ring, torus2d or torus3d", ici.topology));
    }
    return s;
}

}  // namespace tpu::hw
