// SPDX-License-Identifier: Apache-2.0
#include "hw/core/core_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "hw/board_config.h"
#include "hw/core/numerics.h"
#include "hw/mem/hbm_timing.h"
#include "isa/disassembler.h"
#include "isa/scalar_alu.h"
#include "sim/stat_names.h"
#include "sim/tracer.h"

namespace tpu::hw {

using isa::Opcode;

/// In-order unit queue: entries occupy a slot from issue until their unit starts them.
struct CoreModel::UnitQueue {
    std::deque<uint64_t> starts;  ///< start cycles of entries not yet started, oldest first
    uint64_t last_start = 0;      ///< start of the previous instruction (in-order issue)
};

/// Byte ranges written by a unit's in-flight instructions: a later instruction of the same
/// unit that reads or writes them waits for the writer's done cycle (RAW and WAW). WAR needs
/// no wait because reads happen at start and starts are in order.
struct CoreModel::Hazards {
    struct Range {
        bool hbm;
        uint64_t lo, hi, done;
    };
    std::vector<Range> writes;

    uint64_t ready_after(bool hbm, uint64_t lo, uint64_t hi, uint64_t from) const {
        uint64_t t = from;
        for (const Range& r : writes)
            if (r.hbm == hbm && lo < r.hi && r.lo < hi) t = std::max(t, r.done);
        return t;
    }
    void add(bool hbm, uint64_t lo, uint64_t hi, uint64_t done, uint64_t now) {
        // Writers that finished before the current issue cycle can no longer delay anyone.
        std::erase_if(writes, [now](const Range& r) { return r.done <= now; });
        writes.push_back({hbm, lo, hi, done});
    }
};

namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

/// Span of a 2-D access: rows of row_bytes, `stride` apart.
uint64_t span_2d(uint64_t rows, uint64_t row_bytes, uint64_t stride) {
    return rows == 0 ? 0 : (rows - 1) * stride + row_bytes;
}

float max_nan(float x, float y) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<float>::quiet_NaN();
    return x > y ? x : y;
}
float min_nan(float x, float y) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<float>::quiet_NaN();
    return x < y ? x : y;
}

}  // namespace

CoreModel::CoreModel(uint32_t id, const BoardConfig& cfg, SparseMemory& hbm, SparseMemory& vmem,
                     CoreEnv* env, HbmTimingModel* hbm_timing)
    : m_id(id),
      m_cfg(cfg),
      m_core(cfg.core),
      m_hbm(hbm),
      m_vmem(vmem),
      m_smem(fmt::format("core{}.smem", id), cfg.core.smem_bytes),
      m_env(env),
      m_own_hbm_timing(hbm_timing ? nullptr : make_hbm_timing(cfg)),
      m_hbm_timing(hbm_timing ? hbm_timing : m_own_hbm_timing.get()),
      m_dma_q(std::make_unique<UnitQueue>()),
      m_vpu_q(std::make_unique<UnitQueue>()),
      m_ici_q(std::make_unique<UnitQueue>()),
      m_dma_hz(std::make_unique<Hazards>()),
      m_vpu_hz(std::make_unique<Hazards>()),
      m_dma(cfg.core, m_hbm_timing),
      m_vpu(cfg.core) {
    for (uint32_t i = 0; i < m_core.mxus; ++i) {
        m_mxu_q.push_back(std::make_unique<UnitQueue>());
        m_mxu_timer.emplace_back(m_core.mxu_rows, m_core.mxu_cols, m_core.mxu_swap_drains);
        m_mxu_units.push_back(fmt::format("mxu{}", i));
    }
    m_mxu_weights.resize(m_core.mxus);
    m_mxu_shape.resize(m_core.mxus);
    m_mxu_loaded.assign(m_core.mxus, false);
    m_stats.mxu_busy.assign(m_core.mxus, 0);
    m_stats.mxu_macs.assign(m_core.mxus, 0);
}

CoreModel::~CoreModel() = default;

sim::StatGroup& CoreModel::register_stats(sim::StatGroup& parent) {
    namespace n = sim::stat_names;
    using sim::StatUnit;
    m_stat_groups.clear();
    auto group = [&](std::string name, sim::StatGroup& up) -> sim::StatGroup& {
        return *m_stat_groups.emplace_back(std::make_unique<sim::StatGroup>(std::move(name), &up));
    };
    const CoreStats& s = m_stats;
    sim::StatGroup& core = group(fmt::format("{}{}", n::kCorePrefix, m_id), parent);
    core.add(std::string(n::kInstructions), "instructions issued", StatUnit::Count, s.instructions);
    core.add("stall_queue_cycles", "sequencer cycles stalled on a full unit queue",
             StatUnit::Cycles, s.stall_queue);
    core.add("stall_wait_cycles", "sequencer cycles stalled in wait or fence", StatUnit::Cycles,
             s.stall_wait);
    sim::StatGroup& dma = group(std::string(n::kDma), core);
    dma.add("ops", "DMA instructions", StatUnit::Count, s.dma_ops);
    dma.add(std::string(n::kHbmReadBytes), "bytes read from HBM by DMA", StatUnit::Bytes,
            s.hbm_read_bytes);
    dma.add(std::string(n::kHbmWriteBytes), "bytes written to HBM by DMA", StatUnit::Bytes,
            s.hbm_write_bytes);
    sim::StatGroup& vpu = group(std::string(n::kVpu), core);
    vpu.add("ops", "VPU instructions", StatUnit::Count, s.vpu_ops);
    vpu.add("busy_cycles", "VPU issue cycles", StatUnit::Cycles, s.vpu_busy);
    vpu.add(std::string(n::kFlops), "VPU fp32 operations", StatUnit::Flops, s.vpu_flops);
    sim::StatGroup& ici = group(std::string(n::kIci), core);
    ici.add("ops", "ICI instructions", StatUnit::Count, s.ici_ops);
    ici.add("bytes", "bytes sent over ICI", StatUnit::Bytes, s.ici_bytes);
    core.add("mxu_ops", "MXU instructions (mxu.lw and mxu.mm, both MXUs)", StatUnit::Count,
             s.mxu_ops);
    for (size_t i = 0; i < s.mxu_macs.size(); ++i) {
        sim::StatGroup& mxu = group(fmt::format("{}{}", n::kMxuPrefix, i), core);
        mxu.add("busy_cycles", "cycles streaming LHS rows", StatUnit::Cycles, s.mxu_busy[i]);
        mxu.add("macs", "useful multiply-accumulates", StatUnit::Count, s.mxu_macs[i]);
        mxu.add(std::string(n::kFlops), "2 x useful multiply-accumulates", StatUnit::Flops,
                [&s, i] { return 2 * s.mxu_macs[i]; });
    }
    return core;
}

