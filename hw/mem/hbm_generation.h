// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "hw/mem/hbm_config.h"

namespace tpu::hw {

/// The timing set of one HBM generation as data (hw/README.md, "HBM generations"): the DRAM
/// array's timings in picoseconds, which stay about the same from one generation to the next
/// (the same cells and sense amplifiers), and the column-to-column spacing in tCK, which scales
/// with the burst on the interface. hbm_timing_at() turns a set into hbm.timing at a clock.
struct HbmGeneration {
    std::string_view name;  ///< value of hbm.generation
    // Array timings, ps; each becomes ceil(ps / tck_ps) tCK (at least 1).
    uint32_t cl_ps, rcd_ps, rp_ps, ras_ps, rc_ps, rrd_ps, faw_ps, rfc_ps, refi_ps;
    uint32_t wl_ps, wr_ps, rtp_ps, wtr_ps, rtw_ps;
    uint32_t ccd_s, ccd_l;    ///< tCK: column to column, other / same bank group
    std::string_view source;  ///< where the numbers come from
};

/// Every generation hbm.generation can name (besides "custom").
std::span<const HbmGeneration> hbm_generations();
/// The generation called `name`, or nullptr.
const HbmGeneration* find_hbm_generation(std::string_view name);
/// `g`'s timing at an HBM clock of `tck_ps`: each array timing rounded up to whole tCK (a
/// timing never ends early), at least 1.
HbmTiming hbm_timing_at(const HbmGeneration& g, uint32_t tck_ps);

}  // namespace tpu::hw
