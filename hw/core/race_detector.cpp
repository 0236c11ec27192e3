// SPDX-License-Identifier: Apache-2.0
#include "hw/core/race_detector.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "isa/disassembler.h"

namespace tpu::hw {
namespace {

std::string side(const AccessRecord& r, bool write) {
    return fmt::format("core {} pc {} `{}` ({}, {}, issued at cycle {}, done at {})", r.core, r.pc,
                       isa::to_string(r.instr), r.unit, write ? "writes" : "reads", r.issue,
                       r.done);
}

}  // namespace

std::optional<std::string> RaceDetector::add(AccessRecord rec) {
    for (const AccessRecord& a : m_open) {
        if (a.core == rec.core && a.unit == rec.unit) continue;
        for (const MemRange& x : a.ranges)
            for (const MemRange& y : rec.ranges) {
                if (x.hbm != y.hbm || !(x.write || y.write)) continue;
                const uint64_t lo = std::max(x.lo, y.lo), hi = std::min(x.hi, y.hi);
                if (lo >= hi) continue;
                const std::string how =
                    a.flag == isa::kNoFlag
                        ? fmt::format("give pc {} a completion flag and wait on it, or fence,",
                                      a.pc)
                        : fmt::format("wait on f{} (raised by pc {}) or fence", a.flag, a.pc);
                return fmt::format(
                    "data race on core {} {} [0x{:x}, 0x{:x}): {} and {} are not ordered; {} "
                    "before pc {}",
                    rec.core, x.hbm ? "HBM" : "VMEM", lo, hi, side(rec, y.write), side(a, x.write),
                    how, rec.pc);
            }
    }
    m_open.push_back(std::move(rec));
    if (m_open.size() > kWindow) m_open.pop_front();
    return std::nullopt;
}

void RaceDetector::acknowledge(uint8_t flag, uint64_t t) {
    // The latest acknowledged record per unit: everything before it in that unit that is done
    // by t is ordered too.
    std::map<std::pair<uint32_t, std::string>, uint64_t> acked;
    for (const AccessRecord& r : m_open)
        if (r.flag == flag && r.done <= t) {
            auto& s = acked[{r.core, r.unit}];
            s = std::max(s, r.seq + 1);
        }
    if (acked.empty()) return;
    std::erase_if(m_open, [&](const AccessRecord& r) {
        const auto it = acked.find({r.core, r.unit});
        return it != acked.end() && r.seq < it->second && r.done <= t;
    });
}

void RaceDetector::fence(uint32_t core, uint64_t t) {
    std::erase_if(m_open, [&](const AccessRecord& r) { return r.core == core && r.done <= t; });
}

}  // namespace tpu::hw