void CoreModel::load(const isa::Program& program) {
    const uint64_t bytes = program.code.size() * uint64_t(isa::kInstrBytes);
    if (bytes > m_core.imem_bytes)
        throw std::invalid_argument(fmt::format(
            "core {}: program of {} instructions ({} bytes) does not fit in instruction memory "
            "({} bytes, core.imem_bytes)",
            m_id, program.code.size(), bytes, m_core.imem_bytes));
    // A program built in memory (an embedder's, not the assembler's or decoder's) may hold a
    // register or flag number that would index past the core's files: refuse it here.
    for (size_t i = 0; i < program.code.size(); ++i) {
        try {
            isa::validate(program.code[i], i);
        } catch (const isa::DecodeError& e) {
            throw std::invalid_argument(fmt::format("core {}: program: {}", m_id, e.what()));
        }
    }
    m_program = program.code;
}

void CoreModel::start(uint64_t cycle, const std::vector<uint32_t>& args) {
    if (args.size() >= isa::kNumSregs)
        throw std::invalid_argument(
            fmt::format("core {}: {} launch arguments; at most {} fit "
                        "in s1..s{}",
                        m_id, args.size(), isa::kNumSregs - 1, isa::kNumSregs - 1));
    m_sregs.fill(0);
    for (size_t i = 0; i < args.size(); ++i) m_sregs[i + 1] = args[i];
    m_flags.fill(0);
    m_pending.clear();
    m_pc = 0;
    m_start_cycle = cycle;
    m_fault.reset();
    m_race.clear();
    m_seq = 0;
    m_blocked = false;
    m_cycle = cycle;
    m_windows.reset();
    m_units_done = cycle;
    m_running = true;
    for (auto* q : {m_dma_q.get(), m_vpu_q.get(), m_ici_q.get()}) *q = UnitQueue{{}, cycle};
    for (auto& q : m_mxu_q) *q = UnitQueue{{}, cycle};
    for (auto& t : m_mxu_timer)
        t = MxuTimer(m_core.mxu_rows, m_core.mxu_cols, m_core.mxu_swap_drains);
    m_mxu_loaded.assign(m_core.mxus, false);
    m_dma.start_at(cycle);
    m_vpu.start_at(cycle);
    m_ici.start_at(cycle);
    m_ici_wait.clear();
    m_ici_seq = 0;
    m_dma_hz->writes.clear();
    m_vpu_hz->writes.clear();
    m_records.clear();
}

void CoreModel::set_tracer(sim::Tracer* tracer) {
    m_tracer = tracer && tracer->enabled() ? tracer : nullptr;
    m_tracks = {};
    m_mxu_util.reset();
    m_hbm_gbps.reset();
    m_queue_depth.reset();
    if (!m_tracer) return;
    const std::string proc = fmt::format("core{}", m_id);
    m_tracks.seq = m_tracer->track(proc, "seq");
    m_tracks.dma = m_tracer->track(proc, "dma");
    m_tracks.vpu = m_tracer->track(proc, "vpu");
    m_tracks.ici = m_tracer->track(proc, "ici");
    for (uint32_t i = 0; i < m_core.mxus; ++i)
        m_tracks.mxu.push_back(m_tracer->track(proc, fmt::format("mxu{}", i)));
    const uint64_t window = m_cfg.sim.trace_counter_cycles;
    m_mxu_util = std::make_unique<CounterTrack>(proc, "mxu_utilization", window, 1.0 / m_core.mxus);
    // bytes per cycle -> GB/s at the core clock.
    m_hbm_gbps = std::make_unique<CounterTrack>(proc, "hbm_gbps", window, m_cfg.clock().hz() / 1e9);
    // Cycles spent queued per cycle: the average number of instructions waiting in the unit
    // queues (dispatched, not started).
    m_queue_depth = std::make_unique<CounterTrack>(proc, "queue_depth", window, 1.0);
}

void CoreModel::trace_queued(uint64_t start) {
    const uint64_t queued = m_cycle + m_core.dispatch_cycles;
    if (start > queued) {
        m_queue_depth->add(queued, start, double(start - queued));
        m_queue_depth->flush_before(m_cycle, *m_tracer);
    }
}

void CoreModel::trace(int track, uint64_t start, uint64_t done, std::string_view key,
                      uint64_t detail) {
    if (!m_tracer || track < 0) return;
    trace_queued(start);
    const auto& oi = isa::info(m_program[m_pc].op);
    if (key.empty())
        m_tracer->complete(track, oi.mnemonic, start, done, {{"pc", uint64_t(m_pc)}});
    else
        m_tracer->complete(track, oi.mnemonic, start, done,
                           {{"pc", uint64_t(m_pc)}, {key, detail}});
}

bool CoreModel::fault(std::string unit, uint64_t address, std::string what) {
    FaultInfo f;
    f.core = m_id;
    f.pc = m_pc;
    f.instruction = m_pc < m_program.size() ? isa::to_string(m_program[m_pc]) : "<none>";
    f.unit = std::move(unit);
    f.address = address;
    f.cycle = m_cycle;
    f.what = std::move(what);
    // Recorded, not thrown: this runs on a SystemC thread stack, and unwinding across
    // QuickThreads stacks is what AddressSanitizer cannot follow.
    m_fault = std::move(f);
    m_running = false;
    return false;
}

bool CoreModel::check(SparseMemory& mem, uint64_t addr, uint64_t bytes, std::string_view unit,
                      std::string_view what, uint32_t align) {
    if (bytes == 0) return fault(std::string(unit), addr, fmt::format("{} of 0 bytes", what));
    if (!mem.in_range(addr, bytes))
        return fault(std::string(unit), addr,
                     fmt::format("{} of {} bytes at 0x{:x} is outside {} ({} bytes)", what, bytes,
                                 addr, mem.name(), mem.size()));
    if (addr % align != 0)
        return fault(std::string(unit), addr,
                     fmt::format("{} at 0x{:x} is not {}-byte aligned", what, addr, align));
    return true;
}

uint64_t CoreModel::flag_value(uint32_t flag, uint64_t cycle) const {
    uint64_t v = m_flags[flag];
    for (auto it = m_pending.begin(); it != m_pending.end() && it->cycle <= cycle; ++it)
        if (it->flag == flag) v += it->amount;
    return v;
}

uint64_t CoreModel::next_flag_event(uint64_t now) const {
    const auto it = std::upper_bound(m_pending.begin(), m_pending.end(), now,
                                     [](uint64_t c, const PendingFlag& p) { return c < p.cycle; });
    return it == m_pending.end() ? kNever : it->cycle;
}

