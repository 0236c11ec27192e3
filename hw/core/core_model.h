// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hw/core/core_config.h"
#include "hw/core/counter_track.h"
#include "hw/core/dma_engine.h"
#include "hw/core/hbm_windows.h"
#include "hw/core/ici_engine.h"
#include "hw/core/mxu_model.h"
#include "hw/core/race_detector.h"
#include "hw/core/vpu_unit.h"
#include "hw/fault.h"
#include "hw/mem/sparse_memory.h"
#include "isa/isa.h"
#include "sim/stats.h"

namespace tpu::sim {
class Tracer;
}

namespace tpu::hw {

struct BoardConfig;
class HbmTimingModel;

/// Timing of one executed instruction: the sequencer issued it at `issue`; its unit started
/// it at `start` and finished at `done` (all core cycles). Inline instructions have
/// start == issue and done == issue + 1, waits have start = the cycle the condition held.
struct InstrRecord {
    uint32_t pc;     ///< instruction index
    isa::Opcode op;  ///< opcode
    uint64_t issue;  ///< cycle the sequencer issued it
    uint64_t start;  ///< cycle its unit started it
    uint64_t done;   ///< cycle its unit finished (completion flag visible from here)
    friend bool operator==(const InstrRecord&, const InstrRecord&) = default;
};

/// An ICI transfer or flag message a core started (CoreEnv::ici_post). The board applies it:
/// link reservations, the write into the destination's memory and the flags it raises.
struct IciPost {
    uint64_t issue = 0;         ///< cycle the source issued it (simulated time)
    uint32_t src = 0;           ///< sending core
    uint32_t dst = 0;           ///< receiving core
    uint64_t seq = 0;           ///< the source's ICI instructions before it in this launch
    uint64_t start = 0;         ///< cycle the source's ICI engine starts it
    bool signal = false;        ///< sigr: a flag message without data
    bool hbm = false;           ///< data into the destination's HBM (else its VMEM)
    uint64_t addr = 0;          ///< destination byte address (HBM: including the window base)
    uint64_t bytes = 0;         ///< payload bytes (0 for a signal)
    uint32_t flag = 0;          ///< destination flag raised when the data is in (or the message is)
    uint32_t amount = 1;        ///< added to that flag
    std::vector<uint8_t> data;  ///< the payload read at issue (functional runs; else empty)
};

/// What the board provides to a core: the inter-core network and the other cores' flags and
/// memories. Calls happen with the caller synchronised to simulated time (`now` == its cycle).
class CoreEnv {
public:
    /// ici_post's answer when the board resolves the post later (CoreModel::ici_done).
    static constexpr uint64_t kIciPending = UINT64_MAX;

