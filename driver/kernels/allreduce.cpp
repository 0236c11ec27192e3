// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/allreduce.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <string>
#include <unordered_set>

#include <fmt/format.h>

#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "isa/assembler.h"

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

isa::Program allreduce_program(const AllReducePlan& p) {
    const uint32_t N = p.cores, C = allreduce_chunk_bytes(p), E = C / 4;
    const uint64_t half = uint64_t(N) * C;  // direction 1 works on the second half
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    L("# ring all-reduce: N={} chunk={} B; s1 position, s2 next core, s3 previous core", N, C);
    // Byte offset of chunk (s1 + delta) mod N into `reg`.
    auto chunk = [&](int delta, const char* reg) {
        L("        add {}, s1, {}", reg, (delta % int(N) + int(N)) % int(N));
        L("        remu {}, {}, {}", reg, reg, N);
        L("        mul {}, {}, {}", reg, reg, C);
    };
    // Direction 0 sends to s2 (clockwise) and receives from s3; direction 1 the reverse. In
    // reduce-scatter step k direction 0 sends chunk p-k and adds the received chunk p-1-k into
    // its own; direction 1 mirrors it (p+k, p+1+k). Both directions interleave step by step.
    for (uint32_t k = 0; k + 1 < N; ++k) {
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const uint64_t base = p.x_addr + d * half;
            const uint64_t slot = p.scratch_addr + (uint64_t(d) * (N - 1) + k) * C;
            if (k > 0) L("        wait f{}, {}", 3 + d, k);
            chunk(sign * int(k), "s10");
            L("        ici.v {}, [{}], [s10+{}], {}, f{}", d == 0 ? "s2" : "s3", slot, base, C,
              1 + d);
        }
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const uint64_t base = p.x_addr + d * half;
            const uint64_t slot = p.scratch_addr + (uint64_t(d) * (N - 1) + k) * C;
            L("        wait f{}, {}", 1 + d, k + 1);
            chunk(sign * (int(k) + 1), "s11");
            L("        v.add [s11+{}], [s11+{}], [{}], {}, f{}", base, base, slot, E, 3 + d);
        }
    }
    // Own reduced chunk (p+1 clockwise, p-1 counter-clockwise) into y.
    for (int d = 0; d < 2; ++d) {
        const int sign = d == 0 ? -1 : 1;
        L("        wait f{}, {}", 3 + d, N - 1);
        chunk(-sign, "s12");
        L("        dma.vv [s12+{}], [s12+{}], 1, {}, {}, {}, f7", p.y_addr + d * half,
          p.x_addr + d * half, C, C, C);
    }
    // All-gather: step k sends chunk p+1-k (clockwise) to the neighbour's y; from step 1 on
    // the chunk is the one received in the step before.
    for (uint32_t k = 0; k + 1 < N; ++k)
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const char* src = k == 0 ? "x" : "y";
            if (k > 0) L("        wait f{}, {}", 5 + d, k);
            chunk(sign * (int(k) - 1), "s13");
            L("        ici.v {}, [s13+{}], [s13+{}], {}, f{}   # from {}", d == 0 ? "s2" : "s3",
              p.y_addr + d * half, (k == 0 ? p.x_addr : p.y_addr) + d * half, C, 5 + d, src);
        }
    L("        wait f5, {}", N - 1);
    L("        wait f6, {}", N - 1);
    L("        wait f7, 2");
    L("        halt");
    return isa::assemble(s, "allreduce.s");
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
    r.event = dev.launch(cores, allreduce_program(p), [&](size_t i) {
        return std::vector<uint32_t>{static_cast<uint32_t>(i), cores[(i + 1) % N],
                                     cores[(i + N - 1) % N]};
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
    const double bw = cfg.clock().bytes_per_cycle(cfg.ici.link_gb_per_s);
    return {cfg.ns_to_cycles(cfg.ici.hop_latency_ns),
            std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(piece_values * 4.0 / bw)))};
}

}  // namespace

AllReduceHbmPlan plan_allreduce_hbm(uint32_t cores, uint32_t elements, const hw::BoardConfig& cfg,
                                    AllReduceSchedule schedule) {
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
    const uint64_t vmem = cfg.core.vmem_bytes, own = 2 * uint64_t(p.own_slots) * P;
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
    p.recv_addr[0] = 0;
    p.recv_addr[1] = static_cast<uint32_t>(k * P);
    p.own_addr[0] = static_cast<uint32_t>(2 * k * P);
    p.own_addr[1] = static_cast<uint32_t>(2 * k * P + p.own_slots * P);
    return p;
}

