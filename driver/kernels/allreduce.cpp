// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/allreduce.h"

#include <algorithm>
#include <array>
#include <bit>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include <fmt/format.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/ici/ici_costs.h"

namespace tpu::driver {

uint32_t allreduce_chunk_bytes(const AllReducePlan& p) {
    const uint32_t per = (p.elements + 2 * p.cores - 1) / (2 * p.cores);
    return per * 4;
}

uint64_t allreduce_vmem_bytes(const AllReducePlan& p) {
    return uint64_t(allreduce_chunk_bytes(p)) * (2 * p.cores);
}

AllReducePlan plan_allreduce(uint32_t cores, uint32_t elements, uint64_t vmem_bytes) {
    if (cores < 2) throw DeviceError(ErrorKind::Usage, "all-reduce needs at least 2 cores");
    if (elements == 0) throw DeviceError(ErrorKind::Usage, "all-reduce of 0 values");
    AllReducePlan p{cores, elements, 0, 0, 0};
    const uint64_t full = allreduce_vmem_bytes(p);
    const uint64_t scratch = uint64_t(allreduce_chunk_bytes(p)) * 2 * (cores - 1);
    if (2 * full + scratch > vmem_bytes)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("all-reduce of {} values needs {} bytes of VMEM per core; "
                                      "the core has {}",
                                      elements, 2 * full + scratch, vmem_bytes));
    p.y_addr = static_cast<uint32_t>(full);
    p.scratch_addr = static_cast<uint32_t>(2 * full);
    return p;
}

isa::Program generate(const AllReducePlan& p) {
    using enum isa::Opcode;
    using isa::imm;
    const uint32_t N = p.cores, C = allreduce_chunk_bytes(p), E = C / 4;
    const uint64_t half = uint64_t(N) * C;  // direction 1 works on the second half
    isa::Builder b(p.name());
    const isa::Reg pos = b.arg("position"), next = b.arg("next"), prev = b.arg("prev");
    const uint64_t full = allreduce_vmem_bytes(p);
    const isa::Vmem x = b.vmem_at("x", p.x_addr, full), y = b.vmem_at("y", p.y_addr, full);
    const isa::Vmem scratch =
        b.vmem_at("scratch", p.scratch_addr, uint64_t(allreduce_chunk_bytes(p)) * 2 * (N - 1));
    const isa::Reg send = b.reg("send", 10), add = b.reg("add", 11), own = b.reg("own", 12);
    const isa::Reg gather = b.reg("gather", 13);
    // Reduce-scatter arrivals and all-gather arrivals are raised by the neighbours.
    const isa::Flag arrived[2] = {b.flag("arrived.cw", 1), b.flag("arrived.ccw", 2)};
    isa::CountedFlag adds[2] = {{b, "adds.cw", isa::Count::AtBuild, 3},
                                {b, "adds.ccw", isa::Count::AtBuild, 4}};
    const isa::Flag gathered[2] = {b.flag("gathered.cw", 5), b.flag("gathered.ccw", 6)};
    isa::CountedFlag copies(b, "copies", isa::Count::AtBuild, 7);
    // Byte offset of chunk (position + delta) mod N into `reg`.
    auto chunk = [&](int delta, const isa::Reg& reg) {
        b.emit(Add, {reg, pos, imm((delta % int(N) + int(N)) % int(N))});
        b.emit(Remu, {reg, reg, imm(N)});
        b.emit(Mul, {reg, reg, imm(C)});
    };
    auto dir = [&](int d) -> const isa::Reg& { return d == 0 ? next : prev; };
    // Direction 0 sends to `next` (clockwise) and receives from `prev`; direction 1 the
    // reverse. In reduce-scatter step k direction 0 sends chunk p-k and adds the received
    // chunk p-1-k into its own; direction 1 mirrors it (p+k, p+1+k). Both directions
    // interleave step by step.
    for (uint32_t k = 0; k + 1 < N; ++k) {
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const isa::Arg slot = scratch.at((uint64_t(d) * (N - 1) + k) * C);
            if (k > 0) adds[d].wait_all();
            chunk(sign * int(k), send);
            b.emit(IciV, {dir(d), slot, send + int64_t(x.addr() + d * half), imm(C), arrived[d]});
        }
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const int64_t base = int64_t(x.addr() + d * half);
            const isa::Arg slot = scratch.at((uint64_t(d) * (N - 1) + k) * C);
            b.emit(Wait, {arrived[d], imm(k + 1)});
            chunk(sign * (int(k) + 1), add);
            adds[d].issue(VAdd, {add + base, add + base, slot, imm(E)});
        }
    }
    // Own reduced chunk (p+1 clockwise, p-1 counter-clockwise) into y.
    for (int d = 0; d < 2; ++d) {
        const int sign = d == 0 ? -1 : 1;
        adds[d].wait_all();
        chunk(-sign, own);
        copies.issue(DmaVv, {own + int64_t(y.addr() + d * half), own + int64_t(x.addr() + d * half),
                             imm(1), imm(C), imm(C), imm(C)});
    }
    // All-gather: step k sends chunk p+1-k (clockwise) to the neighbour's y; from step 1 on
    // the chunk is the one received in the step before.
    for (uint32_t k = 0; k + 1 < N; ++k)
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            if (k > 0) b.emit(Wait, {gathered[d], imm(k)});
            chunk(sign * (int(k) - 1), gather);
            b.emit(IciV, {dir(d), gather + int64_t(y.addr() + d * half),
                          gather + int64_t((k == 0 ? x.addr() : y.addr()) + d * half), imm(C),
                          gathered[d]});
        }
    for (int d = 0; d < 2; ++d) b.emit(Wait, {gathered[d], imm(N - 1)});
    copies.wait_all();
    b.emit(Halt, {});
    return b.finish();
}

isa::Program allreduce_program(const AllReducePlan& p) {
    return generate(p);
}

