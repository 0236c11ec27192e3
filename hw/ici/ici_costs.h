// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

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

}  // namespace tpu::hw
