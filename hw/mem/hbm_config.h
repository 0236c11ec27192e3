// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "sim/reflect.h"

namespace tpu::hw {

/// HBM2 timing parameters in tCK (JEDEC names, lower case).
struct HbmTiming {
    uint32_t cl = 13;      ///< read CAS latency
    uint32_t rcd = 13;     ///< ACT to RD/WR
    uint32_t rp = 13;      ///< PRE to ACT
    uint32_t ras = 30;     ///< ACT to PRE
    uint32_t rc = 43;      ///< ACT to ACT, same bank
    uint32_t ccd_s = 2;    ///< column to column, different bank group
    uint32_t ccd_l = 4;    ///< column to column, same bank group
    uint32_t rrd = 4;      ///< ACT to ACT, different bank
    uint32_t faw = 14;     ///< four-activate window
    uint32_t rfc = 229;    ///< refresh cycle time
    uint32_t refi = 3434;  ///< refresh interval
    uint32_t wl = 4;       ///< write latency
    uint32_t wr = 14;      ///< write recovery (end of write data to PRE)
    uint32_t rtp = 4;      ///< RD to PRE
    uint32_t wtr = 6;      ///< end of write data to RD
    uint32_t rtw = 8;      ///< RD to WR bus turnaround

    void visit(sim::Visitor& v) {
        v("cl", cl, "read CAS latency (tCK)", {.min = 1});
        v("rcd", rcd, "ACT to RD/WR (tCK)", {.min = 1});
        v("rp", rp, "PRE to ACT (tCK)", {.min = 1});
        v("ras", ras, "ACT to PRE (tCK)", {.min = 1});
        v("rc", rc, "ACT to ACT in one bank (tCK)", {.min = 1});
        v("ccd_s", ccd_s, "column to column, other bank group (tCK)", {.min = 1});
        v("ccd_l", ccd_l, "column to column, same bank group (tCK)", {.min = 1});
        v("rrd", rrd, "ACT to ACT, other bank (tCK)", {.min = 1});
        v("faw", faw, "four-activate window (tCK)", {.min = 1});
        v("rfc", rfc, "refresh cycle time (tCK)", {.min = 1});
        v("refi", refi, "refresh interval (tCK); 0 disables refresh", {.min = 0});
        v("wl", wl, "write latency (tCK)", {.min = 1});
        v("wr", wr, "write recovery (tCK)", {.min = 1});
        v("rtp", rtp, "RD to PRE (tCK)", {.min = 1});
        v("wtr", wtr, "end of write data to RD (tCK)", {.min = 1});
        v("rtw", rtw, "RD to WR turnaround (tCK)", {.min = 1});
    }
};

/// Per-core HBM stack: geometry, address map and timing.
struct HbmConfig {
    std::string model = "hbm2";             ///< "hbm2" (banks, rows, refresh) or "simple"
    uint64_t bytes_per_core = 16ull << 30;  ///< capacity per core
    uint32_t channels = 16;                 ///< channels per core
    uint32_t pseudo_channels = 2;           ///< pseudo-channels per channel
    uint32_t bank_groups = 4;               ///< bank groups per pseudo-channel
    uint32_t banks_per_group = 4;           ///< banks per bank group
    uint32_t row_bytes = 1024;              ///< page size per pseudo-channel
    uint32_t bus_bits = 128;                ///< data bits per channel (split over pseudo-channels)
    uint32_t burst_length = 4;              ///< beats per burst
    uint32_t tck_ps = 1136;                 ///< clock period (1.76 Gb/s/pin double data rate)
    uint32_t interleave_bytes = 256;        ///< consecutive bytes mapped to one pseudo-channel
    std::string page_policy = "open";       ///< "open" or "closed"
    std::string address_hash = "xor";       ///< "xor": higher address bits permute pseudo-channels
    uint32_t queue_bursts = 32;             ///< bursts a pseudo-channel controller holds ("hbm2")
    uint32_t simple_latency_ns = 100;       ///< "simple" model: access latency
    HbmTiming timing;                       ///< timing parameters

    void visit(sim::Visitor& v) {
        v("model", model, "timing model: hbm2 (banks, rows, refresh) or simple (fixed latency)",
          {.choices = "hbm2,simple"});
        v("bytes_per_core", bytes_per_core, "HBM capacity per core in bytes",
          {.min = 1 << 20, .pow2 = true});
        v("channels", channels, "HBM channels per core", {.min = 1, .pow2 = true});
        v("pseudo_channels", pseudo_channels, "pseudo-channels per channel",
          {.min = 1, .max = 2, .pow2 = true});
        v("bank_groups", bank_groups, "bank groups per pseudo-channel", {.min = 1, .pow2 = true});
        v("banks_per_group", banks_per_group, "banks per bank group", {.min = 1, .pow2 = true});
        v("row_bytes", row_bytes, "row (page) size per pseudo-channel in bytes",
          {.min = 64, .pow2 = true});
        v("bus_bits", bus_bits, "data bits per channel", {.min = 16, .pow2 = true});
        v("burst_length", burst_length, "beats per burst", {.min = 1, .pow2 = true});
        v("tck_ps", tck_ps, "HBM clock period in picoseconds", {.min = 100});
        v("interleave_bytes", interleave_bytes, "bytes per pseudo-channel before interleaving",
          {.min = 32, .pow2 = true});
        v("page_policy", page_policy, "row buffer policy", {.choices = "open,closed"});
        v("address_hash", address_hash,
          "xor: the pseudo-channel index is XORed with higher address bits, so strided streams "
          "spread over every pseudo-channel (as real controllers hash); none: plain modulo "
          "interleaving",
          {.choices = "xor,none"});
        v("queue_bursts", queue_bursts,
          "hbm2: bursts (column accesses) a pseudo-channel controller holds; it prepares rows "
          "this far ahead of the data bus",
          {.min = 1, .max = 4096});
        v("simple_latency_ns", simple_latency_ns, "latency of the simple model", {.min = 1});
        v.section("timing", timing, "HBM2 timing parameters in tCK");
    }
};

}  // namespace tpu::hw
