// SPDX-License-Identifier: Apache-2.0
// The SystemC board end to end: programs, flags across cores, faults and deadlocks, and boards
// one after another and side by side in one process (each owns its SystemC context).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <systemc>

#include "hw/board.h"
#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"
#include "hw/ici/ici_network.h"
#include "isa/assembler.h"
#include "sim/stats.h"
#include "tests/common/paths.h"

namespace tpu::hw {
namespace {

/// Boards in tests run with the race detector on: the example kernels must be race-free.
BoardConfig tiny() {
    return BoardConfig::load(test::source_dir() + "/configs/tiny.json", {"sim.race_detector=true"});
}
/// The default board with the cores starting at the launch cycle, so unit timing is derived
/// from cycle 0 (the launch costs have their own test).
BoardConfig v3() {
    return BoardConfig::load("", {"sim.race_detector=true", "sim.launch_costs=false"});
}

isa::Program kernel(const std::string& name) {
    return isa::assemble_file(test::source_dir() + "/isa/examples/" + name);
}

template <class T>
void put(SparseMemory& m, uint64_t addr, const std::vector<T>& v) {
    m.write(addr, {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)});
}
template <class T>
std::vector<T> get(SparseMemory& m, uint64_t addr, size_t n) {
    std::vector<T> v(n);
    m.read(addr, {reinterpret_cast<uint8_t*>(v.data()), n * sizeof(T)});
    return v;
}

/// Core 0 runs `send` (an ICI instruction raising the receiver's f3) and halts; every other
/// core waits for f3 and halts.
isa::Program send_and_wait(const std::string& send) {
    return isa::assemble("coreid s1\nbne s1, 0, receiver\n" + send +
                         "\nhalt\nreceiver:\nwait f3, 1\nhalt\n");
}

/// 1024 words i * mul + add, written to `m` at 0.
std::vector<uint32_t> put_words(SparseMemory& m, uint32_t mul, uint32_t add) {
    std::vector<uint32_t> data(1024);
    for (uint32_t i = 0; i < data.size(); ++i) data[i] = i * mul + add;
    put(m, 0, data);
    return data;
}

TEST(Board, ScalarLoopTakesOneCyclePerInstruction) {
    Board b(tiny());
    b.load(0, isa::assemble("li s1, 10\nloop: sub s1, s1, 1\nbne s1, 0, loop\nhalt"));
    const auto r = b.run({0});
    // li at 0, ten (sub, bne) pairs at 1..20, halt issues at 21 with nothing in flight.
    EXPECT_EQ(r.core_cycles, std::vector<uint64_t>{21});
    EXPECT_EQ(b.core(0).sreg(1), 0u);
    EXPECT_EQ(b.now_cycle(), 21u);
}

TEST(Board, TrivialLaunchPaysTheDocumentedStartAndEndCosts) {
    // A program that only halts, on the default board with the simple HBM (hw/README.md,
    // "Launch timing"): doorbell 650 ns = 611 cycles at 940 MHz; the 32-byte program fetched
    // from HBM: bus 32 / 479.49 = 0.07 cycles -> ceil(611.07) = 612, + 100 ns latency (94) =
    // 706; the first instruction (the halt) issues 16 cycles later, at 722, with nothing in
    // flight; the completion (650 ns = 611 cycles) reaches the host at 1333 = 1.42 us.
    Board b(BoardConfig::load("", {"hbm.model=simple"}));
    b.load(0, isa::assemble("halt"));
    const auto r = b.run({0});
    EXPECT_EQ(r.core_cycles, std::vector<uint64_t>{722});
    EXPECT_EQ(r.completion_cycles, 611u);
    EXPECT_EQ(r.end_cycle - r.start_cycle, 1333u);
    EXPECT_EQ(b.now_cycle(), 1333u);  // the next launch rings its doorbell after the completion
    // A second launch pays the same again: its fetch finds the HBM pipe idle.
    const auto r2 = b.run({0});
    EXPECT_EQ(r2.start_cycle, 1333u);
    EXPECT_EQ(r2.end_cycle - r2.start_cycle, 1333u);
}

TEST(Board, Matmul128ExampleIsBitExactAndCycleExact) {
    // The cycle count below is derived for the simple HBM model.
    Board b(BoardConfig::load("", {"sim.race_detector=true", "hbm.model=simple"}));
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<uint16_t> a(128 * 128), w(128 * 128);
    for (auto& x : a) x = f32_to_bf16(nd(rng));
    for (auto& x : w) x = f32_to_bf16(nd(rng));
    put(b.hbm(0), 0x0, a);
    put(b.hbm(0), 0x8000, w);
    b.load(0, kernel("matmul128.s"));
    const auto r = b.run({0});
    std::vector<float> want(128 * 128);
    mxu_matmul(a.data(), 128, 128, w.data(), 128, want.data(), false);
    const auto got = get<float>(b.hbm(0), 0x10000, 128 * 128);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
    // Hand-derived from hw/README.md (simple HBM: 479.49 B/cycle, latency 94; DMA requests
    // leave at 512 B/cycle):
    //   dma A (32 KiB): issue 0, start 1, bus busy until 1 + 68.34 -> done 70 + 94 = 164;
    //   dma W: issue 1, start 65 (engine sent A's requests until 65), bus until 137.68 ->
    //   done 138 + 94 = 232; wait f1 -> 232; mxu.lw: issue 233, start 234, done 362;
    //   wait f0 at 234; mxu.mm: issue 235, start 362 (weights), done 362 + 382 = 744;
    //   wait f2 -> 744; dma.vh 64 KiB: issue 745, start 746, bus until 882.68 -> done 977;
    //   wait f3 -> 977; halt issues at 978.
    // All of that after the launch prologue (hw/README.md, "Launch timing"): doorbell 650 ns =
    // 611 cycles; the 10-instruction program (320 B) fetched from the simple HBM: bus 0.67
    // cycles -> ceil 612 + 94 = 706; first instruction 16 cycles later: 722. The completion
    // (611 cycles) ends the launch.
    EXPECT_EQ(r.core_cycles, std::vector<uint64_t>{722 + 978});
    EXPECT_EQ(r.end_cycle - r.start_cycle, 722 + 978 + 611);
}

TEST(Board, VpuChainComputesTheDocumentedFunction) {
    Board b(v3());
    std::vector<float> x(8192);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 3.0f;
    put(b.hbm(0), 0, x);
    b.load(0, kernel("vpu_chain.s"));
    b.run({0});
    const auto y = get<float>(b.hbm(0), 0x10000, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const float t = std::tanh(x[i] * 2.0f + 1.0f);
        ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(t * x[i])) << i;
    }
}