AllReduceResult allreduce(Device& dev, const std::vector<uint32_t>& cores,
                          const std::vector<std::vector<float>>& data) {
    if (data.size() != cores.size())
        throw DeviceError(ErrorKind::Usage, fmt::format("all-reduce: {} vectors for {} cores",
                                                        data.size(), cores.size()));
    const uint32_t n = static_cast<uint32_t>(data.at(0).size());
    for (const auto& v : data)
        if (v.size() != n)
            throw DeviceError(ErrorKind::Usage, "all-reduce: vectors differ in length");
    const AllReducePlan p =
        plan_allreduce(static_cast<uint32_t>(cores.size()), n, dev.config().core.vmem_bytes);
    const uint64_t padded = allreduce_vmem_bytes(p);
    // Inputs go straight to VMEM (as a previous kernel would have left them), zero-padded.
    for (size_t i = 0; i < cores.size(); ++i) {
        std::vector<float> x(padded / 4, 0.0f);
        std::copy(data[i].begin(), data[i].end(), x.begin());
        if (dev.board().owns(cores[i]))
            dev.board().vmem(cores[i]).write(
                p.x_addr, {reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
    }
    const uint32_t N = p.cores;
    AllReduceResult r;
    r.event = launch(dev, cores, generate(p), [&](size_t i, LaunchArgs& a) {
        a.set("position", static_cast<uint32_t>(i))
            .set("next", cores[(i + 1) % N])
            .set("prev", cores[(i + N - 1) % N]);
    });
    for (uint32_t c : cores) {
        std::vector<float> y(n);
        dev.board().fetch(c, false, p.y_addr, {reinterpret_cast<uint8_t*>(y.data()), y.size() * 4});
        r.out.push_back(std::move(y));
    }
    return r;
}

// ---- All-reduce of tensors in HBM -----------------------------------------------------------

namespace {

/// Values per piece at most: 64 KiB keeps the DMA's and the ICI's fixed costs small against a
/// piece's 770 link cycles and still leaves VMEM for a ring of slots.
constexpr uint32_t kMaxPieceValues = 16384;
/// Values per piece at least, when a chunk is split: a piece's link time (193 cycles at 16 KiB)
/// must exceed the sequencer's work per piece (about 100 instructions).
constexpr uint32_t kMinPieceValues = 4096;
/// Pieces per chunk in one group at most: 64 x 64 KiB chunks, so 2 x (64 + slack) receive
/// slots of 64 KiB fit the 16 MiB VMEM; larger tensors are reduced group after group.
constexpr uint32_t kMaxGroupPieces = 64;
/// Pieces are whole 256-byte HBM granules.
constexpr uint32_t kPieceAlign = 64;
constexpr uint32_t kOneBits = 0x3f800000;  // fp32 1.0f
/// Pipelined schedule: the last sending step stores the final pieces that arrived this many
/// pieces earlier (a piece arrives hop + its link time after it left: about 2.2 pieces).
constexpr uint32_t kEarly = 3;

uint64_t ceil_div(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

}  // namespace

AllReduceHbmPlan allreduce_partition(uint32_t cores, uint32_t elements) {
    if (cores < 2) throw DeviceError(ErrorKind::Usage, "all-reduce needs at least 2 cores");
    if (elements == 0) throw DeviceError(ErrorKind::Usage, "all-reduce of 0 values");
    AllReduceHbmPlan p;
    p.cores = cores;
    p.elements = elements;
    const uint64_t e0 = ceil_div(elements, 2 * uint64_t(cores));
    // At least 4 pieces of at least kMinPieceValues per chunk where the chunk allows: the first
    // load and the last store of a piece are not overlapped with the links.
    const uint64_t total_pieces = std::max(ceil_div(e0, kMaxPieceValues),
                                           std::min<uint64_t>(4, ceil_div(e0, kMinPieceValues)));
    const uint64_t g0 = ceil_div(total_pieces, kMaxGroupPieces);
    p.pieces = static_cast<uint32_t>(ceil_div(total_pieces, g0));
    p.piece =
        static_cast<uint32_t>(ceil_div(ceil_div(e0, g0 * p.pieces), kPieceAlign) * kPieceAlign);
    p.chunk = p.pieces * p.piece;
    p.groups = static_cast<uint32_t>(ceil_div(elements, 2 * uint64_t(cores) * p.chunk));
    return p;
}

namespace {

/// Link and latency figures the plan sizes its rings with.
struct RingTiming {
    uint64_t hop = 0;  ///< cycles per hop
    uint64_t ser = 0;  ///< cycles one piece occupies a link
};

RingTiming ring_timing(const hw::BoardConfig& cfg, uint32_t piece_values) {
    const hw::IciCosts c = hw::ici_costs(cfg);
    return {c.hop, std::max<uint64_t>(1, c.ser_cycles(uint64_t(piece_values) * 4))};
}

}  // namespace

AllReduceHbmPlan plan_allreduce_hbm(uint32_t cores, uint32_t elements, const hw::BoardConfig& cfg,
                                    AllReduceSchedule schedule, uint64_t vmem_bytes) {
    AllReduceHbmPlan p = allreduce_partition(cores, elements);
    const uint64_t P = uint64_t(p.piece) * 4, Q = p.pieces;
    const RingTiming t = ring_timing(cfg, p.piece);
    // Own-data slots: a slot sent from directly (step 0) is busy until the transfer arrives.
    p.own_slots =
        static_cast<uint32_t>(std::min<uint64_t>(cores * Q, 2 + ceil_div(t.hop + 400, t.ser)));
    p.own_slots = std::max<uint32_t>(p.own_slots, 2);
    // A receive slot goes back to its sender once the piece has been forwarded (arrived at
    // the next core) and stored: free_lag pieces later, when that has normally happened.
    p.free_lag = static_cast<uint32_t>(2 + ceil_div(t.hop + t.ser, t.ser));
    const uint64_t messages = uint64_t(2 * (cores - 1)) * Q * p.groups;
    const uint64_t vmem = vmem_bytes ? vmem_bytes : cfg.core.vmem_bytes,
                   own = 2 * uint64_t(p.own_slots) * P;
    const uint64_t fit = vmem > own ? (vmem - own) / (2 * P) : 0;
    const uint64_t k = std::min(messages, fit);
    // Slots a credit round trip (data there, credit back) and the free lag keep busy.
    const uint64_t slack = p.free_lag + 2 + ceil_div(2 * t.hop, t.ser);
    const bool barrier_fits = k == messages || k >= 2 * Q + slack;
    if (k < messages && k < Q + p.free_lag + 1)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("all-reduce of {} values over {} cores needs {} bytes of "
                                      "VMEM per core; the core has {}",
                                      elements, cores, own + 2 * (Q + p.free_lag + 1) * P, vmem));
    if (schedule == AllReduceSchedule::StepBarrier && !barrier_fits)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("all-reduce of {} values over {} cores: a step barrier "
                                      "needs {} receive slots of {} bytes; VMEM holds {}",
                                      elements, cores, 2 * Q + slack, P, k));
    p.barrier = schedule == AllReduceSchedule::Auto ? barrier_fits
                                                    : schedule == AllReduceSchedule::StepBarrier;
    p.recv_slots = static_cast<uint32_t>(k);
    p.imem_instrs = static_cast<uint32_t>(cfg.core.imem_bytes / isa::kInstrBytes);
    return p;
}

namespace {

/// Emits the HBM ring all-reduce of `p` (see emit_allreduce); with `roll`, runs of steps whose
/// code differs only in the step number become one loop over a step register instead of a
/// copy each.
void emit_hbm(isa::Builder& b, const AllReduceHbmPlan& p, const AllReduceOperands& ops, bool roll) {
    using enum isa::Opcode;
    using isa::Arg;
    using isa::imm;
    using isa::Label;
    using isa::Reg;
    const uint32_t N = p.cores, Q = p.pieces, Pe = p.piece, E = p.chunk, K = p.recv_slots;
    const uint32_t O = p.own_slots, D = p.free_lag, n = p.elements;
    const uint64_t P = uint64_t(Pe) * 4;
    // Steps st0..st1 of the full all-reduce's 0..2N-2 (reduce-scatter: 0..N-1, all-gather:
    // N-1..2N-2); messages are numbered from the first step's.
    const bool rs = p.phase == AllReducePhase::ReduceScatter;
    const bool ag = p.phase == AllReducePhase::AllGather;
    const uint32_t st0 = ag ? N - 1 : 0, st1 = rs ? N - 1 : 2 * (N - 1);
    const uint64_t Mg = uint64_t(rs || ag ? N - 1 : 2 * (N - 1)) * Q;  // messages per direction
                                                                       // and group
    const uint64_t Gel = 2 * uint64_t(N) * E;                          // values per group
    const bool reuse = uint64_t(K) < Mg * p.groups;
    const auto scope = b.scope(p.name());
    const Arg pos = ops.position.value, x = ops.x.value, scale = ops.scale.value;
    const Arg next = ops.next.value, prev = ops.prev.value;
    // Two ranges: direction 1 works on its own range (x_ccw), each clipped to its own length.
    const Arg xd[2] = {x, p.ranges ? ops.x_ccw.value : x};
    const Arg limit[2] = {p.ranges ? ops.n_cw.value : imm(n), p.ranges ? ops.n_ccw.value : imm(n)};
    // Receive rings and own-data rings, per direction (clockwise, counter-clockwise).
    const isa::Vmem recv[2] = {b.vmem("recv.cw", uint64_t(K) * P),
                               b.vmem("recv.ccw", uint64_t(K) * P)};
    const isa::Vmem own[2] = {b.vmem("own.cw", uint64_t(O) * P),
                              b.vmem("own.ccw", uint64_t(O) * P)};
    const Reg q = b.reg("piece", 6);
    // Loads from HBM: counted in a register and waited for piece by piece before the next
    // prefetch (every load is waited for, the last one by the piece that uses it).
    const Reg nloads = b.reg("loads.count", 7);
    b.emit(Li, {nloads, imm(0)});
    isa::CountedFlag stores(b, "stores", isa::Count::InRegister, 6, 8);
    isa::CountedFlag vpu[2] = {{b, "vpu.cw", isa::Count::InRegister, 9, 9},
                               {b, "vpu.ccw", isa::Count::InRegister, 10, 10}};
    const isa::Flag loads = b.flag("loads", 5);
    // Raised by the neighbours: arrivals of their sends, credits for our sends' slots.
    const isa::Flag arrived[2] = {b.flag("arrived.cw", 1), b.flag("arrived.ccw", 2)};
    const isa::Flag credit[2] = {b.flag("credit.cw", 3), b.flag("credit.ccw", 4)};
    const isa::Flag sent[2] = {b.flag("sent.cw", 7), b.flag("sent.ccw", 8)};
    const Reg i = b.reg("i", 11), own_slot = b.reg("own_slot", 12), in_slot = b.reg("in_slot", 13);
    const Reg out_slot = b.reg("out_slot", 14), nq = b.reg("next_piece", 15);
    const Reg nstep = b.reg("next_step", 16), gfirst = b.reg("group_first", 17);
    const Reg gmsgs = b.reg("group_messages", 18), msg = b.reg("message", 19);
    const Reg group = b.reg("group", 21), at = b.reg("at", 22), len = b.reg("len", 23);
    const Reg t = b.reg("t", 24);
    for (const Reg* r : {&gfirst, &gmsgs, &group}) b.emit(Li, {*r, imm(0)});
    // The caller's handshake: the flags above are ours now, nothing has been sent yet.
    if (ops.ready) ops.ready();
    // One HBM transfer of piece `pq` of the step-`step` chunk of direction d, clipped to the
    // tensor (a piece past its end moves nothing and counts nothing).
    auto dma = [&](bool load, int d, Arg step, Arg pq, Arg vmem) {
        const Label go = b.label("go"), skip = b.label("skip"), whole = b.label("whole");
        if (d == 0) {
            b.emit(Sub, {at, pos, step});
            b.emit(Add, {at, at, imm(2 * N)});  // step < 2N: stays positive
        } else {
            b.emit(Add, {at, pos, step});
        }
        b.emit(Remu, {at, at, imm(N)});
        b.emit(Mul, {at, at, imm(E)});
        b.emit(Add, {at, at, gfirst + int64_t(p.ranges ? 0 : uint64_t(d) * N * E)});
        b.emit(Mul, {len, pq, imm(Pe)});
        b.emit(Add, {at, at, len});
        b.emit(Bltu, {at, limit[d], go});
        b.emit(Jmp, {skip});
        b.bind(go);
        b.emit(Sub, {len, limit[d], at});
        b.emit(Bltu, {len, imm(Pe), whole});
        b.emit(Li, {len, imm(Pe)});
        b.bind(whole);
        b.emit(Shl, {len, len, imm(2)});
        b.emit(Shl, {at, at, imm(2)});
        b.emit(Add, {at, at, xd[d]});
        if (load) {
            b.emit(DmaHv, {vmem, at, imm(1), len, len, len, loads});
            b.emit(Add, {nloads, nloads, imm(1)});
        } else {
            stores.issue(DmaVh, {at, vmem, imm(1), len, len, len});
        }
        b.bind(skip);
    };
    const Label group_top = b.label("group");
    b.bind(group_top);
    // Own data of step 0, piece 0 (slot 0): every earlier user of the slot has finished.
    for (int d = 0; d < 2; ++d) dma(true, d, imm(st0), imm(0), own[d].at(0));
    // Everything about a step's code but its number: steps with equal shapes can share a loop.
    // What step st does: the reduce-scatter's last step only adds and stores; the all-gather's
    // first sends its own (reduced) data.
    auto sends_at = [&](uint32_t st) { return st <= 2 * (N - 1) - 1 && !(rs && st == N - 1); };
    auto adds_at = [&](uint32_t st) { return st >= 1 && st <= N - 1 && !(ag && st == N - 1); };
    auto stores_at = [&](uint32_t st) { return st >= N - 1 && !(ag && st == N - 1); };
    auto shape = [&](uint32_t st) {
        const uint32_t ord = st - st0;
        return std::array<bool, 10>{st == st0,
                                    st <= N - 1,
                                    adds_at(st),
                                    stores_at(st),
                                    sends_at(st),
                                    st == N - 1,
                                    uint64_t(ord) * Q < Q + O,
                                    reuse && uint64_t(ord + 1) * Q > K,
                                    st == 2 * (N - 1) - 1,
                                    st == st1};
    };
    for (uint32_t st = st0; st <= st1; ++st) {
        const uint32_t ord = st - st0;  // steps before this one
        const bool sends = sends_at(st), loads_own = st <= N - 1;
        const bool adds = adds_at(st), stores_out = stores_at(st);
        // This step and the following ones of the same shape, when rolled into a loop.
        uint32_t last = st;
        if (roll)
            while (last < st1 && shape(last + 1) == shape(st)) ++last;
        const bool looped = last > st;
        // The step number and step x Q: constants, or registers in a loop over steps.
        Reg step_reg, step_q;
        const Label steps = b.label("steps");
        if (looped) {
            step_reg = b.reg("step", 25);
            step_q = b.reg("step_q", 26);
            b.emit(Li, {step_reg, imm(st)});
            b.emit(Li, {step_q, imm(int64_t(uint64_t(ord) * Q))});
            b.bind(steps);
        }
        const Arg stv = looped ? Arg(step_reg) : imm(st);
        const Arg stq = looped ? Arg(step_q) : imm(int64_t(uint64_t(ord) * Q));
        const Label loop = b.label("step");
        // Pipelined: the previous step already stored all but the last kEarly pieces.
        const uint32_t q0 = !sends && !p.barrier && Q > kEarly ? Q - kEarly : 0;
        b.emit(Li, {q, imm(q0)});
        b.bind(loop);
        b.emit(Add, {i, q, stq});
        b.emit(Add, {msg, i, gmsgs});
        b.emit(Remu, {own_slot, i, imm(O)});
        b.emit(Mul, {own_slot, own_slot, imm(int64_t(P))});
        if (sends) {
            b.emit(Remu, {out_slot, msg, imm(K)});
            b.emit(Mul, {out_slot, out_slot, imm(int64_t(P))});
        }
        if (st > st0) {
            b.emit(Sub, {in_slot, msg, imm(Q)});
            b.emit(Remu, {in_slot, in_slot, imm(K)});
            b.emit(Mul, {in_slot, in_slot, imm(int64_t(P))});
        }
        // (1) Prefetch the own data of the next piece of this group (double buffering).
        if (loads_own) {
            // This piece's own data must be in before the prefetch is issued: the banked HBM can
            // finish a later load first, and the flag only counts completions, so a wait after
            // the prefetch could be satisfied by the prefetch while this piece is still on its
            // way.
            b.emit(Wait, {loads, nloads});
            const Label none = b.label("nopre"), same = b.label("same");
            b.emit(Add, {nq, q, imm(1)});
            if (looped)
                b.emit(Add, {nstep, step_reg, imm(0)});
            else
                b.emit(Li, {nstep, imm(st)});
            b.emit(Bltu, {nq, imm(Q), same});
            if (st + 1 > N - 1) {
                b.emit(Jmp, {none});
            } else {
                b.emit(Li, {nq, imm(0)});
                if (looped)
                    b.emit(Add, {nstep, step_reg, imm(1)});
                else
                    b.emit(Li, {nstep, imm(st + 1)});
            }
            b.bind(same);
            // The slot's previous user: a step-0 piece sent straight from it must have arrived.
            if (uint64_t(ord) * Q < Q + O) {
                const Label ok = b.label("ownok");
                b.emit(Add, {t, i, imm(1)});
                b.emit(Bltu, {t, imm(O), ok});
                b.emit(Sub, {t, t, imm(O - 1)});
                b.emit(Bltu, {imm(Q), t, ok});
                b.emit(Add, {t, t, gmsgs});
                for (int d = 0; d < 2; ++d) b.emit(Wait, {sent[d], t});
                b.bind(ok);
            }
            b.emit(Add, {t, i, imm(1)});
            b.emit(Remu, {t, t, imm(O)});
            b.emit(Mul, {t, t, imm(int64_t(P))});
            for (int d = 0; d < 2; ++d) dma(true, d, nstep, nq, t + int64_t(own[d].addr()));
            b.bind(none);
        }
        // (2) The piece of step st-1 has arrived (whole step st-1 with the barrier).
        if (st > st0) {
            // The last step only stores what arrives, so it never waits for the whole chunk.
            if (p.barrier && sends)
                b.emit(Add, {t, gmsgs, stq});
            else
                b.emit(Add, {t, msg, imm(1 - int64_t(Q))});
            for (int d = 0; d < 2; ++d) b.emit(Wait, {arrived[d], t});
        }
        // (3) Add the own piece into the received one; the owner of the sum scales it.
        if (adds) {
            for (int d = 0; d < 2; ++d) {
                const Arg acc = in_slot + int64_t(recv[d].addr());
                vpu[d].issue(VAdd, {acc, acc, own_slot + int64_t(own[d].addr()), imm(Pe)});
                if (st == N - 1 && !rs) {
                    const Label one = b.label("one");
                    b.emit(Beq, {scale, imm(kOneBits), one});
                    vpu[d].issue(VMulS, {acc, acc, scale, imm(Pe)});
                    b.bind(one);
                }
            }
        }
        // (4) Send: a free slot on the receiver (credits), then the transfer.
        if (sends) {
            if (reuse && uint64_t(st + 1) * Q > K) {
                const Label ok = b.label("credit");
                b.emit(Bltu, {msg, imm(K), ok});
                b.emit(Add, {t, msg, imm(1 - int64_t(K))});
                for (int d = 0; d < 2; ++d) b.emit(Wait, {credit[d], t});
                b.bind(ok);
            }
            for (int d = 0; d < 2; ++d) {
                if (adds) vpu[d].wait_all();
                const Arg src = st == st0 ? own_slot + int64_t(own[d].addr())
                                          : in_slot + int64_t(recv[d].addr());
                b.emit(IciV, {d == 0 ? next : prev, out_slot + int64_t(recv[d].addr()), src,
                              imm(int64_t(P)), arrived[d], sent[d]});
            }
        }
        // (5) Hand back the slot used free_lag pieces ago: its forward has arrived, its store
        // is done.
        if (reuse && st > st0 && sends) {
            const Label none = b.label("nofree"), clamp = b.label("clamp");
            b.emit(Bltu, {i, imm(int64_t(uint64_t(Q) + D)), none});
            b.emit(Add, {t, i, imm(1 - int64_t(D))});
            b.emit(Bltu, {t, imm(int64_t(Mg + 1)), clamp});
            b.emit(Li, {t, imm(int64_t(Mg))});
            b.bind(clamp);
            b.emit(Add, {t, t, gmsgs});
            for (int d = 0; d < 2; ++d) b.emit(Wait, {sent[d], t});
            stores.wait_all();
            b.emit(Sigr, {prev, credit[0], imm(1)});
            b.emit(Sigr, {next, credit[1], imm(1)});
            b.bind(none);
        }
        // (6) Pipelined, last sending step: store the final piece that arrived kEarly pieces
        // ago, so the last step does not store a whole chunk after the links went quiet.
        if (!p.barrier && st == 2 * (N - 1) - 1 && Q > kEarly) {
            const Label none = b.label("noearly");
            const Reg early = b.reg("early_slot", 25);
            b.emit(Bltu, {q, imm(kEarly), none});
            b.emit(Add, {t, msg, imm(1 - int64_t(kEarly))});
            for (int d = 0; d < 2; ++d) b.emit(Wait, {arrived[d], t});
            b.emit(Sub, {t, t, imm(1)});
            b.emit(Remu, {t, t, imm(K)});
            b.emit(Mul, {early, t, imm(int64_t(P))});
            b.emit(Sub, {nq, q, imm(kEarly)});
            for (int d = 0; d < 2; ++d)
                dma(false, d, imm(st + 1), nq, early + int64_t(recv[d].addr()));
            b.bind(none);
        }
        // (7) Store the finished piece.
        if (stores_out)
            for (int d = 0; d < 2; ++d) {
                if (adds && !sends) vpu[d].wait_all();  // the reduce-scatter's last sum
                dma(false, d, stv, q, in_slot + int64_t(recv[d].addr()));
            }
        b.emit(Add, {q, q, imm(1)});
        b.emit(Bltu, {q, imm(Q), loop});
        if (looped) {
            b.emit(Add, {step_reg, step_reg, imm(1)});
            b.emit(Add, {step_q, step_q, imm(Q)});
            b.emit(Bltu, {step_reg, imm(last + 1), steps});
            st = last;
        }
    }
    if (p.groups > 1) {
        // Between groups: every transfer has arrived and every store is done, so the slots
        // not yet handed back go back at once and the next group starts with empty rings.
        const Label done = b.label("last");
        b.emit(Add, {group, group, imm(1)});
        b.emit(Bltu, {imm(p.groups - 1), group, done});
        b.emit(Add, {t, gmsgs, imm(int64_t(Mg))});
        for (int d = 0; d < 2; ++d) b.emit(Wait, {sent[d], t});
        stores.wait_all();
        if (reuse) {
            // Handed back in the loop: pieces Q + D .. Mg - 1 of steps 1 .. 2N-3.
            const uint64_t freed = Mg > uint64_t(Q) + D ? Mg - Q - D : 0;
            b.emit(Sigr, {prev, credit[0], imm(int64_t(Mg - freed))});
            b.emit(Sigr, {next, credit[1], imm(int64_t(Mg - freed))});
        }
        b.emit(Add, {gfirst, gfirst, imm(int64_t(Gel))});
        b.emit(Add, {gmsgs, gmsgs, imm(int64_t(Mg))});
        b.emit(Jmp, {group_top});
        b.bind(done);
    }
    stores.wait_all();
    for (int d = 0; d < 2; ++d) b.emit(Wait, {sent[d], imm(int64_t(Mg * p.groups))});
    // A phase's credits must all be in before the next phase takes the flags (and resets them).
    if ((rs || ag) && reuse && Mg > uint64_t(Q) + D)
        for (int d = 0; d < 2; ++d)
            b.emit(Wait, {credit[d], imm(int64_t((Mg - Q - D) * p.groups))});
}

/// Declares the stand-alone kernel's launch arguments and emits it.
isa::Program standalone_hbm(const AllReduceHbmPlan& p, bool roll) {
    isa::Builder b(p.name());
    const isa::Reg position = b.arg("position"), next = b.arg("next"), prev = b.arg("prev");
    const isa::Reg x = b.arg("x"), scale = b.arg("scale");
    emit_hbm(b, p, AllReduceOperands::ring(x, scale, position, next, prev), roll);
    b.emit(isa::Opcode::Halt, {});
    return b.finish();
}

/// Whether the kernel of `p` loops over its steps: only when unrolled it does not fit in
/// instruction memory.
bool rolled(const AllReduceHbmPlan& p) {
    return p.imem_instrs != 0 && standalone_hbm(p, false).code.size() > p.imem_instrs;
}

}  // namespace

uint64_t AllReduceHbmPlan::vmem_bytes() const {
    return 2 * (uint64_t(recv_slots) + own_slots) * piece * 4;
}

void emit_ring_ready(isa::Builder& b, const isa::Arg& next, const isa::Arg& prev,
                     const isa::Flag& flag, uint32_t count) {
    b.emit(isa::Opcode::Sigr, {next, flag, isa::imm(1)});
    b.emit(isa::Opcode::Sigr, {prev, flag, isa::imm(1)});
    b.emit(isa::Opcode::Wait, {flag, isa::imm(2 * int64_t(count))});
}

void emit_allreduce(isa::Builder& b, const AllReduceHbmPlan& p, const AllReduceOperands& ops) {
    using K = streaming::Operand::Kind;
    if (ops.x.kind != K::Hbm || ops.scale.kind != K::Scalar || ops.position.kind != K::Scalar ||
        ops.next.kind != K::Scalar || ops.prev.kind != K::Scalar ||
        (p.ranges &&
         (ops.x_ccw.kind != K::Hbm || ops.n_cw.kind != K::Scalar || ops.n_ccw.kind != K::Scalar)))
        throw isa::BuildError(fmt::format(
            "kernel '{}': allreduce_hbm takes its tensor in HBM and scale, position, next and "
            "prev as scalars (with ranges: x_ccw in HBM, n_cw and n_ccw as scalars)",
            b.kernel()));
    emit_hbm(b, p, ops, rolled(p));
}

isa::Program generate(const AllReduceHbmPlan& p) {
    // Unrolled while it fits in instruction memory (no step-loop overhead); past that, as a
    // compiler would, steps of one shape share a loop, so any ring size fits.
    isa::Program prog = standalone_hbm(p, false);
    if (p.imem_instrs == 0 || prog.code.size() <= p.imem_instrs) return prog;
    return standalone_hbm(p, true);
}

isa::Program allreduce_hbm_program(const AllReduceHbmPlan& p) {
    return generate(p);
}

// ---- Torus all-reduce ------------------------------------------------------------------------

namespace {

/// Cores along x, y, z of the board's network (1 for a dimension it lacks).
std::array<uint32_t, 3> torus_dims(const hw::BoardConfig& cfg) {
    const hw::TorusShape s = hw::torus_shape(cfg.ici, cfg.cores());
    return {s.x, s.y, s.z};
}

/// A phase of the torus all-reduce on `cores` cores over `elements` (virtual) values: step
/// barriers (the pipelined schedule's early stores belong to the whole all-reduce's last
/// steps), one group covering the values.
std::optional<AllReduceHbmPlan> plan_phase(uint32_t cores, uint32_t elements,
                                           const hw::BoardConfig& cfg, AllReducePhase phase) {
    AllReduceHbmPlan p;
    try {
        p = plan_allreduce_hbm(cores, elements, cfg);
    } catch (const DeviceError&) {
        return std::nullopt;
    }
    if (p.groups != 1) return std::nullopt;
    const uint64_t P = uint64_t(p.piece) * 4, Q = p.pieces;
    const uint64_t messages = uint64_t(phase == AllReducePhase::Full ? 2 : 1) * (cores - 1) * Q;
    const uint64_t own = 2 * uint64_t(p.own_slots) * P;
    const uint64_t fit = cfg.core.vmem_bytes > own ? (cfg.core.vmem_bytes - own) / (2 * P) : 0;
    const RingTiming t = ring_timing(cfg, p.piece);
    const uint64_t slack = p.free_lag + 2 + ceil_div(2 * t.hop, t.ser);  // as for the ring
    if (fit < messages && fit < 2 * Q + slack) return std::nullopt;
    p.recv_slots = static_cast<uint32_t>(std::min(messages, fit));
    p.barrier = true;
    p.phase = phase;
    p.ranges = true;
    return p;
}

/// Values of direction d's range after the first phase: the partition's first half, the rest.
std::array<uint64_t, 2> first_ranges(const AllReduceHbmPlan& p) {
    const uint64_t half = std::min<uint64_t>(p.elements, uint64_t(p.cores) * p.chunk);
    return {half, p.elements - half};
}

constexpr const char* kDimName[3] = {"x", "y", "z"};

}  // namespace

std::optional<TorusAllReduceKey> plan_allreduce_torus(const hw::BoardConfig& cfg,
                                                      const std::vector<uint32_t>& cores,
                                                      uint32_t elements, bool force) {
    if (cfg.ici.topology == "ring" || cores.size() != cfg.cores()) return std::nullopt;
    for (size_t i = 0; i < cores.size(); ++i)
        if (cores[i] != i) return std::nullopt;
    std::vector<uint32_t> sizes;
    for (uint32_t n : torus_dims(cfg))
        if (n > 1) sizes.push_back(n);
    if (sizes.size() < 2 || elements == 0) return std::nullopt;
    TorusAllReduceKey k;
    k.elements = elements;
    uint64_t values = elements;  // the phase's (virtual) values: its two ranges' partition
    for (size_t i = 0; i < sizes.size(); ++i) {
        if (values > 0xFFFFFFFFull) return std::nullopt;
        const auto phase =
            i + 1 == sizes.size() ? AllReducePhase::Full : AllReducePhase::ReduceScatter;
        const auto p = plan_phase(sizes[i], static_cast<uint32_t>(values), cfg, phase);
        if (!p) return std::nullopt;
        k.phases.push_back(*p);
        values = 2 * uint64_t(p->chunk);  // a core's two chunks after the reduce-scatter
    }
    // The planner asks the network for both bounds and takes the smaller.
    const hw::IciCosts c = hw::ici_costs(cfg);
    const uint64_t bytes = uint64_t(elements) * 4;
    if (!force && hw::allreduce_torus_bound(c, sizes, bytes) >=
                      hw::allreduce_ring_bound(c, static_cast<uint32_t>(cores.size()), bytes))
        return std::nullopt;
    return k;
}

namespace {

/// The torus all-reduce of `k` into `b` (emit_allreduce_torus); with `roll`, every phase loops
/// over its steps of one shape.
void emit_torus(isa::Builder& b, const TorusAllReduceKey& k, const isa::Reg& x,
                const isa::Reg& scale, const isa::Smem& dims, const TorusReady& ready, bool roll) {
    using enum isa::Opcode;
    using isa::imm;
    using streaming::Operand;
    const size_t D = k.phases.size();
    const isa::Smem saved = b.smem("ranges", 4 * D);
    // The two ranges the current phase works on: HBM addresses and values.
    const isa::Reg xa = b.reg("range.cw"), xb = b.reg("range.ccw");
    const isa::Reg na = b.reg("values.cw"), nb = b.reg("values.ccw");
    const auto first = first_ranges(k.phases[0]);
    b.emit(Li, {xa, x});
    b.emit(Add, {xb, x, imm(int64_t(4 * uint64_t(k.phases[0].cores) * k.phases[0].chunk))});
    b.emit(Li, {na, imm(int64_t(first[0]))});
    b.emit(Li, {nb, imm(int64_t(first[1]))});
    auto run = [&](size_t dim, const AllReduceHbmPlan& p, size_t phase) {
        const auto scope = b.scope(fmt::format("{}.{}", kDimName[dim], phase));
        const isa::Reg pos = b.reg("position"), next = b.reg("next"), prev = b.reg("prev");
        b.emit(Lw, {pos, dims.word(3 * dim)});
        b.emit(Lw, {next, dims.word(3 * dim + 1)});
        b.emit(Lw, {prev, dims.word(3 * dim + 2)});
        AllReduceOperands ops = AllReduceOperands::ring(xa, scale, pos, next, prev);
        ops.x_ccw = Operand::hbm(xb);
        ops.n_cw = Operand::scalar(na);
        ops.n_ccw = Operand::scalar(nb);
        ops.ready = [&] { ready(phase, next, prev); };
        emit_hbm(b, p, ops, roll);
    };
    size_t phase = 0;
    for (size_t i = 0; i + 1 < D; ++i) {
        const AllReduceHbmPlan& p = k.phases[i];
        run(i, p, phase++);
        // Keep this phase's ranges for its all-gather, then narrow them to the two chunks this
        // core now holds summed: chunk position + 1 of the first, position - 1 of the second.
        for (int j = 0; j < 4; ++j)
            b.emit(Sw, {(j == 0 ? xa : j == 1 ? xb : j == 2 ? na : nb), saved.word(4 * i + j)});
        const auto scope = b.scope("narrow");
        const isa::Reg pos = b.reg("position"), off = b.reg("offset");
        b.emit(Lw, {pos, dims.word(3 * i)});
        for (int d = 0; d < 2; ++d) {
            const isa::Reg& base = d == 0 ? xa : xb;
            const isa::Reg& n = d == 0 ? na : nb;
            b.emit(Add, {off, pos, imm(d == 0 ? 1 : p.cores - 1)});
            b.emit(Remu, {off, off, imm(p.cores)});
            b.emit(Mul, {off, off, imm(p.chunk)});
            // values = clamp(values - offset, 0, chunk)
            b.if_(
                isa::Cond::Ltu, n, off,
                [&] {
                    b.emit(Li, {n, imm(0)});
                },
                [&] {
                    b.emit(Sub, {n, n, off});
                    b.if_(isa::Cond::Ltu, imm(p.chunk), n, [&] { b.emit(Li, {n, imm(p.chunk)}); });
                });
            b.emit(Shl, {off, off, imm(2)});
            b.emit(Add, {base, base, off});
        }
    }
    run(D - 1, k.phases[D - 1], phase++);
    for (size_t i = D - 1; i-- > 0;) {
        for (int j = 0; j < 4; ++j)
            b.emit(Lw, {(j == 0 ? xa : j == 1 ? xb : j == 2 ? na : nb), saved.word(4 * i + j)});
        AllReduceHbmPlan p = k.phases[i];
        p.phase = AllReducePhase::AllGather;
        run(i, p, phase++);
    }
}

/// The torus kernel of `k`; with `roll`, every phase loops over its steps of one shape.
isa::Program torus_program(const TorusAllReduceKey& k, bool roll) {
    using enum isa::Opcode;
    const size_t D = k.phases.size();
    isa::Builder b(k.name());
    const isa::Reg x = b.arg("x"), scale = b.arg("scale");
    // Each dimension's position and neighbours wait in scalar memory until their phases.
    const isa::Smem dims = b.smem("dims", 3 * D);
    {
        std::vector<isa::Reg> args;
        for (size_t i = 0; i < D; ++i)
            for (const char* what : {"position", "next", "prev"})
                args.push_back(b.arg(fmt::format("{}.{}", what, kDimName[i])));
        for (size_t j = 0; j < args.size(); ++j) b.emit(Sw, {args[j], dims.word(j)});
    }
    // One flag per phase for the handshake: a core sends in a phase only once both its
    // neighbours there have finished the phase before (and so freed the flags and VMEM the
    // phase reuses). Held for the whole program: never reset.
    std::vector<isa::Flag> ready;
    for (size_t i = 0; i + 1 < 2 * D; ++i) ready.push_back(b.flag(fmt::format("ready.{}", i)));
    emit_torus(
        b, k, x, scale, dims,
        [&](size_t phase, const isa::Reg& next, const isa::Reg& prev) {
            emit_ring_ready(b, next, prev, ready[phase], 1);
        },
        roll);
    b.emit(Halt, {});
    return b.finish();
}

/// Whether the torus kernel of `k` loops over its steps: its unrolled stand-alone program does
/// not fit in instruction memory.
bool torus_rolled(const TorusAllReduceKey& k) {
    const uint32_t limit = k.phases.at(0).imem_instrs;
    return limit != 0 && torus_program(k, false).code.size() > limit;
}

}  // namespace

void emit_allreduce_torus(isa::Builder& b, const TorusAllReduceKey& k, const isa::Reg& x,
                          const isa::Reg& scale, const isa::Smem& dims, const TorusReady& ready) {
    if (k.phases.empty()) throw isa::BuildError("allreduce_torus: a key without phases");
    const auto scope = b.scope("allreduce_torus");
    emit_torus(b, k, x, scale, dims, ready, torus_rolled(k));
}

void emit_torus_coordinates(isa::Builder& b, const TorusAllReduceKey& k, const isa::Reg& core,
                            const isa::Smem& dims) {
    using enum isa::Opcode;
    using isa::imm;
    const auto scope = b.scope("torus.coordinates");
    const isa::Reg pos = b.reg("position"), base = b.reg("base"), t = b.reg("t");
    uint64_t stride = 1;  // an active dimension's stride: the cores of the ones before it
    for (size_t j = 0; j < k.phases.size(); ++j) {
        const uint32_t n = k.phases[j].cores;
        // position = (core / stride) mod n; its ring is base + i x stride, i = 0..n-1.
        b.emit(Divu, {pos, core, imm(int64_t(stride))});
        b.emit(Remu, {pos, pos, imm(n)});
        b.emit(Mul, {t, pos, imm(int64_t(stride))});
        b.emit(Sub, {base, core, t});
        b.emit(Sw, {pos, dims.word(3 * j)});
        for (uint32_t w : {1u, 2u}) {  // next: position + 1, prev: position - 1 (mod n)
            b.emit(Add, {t, pos, imm(w == 1 ? 1 : n - 1)});
            b.emit(Remu, {t, t, imm(n)});
            b.emit(Mul, {t, t, imm(int64_t(stride))});
            b.emit(Add, {t, t, base});
            b.emit(Sw, {t, dims.word(3 * j + w)});
        }
        stride *= n;
    }
}

isa::Program generate(const TorusAllReduceKey& k) {
    // Unrolled while the whole program fits in instruction memory, as the ring kernel.
    isa::Program prog = torus_program(k, false);
    const uint32_t limit = k.phases.at(0).imem_instrs;
    if (limit == 0 || prog.code.size() <= limit) return prog;
    return torus_program(k, true);
}

std::vector<float> allreduce_torus_reference(const std::vector<std::vector<float>>& replicas,
                                             float scale, const TorusAllReduceKey& k,
                                             std::array<uint32_t, 3> dims) {
    const uint64_t n = k.elements;
    const uint32_t cores = dims[0] * dims[1] * dims[2];
    if (replicas.size() != cores || k.phases.empty())
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("torus all-reduce reference: {} replicas for {} cores",
                                      replicas.size(), cores));
    for (const auto& r : replicas)
        if (r.size() != n)
            throw DeviceError(ErrorKind::Usage, "all-reduce: replicas differ in length");
    const bool one = std::bit_cast<uint32_t>(scale) == kOneBits;
    std::vector<std::vector<float>> buf = replicas;
    // Each core's two ranges (offset, values), as the kernel narrows them.
    struct Range {
        uint64_t off[2], len[2];
    };
    const auto f0 = first_ranges(k.phases[0]);
    std::vector<Range> range(
        cores, Range{{0, uint64_t(k.phases[0].cores) * k.phases[0].chunk}, {f0[0], f0[1]}});
    std::vector<std::vector<Range>> kept;
    std::vector<uint32_t> active;  // the dimensions the phases run along
    for (uint32_t i = 0; i < 3; ++i)
        if (dims[i] > 1) active.push_back(i);
    auto coord = [&](uint32_t c, uint32_t i) {
        return i == 0 ? c % dims[0] : i == 1 ? (c / dims[0]) % dims[1] : c / (dims[0] * dims[1]);
    };
    auto stride = [&](uint32_t i) { return i == 0 ? 1u : i == 1 ? dims[0] : dims[0] * dims[1]; };
    // One phase along dimension `dim`: every ring of it (cores sharing the other coordinates)
    // reduces (and, for the last phase, scales and spreads) or gathers its chunks.
    auto phase = [&](uint32_t dim, const AllReduceHbmPlan& p, AllReducePhase what) {
        const uint32_t N = p.cores;
        const uint64_t E = p.chunk;
        for (uint32_t c = 0; c < cores; ++c) {
            if (coord(c, dim) != 0) continue;  // ring members: c + j * stride(dim)
            auto member = [&](uint32_t j) { return c + (j % N) * stride(dim); };
            const Range r = range[c];  // the same on every member
            for (int d = 0; d < 2; ++d)
                for (uint32_t ch = 0; ch < N; ++ch)
                    for (uint64_t v = ch * E; v < std::min<uint64_t>((ch + 1) * E, r.len[d]); ++v) {
                        const uint64_t a = r.off[d] + v;
                        const uint32_t owner = d == 0 ? (ch + N - 1) % N : (ch + 1) % N;
                        if (what == AllReducePhase::AllGather) {
                            for (uint32_t j = 0; j < N; ++j)
                                buf[member(j)][a] = buf[member(owner)][a];
                            continue;
                        }
                        float acc = buf[member(ch)][a];
                        for (uint32_t s = 1; s < N; ++s)
                            acc = acc + buf[member(d == 0 ? ch + s : ch + N * N - s)][a];
                        if (what == AllReducePhase::Full) {
                            if (!one) acc = acc * scale;
                            for (uint32_t j = 0; j < N; ++j) buf[member(j)][a] = acc;
                        } else {
                            buf[member(owner)][a] = acc;
                        }
                    }
        }
    };
    for (size_t i = 0; i + 1 < k.phases.size(); ++i) {
        const AllReduceHbmPlan& p = k.phases[i];
        phase(active[i], p, AllReducePhase::ReduceScatter);
        kept.push_back(range);
        for (uint32_t c = 0; c < cores; ++c) {
            const uint32_t pos = coord(c, active[i]);
            for (int d = 0; d < 2; ++d) {
                const uint64_t off =
                    uint64_t((pos + (d == 0 ? 1 : p.cores - 1)) % p.cores) * p.chunk;
                Range& r = range[c];
                r.len[d] = r.len[d] < off ? 0 : std::min<uint64_t>(r.len[d] - off, p.chunk);
                r.off[d] += off;
            }
        }
    }
    phase(active[k.phases.size() - 1], k.phases.back(), AllReducePhase::Full);
    for (size_t i = k.phases.size() - 1; i-- > 0;) {
        range = kept[i];
        phase(active[i], k.phases[i], AllReducePhase::AllGather);
    }
    for (uint32_t c = 1; c < cores; ++c)
        if (buf[c] != buf[0])
            throw std::logic_error(fmt::format("torus all-reduce reference: core {} differs", c));
    return buf[0];
}

