// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "hw/board_config.h"

namespace tpu::hw {

/// What a link costs on a board: the figures IciNetwork times every transfer with, for planners
/// that size their work by them (hw/README.md, "ICI network"; one source of truth).
struct IciCosts {
    double bytes_per_cycle = 0;  ///< link bytes per core cycle and direction
    uint64_t hop = 0;            ///< latency of one hop, core cycles
    /// Cycles a link needs for `bytes`: ceil(bytes / bytes_per_cycle).
    uint64_t ser_cycles(uint64_t bytes) const;
};

/// The link costs of board `cfg` (ici.link_gb_per_s and ici.hop_latency_ns at its clock).
IciCosts ici_costs(const BoardConfig& cfg);

/// Bandwidth-latency bound in cycles of a ring all-reduce of `bytes` per core over `cores`
/// cores, both directions used (hw/README.md, "All-reduce bounds"):
/// 2(N-1)/N x S / (2B) + 2(N-1) x hop.
double allreduce_ring_bound(const IciCosts& c, uint32_t cores, uint64_t bytes);
/// Bound of the torus all-reduce (reduce-scatter along each dimension of `dims` in order, the
/// all-gathers back): per dimension of n > 1 cores on the share S_i it works on (S divided by
/// the earlier dimensions' sizes), 2(n-1)/n x S_i / (2B) + 2(n-1) x hop; a dimension of 2 cores
/// reaches its one neighbour over one link (the route takes the + direction on a tie), so its
/// two directions share it: S_i / (2B) becomes S_i / B.
double allreduce_torus_bound(const IciCosts& c, const std::vector<uint32_t>& dims, uint64_t bytes);

}  // namespace tpu::hw