TEST(Board, ATimingOnlyBoardHoldsNoValues) {
    // sim.functional = false: no core's HBM or VMEM keeps bytes, and a kernel still runs.
    Board b(BoardConfig::load("", {"sim.functional=false"}));
    for (uint32_t c = 0; c < b.config().cores(); ++c) {
        EXPECT_FALSE(b.hbm(c).holds_values()) << c;
        EXPECT_FALSE(b.vmem(c).holds_values()) << c;
    }
    put(b.hbm(0), 0, std::vector<float>(8192, 1.0f));
    b.load(0, kernel("vpu_chain.s"));
    b.run({0});
    EXPECT_EQ(get<float>(b.hbm(0), 0x10000, 4), std::vector<float>(4, 0.0f));
}

TEST(Board, FlagsAcrossCoresOverIci) {
    Board b(v3());
    // Core 0 sends 4 KiB of VMEM to core 5 and raises its f3; core 5 waits for it.
    const std::vector<uint32_t> data = put_words(b.vmem(0), 7, 0);
    for (uint32_t c : {0u, 5u}) b.load(c, send_and_wait("ici.v 5, [0x1000], [0], 4096, f3"));
    const auto r = b.run({0, 5});
    EXPECT_EQ(get<uint32_t>(b.vmem(5), 0x1000, 1024), data);
    // 3 hops on the 8-core ring (0 -> 7 -> 6 -> 5), 940 cycles each, 4096 B at 85.1 B/cycle =
    // 49 cycles; ici.v issues at 2, starts at 3: arrival 3 + 3 * 940 + 49 = 2872.
    // Core 5 sees f3 at 2872 and halts at 2873; core 0 halts when its transfer lands.
    EXPECT_EQ(r.core_cycles, (std::vector<uint64_t>{2872, 2873}));
}

TEST(Board, TorusRoutesDimensionOrder) {
    // 16 cores as a 4x4 torus: core 0 -> core 10 (x 0->2, y 0->2) is 2 + 2 hops.
    Board b(BoardConfig::load("", {"chips=8", "ici.topology=torus2d", "sim.launch_costs=false"}));
    for (uint32_t c : {0u, 10u}) b.load(c, send_and_wait("ici.v 10, [0x1000], [0], 4096, f3"));
    const auto r = b.run({0, 10});
    // ici.v starts at 3; 4 hops of 940 cycles, then 49 cycles of data: arrival 3812.
    EXPECT_EQ(r.core_cycles, (std::vector<uint64_t>{3812, 3813}));
}