std::vector<float> allreduce_reference(const hw::BoardConfig& cfg,
                                       const std::vector<uint32_t>& cores,
                                       const std::vector<std::vector<float>>& replicas,
                                       float scale) {
    if (!replicas.empty() && !replicas[0].empty() && replicas[0].size() <= 0xFFFFFFFFu)
        if (const auto k =
                plan_allreduce_torus(cfg, cores, static_cast<uint32_t>(replicas[0].size())))
            return allreduce_torus_reference(replicas, scale, *k, torus_dims(cfg));
    return allreduce_reference(replicas, scale);
}

Event allreduce_torus(Device& dev, ProgramCache& cache, const Tensor& t, float scale,
                      const TorusAllReduceKey& k) {
    const auto dims = torus_dims(dev.config());
    if (t.elements() != k.elements || t.cores.size() != dev.config().cores() ||
        t.bufs.size() != t.cores.size())
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("torus all-reduce: a tensor of {} values on {} cores for a "
                        "plan of {} values on the board's {} cores",
                        t.elements(), t.cores.size(), k.elements, dev.config().cores()));
    std::vector<uint32_t> active;
    for (uint32_t i = 0; i < 3; ++i)
        if (dims[i] > 1) active.push_back(i);
    const uint32_t stride[3] = {1, dims[0], dims[0] * dims[1]};
    return launch(dev, cache, k, t.cores, [&](size_t i, LaunchArgs& a) {
        a.set("x", t.bufs[i]).set_f32("scale", scale);
        const auto c = t.cores[i];
        for (size_t j = 0; j < active.size(); ++j) {
            const uint32_t dim = active[j], w = dims[dim], s = stride[dim];
            const uint32_t pos = (c / s) % w, base = c - pos * s;
            a.set(fmt::format("position.{}", kDimName[j]), pos)
                .set(fmt::format("next.{}", kDimName[j]), base + (pos + 1) % w * s)
                .set(fmt::format("prev.{}", kDimName[j]), base + (pos + w - 1) % w * s);
        }
    });
}

