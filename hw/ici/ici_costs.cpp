// SPDX-License-Identifier: Apache-2.0
#include "hw/ici/ici_costs.h"

#include <cmath>

namespace tpu::hw {

uint64_t IciCosts::ser_cycles(uint64_t bytes) const {
    return static_cast<uint64_t>(std::ceil(double(bytes) / bytes_per_cycle));
}

IciCosts ici_costs(const BoardConfig& cfg) {
    return {cfg.clock().bytes_per_cycle(cfg.ici.link_gb_per_s),
            cfg.ns_to_cycles(cfg.ici.hop_latency_ns)};
}

}  // namespace tpu::hw
