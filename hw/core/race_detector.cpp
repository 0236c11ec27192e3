// SPDX-License-Identifier: Apache-2.0
#include "hw/core/race_detector.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "isa/disassembler.h"

namespace tpu::hw {
namespace {

std::string side(const AccessRecord& r, bool write) {
    // An ICI transfer's end is known only once the board resolves it: until then `done` holds
    // the sentinel, which is no cycle to print.
    const std::string done = r.done == std::numeric_limits<uint64_t>::max()
                                 ? std::string("still in flight")
                                 : fmt::format("done at {}", r.done);
    return fmt::format("core {} pc {} `{}` ({}, {}, issued at cycle {}, {})", r.core, r.pc,
                       isa::to_string(r.instr), r.unit, write ? "writes" : "reads", r.issue, done);
}

}  // namespace

std::string RaceDetector::advice(const AccessRecord& earlier, const AccessRecord& later) const {
    const bool local = earlier.core == m_owner, mine = later.core == m_owner;
    if (local && mine)
        return earlier.flag == isa::kNoFlag
                   ? fmt::format(
                         "give pc {} a completion flag and wait on it, or fence, before "
                         "pc {}",
                         earlier.pc, later.pc)
                   : fmt::format("wait on f{} (raised by pc {}) or fence before pc {}",
                                 earlier.flag, earlier.pc, later.pc);
    // Only the owner's waits and fences order records (see the class comment): the owner must
    // see `earlier` done, and a core that is not the owner learns of that only by a signal.
    std::string wait;
    if (local)
        wait =
            earlier.flag == isa::kNoFlag
                ? fmt::format("give pc {} a completion flag and wait on it, or fence", earlier.pc)
                : fmt::format("wait on f{} (raised by pc {}) or fence", earlier.flag, earlier.pc);
    else
        wait = earlier.flag == isa::kNoFlag
                   ? fmt::format("give core {} pc {} a destination flag and wait on it",
                                 earlier.core, earlier.pc)
                   : fmt::format("wait on f{} (raised on arrival of core {} pc {}'s transfer)",
                                 earlier.flag, earlier.core, earlier.pc);
    const std::string then =
        mine ? fmt::format(" before its pc {}", later.pc)
             : fmt::format(
                   ", then signal core {} (sigr), which must wait for that signal "
                   "before pc {}",
                   later.core, later.pc);
    return fmt::format("core {} must {}{}", m_owner, wait, then);
}

std::optional<std::string> RaceDetector::add(AccessRecord rec) {
    for (const AccessRecord& a : m_open) {
        if (a.core == rec.core && a.unit == rec.unit) continue;
        for (const MemRange& x : a.ranges)
            for (const MemRange& y : rec.ranges) {
                if (x.hbm != y.hbm || !(x.write || y.write)) continue;
                const uint64_t lo = std::max(x.lo, y.lo), hi = std::min(x.hi, y.hi);
                if (lo >= hi) continue;
                return fmt::format(
                    "data race on core {} {} [0x{:x}, 0x{:x}): {} and {} are not ordered; {}",
                    m_owner, x.hbm ? "HBM" : "VMEM", lo, hi, side(rec, y.write), side(a, x.write),
                    // Cores run ahead of each other between syncs, so records of different
                    // cores arrive out of issue order; the advice orders the later after the
                    // earlier.
                    rec.issue < a.issue ? advice(rec, a) : advice(a, rec));
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

void RaceDetector::set_done(uint32_t core, uint64_t seq, uint64_t done) {
    for (auto it = m_open.rbegin(); it != m_open.rend(); ++it)
        if (it->core == core && it->seq == seq) {
            it->done = done;
            return;
        }
}

void RaceDetector::fence(uint64_t t) {
    std::erase_if(m_open, [&](const AccessRecord& r) { return r.core == m_owner && r.done <= t; });
}

}  // namespace tpu::hw