void CoreModel::schedule_flag(uint32_t flag, uint32_t amount, uint64_t cycle) {
    // Behind increments of the same cycle (their order changes no sum). Completions mostly
    // arrive in cycle order, so the insertion point is near the end.
    const auto it = std::upper_bound(m_pending.begin(), m_pending.end(), cycle,
                                     [](uint64_t c, const PendingFlag& p) { return c < p.cycle; });
    m_pending.insert(it, {cycle, flag, amount});
}

void CoreModel::apply_due() {
    // m_cycle never decreases, so increments due by now can be folded in for good.
    auto it = m_pending.begin();
    for (; it != m_pending.end() && it->cycle <= m_cycle; ++it) m_flags[it->flag] += it->amount;
    m_pending.erase(m_pending.begin(), it);
}

uint64_t CoreModel::issue_to_unit(UnitQueue& q) {
    // A full queue stalls issue until its oldest entry starts and frees the slot.
    while (!q.starts.empty() && q.starts.front() <= m_cycle) q.starts.pop_front();
    if (q.starts.size() >= m_core.queue_depth) {
        const uint64_t free_at = q.starts[q.starts.size() - m_core.queue_depth];
        m_stats.stall_queue += free_at - m_cycle;
        m_cycle = free_at;
        while (!q.starts.empty() && q.starts.front() <= m_cycle) q.starts.pop_front();
    }
    return std::max(m_cycle + m_core.dispatch_cycles, q.last_start);
}

bool CoreModel::record_access(std::string_view unit, uint64_t start, uint64_t done, uint8_t flag,
                              std::initializer_list<MemRange> ranges, RaceDetector* target) {
    return !m_cfg.sim.race_detector ||
           record_access(unit, start, done, flag, std::vector<MemRange>(ranges), target);
}

bool CoreModel::record_access(std::string_view unit, uint64_t start, uint64_t done, uint8_t flag,
                              std::vector<MemRange> ranges, RaceDetector* target) {
    if (!m_cfg.sim.race_detector) return true;
    AccessRecord r;
    r.core = m_id;
    r.pc = m_pc;
    r.instr = m_program[m_pc];
    r.unit = std::string(unit);
    r.seq = m_seq++;
    r.issue = m_cycle;
    r.done = done;
    r.flag = flag;
    r.ranges = std::move(ranges);
    (void)start;
    if (auto report = (target ? *target : m_race).add(std::move(r)))
        return fault("race-detector", 0, std::move(*report));
    return true;
}

void CoreModel::finish_unit(UnitQueue& q, uint64_t start, uint64_t done, uint8_t flag) {
    q.starts.push_back(start);
    q.last_start = start;
    if (flag != isa::kNoFlag) schedule_flag(flag, 1, done);
    m_units_done = std::max(m_units_done, done);
    if (recording()) m_records.push_back({m_pc, m_program[m_pc].op, m_cycle, start, done});
}

namespace {
/// Instructions between stop polls: a poll reads the host clock (~20 ns), so 4096 keeps its
/// cost negligible while a spinning core still stops within a millisecond.
constexpr uint32_t kStopPollInstructions = 4096;
}  // namespace