// Issue 13's example: core 0 sends 4 KiB to core 5 (0 -> 7 -> 6 -> 5) and core 7, about 100
// cycles in, sends 4 KiB one hop to core 6 over link 7 -> 6, which core 0's transfer needs only
// later. s1 = 1: core 0 sends; s1 = 0: it does not.
TEST(Board, IciTransferFitsTheIdleGapBeforeAnother) {
    Board b(v3());
    const std::string prog = R"(
        coreid  s10
        beq     s10, 0, sender0
        beq     s10, 7, sender7
        beq     s10, 6, receiver
        beq     s10, 5, receiver5
        halt
sender0:
        beq     s1, 0, done
        ici.v   5, [0x1000], [0], 4096, f3
done:
        halt
sender7:
        li      s3, 50
delay:  sub     s3, s3, 1
        bne     s3, 0, delay
        ici.v   6, [0x1000], [0], 4096, f3
        halt
receiver5:
        beq     s1, 0, done
receiver:
        wait    f3, 1
        halt
)";
    const std::vector<uint32_t> data = put_words(b.vmem(7), 3, 1);
    const std::vector<uint32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
    for (uint32_t c : all) b.load(c, isa::assemble(prog));
    // Core 0: coreid 0, beq 1, beq 2, ici.v issues at 3 and starts at 4; link 0 -> 7 [4, 53),
    // 7 -> 6 [944, 993), 6 -> 5 [1884, 1933); arrival 1884 + 940 + 49 = 2873, core 5 halts at
    // 2874. Core 7: coreid 0, two beqs 1-2, li 3, 50 x (sub, bne) 4-103, ici.v issues at 104 and
    // starts at 105: link 7 -> 6 is idle over [105, 154), so the data arrives at 105 + 940 + 49
    // = 1094; core 6's wait completes there and it halts at 1095. (One busy-until value per link
    // made core 7 wait for 993: core 6 halted at 1983.)
    const auto with = b.run(all, {1});
    EXPECT_EQ(with.core_cycles[0], 2873u);
    EXPECT_EQ(with.core_cycles[5], 2874u);
    EXPECT_EQ(with.core_cycles[7], 1094u);
    EXPECT_EQ(with.core_cycles[6], 1095u);
    EXPECT_EQ(get<uint32_t>(b.vmem(6), 0x1000, 1024), data);
    const auto without = b.run(all, {0});
    EXPECT_EQ(without.core_cycles[6], 1095u);
    EXPECT_EQ(without.core_cycles[7], 1094u);
    const IciLinkStats& link76 = b.ici().link_stats(7 * IciNetwork::kDirs + 1);  // 7 -x
    EXPECT_EQ(link76.transfers, 3u);
    EXPECT_EQ(link76.queue_cycles, 0u);
}

// An ICI write into another core's HBM completes through that core's HBM timing.
TEST(Board, IciHbmWriteGoesThroughTheDestinationHbm) {
    Board b(BoardConfig::load(
        "", {"sim.race_detector=true", "sim.launch_costs=false", "hbm.model=simple"}));
    const std::vector<uint32_t> data = put_words(b.vmem(0), 5, 0x5a5a);
    for (uint32_t c : {0u, 1u}) b.load(c, send_and_wait("ici.h 1, [0x2000], [0], 4096, f3"));
    const auto r = b.run({0, 1});
    EXPECT_EQ(get<uint32_t>(b.hbm(1), 0x2000, 1024), data);
    // ici.h starts at 3: link 0 -> 1 [3, 52); bytes arrive from 943, all by 992. Each 512 B
    // piece is posted to core 1's HBM when its last byte is in, 943 + ceil(512 k / 85.1):
    // 950, 956, ..., 992. The simple HBM pipe moves 479.5 B per cycle (512 B: 1.07 cycles) and
    // answers 94 cycles after the pipe: the last piece leaves the pipe at 993.07, done at
    // ceil(993.07) + 94 = 1088 (instead of 992 for a VMEM write). Core 1 halts at 1089.
    EXPECT_EQ(r.core_cycles, (std::vector<uint64_t>{1088, 1089}));
}