    virtual ~CoreEnv() = default;
    /// Number of cores on the board.
    virtual uint32_t num_cores() const = 0;
    /// The cores of the current launch, ascending (ICI may only reach these).
    virtual const std::vector<uint32_t>& launched() const = 0;
    /// Starts a transfer or flag message. Returns its done cycle (data in the destination's
    /// memory, or the message there, after earlier ones from the same source: IciEngine) if the
    /// board resolves it at once, else kIciPending; the board then calls the source's
    /// ici_done() with it at the end of the window it was issued in (hw/README.md, "ICI
    /// windows").
    virtual uint64_t ici_post(IciPost post) = 0;
    /// Memory of another core (bounds of ICI writes); `hbm` selects HBM over VMEM.
    virtual SparseMemory& remote_memory(uint32_t core, bool hbm) = 0;
    /// The race detector of another core's memories.
    virtual RaceDetector& remote_race_detector(uint32_t core) = 0;
    /// Polled every few thousand instructions: true when the launch must stop now (Ctrl-C, the
    /// host-time limit). The core then returns to the board without executing further.
    virtual bool stop_requested() { return false; }
};

/// Per-core statistics, plain integers on the hot path; register_stats() views them in the
/// stats tree.
struct CoreStats {
    uint64_t instructions = 0;       ///< instructions issued
    uint64_t stall_queue = 0;        ///< sequencer cycles stalled on a full unit queue
    uint64_t stall_wait = 0;         ///< sequencer cycles stalled in wait or fence
    std::vector<uint64_t> mxu_busy;  ///< per MXU: cycles streaming (T per matmul)
    std::vector<uint64_t> mxu_macs;  ///< per MXU: useful multiply-accumulates
    uint64_t mxu_ops = 0;            ///< mxu.lw + mxu.mm instructions
    uint64_t vpu_ops = 0;            ///< VPU instructions
    uint64_t vpu_busy = 0;           ///< VPU issue cycles
    uint64_t vpu_flops = 0;          ///< VPU fp32 operations
    uint64_t dma_ops = 0;            ///< DMA instructions
    uint64_t hbm_read_bytes = 0;     ///< bytes DMA read from HBM
    uint64_t hbm_write_bytes = 0;    ///< bytes DMA wrote to HBM
    uint64_t ici_ops = 0;            ///< ICI instructions
    uint64_t ici_bytes = 0;          ///< bytes sent over ICI
};

/// The fast TensorCore: architectural state, functional execution and the timing of every
/// unit, with no SystemC. Timing is computed when an instruction issues (each unit's start and
/// done follow from its own state), so the core runs ahead of simulated time and only stops
/// where another core can matter: flag waits that are not yet satisfied, ICI, and halt
/// (temporal decoupling). hw/README.md states every rule; hw/reference/ re-derives them cycle
/// by cycle.
class CoreModel {
public:
    /// Why run() returned.
    enum class Block : uint8_t {
        Sync,      ///< needs simulated time == cycle before it can go on (ICI, flag wait)
        WaitFlag,  ///< synchronised and waiting for a flag that nothing has raised yet
        Halted,    ///< finished; cycle = when its last unit drained
        Faulted,   ///< stopped on a device fault; see fault()
    };
    struct Status {
        Block block;
        uint64_t cycle;
    };

    /// `hbm_timing` may be nullptr: then the core builds its own (hbm.model) for its HBM.
    CoreModel(uint32_t id, const BoardConfig& cfg, SparseMemory& hbm, SparseMemory& vmem,
              CoreEnv* env, HbmTimingModel* hbm_timing = nullptr);
    ~CoreModel();

    /// Loads a program into instruction memory; too large, or an instruction isa::validate()
    /// refuses (a register or flag number out of range), is a std::invalid_argument.
    void load(const isa::Program& program);
    /// Resets sequencer state and starts at pc 0 at `cycle`; s1..sN = args, HBM window base.
    void start(uint64_t cycle, const std::vector<uint32_t>& args);
    /// Runs until blocked; `now` is the current simulated cycle. A device fault stops the core
    /// (Block::Faulted, fault()) without throwing.
    Status run(uint64_t now);
    /// Runs a core with no board around it (tests, benchmarks): simulated time follows the
    /// core's own events. Returns Halted, or WaitFlag when a wait can never be satisfied.
    Status run_alone();
    /// Earliest cycle of a scheduled flag increment after `now`, or UINT64_MAX.
    uint64_t next_flag_event(uint64_t now) const;
    /// Schedules flag += amount at cycle (ICI arrivals from other cores).
    void schedule_flag(uint32_t flag, uint32_t amount, uint64_t cycle);
    /// The board resolved this core's ICI post `seq` (IciPost::seq): it is done at `done`.
    void ici_done(uint64_t seq, uint64_t done);
    /// ICI posts the board has not resolved yet (a fence or halt waits for them).
    size_t ici_pending() const { return m_ici_wait.size(); }

    /// Bytes of the loaded program (what a launch fetches into instruction memory).
    uint64_t program_bytes() const { return uint64_t(m_program.size()) * isa::kInstrBytes; }
    bool running() const { return m_running; }
    /// Race detector over this core's VMEM and HBM (active when sim.race_detector is on).
    RaceDetector& race_detector() { return m_race; }
    /// The device fault that stopped the core, if any.
    const std::optional<FaultInfo>& fault() const { return m_fault; }
    uint32_t id() const { return m_id; }
    uint32_t pc() const { return m_pc; }
    uint64_t local_cycle() const { return m_cycle; }
    /// Value of a flag at `cycle`, counting increments scheduled up to then.
    uint64_t flag_value(uint32_t flag, uint64_t cycle) const;
    /// Scalar register (for tests and dumps).
    uint32_t sreg(int i) const { return m_sregs[i]; }
    const CoreStats& stats() const { return m_stats; }
    /// Takes the statistics of this core as another MPI rank, which simulates it, reports them
    /// (this process never runs the core, so its own are unused).
    void mirror_stats(CoreStats stats);
    /// Registers this core's statistics as the group "coreN" under `parent`, with a child per
    /// unit (dma, vpu, ici, mxuN) viewing the plain integers of stats(); returns the core's group.
    sim::StatGroup& register_stats(sim::StatGroup& parent);
    /// A one-paragraph state dump: pc, instruction, waits, flags, unit queues.
    std::string dump_state() const;

