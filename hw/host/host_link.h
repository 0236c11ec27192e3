// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "hw/host/host_config.h"
#include "sim/clock_domain.h"
#include "sim/stats.h"

namespace tpu::hw {

/// When one host transfer occupies its chip's link.
struct HostTransfer {
    uint64_t begin;  ///< first cycle the link works on the transfer (set-up included)
    uint64_t end;    ///< cycle the last byte has arrived
};

/// The host link (PCIe-like) of one chip, shared by the chip's cores (hw/README.md, "Host
/// link"). Plain C++: the driver asks it when a host read or write to one of the chip's cores
/// happens; links of different chips are independent, so transfers to cores on different chips
/// overlap in simulated time.
///
/// Timing, with `f` the core clock in cycles per ns:
///   cycles(bytes) = ceil((setup_ns + bytes / link_gb_per_s) x f)
///   begin = max(issue, end of the link's previous transfer);  end = begin + cycles(bytes)
/// The set-up (descriptor, doorbell, completion) occupies the link like the data does: a PCIe
/// DMA engine works through one descriptor ring in order. The host issues transfers in
/// simulated-time order, so a single "free from" cycle is exact here: no later transfer can
/// fit into a gap before an earlier one (unlike the ICI links, which keep interval calendars).
/// Example (default board, 1 MiB): 2000 ns + 1048576 B / 12 GB/s = 89381.3 ns, x 0.94 =
/// 84018.5 -> 84019 cycles.
class HostLink {
public:
    /// What the link did; a group `name` under the board's "host" group.
    struct Stats : sim::StatGroup {
        using sim::StatGroup::StatGroup;
        sim::Counter& to_device_bytes =
            add("to_device_bytes", "bytes written from the host to the chip's HBM",
                sim::StatUnit::Bytes);
        sim::Counter& to_device_transfers =
            add("to_device_transfers", "host-to-device transfers", sim::StatUnit::Count);
        sim::Counter& to_host_bytes = add(
            "to_host_bytes", "bytes read from the chip's HBM by the host", sim::StatUnit::Bytes);
        sim::Counter& to_host_transfers =
            add("to_host_transfers", "device-to-host transfers", sim::StatUnit::Count);
        sim::Counter& busy_cycles =
            add("busy_cycles", "cycles the link was occupied (set-up plus data)",
                sim::StatUnit::Cycles);
        sim::Counter& queue_cycles =
            add("queue_cycles", "cycles transfers waited for the link to finish earlier ones",
                sim::StatUnit::Cycles);
    };

    /// The link of one chip, its statistics a group `name` under `parent` (may be null).
    HostLink(std::string name, const HostLinkConfig& cfg, sim::ClockDomain clock,
             sim::StatGroup* parent);

    /// Cycles one transfer of `bytes` occupies the link (the formula above).
    uint64_t transfer_cycles(uint64_t bytes) const;
    /// Reserves the link for `bytes` issued by the host at cycle `issue`; returns when it runs.
    HostTransfer transfer(uint64_t issue, uint64_t bytes, bool to_device);
    /// First cycle at which the link is free (everything issued so far has arrived).
    uint64_t free_at() const { return m_free_at; }

private:
    HostLinkConfig m_cfg;
    sim::ClockDomain m_clock;
    uint64_t m_free_at = 0;

public:
    Stats stats;
};

}  // namespace tpu::hw
