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

double allreduce_ring_bound(const IciCosts& c, uint32_t cores, uint64_t bytes) {
    const double N = cores;
    return 2 * (N - 1) / N * double(bytes) / (2 * c.bytes_per_cycle) + 2 * (N - 1) * double(c.hop);
}

double allreduce_torus_bound(const IciCosts& c, const std::vector<uint32_t>& dims, uint64_t bytes) {
    double share = double(bytes), t = 0;
    for (uint32_t n : dims) {
        if (n < 2) continue;
        const double links = n == 2 ? 1 : 2;
        t += 2 * double(n - 1) / n * share / (links * c.bytes_per_cycle) +
             2 * (n - 1) * double(c.hop);
        share /= n;
    }
    return t;
}

}  // namespace tpu::hw
