// SPDX-License-Identifier: Apache-2.0
#include "hw/host/host_link.h"

#include <algorithm>

namespace tpu::hw {

HostLink::HostLink(std::string name, const HostLinkConfig& cfg, sim::ClockDomain clock,
                   sim::StatGroup* parent)
    : m_cfg(cfg), m_clock(clock), stats(std::move(name), parent) {}

uint64_t HostLink::transfer_cycles(uint64_t bytes) const {
    // bytes / (GB/s) is in ns because 1 GB/s is one byte per ns.
    return m_clock.ns_to_cycles(m_cfg.setup_ns + double(bytes) / m_cfg.link_gb_per_s);
}

HostTransfer HostLink::transfer(uint64_t issue, uint64_t bytes, bool to_device) {
    const uint64_t begin = std::max(issue, m_free_at);
    const HostTransfer r{begin, begin + transfer_cycles(bytes)};
    m_free_at = r.end;
    stats.busy_cycles += r.end - r.begin;
    stats.queue_cycles += r.begin - issue;
    if (to_device) {
        stats.to_device_bytes += bytes;
        ++stats.to_device_transfers;
    } else {
        stats.to_host_bytes += bytes;
        ++stats.to_host_transfers;
    }
    return r;
}

}  // namespace tpu::hw
