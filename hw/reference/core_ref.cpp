// SPDX-License-Identifier: Apache-2.0
#include "hw/reference/core_ref.h"

#include "hw/core/hbm_windows.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "hw/core/vpu_unit.h"
#include "isa/scalar_alu.h"

namespace tpu::hw {

using isa::Opcode;

namespace {

constexpr uint64_t kNever = UINT64_MAX;

/// A byte range [lo, hi) in HBM or VMEM.
struct Range {
    bool hbm = false;
    uint64_t lo = 0, hi = 0;
    bool overlaps(const Range& o) const { return hbm == o.hbm && lo < o.hi && o.lo < hi; }
};

/// Bounding box of `rows` rows of `row_bytes`, `stride` apart, from `base`.
Range box(bool hbm, uint64_t base, uint64_t rows, uint64_t row_bytes, uint64_t stride) {
    return {hbm, base, base + (rows - 1) * stride + row_bytes};
}

/// A written range of an instruction that has started but not completed.
struct Writer {
    size_t rec;
    Range range;
};

/// An instruction in a unit queue, with its operand values read at issue.
struct Entry {
    size_t rec;
    Opcode op;
    uint8_t flag;
    std::array<uint32_t, isa::kMaxOperands> v;
    uint64_t ready;      ///< first cycle the unit may see it (issue + dispatch_cycles)
    HbmWindows windows;  ///< the HBM window map at issue (hbm.map)
};

/// Something that ends at a known cycle of the pipeline it is in.
struct Completion {
    size_t rec;
    uint8_t flag;
    int unit;   ///< whose written range stops being a hazard (kDma, kVpu or an MXU)
    bool tile;  ///< an MXU weight tile became complete (shadow buffer now full)
};

constexpr int kDma = 0;
constexpr int kVpu = 1;
constexpr int kMxu0 = 2;

/// The cycle-stepped machine; one per run.
class Stepper {
public:
    Stepper(const BoardConfig& cfg, const isa::Program& program)
        : m_core(cfg.core), m_prog(program.code) {
        m_queues.resize(kMxu0 + m_core.mxus);
        m_writers.resize(kMxu0 + m_core.mxus);
        m_mxu.resize(m_core.mxus);
        // The simple HBM pipe in integer ticks: one core cycle is `m_ticks_per_cycle` ticks and
        // one byte costs `m_ticks_per_byte`, so B = ticks_per_cycle / ticks_per_byte exactly.
        // B = channels * bus_bits / 8 * 2 [edges] * (1e6 / tck_ps) [MHz] / clock_mhz.
        const double khz = cfg.clock_mhz * 1000.0;
        const auto clock_khz = static_cast<uint64_t>(std::llround(khz));
        if (std::abs(khz - double(clock_khz)) > 1e-9 || clock_khz == 0)
            throw std::invalid_argument("CoreRef: clock_mhz must be a whole number of kHz");
        m_ticks_per_cycle = uint64_t(cfg.hbm.channels) * cfg.hbm.bus_bits * 250'000ull * 1000ull;
        m_ticks_per_byte = uint64_t(cfg.hbm.tck_ps) * clock_khz;
        // ns * MHz / 1000 cycles = ns * kHz / 1e6, rounded up.
        m_hbm_latency = (uint64_t(cfg.hbm.simple_latency_ns) * clock_khz + 999'999) / 1'000'000;
    }

    CoreRefResult run(uint64_t start_cycle, const std::vector<uint32_t>& args,
                      uint64_t max_cycles) {
        if (args.size() >= isa::kNumSregs)
            throw std::invalid_argument("CoreRef: too many launch arguments");
        for (size_t i = 0; i < args.size(); ++i) m_sregs[i + 1] = args[i];
        m_seq_free = start_cycle;
        for (m_now = start_cycle; m_now - start_cycle <= max_cycles; ++m_now) {
            // (1) .. (5) of the class comment.
            complete_due();
            step_units();
            step_sequencer();
            step_units();
            step_hbm();
            if (m_finished) {
                m_result.halted = true;
                m_result.finish = m_now;
                return std::move(m_result);
            }
            // Stuck in a wait with nothing in flight: no flag can ever rise again.
            if (m_wait_since && m_outstanding == 0 && m_events.empty()) break;
        }
        m_result.finish = m_now;
        return std::move(m_result);
    }

private:
    // ---- completions ------------------------------------------------------------------------

    void schedule(uint64_t at, Completion c) { m_events.emplace(at, c); }

    void complete_due() {
        auto it = m_events.begin();
        for (; it != m_events.end() && it->first <= m_now; ++it) {
            const Completion& c = it->second;
            if (c.tile) {
                // The loader wrote the tile's last row last cycle: the shadow is full.
                m_mxu[c.unit - kMxu0].shadow = Shadow::Full;
            }
            m_result.records[c.rec].done = m_now;
            if (c.flag != isa::kNoFlag) m_flags[c.flag] += 1;
            auto& w = m_writers[c.unit];
            std::erase_if(w, [&](const Writer& x) { return x.rec == c.rec; });
            --m_outstanding;
        }
        m_events.erase(m_events.begin(), it);
    }

    bool hazard(int unit, const Range& r) const {
        return std::any_of(m_writers[unit].begin(), m_writers[unit].end(),
                           [&](const Writer& w) { return w.range.overlaps(r); });
    }

    void start_entry(const Entry& e) { m_result.records[e.rec].start = m_now; }

    void step_units() {
        step_dma();
        step_vpu();
        for (uint32_t i = 0; i < m_core.mxus; ++i) step_mxu(i);
    }

    // ---- DMA engine and the simple HBM pipe ---------------------------------------------------

    struct Chunk {
        uint64_t before;  ///< bytes of the transfer ahead of this request
        uint32_t len;
    };
    struct DmaXfer {
        size_t rec;
        uint8_t flag;
        bool hbm;  ///< dma.hv / dma.vh: requests go through the HBM pipe
        uint64_t bytes;
        uint64_t cycles;  ///< cycles the port has worked on it so far
        std::vector<Chunk> chunks;
        size_t next = 0;  ///< next request to hand to HBM
    };
    struct HbmReq {
        uint64_t arrival;
        uint64_t ticks_left;
        size_t rec;
        uint8_t flag;
        bool last;  ///< the transfer's last request: its completion is the transfer's done
    };

    /// One cycle of the DMA engine's VMEM port: dma_vmem_bytes_per_cycle bytes move; the
    /// requests whose first byte falls in this cycle leave for HBM now.
    void dma_work(DmaXfer& x) {
        m_dma_worked = m_now;
        const uint64_t port = m_core.dma_vmem_bytes_per_cycle;
        x.cycles += 1;
        const uint64_t moved = x.cycles * port;  // bytes through the port by the end of now
        if (x.hbm) {
            for (; x.next < x.chunks.size() && x.chunks[x.next].before < moved; ++x.next) {
                const Chunk& c = x.chunks[x.next];
                m_pipe.push_back({m_now, uint64_t(c.len) * m_ticks_per_byte, x.rec, x.flag,
                                  x.next + 1 == x.chunks.size()});
            }
        }
        if (moved >= x.bytes) {
            // Port done: free for the next transfer from the next cycle. A VMEM-to-VMEM copy
            // lands one cycle after its last beat left the port.
            if (!x.hbm) schedule(m_now + 2, {x.rec, x.flag, kDma, false});
            m_dma.reset();
        }
    }

    void step_dma() {
        if (m_dma && m_dma_worked != m_now) dma_work(*m_dma);
        auto& q = m_queues[kDma];
        if (m_dma || m_dma_worked == m_now || q.empty()) return;
        const Entry& e = q.front();
        if (m_now < e.ready) return;
        const uint64_t dst = e.v[0], src = e.v[1], rows = e.v[2], row_bytes = e.v[3];
        const uint64_t dst_stride = e.v[4], src_stride = e.v[5];
        // dma.hs writes scalar memory, which no hazard covers (core_model.cpp, exec_dma).
        const bool to_smem = e.op == Opcode::DmaHs;
        const bool to_vmem = e.op != Opcode::DmaVh, from_hbm = e.op == Opcode::DmaHv || to_smem;
        // HBM sides through the window map (hw/core/hbm_windows.h), as the TensorCore does.
        const auto side = [&](bool hbm, uint64_t a, uint64_t stride) {
            std::vector<Range> out;
            if (!hbm) {
                out.push_back(box(false, a, rows, row_bytes, stride));
                return out;
            }
            e.windows.pieces_2d(a, rows, row_bytes, stride,
                                [&](uint64_t, uint64_t, uint64_t p, uint64_t n, uint64_t len) {
                                    out.push_back(box(true, p, n, len, stride));
                                });
            return out;
        };
        const std::vector<Range> wr =
            to_smem ? std::vector<Range>{} : side(!to_vmem, dst, dst_stride);
        const std::vector<Range> rd = side(from_hbm, src, src_stride);
        for (const auto* list : {&rd, &wr})
            for (const Range& r : *list)
                if (hazard(kDma, r)) return;
        DmaXfer x{e.rec, e.flag, e.op != Opcode::DmaVv, rows * row_bytes, 0, {}, 0};
        if (x.hbm) {
            // Requests per window piece (HbmWindows::pieces_2d): a piece after the first starts
            // on a port cycle of its own, as the TensorCore issues it once the port is free.
            const uint64_t port = m_core.dma_vmem_bytes_per_cycle;
            uint64_t before = 0;
            e.windows.pieces_2d(
                from_hbm ? src : dst, rows, row_bytes, from_hbm ? src_stride : dst_stride,
                [&](uint64_t, uint64_t, uint64_t, uint64_t n, uint64_t len) {
                    before = (before + port - 1) / port * port;
                    for (uint64_t r = 0; r < n; ++r)
                        for (uint64_t off = 0; off < len; off += m_core.dma_chunk_bytes) {
                            const auto l = static_cast<uint32_t>(
                                std::min<uint64_t>(m_core.dma_chunk_bytes, len - off));
                            x.chunks.push_back({before, l});
                            before += l;
                        }
                });
            x.bytes = before;
        }
        start_entry(e);
        for (const Range& r : wr) m_writers[kDma].push_back({e.rec, r});
        q.pop_front();
        m_dma = std::move(x);
        dma_work(*m_dma);
    }

    /// One cycle of the HBM pipe: ticks_per_cycle ticks of transfer, oldest request first; a
    /// request may not use ticks of cycles before it arrived.
    void step_hbm() {
        uint64_t budget = m_ticks_per_cycle;
        while (budget > 0 && !m_pipe.empty() && m_pipe.front().arrival <= m_now) {
            HbmReq& r = m_pipe.front();
            const uint64_t use = std::min(budget, r.ticks_left);
            r.ticks_left -= use;
            budget -= use;
            if (r.ticks_left > 0) break;
            // Its last byte moved during this cycle, so its transfer ends at the next cycle
            // boundary; the data is there after the fixed latency.
            if (r.last) schedule(m_now + 1 + m_hbm_latency, {r.rec, r.flag, kDma, false});
            m_pipe.pop_front();
        }
    }

    // ---- VPU ------------------------------------------------------------------------------------

    struct VpuActive {
        size_t rec;
        uint8_t flag;
        uint64_t vregs_left;
        uint64_t latency;
    };

    /// Element count, VMEM ranges read and written of a VPU instruction: the shapes are the
    /// model's (hw/core/vpu_unit.h, the one definition); only the timing is re-derived here.
    struct VpuShape {
        uint64_t elements = 0;
        std::vector<Range> reads;
        Range write;
    };
    static VpuShape vpu_shape(const Entry& e) {
        if (isa::info(e.op).unit != isa::Unit::Vpu)
            throw std::logic_error("CoreRef: not a VPU opcode");
        const hw::VpuShape s = hw::vpu_shape(e.op, e.v);
        auto range = [](const hw::VpuAccess& a) { return Range{false, a.addr, a.addr + a.bytes}; };
        VpuShape out{s.elements, {}, range(s.write)};
        for (const auto& r : s.reads) out.reads.push_back(range(r));
        return out;
    }

    uint64_t vpu_latency(Opcode op) const {
        switch (isa::info(op).timing) {
            case isa::Timing::VpuMul:
                return m_core.vpu_mul_latency_cycles;
            case isa::Timing::VpuTrans:
                return m_core.vpu_transcendental_latency_cycles;
            case isa::Timing::VpuReduce: {
                // A lane-reduction tree: each level halves the lanes still holding partials.
                uint64_t levels = 0;
                for (uint64_t w = m_core.vpu_lanes; w > 1; w = (w + 1) / 2) ++levels;
                return m_core.vpu_add_latency_cycles + levels;
            }
            default:
                return m_core.vpu_add_latency_cycles;
        }
    }

    /// One issue cycle: every ALU takes one vector register; after the last one the result is
    /// written `latency` cycles later.
    void vpu_work(VpuActive& a) {
        m_vpu_worked = m_now;
        a.vregs_left -= std::min<uint64_t>(a.vregs_left, m_core.vpu_alus);
        if (a.vregs_left == 0) {
            schedule(m_now + a.latency, {a.rec, a.flag, kVpu, false});
            m_vpu.reset();
        }
    }

    void step_vpu() {
        if (m_vpu && m_vpu_worked != m_now) vpu_work(*m_vpu);
        auto& q = m_queues[kVpu];
        if (m_vpu || m_vpu_worked == m_now || q.empty()) return;
        const Entry& e = q.front();
        if (m_now < e.ready) return;
        const VpuShape s = vpu_shape(e);
        for (const Range& r : s.reads)
            if (hazard(kVpu, r)) return;
        if (hazard(kVpu, s.write)) return;
        const uint64_t per_vreg = uint64_t(m_core.vpu_sublanes) * m_core.vpu_lanes;
        // Elements are packed into whole vector registers; a partial one costs a full slot.
        uint64_t vregs = 0;
        for (uint64_t packed = 0; packed < s.elements; packed += per_vreg) ++vregs;
        start_entry(e);
        m_writers[kVpu].push_back({e.rec, s.write});
        m_vpu = VpuActive{e.rec, e.flag, vregs, vpu_latency(e.op)};
        q.pop_front();
        vpu_work(*m_vpu);
    }

    // ---- MXUs -----------------------------------------------------------------------------------

    /// Shadow weight buffer: empty, being written by the loader, holding a complete tile no
    /// matmul has taken yet, or taken (its tile is the active weights; free to refill).
    enum class Shadow : uint8_t { Empty, Loading, Full, Taken };
    struct Mxu {
        Shadow shadow = Shadow::Empty;
        uint32_t load_rows_left = 0;  ///< weight loader: rows of the current tile still to write
        size_t lw_rec = 0;
        uint8_t lw_flag = isa::kNoFlag;
        uint64_t loader_worked = kNever;
        uint32_t lhs_rows_left = 0;  ///< input port: LHS rows of the current matmul to emit
        size_t mm_rec = 0;
        uint8_t mm_flag = isa::kNoFlag;
        uint64_t port_worked = kNever;
        uint64_t array_empty_at = 0;  ///< the last matmul's results are all written here
    };

    void loader_work(uint32_t i) {
        Mxu& m = m_mxu[i];
        m.loader_worked = m_now;
        if (--m.load_rows_left == 0)
            schedule(m_now + 1, {m.lw_rec, m.lw_flag, int(kMxu0 + i), true});
    }

    void port_work(uint32_t i) {
        Mxu& m = m_mxu[i];
        m.port_worked = m_now;
        if (--m.lhs_rows_left == 0) {
            // The last row's element k reaches PE(k, 0) k cycles later (skew), its partial sums
            // leave PE(R-1, C-1) after R-1 steps down and C-1 across, and are written a cycle
            // after that.
            const uint64_t drain = uint64_t(m_core.mxu_rows - 1) + (m_core.mxu_cols - 1) + 1;
            m.array_empty_at = m_now + drain;
            schedule(m_now + drain, {m.mm_rec, m.mm_flag, int(kMxu0 + i), false});
        }
    }

    void step_mxu(uint32_t i) {
        Mxu& m = m_mxu[i];
        if (m.load_rows_left > 0 && m.loader_worked != m_now) loader_work(i);
        if (m.lhs_rows_left > 0 && m.port_worked != m_now) port_work(i);
        auto& q = m_queues[kMxu0 + i];
        // An lw right behind an mm may start in the same cycle: the mm took the shadow.
        while (!q.empty() && m_now >= q.front().ready) {
            const Entry& e = q.front();
            if (e.op == Opcode::MxuLw) {
                // The loader writes one tile at a time; a full untaken tile is overwritten.
                if (m.shadow == Shadow::Loading) return;
                m.shadow = Shadow::Loading;
                m.load_rows_left = m_core.mxu_rows;
                m.lw_rec = e.rec;
                m.lw_flag = e.flag;
                start_entry(e);
                q.pop_front();
                loader_work(i);
            } else {
                if (m.lhs_rows_left > 0 || m.port_worked == m_now) return;  // port busy
                if (m.shadow == Shadow::Loading) return;  // its tile is not complete yet
                if (m.shadow == Shadow::Empty)
                    throw std::logic_error("CoreRef: mxu.mm without loaded weights");
                // An array-wide swap waits until the earlier matmuls' results have left.
                if (m_core.mxu_swap_drains && m.shadow == Shadow::Full && m_now < m.array_empty_at)
                    return;
                m.shadow = Shadow::Taken;  // a full tile moves into the array; else reuse
                m.lhs_rows_left = e.v[3];
                m.mm_rec = e.rec;
                m.mm_flag = e.flag;
                start_entry(e);
                q.pop_front();
                port_work(i);
            }
        }
    }

    // ---- sequencer ----------------------------------------------------------------------------

    uint32_t val(const isa::Operand& o) const {
        return m_sregs[o.reg] + static_cast<uint32_t>(o.imm);
    }

    void retire_inline(const isa::Instr& ins, uint32_t next) {
        m_result.records.push_back({m_pc, ins.op, m_now, m_now, m_now + 1});
        m_seq_free = m_now + 1;
        m_pc = next;
    }

    void step_sequencer() {
        if (m_finished) return;
        if (m_halting) {
            if (m_outstanding == 0) {
                m_result.records[m_halt_rec].done = m_now;
                m_finished = true;
            }
            return;
        }
        if (m_now < m_seq_free) return;
        if (m_pc >= m_prog.size())
            throw std::out_of_range(fmt::format("CoreRef: pc {} past the program", m_pc));
        const isa::Instr& ins = m_prog[m_pc];
        const auto& o = ins.ops;
        switch (isa::info(ins.op).unit) {
            case isa::Unit::Scalar: {
                if (ins.op == Opcode::Halt) {
                    m_halt_rec = m_result.records.size();
                    m_result.records.push_back({m_pc, ins.op, m_now, m_now, 0});
                    m_halting = true;
                    step_sequencer();  // drained already?
                    return;
                }
                const uint32_t b = val(o[1]), c = val(o[2]);
                std::optional<uint32_t> r;
                if (const auto alu = isa::scalar_alu(ins.op, b, c)) {
                    if (alu->div_by_zero) throw std::domain_error("CoreRef: division by zero");
                    r = alu->value;
                }
                switch (ins.op) {
                    case Opcode::Lw:
                        r = m_smem.contains(b) ? m_smem.at(b) : 0;
                        break;
                    case Opcode::Sw:
                        m_smem[b] = val(o[0]);
                        break;
                    case Opcode::CoreId:
                        r = 0;
                        break;
                    case Opcode::NCores:
                        r = 1;
                        break;
                    case Opcode::HbmMap:
                        if (val(o[0]) >= isa::kHbmWindows)
                            throw std::out_of_range(fmt::format(
                                "CoreRef: hbm.map window {} does not exist", val(o[0])));
                        m_windows.map(val(o[0]), val(o[1]));
                        break;
                    default:
                        break;
                }
                if (r && o[0].reg != 0) m_sregs[o[0].reg] = *r;
                retire_inline(ins, m_pc + 1);
                return;
            }
            case isa::Unit::Branch: {
                const auto a = static_cast<int32_t>(val(o[0]));
                const auto b = static_cast<int32_t>(val(o[1]));
                const auto target = static_cast<uint32_t>(o[2].imm);
                uint32_t next = m_pc + 1;
                switch (ins.op) {
                    case Opcode::Jmp:
                        next = static_cast<uint32_t>(o[0].imm);
                        break;
                    case Opcode::Beq:
                        if (a == b) next = target;
                        break;
                    case Opcode::Bne:
                        if (a != b) next = target;
                        break;
                    case Opcode::Blt:
                        if (a < b) next = target;
                        break;
                    case Opcode::Bge:
                        if (a >= b) next = target;
                        break;
                    case Opcode::Bltu:
                        if (uint32_t(a) < uint32_t(b)) next = target;
                        break;
                    default:
                        break;
                }
                retire_inline(ins, next);
                return;
            }
            case isa::Unit::Sync: {
                const auto f = static_cast<uint32_t>(o[0].imm);
                switch (ins.op) {
                    case Opcode::Signal:
                        m_flags[f] += val(o[1]);
                        break;
                    case Opcode::Fset:
                        m_flags[f] = val(o[1]);
                        break;
                    case Opcode::Wait:
                    case Opcode::Fence: {
                        if (!m_wait_since) m_wait_since = m_now;
                        const bool go =
                            ins.op == Opcode::Wait ? m_flags[f] >= val(o[1]) : m_outstanding == 0;
                        if (!go) return;
                        m_result.records.push_back({m_pc, ins.op, *m_wait_since, m_now, m_now + 1});
                        m_wait_since.reset();
                        m_seq_free = m_now + 1;
                        m_pc += 1;
                        return;
                    }
                    default:
                        break;
                }
                retire_inline(ins, m_pc + 1);
                return;
            }
            case isa::Unit::Dma:
            case isa::Unit::Vpu:
            case isa::Unit::Mxu: {
                int unit = isa::info(ins.op).unit == isa::Unit::Dma ? kDma : kVpu;
                if (isa::info(ins.op).unit == isa::Unit::Mxu) {
                    const uint32_t idx = val(o[0]);
                    if (idx >= m_core.mxus)
                        throw std::out_of_range(fmt::format("CoreRef: MXU {} does not exist", idx));
                    unit = kMxu0 + int(idx);
                }
                auto& q = m_queues[unit];
                if (q.size() >= m_core.queue_depth) return;  // stalled: no free entry
                Entry e{m_result.records.size(),        ins.op,   ins.flag, {},
                        m_now + m_core.dispatch_cycles, m_windows};
                for (int i = 0; i < isa::kMaxOperands; ++i) e.v[i] = val(o[i]);
                q.push_back(e);
                m_result.records.push_back({m_pc, ins.op, m_now, 0, 0});
                ++m_outstanding;
                m_seq_free = m_now + 1;
                m_pc += 1;
                return;
            }
            case isa::Unit::Ici:
                throw std::invalid_argument("CoreRef: ICI instructions are not modelled");
        }
    }

    const CoreConfig& m_core;
    const std::vector<isa::Instr>& m_prog;
    HbmWindows m_windows;  ///< the HBM window map (hbm.map), identity at the start
    uint64_t m_now = 0;
    CoreRefResult m_result;

    // sequencer
    std::array<uint32_t, isa::kNumSregs> m_sregs{};
    std::unordered_map<uint32_t, uint32_t> m_smem;
    std::array<uint64_t, isa::kNumFlags> m_flags{};
    uint32_t m_pc = 0;
    uint64_t m_seq_free = 0;               ///< earliest cycle of the next issue
    std::optional<uint64_t> m_wait_since;  ///< a wait or fence at m_pc issued then
    bool m_halting = false;
    bool m_finished = false;
    size_t m_halt_rec = 0;
    uint64_t m_outstanding = 0;  ///< unit instructions issued, not yet done

    // units
    std::vector<std::deque<Entry>> m_queues;  ///< DMA, VPU, MXU0..
    std::vector<std::vector<Writer>> m_writers;
    std::multimap<uint64_t, Completion> m_events;
    std::optional<DmaXfer> m_dma;
    uint64_t m_dma_worked = kNever;
    std::deque<HbmReq> m_pipe;
    uint64_t m_ticks_per_cycle = 0, m_ticks_per_byte = 0, m_hbm_latency = 0;
    std::optional<VpuActive> m_vpu;
    uint64_t m_vpu_worked = kNever;
    std::vector<Mxu> m_mxu;
};

}  // namespace

CoreRef::CoreRef(const BoardConfig& cfg) : m_cfg(cfg) {}

CoreRefResult CoreRef::run(const isa::Program& program, uint64_t start_cycle,
                           const std::vector<uint32_t>& args, uint64_t max_cycles) const {
    Stepper s(m_cfg, program);
    return s.run(start_cycle, args, max_cycles);
}

}  // namespace tpu::hw