    /// Keeps an InstrRecord per executed instruction (tests compare with the reference); with
    /// `only`, just of the instructions at those pcs (where a compiled step's fusions begin),
    /// so a long launch keeps a few records rather than one per instruction.
    void record(bool on, const std::vector<uint32_t>& only = {}) {
        m_record = on;
        m_record_only.assign(only.empty() ? 0 : *std::max_element(only.begin(), only.end()) + 1,
                             false);
        for (uint32_t pc : only) m_record_only[pc] = true;
    }
    const std::vector<InstrRecord>& records() const { return m_records; }
    /// Emits a trace event per unit instruction on tracks "coreN/<unit>".
    void set_tracer(sim::Tracer* tracer);

private:
    struct UnitQueue;
    struct Hazards;

    uint32_t val(const isa::Operand& o) const {
        return m_sregs[o.reg] + static_cast<uint32_t>(o.imm);
    }
    enum class IciStep : uint8_t { Done, NeedSync, Faulted };
    /// Records a device fault and stops the core; returns false for `return fault(...)`.
    bool fault(std::string unit, uint64_t address, std::string what);
    /// Bounds, size and alignment of an access; false (with the fault recorded) if bad.
    bool check(SparseMemory& mem, uint64_t addr, uint64_t bytes, std::string_view unit,
               std::string_view what, uint32_t align = 1);
    uint64_t issue_to_unit(UnitQueue& q);
    void finish_unit(UnitQueue& q, uint64_t start, uint64_t done, uint8_t flag);
    void trace(int track, uint64_t start, uint64_t done, std::string_view detail_key = {},
               uint64_t detail = 0);
    /// The queue-depth part of trace(): cycles the instruction waited for its unit.
    void trace_queued(uint64_t start);

    bool exec_dma(const isa::Instr& ins);
    bool exec_mxu(const isa::Instr& ins);
    bool exec_vpu(const isa::Instr& ins);
    void exec_vpu_values(const isa::Instr& ins, const VpuShape& op, uint64_t rows, uint64_t cols,
                         uint64_t n);
    IciStep exec_ici(const isa::Instr& ins, uint64_t now);
    /// Hands a unit instruction's accesses to a race detector (this core's unless `target`);
    /// false with a fault recorded when they race.
    bool record_access(std::string_view unit, uint64_t start, uint64_t done, uint8_t flag,
                       std::vector<MemRange> ranges, RaceDetector* target = nullptr);
    /// The same for a fixed list of ranges, which becomes a vector only while the race
    /// detector is on (most runs leave it off, and every DMA, MXU and ICI instruction calls it).
    bool record_access(std::string_view unit, uint64_t start, uint64_t done, uint8_t flag,
                       std::initializer_list<MemRange> ranges, RaceDetector* target = nullptr);

    uint32_t m_id;
    const BoardConfig& m_cfg;
    const CoreConfig& m_core;
    SparseMemory& m_hbm;
    SparseMemory& m_vmem;
    SparseMemory m_smem;
    CoreEnv* m_env;
    std::unique_ptr<HbmTimingModel> m_own_hbm_timing;
    HbmTimingModel* m_hbm_timing;

    std::vector<isa::Instr> m_program;
    std::array<uint32_t, isa::kNumSregs> m_sregs{};
    std::array<uint64_t, isa::kNumFlags> m_flags{};
    /// A scheduled flag increment.
    struct PendingFlag {
        uint64_t cycle;
        uint32_t flag, amount;
    };
    /// Scheduled increments, sorted by cycle. A flat vector: it holds only the in-flight
    /// completions (a few dozen at most), and a tree node per unit instruction cost an
    /// allocation each.
    std::vector<PendingFlag> m_pending;
    /// Folds increments due by the current cycle into m_flags, keeping m_pending short.
    void apply_due();

