// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "sim/reflect.h"

namespace tpu::hw {

// JEDEC names, lower case; every value in HBM clock cycles (tCK).
#define TPU_HBM_TIMING_FIELDS(F, S)                                                   \
    F(uint32_t, cl, 13, "tCK", "read CAS latency", .min = 1)                          \
    F(uint32_t, rcd, 13, "tCK", "ACT to RD/WR", .min = 1)                             \
    F(uint32_t, rp, 13, "tCK", "PRE to ACT", .min = 1)                                \
    F(uint32_t, ras, 30, "tCK", "ACT to PRE", .min = 1)                               \
    F(uint32_t, rc, 43, "tCK", "ACT to ACT in one bank", .min = 1)                    \
    F(uint32_t, ccd_s, 2, "tCK", "column to column, other bank group", .min = 1)      \
    F(uint32_t, ccd_l, 4, "tCK", "column to column, same bank group", .min = 1)       \
    F(uint32_t, rrd, 4, "tCK", "ACT to ACT, other bank", .min = 1)                    \
    F(uint32_t, faw, 14, "tCK", "four-activate window", .min = 1)                     \
    F(uint32_t, rfc, 229, "tCK", "refresh cycle time", .min = 1)                      \
    F(uint32_t, refi, 3434, "tCK", "refresh interval (0 disables refresh)", .min = 0) \
    F(uint32_t, wl, 4, "tCK", "write latency", .min = 1)                              \
    F(uint32_t, wr, 14, "tCK", "write recovery: end of write data to PRE", .min = 1)  \
    F(uint32_t, rtp, 4, "tCK", "RD to PRE", .min = 1)                                 \
    F(uint32_t, wtr, 6, "tCK", "end of write data to RD", .min = 1)                   \
    F(uint32_t, rtw, 8, "tCK", "RD to WR bus turnaround", .min = 1)

/// HBM timing parameters in tCK.
struct HbmTiming {
    TPU_REFLECT(TPU_HBM_TIMING_FIELDS)
};

// tck_ps 1136: 1.76 Gb/s per pin at double data rate.
#define TPU_HBM_FIELDS(F, S)                                                                     \
    F(std::string, model, "hbm2", "",                                                            \
      "timing model: hbm2 (banks, rows, refresh) or simple (fixed latency)",                     \
      .choices = "hbm2,simple")                                                                  \
    F(uint64_t, bytes_per_core, 16ull << 30, "bytes", "HBM capacity per core", .min = 1 << 20,   \
      .pow2 = true)                                                                              \
    F(uint32_t, channels, 16, "", "HBM channels per core", .min = 1, .pow2 = true)               \
    F(uint32_t, pseudo_channels, 2, "", "pseudo-channels per channel", .min = 1, .max = 2,       \
      .pow2 = true)                                                                              \
    F(uint32_t, bank_groups, 4, "", "bank groups per pseudo-channel", .min = 1, .pow2 = true)    \
    F(uint32_t, banks_per_group, 4, "", "banks per bank group", .min = 1, .pow2 = true)          \
    F(uint32_t, row_bytes, 1024, "bytes", "row (page) size per pseudo-channel", .min = 64,       \
      .pow2 = true)                                                                              \
    F(uint32_t, bus_bits, 128, "bits", "data bits per channel, split over its pseudo-channels",  \
      .min = 16, .pow2 = true)                                                                   \
    F(uint32_t, burst_length, 4, "beats", "beats per burst", .min = 1, .pow2 = true)             \
    F(uint32_t, tck_ps, 1136, "ps", "HBM clock period", .min = 100)                              \
    F(uint32_t, interleave_bytes, 256, "bytes",                                                  \
      "consecutive bytes mapped to one pseudo-channel before the next", .min = 32, .pow2 = true) \
    F(std::string, page_policy, "open", "", "row buffer policy", .choices = "open,closed")       \
    F(std::string, address_hash, "xor", "",                                                      \
      "xor: the pseudo-channel index is XORed with higher address bits, so strided streams "     \
      "spread over every pseudo-channel (as real controllers hash); none: plain modulo "         \
      "interleaving",                                                                            \
      .choices = "xor,none")                                                                     \
    F(uint32_t, queue_bursts, 32, "bursts",                                                      \
      "hbm2: column accesses a pseudo-channel controller holds; it prepares rows this far "      \
      "ahead of the data bus",                                                                   \
      .min = 1, .max = 4096)                                                                     \
    F(uint32_t, simple_latency_ns, 100, "ns", "access latency of the simple model", .min = 1)    \
    F(std::string, generation, "custom", "",                                                     \
      "JEDEC generation whose timing set (hw/mem/hbm_generation.cpp) gives hbm.timing its "      \
      "defaults at hbm.tck_ps; timing values a file or --set gives still win (custom: "          \
      "hbm.timing as written)",                                                                  \
      .choices = "custom,hbm2,hbm2e,hbm3")                                                       \
    S(HbmTiming, timing, "timing parameters in tCK")

/// Per-core HBM stack: geometry, address map and timing.
struct HbmConfig {
    TPU_REFLECT(TPU_HBM_FIELDS)
};

}  // namespace tpu::hw