TEST(Board, DeadlockIsReportedWithAStateDump) {
    Board b(tiny());
    b.load(0, isa::assemble("wait f2, 1\nhalt"));
    b.load(1, isa::assemble("li s1, 1\nwait f7, 3\nhalt"));
    try {
        b.run({0, 1});
        ADD_FAILURE() << "no deadlock reported";
    } catch (const DeadlockError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "deadlock at cycle 1: every running core waits on a flag that nothing can "
                  "raise\n  core 0: running at cycle 0, pc 0 (wait f2, 1); all flags 0\n"
                  "  core 1: running at cycle 1, pc 1 (wait f7, 3); all flags 0");
    }
}

TEST(Board, OutOfRangeDmaIsADeviceFault) {
    Board b(tiny());
    b.load(0, isa::assemble("li s2, 0x4000000\ndma.hv [0], [s2], 1, 64, 64, 64, f0\nhalt"));
    try {
        b.run({0});
        ADD_FAILURE() << "no fault";
    } catch (const DeviceFault& f) {
        EXPECT_EQ(f.info().core, 0u);
        EXPECT_EQ(f.info().pc, 1u);
        EXPECT_EQ(f.info().address, 0x4000000u);
        EXPECT_EQ(std::string(f.what()),
                  "device fault on core 0 at pc 1 (dma.hv [0], [s2], 1, 64, 64, 64, f0) in dma, "
                  "cycle 1: HBM read of 64 bytes at 0x4000000 is outside core0.hbm (67108864 "
                  "bytes)");
    }
}

TEST(Board, RunningOffTheProgramIsADeviceFault) {
    Board b(tiny());
    b.load(0, isa::assemble("nop"));
    EXPECT_THROW(b.run({0}), DeviceFault);
}

TEST(Board, RacyKernelIsReportedNamingBothInstructions) {
    Board b(BoardConfig::load(test::source_dir() + "/configs/tiny.json",
                              {"sim.race_detector=true", "hbm.model=simple"}));  // cycles below
    b.load(0, isa::assemble_file(test::source_dir() + "/isa/examples/bad/race.s"));
    try {
        b.run({0});
        ADD_FAILURE() << "no race reported";
    } catch (const DeviceFault& f) {
        EXPECT_EQ(f.info().unit, "race-detector");
        EXPECT_EQ(f.info().what,
                  "data race on core 0 VMEM [0x0, 0x8000): core 0 pc 1 `v.exp [32768], [0], 8192` "
                  "(vpu, reads, issued at cycle 1, done at 264) and core 0 pc 0 `dma.hv [0], [0], "
                  "8, 4096, 4096, 4096, f0` (dma, writes, issued at cycle 0, done at 642) are not "
                  "ordered; wait on f0 (raised by pc 0) or fence before pc 1");
    }
}

TEST(Board, IciWritesAreOrderedByTheDestinationFlag) {
    Board b(v3());
    // Core 1 reads what core 0 sent only after waiting on the arrival flag: no race. Then it
    // overwrites the buffer without waiting for core 0's second transfer: a race.
    const std::string prog = R"(
        coreid s1
        bne s1, 0, receiver
        ici.v 1, [0x1000], [0], 256, f3
        ici.v 1, [0x1000], [0], 256, f4
        halt
receiver:
        wait f3, 1
        v.adds [0x2000], [0x1000], 1.0, 64
        v.adds [0x1000], [0x2000], 1.0, 64
        halt
)";
    for (uint32_t c : {0u, 1u}) b.load(c, isa::assemble(prog));
    try {
        b.run({0, 1});
        ADD_FAILURE() << "no race reported";
    } catch (const DeviceFault& f) {
        EXPECT_EQ(f.info().unit, "race-detector");
        EXPECT_NE(f.info().what.find("pc 3 `ici.v 1, [4096], [0], 256, f4` (ici, writes"),
                  std::string::npos)
            << f.info().what;
    }
}

TEST(Board, IciRaceIsReportedOnTheReceivingCore) {
    Board b(v3());
    // Core 0 writes core 1's VMEM over ICI; core 1 reads the same bytes after a spin, without
    // waiting on the arrival flag f3. The race is on core 1's VMEM, and core 1 must wait.
    const std::string prog = R"(
        coreid s1
        bne s1, 0, receiver
        ici.v 1, [0x1000], [0], 256, f3
        halt
receiver:
        li s2, 0
spin:
        add s2, s2, 1
        blt s2, 100, spin
        v.adds [0x2000], [0x1000], 1.0, 64
        wait f3, 1
        halt
)";
    for (uint32_t c : {0u, 1u}) b.load(c, isa::assemble(prog));
    try {
        b.run({0, 1});
        ADD_FAILURE() << "no race reported";
    } catch (const DeviceFault& f) {
        EXPECT_EQ(f.info().unit, "race-detector");
        const std::string& w = f.info().what;
        EXPECT_EQ(w.substr(0, 41), "data race on core 1 VMEM [0x1000, 0x1100)") << w;
        const std::string advice =
            "are not ordered; core 1 must wait on f3 (raised on arrival of core 0 pc 2's "
            "transfer) before its pc 7";
        EXPECT_EQ(w.substr(w.size() - advice.size()), advice) << w;
    }
}

