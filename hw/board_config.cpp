// SPDX-License-Identifier: Apache-2.0
#include "hw/board_config.h"

#include <fmt/format.h>

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
    if (ici.topology == "torus2d" && ici.torus_x != 0 && cores() % ici.torus_x != 0)
        throw sim::ConfigError(
            fmt::format("ici.torus_x: {} does not divide the {} cores", ici.torus_x, cores()));
    if (ici.topology == "torus2d" && ici.torus_x == 0) {
        uint32_t x = 1;
        while ((x + 1) * (x + 1) <= cores()) ++x;
        if (x * x != cores())
            throw sim::ConfigError(fmt::format(
                "ici.torus_x: {} cores are not a square; set ici.torus_x to the torus width",
                cores()));
    }
}

BoardConfig BoardConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
    BoardConfig cfg;
    if (!path.empty()) sim::apply_json_file(sim::root_of(cfg), path);
    for (const auto& o : overrides) sim::apply_override(sim::root_of(cfg), o);
    cfg.validate();
    return cfg;
}

}  // namespace tpu::hw