CoreModel::Status CoreModel::run(uint64_t now) {
    if (m_fault) return {Block::Faulted, m_cycle};
    if (!m_running) return {Block::Halted, m_cycle};
    // Resuming a wait that needed simulated time: the stall lasted until now.
    if (m_blocked && now > m_cycle) {
        m_stats.stall_wait += now - m_cycle;
        m_cycle = now;
    }
    const uint64_t limit = m_cfg.sim.max_cycles;
    for (;;) {
        if (m_pc >= m_program.size()) {
            fault("sequencer", m_pc,
                  fmt::format("pc {} is outside the program ({} instructions); a kernel must end "
                              "with halt",
                              m_pc, m_program.size()));
            return {Block::Faulted, m_cycle};
        }
        // A kernel that spins without halting would otherwise hold the host for as long as
        // max_cycles allows (hours at ~1 M cycles per host second): poll for a stop.
        if (++m_poll >= kStopPollInstructions) {
            m_poll = 0;
            if (m_env && m_env->stop_requested()) return {Block::Sync, m_cycle};
        }
        if (limit && m_cycle - m_start_cycle > limit) {
            fault("sequencer", 0,
                  fmt::format("the launch ran past sim.max_cycles = {} cycles without halting",
                              limit));
            return {Block::Faulted, m_cycle};
        }
        const isa::Instr& ins = m_program[m_pc];
        const isa::Unit unit = isa::info(ins.op).unit;
        const uint64_t issue = m_cycle;
        uint32_t next = m_pc + 1;
        auto inline_done = [&] {
            if (recording()) m_records.push_back({m_pc, ins.op, issue, issue, issue + 1});
            m_cycle = issue + 1;
        };
        switch (unit) {
            case isa::Unit::Scalar: {
                const uint32_t b = val(ins.ops[1]);
                const uint32_t c = val(ins.ops[2]);
                uint32_t r = 0;
                bool write = true;
                if (const auto alu = isa::scalar_alu(ins.op, b, c)) {
                    if (alu->div_by_zero) {
                        fault("sequencer", 0, "division by zero");
                        return {Block::Faulted, m_cycle};
                    }
                    if (ins.ops[0].reg != 0) m_sregs[ins.ops[0].reg] = alu->value;
                    inline_done();
                    break;
                }
                switch (ins.op) {
                    case Opcode::Nop:
                        write = false;
                        break;
                    case Opcode::Halt: {
                        // Its end needs the done of every ICI instruction the board has not
                        // resolved yet: wait for the board, in simulated time.
                        if (!m_ici_wait.empty())
                            return {now < m_cycle ? Block::Sync : Block::WaitFlag, m_cycle};
                        const uint64_t end = std::max(issue, m_units_done);
                        if (recording()) m_records.push_back({m_pc, ins.op, issue, issue, end});
                        if (m_tracer) {
                            m_tracer->instant(m_tracks.seq, "halt", end);
                            m_mxu_util->flush_all(*m_tracer);
                            m_hbm_gbps->flush_all(*m_tracer);
                            m_queue_depth->flush_all(*m_tracer);
                        }
                        m_cycle = end;
                        m_running = false;
                        ++m_stats.instructions;
                        return {Block::Halted, end};
                    }
                    case Opcode::Lw:
                        if (!check(m_smem, b, 4, "sequencer", "scalar memory read", 4))
                            return {Block::Faulted, m_cycle};
                        m_smem.read(b, {reinterpret_cast<uint8_t*>(&r), 4});
                        break;
                    case Opcode::Sw: {
                        const uint32_t v = val(ins.ops[0]);
                        if (!check(m_smem, b, 4, "sequencer", "scalar memory write", 4))
                            return {Block::Faulted, m_cycle};
                        m_smem.write(b, {reinterpret_cast<const uint8_t*>(&v), 4});
                        write = false;
                        break;
                    }
                    case Opcode::CoreId:
                        r = m_id;
                        break;
                    case Opcode::NCores:
                        r = m_env ? m_env->num_cores() : 1;
                        break;
                    case Opcode::HbmMap: {
                        // DMA and ICI instructions translate at issue: those in flight keep
                        // the map they were issued with.
                        const uint32_t w = val(ins.ops[0]);
                        if (w >= isa::kHbmWindows) {
                            fault("sequencer", w,
                                  fmt::format("hbm.map: window {} does not exist (0..{})", w,
                                              isa::kHbmWindows - 1));
                            return {Block::Faulted, m_cycle};
                        }
                        m_windows.map(w, val(ins.ops[1]));
                        write = false;
                        break;
                    }
                    default:
                        write = false;
                        break;
                }
                if (write && ins.ops[0].reg != 0) m_sregs[ins.ops[0].reg] = r;
                inline_done();
                break;
            }
            case isa::Unit::Branch: {
                const auto a = static_cast<int32_t>(val(ins.ops[0]));
                const auto b = static_cast<int32_t>(val(ins.ops[1]));
                bool taken = false;
                uint32_t target = static_cast<uint32_t>(ins.ops[2].imm);
                switch (ins.op) {
                    case Opcode::Jmp:
                        taken = true, target = static_cast<uint32_t>(ins.ops[0].imm);
                        break;
                    case Opcode::Beq:
                        taken = a == b;
                        break;
                    case Opcode::Bne:
                        taken = a != b;
                        break;
                    case Opcode::Blt:
                        taken = a < b;
                        break;
                    case Opcode::Bge:
                        taken = a >= b;
                        break;
                    case Opcode::Bltu:
                        taken = uint32_t(a) < uint32_t(b);
                        break;
                    default:
                        break;
                }
                if (taken) next = target;
                inline_done();
                break;
            }
            case isa::Unit::Sync: {
                const uint32_t f = static_cast<uint32_t>(ins.ops[0].imm);
                const uint32_t v = val(ins.ops[1]);
                switch (ins.op) {
                    case Opcode::Wait: {
                        apply_due();
                        if (flag_value(f, m_cycle) < v) {
                            // Another core may raise the flag earlier than anything scheduled
                            // here, so undecided waits happen in simulated time.
                            if (!m_blocked) m_blocked = true, m_blocked_at = m_cycle;
                            if (now < m_cycle) return {Block::Sync, m_cycle};
                            return {Block::WaitFlag, m_cycle};
                        }
                        const uint64_t issued = m_blocked ? m_blocked_at : issue;
                        m_blocked = false;
                        if (m_cfg.sim.race_detector)
                            m_race.acknowledge(static_cast<uint8_t>(f), m_cycle);
                        if (recording())
                            m_records.push_back({m_pc, ins.op, issued, m_cycle, m_cycle + 1});
                        m_cycle += 1;
                        break;
                    }
                    case Opcode::Signal:
                        m_flags[f] += v;
                        inline_done();
                        break;
                    case Opcode::Fset: {
                        // Increments already due are overwritten; later ones add to the value.
                        apply_due();
                        m_flags[f] = v;
                        inline_done();
                        break;
                    }
                    case Opcode::Fence: {
                        if (!m_ici_wait.empty())
                            return {now < m_cycle ? Block::Sync : Block::WaitFlag, m_cycle};
                        const uint64_t at = std::max(m_cycle, m_units_done);
                        m_stats.stall_wait += at - m_cycle;
                        if (m_cfg.sim.race_detector) m_race.fence(at);
                        if (recording()) m_records.push_back({m_pc, ins.op, issue, at, at + 1});
                        m_cycle = at + 1;
                        break;
                    }
                    default:
                        break;
                }
                break;
            }
            case isa::Unit::Dma:
            case isa::Unit::Mxu:
            case isa::Unit::Vpu: {
                const bool ok = unit == isa::Unit::Dma   ? exec_dma(ins)
                                : unit == isa::Unit::Mxu ? exec_mxu(ins)
                                                         : exec_vpu(ins);
                if (!ok) return {Block::Faulted, m_cycle};
                m_cycle += 1;
                break;
            }
            case isa::Unit::Ici: {
                const IciStep step = exec_ici(ins, now);
                if (step == IciStep::Faulted) return {Block::Faulted, m_cycle};
                if (step == IciStep::NeedSync) return {Block::Sync, m_cycle};
                m_cycle += 1;
                break;
            }
        }
        ++m_stats.instructions;
        m_pc = next;
    }
}

CoreModel::Status CoreModel::run_alone() {
    uint64_t now = m_cycle;
    for (;;) {
        const Status st = run(now);
        if (st.block == Block::Halted || st.block == Block::Faulted) return st;
        if (st.block == Block::Sync) {
            now = st.cycle;
            continue;
        }
        const uint64_t t = next_flag_event(now);
        if (t == kNever) return st;
        now = t;
    }
}