    uint32_t m_pc = 0;
    uint64_t m_cycle = 0;
    uint64_t m_start_cycle = 0;  ///< cycle of the current launch
    HbmWindows m_windows;  ///< the HBM window map (hbm.map), reset at each launch
    bool m_running = false;
    RaceDetector m_race{m_id};
    uint64_t m_seq = 0;   ///< unit instructions issued (race detector order)
    uint32_t m_poll = 0;  ///< instructions since the last CoreEnv::stop_requested() poll
    std::optional<FaultInfo> m_fault;
    bool m_blocked = false;     ///< stopped in a wait that needs simulated time
    uint64_t m_blocked_at = 0;  ///< cycle the blocked wait issued
    uint64_t m_units_done = 0;  ///< latest done cycle of any unit instruction (for fence/halt)

    std::unique_ptr<UnitQueue> m_dma_q, m_vpu_q, m_ici_q;
    std::vector<std::unique_ptr<UnitQueue>> m_mxu_q;
    std::vector<MxuTimer> m_mxu_timer;
    std::vector<std::string> m_mxu_units;  ///< "mxu0", "mxu1", ...: fault and race reports
    std::vector<MxuTile> m_mxu_weights;    ///< weights of the latest mxu.lw
    std::vector<uint16_t> m_mxu_lhs;  ///< scratch: an mxu.mm's LHS (kept to avoid reallocation)
    std::vector<float> m_mxu_out;     ///< scratch: an mxu.mm's results
    std::array<std::vector<float>, 3> m_vpu_in;  ///< scratch: VPU inputs the result overlaps
    std::vector<float> m_vpu_out;  ///< scratch: the VPU result when VMEM is not contiguous
    std::vector<std::pair<uint32_t, uint32_t>> m_mxu_shape;  ///< (K, N) of those weights
    std::vector<bool> m_mxu_loaded;
    std::unique_ptr<Hazards> m_dma_hz, m_vpu_hz;
    DmaEngine m_dma;  ///< DMA timing in front of the HBM model
    VpuTimer m_vpu;   ///< VPU issue slot and latencies
    IciEngine m_ici;  ///< ICI descriptor rate (in-order delivery is the board's)
    /// An ICI instruction whose done the board has not resolved yet.
    struct IciWait {
        uint64_t seq;          ///< IciPost::seq
        uint32_t pc;           ///< its pc (trace)
        uint32_t dst;          ///< destination core (trace, remote race record)
        uint64_t start;        ///< cycle the engine started it
        uint8_t flag;          ///< this core's completion flag
        size_t record;         ///< index in m_records, or SIZE_MAX
        uint64_t race_local;   ///< race-detector seq of the local read (UINT64_MAX: none)
        uint64_t race_remote;  ///< of the destination's record (UINT64_MAX: none)
    };
    std::deque<IciWait> m_ici_wait;  ///< in issue order (the board resolves them in order)
    uint64_t m_ici_seq = 0;          ///< ICI instructions issued in this launch

    CoreStats m_stats;
    std::vector<std::unique_ptr<sim::StatGroup>> m_stat_groups;  ///< core first, then its units
    bool m_record = false;
    std::vector<bool> m_record_only;  ///< record(on, only): the pcs recorded (empty: all)
    bool recording() const {
        return m_record &&
               (m_record_only.empty() || (m_pc < m_record_only.size() && m_record_only[m_pc]));
    }
    std::vector<InstrRecord> m_records;
    sim::Tracer* m_tracer = nullptr;
    /// Tracer track of each unit (-1: not traced).
    struct UnitTracks {
        int seq = -1, dma = -1, vpu = -1, ici = -1;
        std::vector<int> mxu;  ///< per MXU
    } m_tracks;
    std::unique_ptr<CounterTrack> m_mxu_util;     ///< trace counter: MXU PE utilisation
    std::unique_ptr<CounterTrack> m_hbm_gbps;     ///< trace counter: HBM traffic in GB/s
    std::unique_ptr<CounterTrack> m_queue_depth;  ///< trace counter: instructions queued
};

}  // namespace tpu::hw
