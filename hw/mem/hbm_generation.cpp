// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/hbm_generation.h"

#include <algorithm>
#include <array>

namespace tpu::hw {
namespace {

// DRAMSys's HBM2 memspec (tukl-msd/DRAMSys configs/memspec/HBM2.json, an AMD Vega HBM2 stack
// at tCK = 1 ns, so its cycle counts are nanoseconds): RL 17, RCDRD 12, RP 14, RAS 28, RC 42,
// RRDS 4, FAW 16, RFC 220, REFI 3900, WL 7, WR 14, RTP 5, WTRL 9, RTW 18, CCDS 2, CCDL 3.
// HBM2E is the same JESD235 device at a faster interface, so the same array timings (assumed);
// its larger dies refresh longer: tRFC 350 ns for 8 Gb (Ramulator 2's HBM2/HBM3 tRFC table,
// CMU-SAFARI/ramulator2 src/dram/impl/HBM2.cpp). HBM3 (JESD238): tRFC 450 ns for 16 Gb dies
// (the same table); the other array timings as HBM2 (assumed), and at the 2x faster interface
// clock tCCD in tCK doubles, as a BL8 burst takes 4 tCK where BL4 took 2.
constexpr std::array<HbmGeneration, 3> kGenerations{{
    {"hbm2", 17000, 12000, 14000, 28000, 42000, 4000, 16000, 220000, 3900000, 7000, 14000, 5000,
     9000, 18000, 2, 3, "DRAMSys HBM2.json (AMD Vega HBM2, tCK 1 ns)"},
    {"hbm2e", 17000, 12000, 14000, 28000, 42000, 4000, 16000, 350000, 3900000, 7000, 14000, 5000,
     9000, 18000, 2, 3, "HBM2 array timings; tRFC of 8 Gb dies (Ramulator 2)"},
    {"hbm3", 17000, 12000, 14000, 28000, 42000, 4000, 16000, 450000, 3900000, 7000, 14000, 5000,
     9000, 18000, 4, 6, "HBM2 array timings; tRFC of 16 Gb dies (Ramulator 2); BL8 tCCD"},
}};

uint32_t cycles(uint32_t ps, uint32_t tck_ps) {
    return std::max<uint32_t>(1, (ps + tck_ps - 1) / tck_ps);
}

}  // namespace

std::span<const HbmGeneration> hbm_generations() {
    return kGenerations;
}

const HbmGeneration* find_hbm_generation(std::string_view name) {
    for (const HbmGeneration& g : kGenerations)
        if (g.name == name) return &g;
    return nullptr;
}

HbmTiming hbm_timing_at(const HbmGeneration& g, uint32_t tck_ps) {
    HbmTiming t;
    t.cl = cycles(g.cl_ps, tck_ps);
    t.rcd = cycles(g.rcd_ps, tck_ps);
    t.rp = cycles(g.rp_ps, tck_ps);
    t.ras = cycles(g.ras_ps, tck_ps);
    t.rc = cycles(g.rc_ps, tck_ps);
    t.ccd_s = g.ccd_s;
    t.ccd_l = g.ccd_l;
    t.rrd = cycles(g.rrd_ps, tck_ps);
    t.faw = cycles(g.faw_ps, tck_ps);
    t.rfc = cycles(g.rfc_ps, tck_ps);
    t.refi = cycles(g.refi_ps, tck_ps);
    t.wl = cycles(g.wl_ps, tck_ps);
    t.wr = cycles(g.wr_ps, tck_ps);
    t.rtp = cycles(g.rtp_ps, tck_ps);
    t.wtr = cycles(g.wtr_ps, tck_ps);
    t.rtw = cycles(g.rtw_ps, tck_ps);
    return t;
}

}  // namespace tpu::hw