bool CoreModel::exec_dma(const isa::Instr& ins) {
    const uint32_t dst = val(ins.ops[0]), src = val(ins.ops[1]);
    const uint64_t rows = val(ins.ops[2]), row_bytes = val(ins.ops[3]);
    const uint64_t dst_stride = val(ins.ops[4]), src_stride = val(ins.ops[5]);
    const bool to_smem = ins.op == Opcode::DmaHs;
    const bool to_vmem = ins.op != Opcode::DmaVh && !to_smem;
    const bool from_hbm = ins.op == Opcode::DmaHv || to_smem;
    const bool hbm_side = ins.op != Opcode::DmaVv;

    SparseMemory& dmem = to_smem ? m_smem : to_vmem ? m_vmem : m_hbm;
    SparseMemory& smem = from_hbm ? m_hbm : m_vmem;
    // HBM addresses through the window map (hw/core/hbm_windows.h); the other side as it is.
    const uint64_t hv = from_hbm ? src : dst, ov = from_hbm ? dst : src;
    const uint64_t hstride = from_hbm ? src_stride : dst_stride;
    const uint64_t ostride = from_hbm ? dst_stride : src_stride;
    const uint64_t hph = hbm_side ? m_windows.phys(hv) : hv;
    const uint64_t dbase = from_hbm ? ov : hph;
    if (rows == 0 || row_bytes == 0)
        return fault("dma", ins.op == Opcode::DmaVv ? uint64_t(dst) : dbase,
                     fmt::format("zero-length transfer ({} rows of {} bytes)", rows, row_bytes));
    // The transfer as pieces whose HBM side lies in one window each: one piece unless a row or
    // the rows cross a window boundary (then a run of rows per window, a crossing row split).
    struct Piece {
        uint64_t h, o, rows, row_bytes;  ///< HBM byte (physical), other side's address
    };
    std::vector<Piece> split;
    Piece one{hph, ov, rows, row_bytes};
    std::span<const Piece> pieces(&one, 1);
    if (hbm_side && !HbmWindows::one_window(hv, span_2d(rows, row_bytes, hstride))) {
        m_windows.pieces_2d(hv, rows, row_bytes, hstride,
                            [&](uint64_t r, uint64_t skip, uint64_t ph, uint64_t n, uint64_t len) {
                                split.push_back({ph, ov + r * ostride + skip, n, len});
                            });
        pieces = split;
    }
    const auto hspan = [&](const Piece& p) { return span_2d(p.rows, p.row_bytes, hstride); };
    const auto ospan = [&](const Piece& p) { return span_2d(p.rows, p.row_bytes, ostride); };
    for (const Piece& p : pieces) {
        const uint64_t pd = from_hbm ? p.o : p.h, ps = from_hbm ? p.h : p.o;
        if (!check(dmem, pd, from_hbm ? ospan(p) : hspan(p), "dma",
                   to_smem   ? "scalar memory write"
                   : to_vmem ? "VMEM write"
                             : "HBM write") ||
            !check(smem, ps, from_hbm ? hspan(p) : ospan(p), "dma",
                   from_hbm ? "HBM read" : "VMEM read"))
            return false;
    }
    if (rows > 1 && (dst_stride < row_bytes || src_stride < row_bytes))
        return fault("dma", dbase,
                     fmt::format("row stride ({} dst, {} src) is smaller than the row "
                                 "({} bytes), so rows would overlap",
                                 dst_stride, src_stride, row_bytes));

    const uint64_t bytes = rows * row_bytes;
    uint64_t start = std::max(issue_to_unit(*m_dma_q), m_dma.free_at());
    std::vector<MemRange> ranges;
    if (!hbm_side) {
        const uint64_t dspan = span_2d(rows, row_bytes, dst_stride);
        const uint64_t sspan = span_2d(rows, row_bytes, src_stride);
        start = m_dma_hz->ready_after(false, src, src + sspan, start);
        start = m_dma_hz->ready_after(false, dst, dst + dspan, start);
        ranges = {{false, src, src + sspan, false}, {false, dst, dst + dspan, true}};
    } else {
        for (const Piece& p : pieces) {
            start = m_dma_hz->ready_after(true, p.h, p.h + hspan(p), start);
            // Scalar memory is no VMEM or HBM range: the sequencer's `lw` after a `wait` on the
            // DMA's flag is what orders it (the program's duty, as for any completion flag).
            if (!to_smem) start = m_dma_hz->ready_after(false, p.o, p.o + ospan(p), start);
            // Source first, as the race detector's reports name them.
            const MemRange h{true, p.h, p.h + hspan(p), !from_hbm};
            if (from_hbm) ranges.push_back(h);
            if (!to_smem) ranges.push_back({false, p.o, p.o + ospan(p), from_hbm});
            if (!from_hbm) ranges.push_back(h);
        }
    }
    // Timing: DmaEngine (hw/core/dma_engine.h) and the HBM model behind it; the pieces of a
    // transfer that crosses a window boundary one after the other, each at its physical address.
    uint64_t done = 0;
    if (!hbm_side) {
        done = m_dma.copy_vmem(start, bytes);
        m_dma_hz->add(false, dst, dst + span_2d(rows, row_bytes, dst_stride), done, m_cycle);
    } else {
        uint64_t at = start;
        for (const Piece& p : pieces) {
            at = std::max(at, m_dma.free_at());
            done = std::max(done,
                            m_dma.transfer_hbm(at, p.rows, p.row_bytes, p.h, hstride, !from_hbm));
        }
        if (!to_smem)
            for (const Piece& p : pieces) {
                if (from_hbm)
                    m_dma_hz->add(false, p.o, p.o + ospan(p), done, m_cycle);
                else
                    m_dma_hz->add(true, p.h, p.h + hspan(p), done, m_cycle);
            }
    }
    if (m_cfg.sim.race_detector && !record_access("dma", start, done, ins.flag, std::move(ranges)))
        return false;

    if (m_cfg.sim.functional) {
        // Straight from the source span where there is one (write() is a memmove, so a row
        // that overlaps itself in VMEM moves as through a copy).
        const auto copy = [&](uint64_t d, uint64_t s, uint64_t n, uint64_t ds, uint64_t ss,
                              uint64_t len) {
            std::vector<uint8_t> row(smem.contiguous() ? 0 : len);
            for (uint64_t r = 0; r < n; ++r) {
                if (smem.contiguous()) {
                    dmem.write(d + r * ds, {smem.data(s + r * ss), len});
                } else {
                    smem.read(s + r * ss, row);
                    dmem.write(d + r * ds, row);
                }
            }
        };
        if (!hbm_side)
            copy(dst, src, rows, dst_stride, src_stride, row_bytes);
        else
            for (const Piece& p : pieces)
                copy(from_hbm ? p.o : p.h, from_hbm ? p.h : p.o, p.rows, dst_stride, src_stride,
                     p.row_bytes);
    }
    ++m_stats.dma_ops;
    if (from_hbm) m_stats.hbm_read_bytes += bytes;
    if (!to_vmem && !to_smem) m_stats.hbm_write_bytes += bytes;
    trace(m_tracks.dma, start, done, "bytes", bytes);
    if (m_hbm_gbps && ins.op != Opcode::DmaVv) {
        m_hbm_gbps->add(start, done, double(bytes));
        m_hbm_gbps->flush_before(m_cycle, *m_tracer);
    }
    finish_unit(*m_dma_q, start, done, ins.flag);
    return true;
}

