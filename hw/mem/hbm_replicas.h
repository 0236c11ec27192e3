// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "hw/mem/hbm2.h"

namespace tpu::hw {

/// The HBM timing of several cores that issue the same requests, served once while their
/// request streams agree (sim.share_hbm_timing; hw/README.md, "Replicas share their HBM
/// timing"). A host-speed shortcut with no timing meaning: each member returns exactly what an
/// Hbm2Timing of its own would, and its statistics are that model's.
///
/// Why it is exact: an Hbm2Timing is a deterministic function of its state and the requests
/// passed to it, and every core's stack starts in the same state. While member m has passed
/// the same first n requests as the *lead* sequence, its own model would be in the lead's state
/// after n requests, so the answer to its request n + 1 is the lead's if the request is the
/// same. The group keeps one model at the front of the lead sequence, a snapshot at index
/// `base` and the log of requests base .. front with their answers; a member that passes a
/// request other than the logged one at its index (an all-reduce sends each core different
/// addresses) takes a model of its own: the snapshot with the log up to its index replayed.
/// From then on it is served alone, as without the group.
///
/// Data-parallel cores run one program on equal shards, so on a training step every core
/// passes the same requests up to its first collective: the stacks of 8 cores cost about one.
class HbmReplicaGroup {
public:
    /// `members` cores of a board with `cfg.hbm.model` "hbm2", all in their initial state.
    HbmReplicaGroup(const BoardConfig& cfg, uint32_t members);
    HbmReplicaGroup(const HbmReplicaGroup&) = delete;
    HbmReplicaGroup& operator=(const HbmReplicaGroup&) = delete;
    ~HbmReplicaGroup();

    /// Member `i`'s timing model (one per member; the group must outlive it).
    std::unique_ptr<HbmTimingModel> member(uint32_t i);

    /// What the group did, for tests that prove a path is taken (no timing meaning).
    struct Counters {
        uint64_t served = 0;    ///< requests the front model served for the members in step
        uint64_t replayed = 0;  ///< requests answered from the log
        uint64_t own = 0;       ///< requests served by a member's own model
        uint32_t diverged = 0;  ///< members that took a model of their own
    };
    /// Counters since construction.
    const Counters& counters() const { return m_counters; }
    /// True while member `i` is served from the shared sequence.
    bool in_step(uint32_t i) const { return !m_members.at(i).own; }

    /// A request as HbmTimingModel receives it; `single` marks access() (then `rows` is 1,
    /// `row_bytes` the request's bytes and stride, chunk and port 0).
    struct Request {
        uint64_t start, rows, row_bytes, addr, stride;
        uint32_t chunk, port;
        bool write, single;
        bool operator==(const Request&) const = default;
        /// Passes the request to `m` (access() or access_rows()); returns its completion.
        uint64_t apply(HbmTimingModel& m) const;
    };
    /// Serves member `i`'s request `q`; returns its completion (core cycles).
    uint64_t serve(uint32_t i, const Request& q);
    /// The model whose state is member `i`'s now (its own, the front one, or a new own one
    /// when the member lags behind the front: statistics are read from it).
    const Hbm2Timing& state_of(uint32_t i);

private:
    struct Entry {
        Request q;
        uint64_t done;  ///< the lead's answer
    };
    struct Member {
        uint64_t next = 0;                ///< index of its next request in the lead sequence
        std::unique_ptr<Hbm2Timing> own;  ///< set once it has left the shared sequence
    };
    /// Gives member `i` (in step, behind the front) a model of its own at its index.
    void take_own(uint32_t i);
    /// take_own(i), then trim().
    void leave(uint32_t i);
    /// The lowest index of a member in step (m_end if none).
    uint64_t lowest_in_step() const;
    /// Moves the snapshot forward over log entries every member in step has passed.
    void trim();

    /// The log is trimmed once it holds this many entries (a host-memory choice: the members
    /// of a launch move in step, so the front is rarely more than a few requests ahead).
    static constexpr size_t kTrim = 4096;
    /// Members still this far behind the front take a model of their own rather than hold
    /// the log (cores idle in a launch of others: a single-core GEMM on an 8-core board).
    static constexpr size_t kMaxLog = size_t(1) << 18;

    Hbm2Timing m_front;                 ///< state after every logged request (index m_end)
    Hbm2Timing m_snap;                  ///< state at index m_base, while a member in step may lag
    std::deque<Entry> m_log;            ///< requests m_base .. m_end - 1
    std::unique_ptr<Hbm2Timing> m_cut;  ///< the state at index m_cut_at, where a member left
    uint64_t m_cut_at = 0;
    uint64_t m_base = 0, m_end = 0;
    std::vector<Member> m_members;
    uint32_t m_in_step;  ///< members without a model of their own
    Counters m_counters;
};

}  // namespace tpu::hw
