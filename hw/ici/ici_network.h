// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hw/board_config.h"
#include "sim/stats.h"

namespace tpu::hw {

/// What one link direction did (plain integers on the hot path; register_stats views them).
struct IciLinkStats {
    uint64_t bytes = 0;         ///< payload bytes that crossed the link
    uint64_t transfers = 0;     ///< transfers that crossed the link
    uint64_t busy_cycles = 0;   ///< cycles the link was reserved (the transfers' serialisation)
    uint64_t queue_cycles = 0;  ///< cycles transfers waited at the link's input for it to be free
};

/// When a transfer's data reaches its destination: the link delivers bytes at the link rate
/// from `first`, so the first b bytes are in by `first + ser_cycles(b)`, all of them by `last`.
struct IciArrival {
    uint64_t first;  ///< cycle the first byte arrives
    uint64_t last;   ///< cycle the last byte has arrived (first + ser_cycles(bytes))
};

/// One link's reservation for one transfer, for traces.
struct IciHop {
    uint32_t link;   ///< link id (IciNetwork::link_name)
    uint64_t begin;  ///< first cycle the link sends the transfer
    uint64_t end;    ///< cycle after the last one
};

/// Timing of the inter-core interconnect (hw/README.md, "ICI network"). Plain C++: the board
/// calls it when a core's ICI engine starts a transfer, in simulated-time order.
///
/// Links: every core has a link to each neighbour in each direction of the ring or the 2-D or
/// 3-D torus (ici.topology, shape from torus_shape()); id = core * 6 + {0: +x, 1: -x, 2: +y,
/// 3: -y, 4: +z, 5: -z}, and each id is a separate resource. Route: dimension order (x, then y,
/// then z), each dimension the shorter way round, the positive direction on a tie; a ring is a
/// torus of one row.
///
/// Timing, with `ser = ceil(bytes / B)` (B = link bytes per core cycle) and `hop` the per-hop
/// latency in cycles. A link sends one transfer at a time, contiguously, for `ser` cycles, and
/// keeps a calendar of the intervals [s, s + ser) it has promised. A transfer that reaches the
/// link's input at `t` gets the earliest `s >= t` such that [s, s + ser) overlaps no promised
/// interval, and is promised [s, s + ser):
///   cut-through:        t_0 = start; t_{k+1} = s_k + hop;        arrival = t_n + ser
///   store-and-forward:  t_0 = start; t_{k+1} = s_k + hop + ser;  arrival = t_n
/// (n links, s_k the reserved start on link k). Derivation: a link sends flit i (one link cycle
/// of data) in cycle s + i, and the next core has it from cycle s + i + hop. Cut-through
/// forwards flit i in the cycle it arrives, so the next link may begin at s + hop (each later
/// flit arrives just in time, one per cycle); the destination writes the last flit in cycle
/// s + hop + ser - 1 of the last link, so the data is complete at t_n + ser. Store-and-forward
/// buffers the whole packet first: its tail is written in cycle s + hop + ser - 1, so the next
/// link begins no earlier than s + hop + ser.
/// Transfers are promised intervals in the order the board hands them over: (issue cycle,
/// source core, source order), at the end of each ICI window (hw/README.md). A later one may
/// use an idle gap before an earlier one's interval if it fits there
/// whole: it waits only while the link is really in use, and never moves an earlier promise
/// (whose arrival the destination already knows). `src == dst` uses no link: arrival = start +
/// ser. A flag message (`sigr`) takes `start + hops x hop` and occupies no link (a side band).
/// Example (default board, ser(4 KiB) = 49, hop = 940): 4 KiB from core 0 to core 5 started at
/// 4 is promised link 7 -> 6 over [944, 993); 4 KiB from core 7 to core 6 started later, at 105,
/// fits [105, 154) and arrives at 105 + 940 + 49 = 1094, as it would alone.
class IciNetwork {
public:
    /// Link ids per core: +x, -x, +y, -y, +z, -z.
    static constexpr uint32_t kDirs = 6;

    /// The network of the board `cfg` (its cores, clock and `ici` section); throws
    /// sim::ConfigError if the torus widths do not tile the cores.
    explicit IciNetwork(const BoardConfig& cfg);

    /// Cores along x (all of them on the ring).
    uint32_t torus_x() const { return m_shape.x; }
    /// Cores along each dimension.
    const TorusShape& shape() const { return m_shape; }
    /// Number of link ids (kDirs per core; a ring uses only the x ones, a 2-D torus no z).
    uint32_t num_links() const { return m_cores * kDirs; }
    /// True if the topology has this link (a ring has no y links, a torus of width 1 no x).
    bool has_link(uint32_t link) const;
    /// The core a link leaves.
    static uint32_t link_core(uint32_t link) { return link / kDirs; }
    /// The core a link enters: the neighbour one step along its direction, wrapping around.
    uint32_t link_target(uint32_t link) const;
    /// "core3+x": the link leaving core 3 in the +x direction.
    static std::string link_name(uint32_t link);
    /// Links from `src` to `dst` in order (empty when they are equal).
    std::vector<uint32_t> route(uint32_t src, uint32_t dst) const;
    /// Link bytes per core cycle.
    double bytes_per_cycle() const { return m_bytes_per_cycle; }
    /// Cycles a link needs for `bytes`: ceil(bytes / bytes_per_cycle()).
    uint64_t ser_cycles(uint64_t bytes) const;
    /// Latency of one hop in core cycles.
    uint64_t hop_cycles() const { return m_hop; }

    /// Reserves the route of `bytes` from `src` to `dst` starting no earlier than `start`; returns
    /// when the data arrives. `hops`, if given, receives each link's reservation. Throws
    /// std::invalid_argument for a core that does not exist or 0 bytes.
    IciArrival transfer(uint32_t src, uint32_t dst, uint64_t start, uint64_t bytes,
                        std::vector<IciHop>* hops = nullptr);
    /// Cycle a flag message sent at `start` arrives (latency only).
    uint64_t message(uint32_t src, uint32_t dst, uint64_t start) const;
    /// Forgets promised intervals that end at or before `cycle`: the caller starts no later
    /// transfer before it. Keeps the calendars short in long runs; never changes a result.
    void retire(uint64_t cycle);

    /// Statistics of one link.
    const IciLinkStats& link_stats(uint32_t link) const { return m_stats.at(link); }
    /// Registers the group "ici" under `parent` with a child per link of the topology
    /// ("core3+x"); `cycles` gives the elapsed cycles its utilisation is measured against.
    void register_stats(sim::StatGroup& parent, std::function<uint64_t()> cycles);

private:
    void check_core(uint32_t core) const;
    /// Earliest s >= t with [s, s + len) free on `link`, which it then promises.
    uint64_t reserve(uint32_t link, uint64_t t, uint64_t len);

    uint32_t m_cores;
    TorusShape m_shape;
    double m_bytes_per_cycle;
    uint64_t m_hop;
    bool m_cut_through;
    /// Per link: promised intervals, begin -> end, disjoint and never touching (merged).
    std::vector<std::map<uint64_t, uint64_t>> m_busy;
    std::vector<IciLinkStats> m_stats;
    std::vector<std::unique_ptr<sim::StatGroup>> m_stat_groups;  ///< "ici", then its links
};

}  // namespace tpu::hw