bool CoreModel::exec_mxu(const isa::Instr& ins) {
    const uint32_t idx = val(ins.ops[0]);
    if (idx >= m_core.mxus)
        return fault("mxu", idx,
                     fmt::format("MXU {} does not exist (core.mxus = {})", idx, m_core.mxus));
    const std::string& unit = m_mxu_units[idx];
    const uint32_t R = m_core.mxu_rows, C = m_core.mxu_cols;
    UnitQueue& q = *m_mxu_q[idx];
    const uint64_t ready = issue_to_unit(q);
    MxuSpan span;
    if (ins.op == Opcode::MxuLw) {
        const uint32_t addr = val(ins.ops[1]), K = val(ins.ops[2]), N = val(ins.ops[3]);
        if (K == 0 || K > R || N == 0 || N > C)
            return fault(unit, addr,
                         fmt::format("weight tile {}x{} does not fit the {}x{} array "
                                     "(1..{} rows, 1..{} columns)",
                                     K, N, R, C, R, C));
        if (!check(m_vmem, addr, uint64_t(K) * N * 2, unit, "weight read", 2)) return false;
        span = m_mxu_timer[idx].lw(ready);
        if (!record_access(unit, span.start, span.done, ins.flag,
                           {{false, addr, addr + uint64_t(K) * N * 2, false}}))
            return false;
        m_mxu_shape[idx] = {K, N};
        m_mxu_loaded[idx] = true;
        if (m_cfg.sim.functional) {
            // Straight from VMEM where it is one span: load() only reads the tile.
            const uint16_t* tile = nullptr;
            if (m_vmem.contiguous()) {
                tile = reinterpret_cast<const uint16_t*>(m_vmem.data(addr));
            } else {
                auto& w = m_mxu_lhs;  // scratch for the bf16 tile
                w.resize(size_t(K) * N);
                m_vmem.read(addr, {reinterpret_cast<uint8_t*>(w.data()), w.size() * 2});
                tile = w.data();
            }
            m_mxu_weights[idx].load(tile, int(K), int(N));
        }
    } else {
        const uint32_t out = val(ins.ops[1]), lhs = val(ins.ops[2]);
        const uint32_t T = val(ins.ops[3]), acc = val(ins.ops[4]);
        if (!m_mxu_loaded[idx])
            return fault(unit, 0, "mxu.mm without loaded weights (issue mxu.lw first)");
        if (T == 0) return fault(unit, lhs, "matmul of 0 rows");
        if (acc > 1)
            return fault(unit, acc, fmt::format("accumulate operand must be 0 or 1, got {}", acc));
        const auto [K, N] = m_mxu_shape[idx];
        if (!check(m_vmem, lhs, uint64_t(T) * K * 2, unit, "LHS read", 2) ||
            !check(m_vmem, out, uint64_t(T) * N * 4, unit, "result write", 4))
            return false;
        span = m_mxu_timer[idx].mm(ready, T);
        if (!record_access(unit, span.start, span.done, ins.flag,
                           {{false, lhs, lhs + uint64_t(T) * K * 2, false},
                            {false, out, out + uint64_t(T) * N * 4, true}}))
            return false;
        m_stats.mxu_busy[idx] += T;
        m_stats.mxu_macs[idx] += uint64_t(T) * K * N;
        if (m_cfg.sim.functional) {
            const uint64_t lhs_end = lhs + uint64_t(T) * K * 2, out_end = out + uint64_t(T) * N * 4;
            if (m_vmem.contiguous() && (lhs_end <= out || out_end <= lhs)) {
                // In place on VMEM: the operands are disjoint, so reading the LHS while results
                // are written cannot see them, and the copies in and out would only move the
                // same bytes twice more.
                mxu_matmul(reinterpret_cast<const uint16_t*>(m_vmem.data(lhs)), int(T),
                           m_mxu_weights[idx], reinterpret_cast<float*>(m_vmem.data(out)),
                           acc != 0);
            } else {
                // Scratch vectors are only resized: every element is read from VMEM or written
                // by mxu_matmul before use.
                auto& a = m_mxu_lhs;
                a.resize(size_t(T) * K);
                m_vmem.read(lhs, {reinterpret_cast<uint8_t*>(a.data()), a.size() * 2});
                auto& c = m_mxu_out;
                c.resize(size_t(T) * N);
                if (acc) m_vmem.read(out, {reinterpret_cast<uint8_t*>(c.data()), c.size() * 4});
                mxu_matmul(a.data(), int(T), m_mxu_weights[idx], c.data(), acc != 0);
                m_vmem.write(out, {reinterpret_cast<const uint8_t*>(c.data()), c.size() * 4});
            }
        }
    }
    ++m_stats.mxu_ops;
    trace(m_tracks.mxu.empty() ? -1 : m_tracks.mxu[idx], span.start, span.done);
    if (m_mxu_util && ins.op == Opcode::MxuMm) {
        // Useful PE-cycles: the T rows stream for T cycles over K x N of the R x C PEs.
        const auto [K, N] = m_mxu_shape[idx];
        const uint32_t T = val(ins.ops[3]);
        m_mxu_util->add(span.start, span.start + T, double(T) * K * N / (double(R) * C));
        m_mxu_util->flush_before(m_cycle, *m_tracer);
    }
    finish_unit(q, span.start, span.done, ins.flag);
    return true;
}

/// Operand layout of each VPU opcode: which operands are VMEM arrays (read or written), element
/// type and count. Everything the VPU reads is fp32 except v.bf2f's source; only v.f2bf writes
/// bf16.
bool CoreModel::exec_vpu(const isa::Instr& ins) {
    std::array<uint32_t, isa::kMaxOperands> v{};
    for (int i = 0; i < isa::kMaxOperands; ++i) v[i] = val(ins.ops[i]);
    const VpuShape op = vpu_shape(ins.op, v);
    const uint64_t n = op.elements, rows = op.rows, cols = op.cols;
    if (n == 0) return fault("vpu", op.write.addr, "vector operation on 0 elements");
    for (const auto& r : op.reads)
        if (!check(m_vmem, r.addr, r.bytes, "vpu", "VMEM read", r.align)) return false;
    if (!check(m_vmem, op.write.addr, op.write.bytes, "vpu", "VMEM write", op.write.align))
        return false;

    // Timing: VpuTimer (hw/core/vpu_unit.h), after the queue and the unit's RAW/WAW hazards.
    uint64_t start = std::max(issue_to_unit(*m_vpu_q), m_vpu.free_at());
    for (const auto& r : op.reads)
        start = m_vpu_hz->ready_after(false, r.addr, r.addr + r.bytes, start);
    start = m_vpu_hz->ready_after(false, op.write.addr, op.write.addr + op.write.bytes, start);
    const uint64_t issue_cycles = m_vpu.issue_cycles(n);
    const uint64_t done = m_vpu.run(ins.op, n, start);
    m_vpu_hz->add(false, op.write.addr, op.write.addr + op.write.bytes, done, m_cycle);
    if (m_cfg.sim.race_detector) {
        std::vector<MemRange> ranges;
        for (const auto& r : op.reads) ranges.push_back({false, r.addr, r.addr + r.bytes, false});
        ranges.push_back({false, op.write.addr, op.write.addr + op.write.bytes, true});
        if (!record_access("vpu", start, done, ins.flag, std::move(ranges))) return false;
    }

    if (m_cfg.sim.functional) exec_vpu_values(ins, op, rows, cols, n);
    ++m_stats.vpu_ops;
    m_stats.vpu_busy += issue_cycles;
    m_stats.vpu_flops += n;
    trace(m_tracks.vpu, start, done, "elements", n);
    finish_unit(*m_vpu_q, start, done, ins.flag);
    return true;
}

