// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

/// Cycle-stepped ICI network, used only by tests to prove IciNetwork exact. It moves every
/// transfer's flits one cycle at a time over per-link calendars; it never computes a future
/// cycle from a formula.
namespace tpu::hw {

/// One transfer for the reference, in the order the cores start them.
struct IciRefTransfer {
    uint32_t src = 0;    ///< sending core
    uint32_t dst = 0;    ///< receiving core
    uint64_t start = 0;  ///< cycle the sender's engine starts it (data ready in its VMEM)
    uint64_t bytes = 1;  ///< payload, at least 1
};

/// Shape and speed of the reference network.
struct IciRefConfig {
    uint32_t cores = 8;             ///< cores on the network
    uint32_t width = 8;             ///< cores along x; width == cores is the ring
    uint32_t height = 0;            ///< cores along y; 0: cores / width (a 2-D torus or ring)
    uint64_t hop_cycles = 940;      ///< cycles from a flit leaving a core to the next core's input
    double bytes_per_cycle = 85.1;  ///< bytes one flit (one link cycle) carries
    bool cut_through = true;        ///< false: store-and-forward
};

/// Hardware modelled (hw/README.md, "ICI network"): a transfer is ceil(bytes / bytes_per_cycle)
/// flits. It steps cycle by cycle from its start, and in each cycle, on every link of its path:
/// 1. a link that has not begun the transfer begins it when the packet may leave the core
///    (the source: from `start`; cut-through: its head flit is at the core's input, the rest
///    follows one per cycle; store-and-forward: every flit was written into the core's buffer in
///    an earlier cycle) and no earlier transfer holds any of the link's next `flits` cycles
///    (links do not interleave packets, and a transfer never takes a cycle an earlier one holds);
/// 2. a link that has begun sends one flit per cycle, holding that cycle in its calendar; the
///    flit reaches the next core's input hop_cycles later.
/// The transfer has arrived the cycle after the destination wrote its last flit (a flit is
/// written in the cycle it reaches the input). Transfers take the links in the order given;
/// src == dst copies one flit per cycle locally.
class IciRef {
public:
    /// An idle network; throws std::invalid_argument for a width or height that does not
    /// divide the cores.
    explicit IciRef(const IciRefConfig& cfg);
    /// Serves `transfers` in order and returns each one's arrival cycle. Throws
    /// std::invalid_argument for a bad core or 0 bytes, std::logic_error if the model breaks.
    std::vector<uint64_t> run(const std::vector<IciRefTransfer>& transfers);

private:
    /// A link: the core it leaves and its direction (0 +x, 1 -x, 2 +y, 3 -y, 4 +z, 5 -z).
    struct Link {
        uint32_t from;  ///< core the link leaves
        uint32_t dir;   ///< direction
    };
    /// The links a transfer crosses, walking x first, then y, then z, one core at a time, each
    /// the shorter way round (the positive way on a tie).
    std::vector<Link> path(uint32_t src, uint32_t dst) const;

    IciRefConfig m_cfg;
};

}  // namespace tpu::hw
