// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "hw/board_config.h"
#include "hw/core/core_model.h"
#include "isa/isa.h"

namespace tpu::sim {
class StatGroup;
class Tracer;
}  // namespace tpu::sim

namespace tpu::hw {

class HbmTarget;
class HostLink;
class IciNetwork;

/// Every running core waits on a flag that nothing can raise; the message holds a state dump.
class DeadlockError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A launch stopped from the host: Ctrl-C, or sim.max_host_seconds. The message says which,
/// at what cycle, and dumps each unfinished core's state as a deadlock does.
class StoppedError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Result of one launch (hw/README.md, "Launch timing"): the host rings the doorbell at
/// start_cycle; each core fetches its program, issues its first instruction and halts; the
/// completion reaches the host completion_cycles after a core set's last halt.
struct LaunchResult {
    uint64_t start_cycle = 0;           ///< board cycle the host rang the doorbell
    uint64_t end_cycle = 0;             ///< board cycle the last completion reached the host
    std::vector<uint32_t> cores;        ///< launched cores, ascending
    std::vector<uint64_t> core_cycles;  ///< per core (same order): doorbell to its halt
    uint64_t completion_cycles = 0;     ///< completion write-back and interrupt after a halt
};

/// The board: cores, their HBM and VMEM, the inter-core network. Owns the SystemC modules
/// (hidden here so users of this header never include SystemC) and the SystemC simulation
/// context they live in: a process may build any number of boards, one after another or alive
/// at once, and each starts at cycle 0. Every call into a board makes its context SystemC's
/// current one, and it stays current until another board is called or this one is destroyed
/// (hw/README.md, "One board, one SystemC context").
class Board {
public:
    explicit Board(const BoardConfig& cfg);
    ~Board();
    Board(const Board&) = delete;
    Board& operator=(const Board&) = delete;

    const BoardConfig& config() const;
    uint32_t num_cores() const;
    SparseMemory& hbm(uint32_t core);
    /// Core `core`'s HBM as a TLM-2.0 target (hw/mem/hbm_target.h) for SystemC initiators.
    /// Made on the first call, which must come before the first launch (elaboration), and then
    /// its socket must be bound.
    HbmTarget& hbm_target(uint32_t core);
    SparseMemory& vmem(uint32_t core);
    CoreModel& core(uint32_t core);
    /// The inter-core network: link timing and per-link statistics (hw/ici/ici_network.h).
    const IciNetwork& ici() const;
    /// Chip holding `core`: cores are numbered chip by chip (v3-8: cores 2c and 2c+1 on chip c).
    uint32_t chip_of(uint32_t core) const;
    /// Host link of `chip` (hw/host/host_link.h); the driver times host transfers on it.
    HostLink& host_link(uint32_t chip);
    /// Root ("board") of every block's statistics group; stats.json is one walk of it. Over MPI
    /// each rank's tree holds its own cores' values until sync_stats().
    sim::StatGroup& stats();

    /// True if this process simulates `core`: always in one process; over MPI ranks (hw/README.md,
    /// "Pod slices on MPI") each rank simulates the cores of its TPU hosts.
    bool owns(uint32_t core) const;
    /// MPI rank that simulates `core` (0 in one process).
    int rank_of(uint32_t core) const;
    /// Reads `out.size()` bytes at `addr` of `core`'s HBM (or VMEM) on every rank: the rank that
    /// simulates the core reads and sends them to the others. Over MPI every rank must call it.
    void fetch(uint32_t core, bool hbm, uint64_t addr, std::span<uint8_t> out);
    /// FNV-1a (64-bit) of `bytes` bytes at `addr` of `core`'s HBM, continuing from `h` (the
    /// offset basis 14695981039346656037 starts a new one): the rank that simulates the core
    /// hashes and only the 8-byte result travels. Over MPI every rank must call it.
    uint64_t digest(uint32_t core, uint64_t addr, uint64_t bytes, uint64_t h);
    /// Makes stats() show every core's values on every rank (each rank sends those of its own
    /// cores; the network and host links are the same on all ranks). Over MPI every rank must
    /// call it, before writing statistics.
    void sync_stats();

    /// Loads a program on a core (checked against instruction memory).
    void load(uint32_t core, const isa::Program& program);
    /// Launches `cores` at the current board cycle with launch arguments in s1.. and runs until
    /// all of them halt and the completion has reached the host (launch costs: hw/README.md).
    /// Throws DeviceFault, DeadlockError, std::invalid_argument.
    LaunchResult run(const std::vector<uint32_t>& cores, const std::vector<uint32_t>& args = {});
    /// As run(), with each core's own arguments: `args[i]` goes to `cores[i]`.
    LaunchResult run_each(const std::vector<uint32_t>& cores,
                          const std::vector<std::vector<uint32_t>>& args);
    /// Current board cycle (simulated time / clock period).
    uint64_t now_cycle() const;
    /// Simulated seconds at the current cycle.
    double now_seconds() const;
    /// Advances simulated time by `cycles` with nothing running (host-side waits).
    void advance(uint64_t cycles);
    /// Traces every core's units (nullptr or a closed tracer: off).
    void set_tracer(sim::Tracer* tracer);

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

/// Parses a core list "3", "0-7", "0,2,5-6" or "all"; throws std::invalid_argument naming the
/// bad part.
std::vector<uint32_t> parse_core_set(const std::string& text, uint32_t num_cores);

}  // namespace tpu::hw