// The values of a VPU instruction, computed in place on VMEM spans. Every operand behaves as if
// read completely before the result is written: an input the result overlaps is copied first,
// unless the op is elementwise over fp32 and the two start at the same address (each result
// element then depends only on the input elements at its own index, read before it is written).
void CoreModel::exec_vpu_values(const isa::Instr& ins, const VpuShape& op, uint64_t rows,
                                uint64_t cols, uint64_t n) {
    const VpuAccess& w = op.write;
    const bool direct = m_vmem.contiguous();
    const bool elementwise = op.elementwise;
    std::array<const void*, 3> in{};
    for (size_t k = 0; k < op.reads.size(); ++k) {
        const VpuAccess& r = op.reads[k];
        const bool overlaps = r.addr < w.addr + w.bytes && w.addr < r.addr + r.bytes;
        if (direct && !(overlaps && !(elementwise && r.addr == w.addr))) {
            in[k] = m_vmem.data(r.addr);
        } else {
            auto& buf = m_vpu_in[k];
            buf.resize(r.bytes / 4 + 1);
            m_vmem.read(r.addr, {reinterpret_cast<uint8_t*>(buf.data()), r.bytes});
            in[k] = buf.data();
        }
    }
    if (!direct) m_vpu_out.resize(w.bytes / 4 + 1);
    void* out_raw = direct ? static_cast<void*>(m_vmem.data(w.addr)) : m_vpu_out.data();
    float* out = static_cast<float*>(out_raw);
    const auto* b = static_cast<const float*>(in[0]);
    const auto* c = static_cast<const float*>(in[1]);
    const auto* d = static_cast<const float*>(in[2]);
    const float s = std::bit_cast<float>(val(ins.ops[2]));
    // One loop per opcode, so each is a plain loop the compiler can vectorise.
    switch (ins.op) {
        case Opcode::VAdd:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] + c[i];
            break;
        case Opcode::VSub:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] - c[i];
            break;
        case Opcode::VMul:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] * c[i];
            break;
        case Opcode::VMax:
            for (uint64_t i = 0; i < n; ++i) out[i] = max_nan(b[i], c[i]);
            break;
        case Opcode::VMin:
            for (uint64_t i = 0; i < n; ++i) out[i] = min_nan(b[i], c[i]);
            break;
        case Opcode::VCmpGt:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] > c[i] ? 1.0f : 0.0f;
            break;
        case Opcode::VSel:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] != 0.0f ? c[i] : d[i];
            break;
        case Opcode::VAddS:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] + s;
            break;
        case Opcode::VMulS:
            for (uint64_t i = 0; i < n; ++i) out[i] = b[i] * s;
            break;
        case Opcode::VMaxS:
            for (uint64_t i = 0; i < n; ++i) out[i] = max_nan(b[i], s);
            break;
        case Opcode::VExp:
            for (uint64_t i = 0; i < n; ++i) out[i] = std::exp(b[i]);
            break;
        case Opcode::VLog:
            for (uint64_t i = 0; i < n; ++i) out[i] = std::log(b[i]);
            break;
        case Opcode::VTanh:
            for (uint64_t i = 0; i < n; ++i) out[i] = std::tanh(b[i]);
            break;
        case Opcode::VRsqrt:
            for (uint64_t i = 0; i < n; ++i) out[i] = 1.0f / std::sqrt(b[i]);
            break;
        case Opcode::VF2Bf: {
            auto* h = static_cast<uint16_t*>(out_raw);
            for (uint64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(b[i]);
            break;
        }
        case Opcode::VBf2F: {
            const auto* h = static_cast<const uint16_t*>(in[0]);
            for (uint64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
            break;
        }
        case Opcode::VRand:
            for (uint64_t i = 0; i < n; ++i) out[i] = vpu_uniform(val(ins.ops[1]), i);
            break;
        case Opcode::VRSum:
            for (uint64_t r = 0; r < rows; ++r) {
                float acc = 0.0f;
                for (uint64_t j = 0; j < cols; ++j) acc = acc + b[r * cols + j];
                out[r] = acc;
            }
            break;
        case Opcode::VRMax:
            for (uint64_t r = 0; r < rows; ++r) {
                float acc = -INFINITY;
                for (uint64_t j = 0; j < cols; ++j) acc = max_nan(acc, b[r * cols + j]);
                out[r] = acc;
            }
            break;
        case Opcode::VCSum:
            std::fill_n(out, cols, 0.0f);
            for (uint64_t r = 0; r < rows; ++r)
                for (uint64_t j = 0; j < cols; ++j) out[j] = out[j] + b[r * cols + j];
            break;
        case Opcode::VTrans: {
            // In tiles, so that neither the reads nor the writes stride through the whole array.
            constexpr uint64_t kTile = 16;
            for (uint64_t r0 = 0; r0 < rows; r0 += kTile)
                for (uint64_t j0 = 0; j0 < cols; j0 += kTile) {
                    const uint64_t r1 = std::min(rows, r0 + kTile), j1 = std::min(cols, j0 + kTile);
                    for (uint64_t r = r0; r < r1; ++r)
                        for (uint64_t j = j0; j < j1; ++j) out[j * rows + r] = b[r * cols + j];
                }
            break;
        }
        case Opcode::VAddRow:
            for (uint64_t r = 0; r < rows; ++r)
                for (uint64_t j = 0; j < cols; ++j) out[r * cols + j] = b[r * cols + j] + c[j];
            break;
        case Opcode::VSubCol:
            for (uint64_t r = 0; r < rows; ++r)
                for (uint64_t j = 0; j < cols; ++j) out[r * cols + j] = b[r * cols + j] - c[r];
            break;
        case Opcode::VMulCol:
            for (uint64_t r = 0; r < rows; ++r)
                for (uint64_t j = 0; j < cols; ++j) out[r * cols + j] = b[r * cols + j] * c[r];
            break;
        default:
            break;
    }
    if (!direct) m_vmem.write(w.addr, {static_cast<const uint8_t*>(out_raw), w.bytes});
}