Event allreduce(Device& dev, ProgramCache& cache, const Tensor& t, float scale,
                AllReduceSchedule schedule) {
    if (t.cores.empty() || t.elements() == 0)
        throw DeviceError(ErrorKind::Usage, "all-reduce of an empty tensor");
    if (t.bufs.size() != t.cores.size())
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("all-reduce: the tensor has {} buffers for {} cores",
                                      t.bufs.size(), t.cores.size()));
    std::unordered_set<uint32_t> seen;
    for (size_t i = 0; i < t.cores.size(); ++i) {
        if (t.bufs[i].core != t.cores[i])
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("all-reduce: replica {} lives on core {}, not core {}", i,
                                          t.bufs[i].core, t.cores[i]));
        if (!seen.insert(t.cores[i]).second)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("all-reduce: core {} appears twice", t.cores[i]));
        if (t.bufs[i].bytes < t.bytes())
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("all-reduce: replica {} holds {} bytes, not {}", i,
                                          t.bufs[i].bytes, t.bytes()));
    }
    if (t.elements() > 0xFFFFFFFFull / 4)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("all-reduce of {} values: at most {} per core", t.elements(),
                                      0xFFFFFFFFull / 4));
    const auto N = static_cast<uint32_t>(t.cores.size());
    if (N == 1) {
        if (std::bit_cast<uint32_t>(scale) == kOneBits) {
            Event e;
            e.start_cycle = e.end_cycle = dev.now_cycle();
            e.cores = t.cores;
            e.core_cycles = {0};
            return e;
        }
        return driver::scale(dev, cache, t, scale, t);
    }
    const auto n = static_cast<uint32_t>(t.elements());
    if (schedule == AllReduceSchedule::Auto)
        if (const auto k = plan_allreduce_torus(dev.config(), t.cores, n))
            return allreduce_torus(dev, cache, t, scale, *k);
    const AllReduceHbmPlan p = plan_allreduce_hbm(N, n, dev.config(), schedule);
    return launch(dev, cache, p, t.cores, [&](size_t i, LaunchArgs& a) {
        a.set("position", static_cast<uint32_t>(i))
            .set("next", t.cores[(i + 1) % N])
            .set("prev", t.cores[(i + N - 1) % N])
            .set("x", t.bufs[i])
            .set_f32("scale", scale);
    });
}

