// SPDX-License-Identifier: Apache-2.0
#include "hw/ici/ici_network.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "hw/ici/ici_costs.h"
#include "sim/stat_names.h"

namespace tpu::hw {

IciNetwork::IciNetwork(const BoardConfig& cfg)
    : m_cores(cfg.cores()),
      m_bytes_per_cycle(ici_costs(cfg).bytes_per_cycle),
      m_hop(ici_costs(cfg).hop),
      m_cut_through(cfg.ici.switching == "cut-through") {
    if (m_cores == 0) throw std::invalid_argument("ICI network of 0 cores");
    if (!(m_bytes_per_cycle > 0))
        throw std::invalid_argument(fmt::format("ici.link_gb_per_s: {} is not a positive bandwidth",
                                                cfg.ici.link_gb_per_s));
    m_shape = torus_shape(cfg.ici, m_cores);
    m_busy.resize(num_links());
    m_stats.resize(num_links());
}

bool IciNetwork::has_link(uint32_t link) const {
    if (link >= num_links()) return false;
    const uint32_t size[] = {m_shape.x, m_shape.y, m_shape.z};
    return size[link % kDirs / 2] > 1;
}

uint32_t IciNetwork::link_target(uint32_t link) const {
    const uint32_t core = link_core(link);
    check_core(core);
    const uint32_t X = m_shape.x, Y = m_shape.y;
    uint32_t pos[3] = {core % X, core / X % Y, core / X / Y};
    const uint32_t size[3] = {X, Y, m_shape.z}, dim = link % kDirs / 2;
    pos[dim] = (pos[dim] + (link % 2 == 0 ? 1 : size[dim] - 1)) % size[dim];
    return (pos[2] * Y + pos[1]) * X + pos[0];
}

std::string IciNetwork::link_name(uint32_t link) {
    static const char* kDir[] = {"+x", "-x", "+y", "-y", "+z", "-z"};
    return fmt::format("core{}{}", link / kDirs, kDir[link % kDirs]);
}

void IciNetwork::check_core(uint32_t core) const {
    if (core >= m_cores)
        throw std::invalid_argument(fmt::format(
            "ICI: core {} does not exist (the network has cores 0-{})", core, m_cores - 1));
}

std::vector<uint32_t> IciNetwork::route(uint32_t src, uint32_t dst) const {
    check_core(src);
    check_core(dst);
    std::vector<uint32_t> links;
    const uint32_t X = m_shape.x, Y = m_shape.y, Z = m_shape.z;
    uint32_t pos[3] = {src % X, src / X % Y, src / X / Y};
    const uint32_t target[3] = {dst % X, dst / X % Y, dst / X / Y}, size[3] = {X, Y, Z};
    for (uint32_t dim = 0; dim < 3; ++dim) {
        const uint32_t n = size[dim], fwd = (target[dim] + n - pos[dim]) % n;
        const bool plus = fwd <= n - fwd;
        for (uint32_t h = 0, hops = plus ? fwd : n - fwd; h < hops; ++h) {
            const uint32_t core = (pos[2] * Y + pos[1]) * X + pos[0];
            links.push_back(core * kDirs + dim * 2 + (plus ? 0 : 1));
            pos[dim] = plus ? (pos[dim] + 1) % n : (pos[dim] + n - 1) % n;
        }
    }
    return links;
}

uint64_t IciNetwork::ser_cycles(uint64_t bytes) const {
    return IciCosts{m_bytes_per_cycle, m_hop}.ser_cycles(bytes);
}

uint64_t IciNetwork::reserve(uint32_t link, uint64_t t, uint64_t len) {
    auto& busy = m_busy[link];
    uint64_t s = t;
    auto it = busy.upper_bound(s);
    if (it != busy.begin()) {
        auto prev = std::prev(it);
        s = std::max(s, prev->second);
    }
    // Skip every promise that begins before the candidate interval ends.
    while (it != busy.end() && it->first < s + len) {
        s = std::max(s, it->second);
        ++it;
    }
    // Merge with touching neighbours so the calendar holds only real gaps.
    uint64_t begin = s, end = s + len;
    if (it != busy.end() && it->first == end) {
        end = it->second;
        it = busy.erase(it);
    }
    if (it != busy.begin()) {
        auto prev = std::prev(it);
        if (prev->second == begin) {
            begin = prev->first;
            busy.erase(prev);
        }
    }
    busy.emplace(begin, end);
    return s;
}

IciArrival IciNetwork::transfer(uint32_t src, uint32_t dst, uint64_t start, uint64_t bytes,
                                std::vector<IciHop>* hops) {
    if (bytes == 0) throw std::invalid_argument("ICI: a transfer of 0 bytes");
    const uint64_t ser = ser_cycles(bytes);
    const std::vector<uint32_t> links = route(src, dst);
    if (links.empty()) return {start, start + ser};
    uint64_t t = start;
    for (uint32_t link : links) {
        const uint64_t s = reserve(link, t, ser);
        IciLinkStats& st = m_stats[link];
        st.bytes += bytes;
        ++st.transfers;
        st.busy_cycles += ser;
        st.queue_cycles += s - t;
        if (hops) hops->push_back({link, s, s + ser});
        t = s + m_hop + (m_cut_through ? 0 : ser);
    }
    return m_cut_through ? IciArrival{t, t + ser} : IciArrival{t - ser, t};
}

uint64_t IciNetwork::message(uint32_t src, uint32_t dst, uint64_t start) const {
    return start + route(src, dst).size() * m_hop;
}

void IciNetwork::retire(uint64_t cycle) {
    for (auto& busy : m_busy)
        while (!busy.empty() && busy.begin()->second <= cycle) busy.erase(busy.begin());
}

void IciNetwork::register_stats(sim::StatGroup& parent, std::function<uint64_t()> cycles) {
    namespace n = sim::stat_names;
    using sim::StatUnit;
    m_stat_groups.clear();
    auto& top = *m_stat_groups.emplace_back(
        std::make_unique<sim::StatGroup>(std::string(n::kIci), &parent));
    for (uint32_t link = 0; link < num_links(); ++link) {
        if (!has_link(link)) continue;
        const IciLinkStats& s = m_stats[link];
        auto& g =
            *m_stat_groups.emplace_back(std::make_unique<sim::StatGroup>(link_name(link), &top));
        g.add(std::string(n::kBytes), "payload bytes sent over the link", StatUnit::Bytes, s.bytes);
        g.add("transfers", "transfers that crossed the link", StatUnit::Count, s.transfers);
        g.add("busy_cycles", "cycles the link was sending (serialisation of its transfers)",
              StatUnit::Cycles, s.busy_cycles);
        g.add("queue_cycles", "cycles transfers waited at the link's input while it was in use",
              StatUnit::Cycles, s.queue_cycles);
        g.add_formula(std::string(n::kUtilization), "busy_cycles / board cycles", StatUnit::Ratio,
                      [&s, cycles] {
                          const uint64_t c = cycles();
                          return c ? double(s.busy_cycles) / double(c) : 0.0;
                      });
    }
}

}  // namespace tpu::hw