/// Runs `op` on core 0 alone and expects a device fault naming core 1, which exists but runs
/// nothing, and core 1's VMEM untouched.
void expect_fault_outside_launch(const std::string& op) {
    Board b(v3());
    b.load(0, isa::assemble(op + "\nhalt\n"));
    try {
        b.run({0});
        ADD_FAILURE() << op << ": no fault";
    } catch (const DeviceFault& f) {
        EXPECT_EQ(f.info().unit, "ici");
        EXPECT_EQ(f.info().core, 0u);
        EXPECT_EQ(f.info().what,
                  "core 1 is not in this launch (cores 0): ICI reaches only launched cores");
    }
    std::vector<uint8_t> got(256, 0xAA);
    b.vmem(1).read(0x1000, got);
    EXPECT_EQ(got, std::vector<uint8_t>(256, 0));
}

TEST(Board, IciTransferToACoreOutsideTheLaunchIsADeviceFault) {
    expect_fault_outside_launch("ici.v 1, [0x1000], [0], 256, f3");
}

TEST(Board, SignalToACoreOutsideTheLaunchIsADeviceFault) {
    expect_fault_outside_launch("sigr 1, f4, 1");
}

// ---- One board, one SystemC context (hw/README.md) ---------------------------------------------

/// The loop of Board.ScalarLoopTakesOneCyclePerInstruction on core 0 of `b`: li at 0, ten
/// (sub, bne) pairs at 1..20, the halt issues at 21 with nothing in flight (tiny board, no
/// launch costs).
void expect_scalar_loop(Board& b, uint64_t start) {
    b.load(0, isa::assemble("li s1, 10\nloop: sub s1, s1, 1\nbne s1, 0, loop\nhalt"));
    const auto r = b.run({0});
    EXPECT_EQ(r.start_cycle, start);
    EXPECT_EQ(r.core_cycles, std::vector<uint64_t>{21});
    EXPECT_EQ(b.now_cycle(), start + 21);
}

/// The launch of Board.FlagsAcrossCoresOverIci: core 0 sends 4 KiB to core 5 over 3 hops and
/// raises its f3; arrival 3 + 3 x 940 + 49 = 2872, core 5 halts at 2873 (derivation there).
void expect_flags_over_ici(Board& b) {
    const std::vector<uint32_t> data = put_words(b.vmem(0), 7, 0);
    for (uint32_t c : {0u, 5u}) b.load(c, send_and_wait("ici.v 5, [0x1000], [0], 4096, f3"));
    const auto r = b.run({0, 5});
    EXPECT_EQ(get<uint32_t>(b.vmem(5), 0x1000, 1024), data);
    EXPECT_EQ(r.core_cycles, (std::vector<uint64_t>{2872, 2873}));
}

/// An out-of-range DMA (Board.OutOfRangeDmaIsADeviceFault) with core 1 still waiting on a flag
/// when core 0 faults: the fault pauses the simulation with core 1 in the middle of its launch.
void fault(Board& b) {
    b.load(0, isa::assemble("li s2, 0x4000000\ndma.hv [0], [s2], 1, 64, 64, 64, f0\nhalt"));
    b.load(1, isa::assemble("li s1, 5000\nloop: sub s1, s1, 1\nbne s1, 0, loop\nhalt"));
    EXPECT_THROW(b.run({0, 1}), DeviceFault);
}

std::string stats_json(Board& b) {
    std::ostringstream os;
    b.stats().write_json(os);
    return os.str();
}