std::vector<float> allreduce_reference(const std::vector<std::vector<float>>& replicas,
                                       float scale) {
    if (replicas.empty() || replicas[0].empty())
        throw DeviceError(ErrorKind::Usage, "all-reduce of an empty tensor");
    const auto N = static_cast<uint32_t>(replicas.size());
    const uint64_t n = replicas[0].size();
    for (const auto& r : replicas)
        if (r.size() != n)
            throw DeviceError(ErrorKind::Usage, "all-reduce: replicas differ in length");
    const bool one = std::bit_cast<uint32_t>(scale) == kOneBits;
    std::vector<float> out(n);
    if (N == 1) {
        for (uint64_t i = 0; i < n; ++i) out[i] = one ? replicas[0][i] : replicas[0][i] * scale;
        return out;
    }
    const AllReduceHbmPlan p = allreduce_partition(N, static_cast<uint32_t>(n));
    const uint64_t E = p.chunk, Gel = 2 * uint64_t(N) * E;
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t j = (i % Gel) / E;
        const uint32_t d = static_cast<uint32_t>(j / N), c = static_cast<uint32_t>(j % N);
        float acc = replicas[c][i];
        for (uint32_t k = 1; k < N; ++k) {
            const uint32_t from = d == 0 ? (c + k) % N : (c + N - k) % N;
            acc = acc + replicas[from][i];
        }
        out[i] = one ? acc : acc * scale;
    }
    return out;
}

}  // namespace tpu::driver
