// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/hbm_replicas.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "hw/board_config.h"

namespace tpu::hw {
namespace {

/// A member's view of its group.
class ReplicaHbmTiming : public HbmTimingModel {
public:
    ReplicaHbmTiming(HbmReplicaGroup& group, uint32_t index, double peak)
        : m_group(group), m_index(index), m_peak(peak) {}
    uint64_t access(uint64_t arrive, uint64_t addr, uint32_t bytes, bool write) override {
        return m_group.serve(m_index, {arrive, 1, bytes, addr, 0, 0, 0, write, true});
    }
    uint64_t access_rows(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                         uint64_t stride, uint32_t chunk, uint32_t port, bool write) override {
        return m_group.serve(m_index,
                             {start, rows, row_bytes, addr, stride, chunk, port, write, false});
    }
    double peak_bytes_per_cycle() const override { return m_peak; }
    void register_stats(sim::StatGroup& group) override {
        Hbm2Timing::register_stats_of(
            group, [this]() -> const Hbm2Timing& { return m_group.state_of(m_index); });
    }

private:
    HbmReplicaGroup& m_group;
    uint32_t m_index;
    double m_peak;
};

}  // namespace

HbmReplicaGroup::HbmReplicaGroup(const BoardConfig& cfg, uint32_t members)
    : m_front(cfg), m_snap(m_front), m_members(members), m_in_step(members) {}

HbmReplicaGroup::~HbmReplicaGroup() = default;

std::unique_ptr<HbmTimingModel> HbmReplicaGroup::member(uint32_t i) {
    if (i >= m_members.size())
        throw std::out_of_range(
            fmt::format("HbmReplicaGroup: no member {} of {}", i, m_members.size()));
    return std::make_unique<ReplicaHbmTiming>(*this, i, m_front.peak_bytes_per_cycle());
}

uint64_t HbmReplicaGroup::Request::apply(HbmTimingModel& m) const {
    return single ? m.access(start, addr, static_cast<uint32_t>(row_bytes), write)
                  : m.access_rows(start, rows, row_bytes, addr, stride, chunk, port, write);
}

uint64_t HbmReplicaGroup::serve(uint32_t i, const Request& q) {
    Member& m = m_members[i];
    if (m.own) {
        ++m_counters.own;
        return q.apply(*m.own);
    }
    if (m.next == m_end) {
        // At the front: the front model's state is this member's.
        const uint64_t done = q.apply(m_front);
        ++m_counters.served;
        ++m_end;
        ++m.next;
        if (m_in_step > 1) {
            m_log.push_back({q, done});
            trim();
        } else {
            // Nobody else can read the log or the snapshot: drop them.
            m_log.clear();
            m_base = m_end;
        }
        return done;
    }
    const Entry& e = m_log[m.next - m_base];
    if (e.q == q) {
        ++m.next;
        ++m_counters.replayed;
        const uint64_t done = e.done;
        trim();
        return done;
    }
    leave(i);
    ++m_counters.own;
    return q.apply(*m.own);
}

const Hbm2Timing& HbmReplicaGroup::state_of(uint32_t i) {
    Member& m = m_members.at(i);
    if (m.own) return *m.own;
    if (m.next == m_end) return m_front;
    leave(i);
    return *m.own;
}

void HbmReplicaGroup::leave(uint32_t i) {
    take_own(i);
    trim();
}

void HbmReplicaGroup::take_own(uint32_t i) {
    Member& m = m_members[i];
    if (m_cut && m_cut_at == m.next) {
        m.own = std::make_unique<Hbm2Timing>(*m_cut);
    } else {
        // The snapshot is the state at m_base, and a member in step is never behind m_base.
        m.own = std::make_unique<Hbm2Timing>(m_snap);
        for (uint64_t k = m_base; k < m.next; ++k) m_log[k - m_base].q.apply(*m.own);
        // Members that part at the same index (a collective parts them all at once) copy this
        // state rather than replay the log again.
        m_cut = std::make_unique<Hbm2Timing>(*m.own);
        m_cut_at = m.next;
    }
    --m_in_step;
    ++m_counters.diverged;
}

uint64_t HbmReplicaGroup::lowest_in_step() const {
    uint64_t low = m_end;
    for (const Member& m : m_members)
        if (!m.own) low = std::min(low, m.next);
    return low;
}

void HbmReplicaGroup::trim() {
    if (m_log.size() < kTrim) return;
    uint64_t low = lowest_in_step();
    if (m_log.size() >= kMaxLog && low < m_end) {
        // The members this far behind (idle in this launch, or much slower) leave: those at
        // m_base for a copy, the others for one replay.
        for (uint32_t k = 0; k < m_members.size(); ++k)
            if (!m_members[k].own && m_members[k].next == low) take_own(k);
        low = lowest_in_step();
    }
    if (low == m_end) {
        // Every member in step is at the front: the snapshot is a copy.
        m_snap = m_front;
        m_log.clear();
        m_base = m_end;
    } else if (low - m_base >= kTrim / 2) {
        // Half the log is behind every member in step: the snapshot moves over it.
        for (; m_base < low; ++m_base) {
            m_log.front().q.apply(m_snap);
            m_log.pop_front();
        }
    }
}

}  // namespace tpu::hw
