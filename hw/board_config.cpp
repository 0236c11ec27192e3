// SPDX-License-Identifier: Apache-2.0
#include "hw/board_config.h"

#include <fmt/format.h>

#include "hw/mem/hbm_generation.h"
#include "sim/config_io.h"

namespace tpu::hw {

void BoardConfig::validate() {
    sim::validate_fields(sim::root_of(*this));
    // One burst is the pseudo-channel's share of the bus times the beats; the address map cuts
    // granules and rows into whole bursts.
    const uint64_t burst_bytes =
        uint64_t(hbm.bus_bits) / hbm.pseudo_channels * hbm.burst_length / 8;
    if (hbm.interleave_bytes < burst_bytes)
        throw sim::ConfigError(
            fmt::format("hbm.interleave_bytes: {} is smaller than one burst ({} bytes = bus_bits / "
                        "pseudo_channels x burst_length / 8)",
                        hbm.interleave_bytes, burst_bytes));
    if (hbm.row_bytes < burst_bytes)
        throw sim::ConfigError(fmt::format("hbm.row_bytes: {} is smaller than one burst ({} bytes)",
                                           hbm.row_bytes, burst_bytes));
    // A refresh interval no longer than the refresh itself would leave the banks no time for data.
    if (hbm.timing.refi != 0 && hbm.timing.refi <= hbm.timing.rfc)
        throw sim::ConfigError(fmt::format("hbm.timing.refi: {} must be 0 or more than rfc ({})",
                                           hbm.timing.refi, hbm.timing.rfc));
    const uint64_t pc_bytes = hbm.bytes_per_core / (uint64_t(hbm.channels) * hbm.pseudo_channels);
    // pc_bytes < row_bytes * bank_groups * banks_per_group, divided out so that the product
    // (up to 2^93 with 32-bit powers of two) cannot wrap around to a small number.
    if (pc_bytes / hbm.row_bytes / hbm.bank_groups < hbm.banks_per_group)
        throw sim::ConfigError(fmt::format(
            "hbm.bytes_per_core: {} bytes cannot hold one row in every bank of every channel",
            hbm.bytes_per_core));
    // Every host drives the same number of chips; only a board smaller than one host (a
    // teaching board such as tiny.json) has a host that is not full.
    if (chips > chips_per_host && chips % chips_per_host != 0)
        throw sim::ConfigError(fmt::format(
            "chips_per_host: {} chips per host do not divide {} chips", chips_per_host, chips));
    torus_shape(ici, cores());  // throws naming torus_x or torus_y when they do not tile
}

BoardConfig BoardConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
    const auto layer = [&](BoardConfig& cfg) {
        if (!path.empty()) sim::apply_json_file(sim::root_of(cfg), path);
        for (const auto& o : overrides) sim::apply_override(sim::root_of(cfg), o);
    };
    BoardConfig cfg;
    layer(cfg);
    // A named HBM generation gives hbm.timing its defaults at the configured clock; the values
    // the file and the overrides set are laid over them again, so they win.
    if (const HbmGeneration* g = find_hbm_generation(cfg.hbm.generation)) {
        BoardConfig base;
        base.hbm.timing = hbm_timing_at(*g, cfg.hbm.tck_ps);
        layer(base);
        cfg = std::move(base);
    }
    cfg.validate();
    return cfg;
}

}  // namespace tpu::hw
