// SPDX-License-Identifier: Apache-2.0
// Temporary (issue 25 item 4): the all-reduce kernels' old assembly-text generators, kept only
// to prove that the builder versions emit byte-identical programs for every plan the tests,
// the presets and the pod tests use (and many more). Deleted once they agree; the golden
// hashes in kernel_programs_test.cpp keep them identical afterwards.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include <fmt/format.h>

#include "driver/kernels/allreduce.h"
#include "hw/board.h"
#include "isa/assembler.h"
#include "tests/common/paths.h"

namespace tpu::driver {
namespace {

constexpr uint32_t kOneBits = 0x3f800000;
constexpr uint32_t kEarly = 3;

isa::Program old_allreduce_program(const AllReducePlan& p) {
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

/// The kernel's source; with `roll`, runs of steps whose code differs only in the step number
/// become one loop over a step register (s25 = step, s26 = step x Q) instead of a copy each.
std::string allreduce_hbm_source(const AllReduceHbmPlan& p, bool roll) {
    const uint64_t Pb = uint64_t(p.piece) * 4;
    const uint64_t recv_addr[2] = {0, uint64_t(p.recv_slots) * Pb};
    const uint64_t own_addr[2] = {2 * uint64_t(p.recv_slots) * Pb,
                                  2 * uint64_t(p.recv_slots) * Pb + p.own_slots * Pb};
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
    for (int d = 0; d < 2; ++d) dma(true, d, "0", "0", fmt::format("{}", own_addr[d]));
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
                dma(true, d, "s16", "s15", fmt::format("s24+{}", own_addr[d]));
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
                L("        v.add [s13+{}], [s13+{}], [s12+{}], {}, f{}", recv_addr[d], recv_addr[d],
                  own_addr[d], Pe, 9 + d);
                L("        add s{}, s{}, 1", 9 + d, 9 + d);
                if (st == N - 1) {
                    const std::string one = fresh("one");
                    L("        beq s5, {}, {}", kOneBits, one);
                    L("        v.muls [s13+{}], [s13+{}], s5, {}, f{}", recv_addr[d], recv_addr[d],
                      Pe, 9 + d);
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
                const std::string src = st == 0 ? fmt::format("s12+{}", own_addr[d])
                                                : fmt::format("s13+{}", recv_addr[d]);
                L("        ici.v {}, [s14+{}], [{}], {}, f{}, f{}", d == 0 ? "s2" : "s3",
                  recv_addr[d], src, P, 1 + d, 7 + d);
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
                    fmt::format("s25+{}", recv_addr[d]));
            L("{}:", none);
        }
        // (7) Store the finished piece.
        if (stores)
            for (int d = 0; d < 2; ++d)
                dma(false, d, stv, "s6", fmt::format("s13+{}", recv_addr[d]));
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

isa::Program old_allreduce_hbm_program(const AllReduceHbmPlan& p) {
    isa::Program prog = isa::assemble(allreduce_hbm_source(p, false), "allreduce_hbm.s");
    if (p.imem_instrs == 0 || prog.code.size() <= p.imem_instrs) return prog;
    return isa::assemble(allreduce_hbm_source(p, true), "allreduce_hbm.s");
}

TEST(AllReduceMigration, VmemKernelIsByteIdentical) {
    for (uint32_t N : {2u, 3u, 4u, 8u, 16u})
        for (uint32_t n : {1u, 777u, 1000u, 4096u, 65536u, 100000u}) {
            const AllReducePlan p = plan_allreduce(N, n, 16u << 20);
            EXPECT_EQ(isa::encode_program(allreduce_program(p)),
                      isa::encode_program(old_allreduce_program(p)))
                << N << " " << n;
        }
}

TEST(AllReduceMigration, HbmKernelIsByteIdentical) {
    std::vector<std::pair<std::string, std::vector<std::string>>> boards = {
        {"", {}},
        {"", {"core.vmem_bytes=1048576"}},
        {"", {"chips=8", "core.imem_bytes=32768", "core.vmem_bytes=1048576"}},
        {"", {"core.vmem_bytes=262144"}},
    };
    for (const char* c :
         {"v2-8", "v3-8", "v3-32", "v3-128", "v3-512", "v3-2048", "v4-8", "v5e-8", "v6e-8", "tiny"})
        boards.push_back({fmt::format("{}/configs/{}.json", test::source_dir(), c), {}});
    size_t compared = 0;
    for (const auto& [file, sets] : boards) {
        const auto cfg = hw::BoardConfig::load(file, sets);
        const uint32_t cores = cfg.chips * cfg.cores_per_chip;
        for (uint32_t N : {2u, 3u, 4u, 8u, 16u, 32u, 128u, 2048u}) {
            if (N > cores) continue;
            for (uint32_t n : {1u, 10u, 100u, 300u, 777u, 1000u, 5000u, 20000u, 65536u, 100000u,
                               262144u, 1048576u, 4194304u, 6291456u, 16777216u}) {
                if (N >= 128 && n != 4194304u && n != 20000u && n != 1000u) continue;
                for (auto s :
                     N >= 128 ? std::vector{AllReduceSchedule::Auto}
                              : std::vector{AllReduceSchedule::Auto, AllReduceSchedule::StepBarrier,
                                            AllReduceSchedule::Pipelined}) {
                    AllReduceHbmPlan p;
                    try {
                        p = plan_allreduce_hbm(N, n, cfg, s);
                    } catch (const DeviceError&) {
                        continue;
                    }
                    ASSERT_EQ(isa::encode_program(allreduce_hbm_program(p)),
                              isa::encode_program(old_allreduce_hbm_program(p)))
                        << file << " N" << N << " n" << n << " K" << p.recv_slots;
                    ++compared;
                }
            }
        }
    }
    EXPECT_GT(compared, 500u);
}

}  // namespace
}  // namespace tpu::driver