namespace {
/// The kernel's source; with `roll`, runs of steps whose code differs only in the step number
/// become one loop over a step register (s25 = step, s26 = step x Q) instead of a copy each.
std::string allreduce_hbm_source(const AllReduceHbmPlan& p, bool roll) {
    const uint32_t N = p.cores, Q = p.pieces, Pe = p.piece, E = p.chunk, K = p.recv_slots;
    const uint32_t O = p.own_slots, D = p.free_lag, n = p.elements;
    const uint64_t P = uint64_t(Pe) * 4;
    const uint64_t Mg = uint64_t(2 * (N - 1)) * Q;  // messages per direction and group
    const uint64_t Gel = 2 * uint64_t(N) * E;       // values per group
    const bool reuse = uint64_t(K) < Mg * p.groups;
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    int label = 0;
    auto fresh = [&](const char* what) { return fmt::format("{}{}", what, label++); };
    L("# HBM ring all-reduce: N={} values={} piece={} pieces={} groups={} K={} O={} D={} {}", N, n,
      Pe, Q, p.groups, K, O, D, p.barrier ? "step-barrier" : "pipelined");
    L("# s1 position, s2 next, s3 previous, s4 HBM address, s5 scale; s6 piece q, s7 loads,");
    L("# s8 stores, s9/s10 VPU ops per direction issued; s11 i (piece of the group), s12 own");
    L("# slot, s13 slot of the piece received, s14 slot it goes to; s17 first value of the");
    L("# group, s18 messages before it, s19 global message index, s21 group.");
    L("# Flags: f1/f2 arrivals, f3/f4 credits, f5 loads, f6 stores, f7/f8 sends done, f9/f10 VPU");
    // One HBM transfer of piece `q` of the step-`step` chunk of direction d, clipped to the
    // tensor (a piece past its end moves nothing and counts nothing).
    auto dma = [&](bool load, int d, const std::string& step, const std::string& q,
                   const std::string& vmem) {
        const std::string go = fresh("go"), skip = fresh("skip"), full = fresh("full");
        if (d == 0) {
            L("        sub s22, s1, {}", step);
            L("        add s22, s22, {}", 2 * N);  // step < 2N: stays positive
        } else {
            L("        add s22, s1, {}", step);
        }
        L("        remu s22, s22, {}", N);
        L("        mul s22, s22, {}", E);
        L("        add s22, s22, s17+{}", uint64_t(d) * N * E);
        L("        mul s23, {}, {}", q, Pe);
        L("        add s22, s22, s23");
        L("        bltu s22, {}, {}", n, go);
        L("        jmp {}", skip);
        L("{}:     sub s23, {}, s22", go, n);
        L("        bltu s23, {}, {}", Pe, full);
        L("        li s23, {}", Pe);
        L("{}:     shl s23, s23, 2", full);
        L("        shl s22, s22, 2");
        L("        add s22, s22, s4");
        if (load) {
            L("        dma.hv [{}], [s22], 1, s23, s23, s23, f5", vmem);
            L("        add s7, s7, 1");
        } else {
            L("        dma.vh [s22], [{}], 1, s23, s23, s23, f6", vmem);
            L("        add s8, s8, 1");
        }
        L("{}:", skip);
    };
    for (int r : {7, 8, 9, 10, 17, 18, 21}) L("        li s{}, 0", r);
    L("group:");
    // Own data of step 0, piece 0 (slot 0): every earlier user of the slot has finished.
    for (int d = 0; d < 2; ++d) dma(true, d, "0", "0", fmt::format("{}", p.own_addr[d]));
    // Everything about a step's code but its number: steps with equal shapes can share a loop.
    auto shape = [&](uint32_t st) {
        const bool sends = st <= 2 * (N - 1) - 1;
        return std::array<bool, 10>{st == 0,
                                    st <= N - 1,
                                    st >= 1 && st <= N - 1,
                                    st >= N - 1,
                                    sends,
                                    st == N - 1,
                                    uint64_t(st) * Q < Q + O,
                                    reuse && uint64_t(st + 1) * Q > K,
                                    st == 2 * (N - 1) - 1,
                                    st == 2 * (N - 1)};
    };
    for (uint32_t st = 0; st <= 2 * (N - 1); ++st) {
        const bool sends = st <= 2 * (N - 1) - 1, loads = st <= N - 1;
        const bool adds = st >= 1 && st <= N - 1, stores = st >= N - 1;
        // This step and the following ones of the same shape, when rolled into a loop.
        uint32_t last = st;
        if (roll)
            while (last < 2 * (N - 1) && shape(last + 1) == shape(st)) ++last;
        const bool looped = last > st;
        // The step number and step x Q: constants, or registers in a loop over steps.
        const std::string stv = looped ? "s25" : fmt::format("{}", st);
        const std::string stq = looped ? "s26" : fmt::format("{}", uint64_t(st) * Q);
        const std::string steps = fresh("steps");
        if (looped) {
            L("        li s25, {}", st);
            L("        li s26, {}", uint64_t(st) * Q);
            L("{}:", steps);
        }
        const std::string loop = fresh("step");
        L("# step {}{}: {}{}{}{}", st, looped ? fmt::format("-{}", last) : "", loads ? "load " : "",
          adds ? "add " : "", sends ? "send " : "", stores ? "store" : "");
        // Pipelined: the previous step already stored all but the last kEarly pieces.
        const uint32_t q0 = !sends && !p.barrier && Q > kEarly ? Q - kEarly : 0;
        L("        li s6, {}", q0);
        L("{}:", loop);
        L("        add s11, s6, {}", stq);
        L("        add s19, s11, s18");
        L("        remu s12, s11, {}", O);
        L("        mul s12, s12, {}", P);
        if (sends) {
            L("        remu s14, s19, {}", K);
            L("        mul s14, s14, {}", P);
        }
        if (st >= 1) {
            L("        sub s13, s19, {}", Q);
            L("        remu s13, s13, {}", K);
            L("        mul s13, s13, {}", P);
        }
        // (1) Prefetch the own data of the next piece of this group (double buffering).
        if (loads) {
            // This piece's own data must be in before the prefetch is issued: the banked HBM can
            // finish a later load first, and f5 only counts completions, so a wait after the
            // prefetch could be satisfied by the prefetch while this piece is still on its way.
            L("        wait f5, s7");
            const std::string none = fresh("nopre"), same = fresh("same");
            L("        add s15, s6, 1");
            if (looped)
                L("        add s16, s25, 0");
            else
                L("        li s16, {}", st);
            L("        bltu s15, {}, {}", Q, same);
            if (st + 1 > N - 1) {
                L("        jmp {}", none);
            } else {
                L("        li s15, 0");
                if (looped)
                    L("        add s16, s25, 1");
                else
                    L("        li s16, {}", st + 1);
            }
            L("{}:", same);
            // The slot's previous user: a step-0 piece sent straight from it must have arrived.
            if (uint64_t(st) * Q < Q + O) {
                const std::string ok = fresh("ownok");
                L("        add s24, s11, 1");
                L("        bltu s24, {}, {}", O, ok);
                L("        sub s24, s24, {}", O - 1);
                L("        bltu {}, s24, {}", Q, ok);
                L("        add s24, s24, s18");
                L("        wait f7, s24");
                L("        wait f8, s24");
                L("{}:", ok);
            }
            L("        add s24, s11, 1");
            L("        remu s24, s24, {}", O);
            L("        mul s24, s24, {}", P);
            for (int d = 0; d < 2; ++d)
                dma(true, d, "s16", "s15", fmt::format("s24+{}", p.own_addr[d]));
            L("{}:", none);
        }
        // (2) The piece of step st-1 has arrived (whole step st-1 with the barrier).
        if (st >= 1) {
            // The last step only stores what arrives, so it never waits for the whole chunk.
            if (p.barrier && sends)
                L("        add s24, s18, {}", stq);
            else
                L("        add s24, s19, {}", 1 - int64_t(Q));
            L("        wait f1, s24");
            L("        wait f2, s24");
        }
        // (3) Add the own piece into the received one; the owner of the sum scales it.
        if (adds) {
            for (int d = 0; d < 2; ++d) {
                L("        v.add [s13+{}], [s13+{}], [s12+{}], {}, f{}", p.recv_addr[d],
                  p.recv_addr[d], p.own_addr[d], Pe, 9 + d);
                L("        add s{}, s{}, 1", 9 + d, 9 + d);
                if (st == N - 1) {
                    const std::string one = fresh("one");
                    L("        beq s5, {}, {}", kOneBits, one);
                    L("        v.muls [s13+{}], [s13+{}], s5, {}, f{}", p.recv_addr[d],
                      p.recv_addr[d], Pe, 9 + d);
                    L("        add s{}, s{}, 1", 9 + d, 9 + d);
                    L("{}:", one);
                }
            }
        }
        // (4) Send: a free slot on the receiver (credits), then the transfer.
        if (sends) {
            if (reuse && uint64_t(st + 1) * Q > K) {
                const std::string ok = fresh("credit");
                L("        bltu s19, {}, {}", K, ok);
                L("        add s24, s19, {}", 1 - int64_t(K));
                L("        wait f3, s24");
                L("        wait f4, s24");
                L("{}:", ok);
            }
            for (int d = 0; d < 2; ++d) {
                if (adds) L("        wait f{}, s{}", 9 + d, 9 + d);
                const std::string src = st == 0 ? fmt::format("s12+{}", p.own_addr[d])
                                                : fmt::format("s13+{}", p.recv_addr[d]);
                L("        ici.v {}, [s14+{}], [{}], {}, f{}, f{}", d == 0 ? "s2" : "s3",
                  p.recv_addr[d], src, P, 1 + d, 7 + d);
            }
        }
        // (5) Hand back the slot used free_lag pieces ago: its forward has arrived, its store
        // is done.
        if (reuse && st >= 1 && sends) {
            const std::string none = fresh("nofree"), c = fresh("clamp");
            L("        bltu s11, {}, {}", uint64_t(Q) + D, none);
            L("        add s24, s11, {}", 1 - int64_t(D));
            L("        bltu s24, {}, {}", Mg + 1, c);
            L("        li s24, {}", Mg);
            L("{}:     add s24, s24, s18", c);
            L("        wait f7, s24");
            L("        wait f8, s24");
            L("        wait f6, s8");
            L("        sigr s3, f3, 1");
            L("        sigr s2, f4, 1");
            L("{}:", none);
        }
        // (6) Pipelined, last sending step: store the final piece that arrived kEarly pieces
        // ago, so the last step does not store a whole chunk after the links went quiet.
        if (!p.barrier && st == 2 * (N - 1) - 1 && Q > kEarly) {
            const std::string none = fresh("noearly");
            L("        bltu s6, {}, {}", kEarly, none);
            L("        add s24, s19, {}", 1 - int64_t(kEarly));
            L("        wait f1, s24");
            L("        wait f2, s24");
            L("        sub s24, s24, 1");
            L("        remu s24, s24, {}", K);
            L("        mul s25, s24, {}", P);
            L("        sub s15, s6, {}", kEarly);
            for (int d = 0; d < 2; ++d)
                dma(false, d, fmt::format("{}", st + 1), "s15",
                    fmt::format("s25+{}", p.recv_addr[d]));
            L("{}:", none);
        }
        // (7) Store the finished piece.
        if (stores)
            for (int d = 0; d < 2; ++d)
                dma(false, d, stv, "s6", fmt::format("s13+{}", p.recv_addr[d]));
        L("        add s6, s6, 1");
        L("        bltu s6, {}, {}", Q, loop);
        if (looped) {
            L("        add s25, s25, 1");
            L("        add s26, s26, {}", Q);
            L("        bltu s25, {}, {}", last + 1, steps);
            st = last;
        }
    }
    if (p.groups > 1) {
        // Between groups: every transfer has arrived and every store is done, so the slots
        // not yet handed back go back at once and the next group starts with empty rings.
        const std::string last = fresh("last");
        L("        add s21, s21, 1");
        L("        bltu {}, s21, {}", p.groups - 1, last);
        L("        add s24, s18, {}", Mg);
        L("        wait f7, s24");
        L("        wait f8, s24");
        L("        wait f6, s8");
        if (reuse) {
            // Handed back in the loop: pieces Q + D .. Mg - 1 of steps 1 .. 2N-3.
            const uint64_t freed = Mg > uint64_t(Q) + D ? Mg - Q - D : 0;
            L("        sigr s3, f3, {}", Mg - freed);
            L("        sigr s2, f4, {}", Mg - freed);
        }
        L("        add s17, s17, {}", Gel);
        L("        add s18, s18, {}", Mg);
        L("        jmp group");
        L("{}:", last);
    }
    L("        wait f6, s8");
    L("        wait f7, {}", Mg * p.groups);
    L("        wait f8, {}", Mg * p.groups);
    L("        halt");
    return s;
}
}  // namespace

isa::Program allreduce_hbm_program(const AllReduceHbmPlan& p) {
    // Unrolled while it fits in instruction memory (no step-loop overhead); past that, as a
    // compiler would, steps of one shape share a loop, so any ring size fits.
    isa::Program prog = isa::assemble(allreduce_hbm_source(p, false), "allreduce_hbm.s");
    if (p.imem_instrs == 0 || prog.code.size() <= p.imem_instrs) return prog;
    return isa::assemble(allreduce_hbm_source(p, true), "allreduce_hbm.s");
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
    const AllReduceHbmPlan p = plan_allreduce_hbm(N, n, dev.config(), schedule);
    const std::string key =
        fmt::format("allreduce_hbm N{} n{} {}", N, n, p.barrier ? "barrier" : "pipelined");
    const isa::Program& prog = cache.get(key, [&] { return allreduce_hbm_program(p); });
    return dev.launch(t.cores, prog, [&](size_t i) {
        return std::vector<uint32_t>{
            static_cast<uint32_t>(i), t.cores[(i + 1) % N], t.cores[(i + N - 1) % N],
            static_cast<uint32_t>(t.bufs[i].addr), std::bit_cast<uint32_t>(scale)};
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
