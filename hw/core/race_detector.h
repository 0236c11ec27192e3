// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "isa/isa.h"

namespace tpu::hw {

/// A byte range one instruction reads or writes.
struct MemRange {
    bool hbm = false;  ///< HBM (else VMEM)
    uint64_t lo = 0;   ///< first byte
    uint64_t hi = 0;   ///< one past the last byte
    bool write = false;
};

/// One unit instruction's memory accesses, as the race detector sees them.
struct AccessRecord {
    uint32_t core = 0;            ///< issuing core
    uint32_t pc = 0;              ///< its pc
    isa::Instr instr;             ///< for the report
    std::string unit;             ///< "dma", "vpu", "mxu1", "ici" (same unit = ordered)
    uint64_t seq = 0;             ///< issue order on the issuing core
    uint64_t issue = 0;           ///< cycle issued
    uint64_t done = 0;            ///< cycle finished
    uint8_t flag = isa::kNoFlag;  ///< flag of the owning core it raises at done
    std::vector<MemRange> ranges;
};

/// Finds accesses to the same bytes of one core's memories that no sync-flag wait orders.
///
/// Rule: B is ordered after A if A is from the same unit (units execute their queue in order and
/// keep their own read-after-write order), or the owning core completed a `wait` on A's flag
/// at a cycle t >= A.done before B issued, or a `fence` after A. A wait that acknowledges a
/// record also acknowledges the earlier records of the same unit that were done by then (the
/// unit is in order). Overlapping ranges where one side writes and neither is ordered are a
/// race, reported naming both instructions.
///
/// A detector covers the memories of one core, its owner; records may come from other cores
/// (ICI writes into the owner's memory), and only the owner's waits and fences order them.
class RaceDetector {
public:
    /// A detector for the memories of core `owner`.
    explicit RaceDetector(uint32_t owner) : m_owner(owner) {}
    /// Checks `rec` against every unacknowledged record and keeps it; returns the report of the
    /// first race found.
    std::optional<std::string> add(AccessRecord rec);
    /// A `wait` on `flag` completed at cycle `t` on the owning core.
    void acknowledge(uint8_t flag, uint64_t t);
    /// Fills in the done cycle of record `seq` of `core`, added with done unknown (an ICI
    /// instruction the board resolves later); a record the window dropped is ignored.
    void set_done(uint32_t core, uint64_t seq, uint64_t done);
    /// A `fence` completed at `t`: everything issued by the owning core is done.
    void fence(uint64_t t);
    /// Forgets everything (a new launch).
    void clear() { m_open.clear(); }
    size_t open_records() const { return m_open.size(); }

    /// Records kept per core; older ones are dropped (documented detector window).
    static constexpr size_t kWindow = 4096;

private:
    /// How to order `later` after `earlier`: who waits on what, before which instruction.
    std::string advice(const AccessRecord& earlier, const AccessRecord& later) const;

    uint32_t m_owner;
    std::deque<AccessRecord> m_open;
};

}  // namespace tpu::hw
