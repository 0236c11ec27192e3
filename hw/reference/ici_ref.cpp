// SPDX-License-Identifier: Apache-2.0
#include "hw/reference/ici_ref.h"

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

namespace tpu::hw {

IciRef::IciRef(const IciRefConfig& cfg) : m_cfg(cfg) {
    if (cfg.cores == 0 || cfg.width == 0 || cfg.cores % cfg.width != 0)
        throw std::invalid_argument("IciRef: width " + std::to_string(cfg.width) +
                                    " does not divide " + std::to_string(cfg.cores) + " cores");
    if (m_cfg.height == 0) m_cfg.height = cfg.cores / cfg.width;
    if ((cfg.cores / cfg.width) % m_cfg.height != 0)
        throw std::invalid_argument("IciRef: height " + std::to_string(m_cfg.height) +
                                    " does not divide a plane of " +
                                    std::to_string(cfg.cores / cfg.width) + " cores");
    if (!(cfg.bytes_per_cycle > 0)) throw std::invalid_argument("IciRef: bytes_per_cycle <= 0");
}

std::vector<IciRef::Link> IciRef::path(uint32_t src, uint32_t dst) const {
    const uint32_t w = m_cfg.width, h = m_cfg.height, d = m_cfg.cores / w / h;
    std::vector<Link> links;
    uint32_t cur = src;
    // One step at a time: decide the direction again at every core.
    while (cur % w != dst % w) {
        const uint32_t x = cur % w, up = (dst % w + w - x) % w;
        const bool plus = up <= w - up;
        links.push_back({cur, plus ? 0u : 1u});
        const uint32_t nx = plus ? (x + 1) % w : (x + w - 1) % w;
        cur = cur - x + nx;
    }
    while (cur / w % h != dst / w % h) {
        const uint32_t y = cur / w % h, up = (dst / w % h + h - y) % h;
        const bool plus = up <= h - up;
        links.push_back({cur, plus ? 2u : 3u});
        const uint32_t ny = plus ? (y + 1) % h : (y + h - 1) % h;
        cur = cur - y * w + ny * w;
    }
    while (cur / (w * h) != dst / (w * h)) {
        const uint32_t z = cur / (w * h), up = (dst / (w * h) + d - z) % d;
        const bool plus = up <= d - up;
        links.push_back({cur, plus ? 4u : 5u});
        const uint32_t nz = plus ? (z + 1) % d : (z + d - 1) % d;
        cur = cur - z * w * h + nz * w * h;
    }
    return links;
}

std::vector<uint64_t> IciRef::run(const std::vector<IciRefTransfer>& transfers) {
    constexpr uint64_t kUnknown = ~uint64_t(0);
    // Per link (from * 6 + dir): 1 for every cycle an earlier transfer holds.
    std::map<uint32_t, std::vector<uint8_t>> calendar;
    auto held = [&](uint32_t link, uint64_t cycle) {
        const auto& cal = calendar[link];
        return cycle < cal.size() && cal[cycle];
    };
    std::vector<uint64_t> arrivals;
    for (const IciRefTransfer& tr : transfers) {
        if (tr.src >= m_cfg.cores || tr.dst >= m_cfg.cores)
            throw std::invalid_argument("IciRef: core out of range");
        if (tr.bytes == 0) throw std::invalid_argument("IciRef: a transfer of 0 bytes");
        const auto flits =
            static_cast<uint64_t>(std::ceil(double(tr.bytes) / m_cfg.bytes_per_cycle));
        const std::vector<Link> links = path(tr.src, tr.dst);
        if (links.empty()) {
            arrivals.push_back(tr.start + flits);
            continue;
        }
        const size_t n = links.size();
        // at_input[k][i]: cycle flit i reached the input of the core link k leaves (kUnknown
        // before); sent[k]: flits link k has sent; begun[k]: link k holds the packet.
        std::vector<std::vector<uint64_t>> at_input(n + 1, std::vector<uint64_t>(flits, kUnknown));
        std::vector<uint64_t> sent(n, 0);
        std::vector<bool> begun(n, false);
        const uint64_t limit = tr.start + 1000000000ull;
        uint64_t cycle = tr.start;
        for (;; ++cycle) {
            if (cycle > limit) throw std::logic_error("IciRef: a transfer never arrived");
            for (size_t k = 0; k < n; ++k) {
                const uint32_t id = links[k].from * 6 + links[k].dir;
                if (!begun[k]) {
                    bool may_leave;
                    if (k == 0)
                        may_leave = true;  // the whole packet is in the sender's VMEM
                    else if (m_cfg.cut_through)
                        may_leave = at_input[k][0] <= cycle;
                    else
                        may_leave = at_input[k][flits - 1] < cycle;
                    if (!may_leave) continue;
                    bool free = true;
                    for (uint64_t i = 0; i < flits && free; ++i) free = !held(id, cycle + i);
                    if (!free) continue;
                    begun[k] = true;
                }
                if (sent[k] == flits) continue;
                const uint64_t f = sent[k]++;
                if (k > 0 && at_input[k][f] > cycle)
                    throw std::logic_error("IciRef: a flit left a core before it arrived");
                auto& cal = calendar[id];
                if (cal.size() <= cycle) cal.resize(cycle + 1, 0);
                cal[cycle] = 1;
                at_input[k + 1][f] = cycle + m_cfg.hop_cycles;
            }
            // The destination writes each flit in the cycle it arrives.
            const uint64_t tail = at_input[n][flits - 1];
            if (tail != kUnknown && tail <= cycle) {
                arrivals.push_back(tail + 1);
                break;
            }
        }
    }
    return arrivals;
}

}  // namespace tpu::hw