TEST(BoardContext, AFaultedBoardLeavesTheProcessUsable) {
    {
        Board bad(tiny());
        fault(bad);
        try {
            bad.run({0});
            ADD_FAILURE() << "a faulted board ran again";
        } catch (const std::invalid_argument& e) {
            EXPECT_STREQ(e.what(),
                         "the board stopped on a device fault; open a new device to run again");
        }
        // Its time can still advance (past core 1's abandoned halt at 1 + 2 x 5000 = 10001),
        // and its memory be read.
        const uint64_t at = bad.now_cycle();
        bad.advance(20000);
        EXPECT_EQ(bad.now_cycle(), at + 20000);
        EXPECT_EQ(get<uint32_t>(bad.vmem(0), 0, 1), std::vector<uint32_t>{0});
    }
    // The next board starts at cycle 0, and its launches take what they take in a fresh process.
    Board good(tiny());
    EXPECT_EQ(good.now_cycle(), 0u);
    expect_scalar_loop(good, 0);
    expect_scalar_loop(good, 21);
}

TEST(BoardContext, AFaultedBoardStillAliveDoesNotDisturbTheNextOne) {
    Board bad(tiny());
    fault(bad);
    Board good(v3());
    expect_flags_over_ici(good);
    EXPECT_EQ(good.now_cycle(), 2873u);
    // Back to the faulted board: its time is its own.
    const uint64_t at = bad.now_cycle();
    bad.advance(5);
    EXPECT_EQ(bad.now_cycle(), at + 5);
    EXPECT_EQ(good.now_cycle(), 2873u);
}

TEST(BoardContext, ADeadlockedBoardThenAGoodOne) {
    {
        Board b(tiny());
        b.load(0, isa::assemble("wait f2, 1\nhalt"));
        EXPECT_THROW(b.run({0}), DeadlockError);
    }
    Board b(tiny());
    expect_scalar_loop(b, 0);
}

TEST(BoardContext, AStoppedBoardThenAGoodOne) {
    {
        // A kernel that never halts, stopped by the host-time limit.
        Board b(BoardConfig::load(test::source_dir() + "/configs/tiny.json",
                                  {"sim.max_host_seconds=0.05"}));
        b.load(0, isa::assemble("loop: jmp loop"));
        EXPECT_THROW(b.run({0}), StoppedError);
    }
    Board b(tiny());
    expect_scalar_loop(b, 0);
}

TEST(BoardContext, BoardsInSequenceMatchTheFirstBoardOfTheProcess) {
    // The first board of this process is a fresh process's board; the ones after it (with a
    // fault and a deadlock in between) must give the same cycles, results and statistics.
    std::string first;
    for (int round = 0; round < 3; ++round) {
        if (round > 0) {
            Board bad(tiny());
            fault(bad);
            Board stuck(v3());
            stuck.load(3, isa::assemble("wait f1, 1\nhalt"));
            EXPECT_THROW(stuck.run({3}), DeadlockError);
        }
        Board b(v3());
        expect_flags_over_ici(b);
        const std::string stats = stats_json(b);
        if (round == 0)
            first = stats;
        else
            EXPECT_EQ(stats, first) << "round " << round;
    }
}

TEST(BoardContext, TwoBoardsAliveAtOnceKeepTheirOwnTime) {
    Board a(tiny()), b(v3());
    expect_scalar_loop(a, 0);
    expect_flags_over_ici(b);
    expect_scalar_loop(a, 21);  // a resumes at its own cycle, not b's
    EXPECT_EQ(a.now_cycle(), 42u);
    EXPECT_EQ(b.now_cycle(), 2873u);
    b.advance(7);
    EXPECT_EQ(b.now_cycle(), 2880u);
    EXPECT_EQ(a.now_cycle(), 42u);
}

TEST(Board, CoreSetParsing) {
    EXPECT_EQ(parse_core_set("0-3,6", 8), (std::vector<uint32_t>{0, 1, 2, 3, 6}));
    EXPECT_EQ(parse_core_set("all", 2), (std::vector<uint32_t>{0, 1}));
    try {
        parse_core_set("0-8", 8);
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(),
                     "bad core list '0-8': core 8 does not exist (the board has cores 0-7)");
    }
    EXPECT_THROW(parse_core_set("3-1", 8), std::invalid_argument);
    EXPECT_THROW(parse_core_set("1,1", 8), std::invalid_argument);
    EXPECT_THROW(parse_core_set("x", 8), std::invalid_argument);
}

TEST(Board, SystemCReportsGoToStderrNotStdout) {
    // stdout carries --json results; a SystemC warning such as W545 must not land there.
    Board b(BoardConfig::load("", {}));
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    SC_REPORT_WARNING("tpusim/test", "a warning for stderr");
    const std::string out = ::testing::internal::GetCapturedStdout();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(out, "");
    EXPECT_NE(err.find("a warning for stderr"), std::string::npos) << err;
}

}  // namespace
}  // namespace tpu::hw