CoreModel::IciStep CoreModel::exec_ici(const isa::Instr& ins, uint64_t now) {
    const uint32_t dst = val(ins.ops[0]);
    const uint32_t cores = m_env ? m_env->num_cores() : 1;
    if (dst >= cores) {
        fault("ici", dst,
              fmt::format("core {} does not exist (the board has {} cores)", dst, cores));
        return IciStep::Faulted;
    }
    // A core outside the launch runs no program that could wait for the data or the flag, and
    // its memory may belong to the host or another launch: a write there is a kernel bug.
    if (m_env && !std::binary_search(m_env->launched().begin(), m_env->launched().end(), dst)) {
        fault("ici", dst,
              fmt::format("core {} is not in this launch (cores {}): ICI reaches only launched "
                          "cores",
                          dst, fmt::join(m_env->launched(), ",")));
        return IciStep::Faulted;
    }
    // Link reservations must happen in simulated-time order across cores.
    if (now < m_cycle) return IciStep::NeedSync;
    UnitQueue& q = *m_ici_q;
    // Timing: IciEngine (hw/core/ici_engine.h) around the board's IciNetwork.
    const uint64_t start = std::max(issue_to_unit(q), m_ici.free_at());
    m_ici.take(start);
    IciPost post;
    post.issue = m_cycle;
    post.src = m_id;
    post.dst = dst;
    post.seq = m_ici_seq++;
    post.start = start;
    const size_t race_seq = m_seq;
    bool raced = false;  // the race detector holds a local and a remote record of this post
    if (ins.op == Opcode::Sigr) {
        post.signal = true;
        post.flag = static_cast<uint32_t>(ins.ops[1].imm);
        post.amount = val(ins.ops[2]);
    } else {
        const uint32_t raddr = val(ins.ops[1]), laddr = val(ins.ops[2]), bytes = val(ins.ops[3]);
        const bool hbm = ins.op == Opcode::IciH;
        if (!check(m_vmem, laddr, bytes, "ici", "VMEM read")) return IciStep::Faulted;
        SparseMemory& rmem = m_env ? m_env->remote_memory(dst, hbm) : (hbm ? m_hbm : m_vmem);
        if (hbm && !HbmWindows::one_window(raddr, bytes)) {
            // A remote write is one post at one address: a piecewise one is not modelled.
            fault("ici", raddr,
                  fmt::format("remote HBM write of {} bytes at 0x{:x} crosses an HBM window "
                              "boundary (isa/README.md, \"HBM windows\"): not supported for ICI",
                              bytes, raddr));
            return IciStep::Faulted;
        }
        const uint64_t rbase = hbm ? m_windows.phys(raddr) : raddr;
        if (!check(rmem, rbase, bytes, "ici", hbm ? "remote HBM write" : "remote VMEM write"))
            return IciStep::Faulted;
        post.hbm = hbm;
        post.addr = rbase;
        post.bytes = bytes;
        post.flag = static_cast<uint32_t>(ins.ops[4].imm);
        // The done cycles are not known yet: the records carry kIciPending, which no wait can
        // acknowledge, until ici_done() fills them in.
        if (!record_access("ici", start, CoreEnv::kIciPending, ins.flag,
                           {{false, laddr, laddr + bytes, false}}))
            return IciStep::Faulted;
        if (m_env &&
            !record_access("ici", start, CoreEnv::kIciPending, static_cast<uint8_t>(post.flag),
                           {{hbm, rbase, rbase + bytes, true}}, &m_env->remote_race_detector(dst)))
            return IciStep::Faulted;
        raced = m_env && m_cfg.sim.race_detector;
        // The data leaves with the values it has now: the source may overwrite its VMEM before
        // the board writes the destination.
        if (m_cfg.sim.functional) {
            post.data.resize(bytes);
            m_vmem.read(laddr, post.data);
        }
        ++m_stats.ici_ops;
        m_stats.ici_bytes += bytes;
    }
    if (!m_env) {
        // No board: the transfer is a local copy, done one cycle per byte after the start.
        const uint64_t done = m_ici.deliver(dst, post.signal ? start + 1 : start + post.bytes);
        if (!post.signal && !post.data.empty())
            (post.hbm ? m_hbm : m_vmem).write(post.addr, post.data);
        if (!post.signal && m_cfg.sim.race_detector) m_race.set_done(m_id, race_seq, done);
        trace(m_tracks.ici, start, done, "dst_core", dst);
        finish_unit(q, start, done, ins.flag);
        return IciStep::Done;
    }
    if (m_tracer && m_tracks.ici >= 0) trace_queued(start);
    q.starts.push_back(start);
    q.last_start = start;
    const size_t record = recording() ? m_records.size() : SIZE_MAX;
    if (recording()) m_records.push_back({m_pc, ins.op, m_cycle, start, CoreEnv::kIciPending});
    m_ici_wait.push_back({post.seq, m_pc, dst, start, ins.flag, record,
                          raced ? uint64_t(race_seq) : UINT64_MAX,
                          raced ? uint64_t(race_seq + 1) : UINT64_MAX});
    const uint64_t seq = post.seq;
    const uint64_t done = m_env->ici_post(std::move(post));
    if (done != CoreEnv::kIciPending) ici_done(seq, done);
    return IciStep::Done;
}

void CoreModel::mirror_stats(CoreStats stats) {
    // The stats tree views these vectors' elements: keep their storage.
    const auto keep = [](std::vector<uint64_t>& mine, const std::vector<uint64_t>& theirs) {
        std::copy_n(theirs.begin(), std::min(mine.size(), theirs.size()), mine.begin());
    };
    keep(m_stats.mxu_busy, stats.mxu_busy);
    keep(m_stats.mxu_macs, stats.mxu_macs);
    stats.mxu_busy = std::move(m_stats.mxu_busy);
    stats.mxu_macs = std::move(m_stats.mxu_macs);
    m_stats = std::move(stats);
}

void CoreModel::ici_done(uint64_t seq, uint64_t done) {
    // The board resolves a core's posts in issue order, except those it answers at once.
    auto it = std::find_if(m_ici_wait.begin(), m_ici_wait.end(),
                           [seq](const IciWait& w) { return w.seq == seq; });
    if (it == m_ici_wait.end())
        throw std::logic_error(fmt::format("core {}: ICI post {} is not pending", m_id, seq));
    const IciWait w = *it;
    m_ici_wait.erase(it);
    if (w.flag != isa::kNoFlag) schedule_flag(w.flag, 1, done);
    m_units_done = std::max(m_units_done, done);
    if (w.record != SIZE_MAX) m_records[w.record].done = done;
    if (w.race_local != UINT64_MAX) {
        m_race.set_done(m_id, w.race_local, done);
        m_env->remote_race_detector(w.dst).set_done(m_id, w.race_remote, done);
    }
    if (m_tracer && m_tracks.ici >= 0) {
        const auto& oi = isa::info(m_program[w.pc].op);
        m_tracer->complete(m_tracks.ici, oi.mnemonic, w.start, done,
                           {{"pc", uint64_t(w.pc)}, {"dst_core", uint64_t(w.dst)}});
    }
}

std::string CoreModel::dump_state() const {
    std::string s = fmt::format("core {}: {} at cycle {}, pc {}", m_id,
                                m_running ? "running" : "halted", m_cycle, m_pc);
    if (m_pc < m_program.size()) s += fmt::format(" ({})", isa::to_string(m_program[m_pc]));
    std::string flags;
    for (uint32_t f = 0; f < isa::kNumFlags; ++f) {
        const uint64_t v = flag_value(f, m_cycle);
        if (v) flags += fmt::format(" f{}={}", f, v);
    }
    s += flags.empty() ? "; all flags 0" : "; flags" + flags;
    return s;
}

}  // namespace tpu::hw
