// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>

#include "driver/device.h"
#include "driver/kernels/gemm.h"
#include "hw/board.h"
#include "hw/host/host_link.h"
#include "isa/assembler.h"
#include "tests/common/paths.h"

namespace tpu::driver {
namespace {

/// Tests run with the race detector on, so every kernel they launch is proven race-free.
hw::BoardConfig tiny() {
    return hw::BoardConfig::load(test::source_dir() + "/configs/tiny.json",
                                 {"sim.race_detector=true"});
}

std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
    try {
        f();
    } catch (const DeviceError& e) {
        if (kind) *kind = e.kind();
        return e.what();
    }
    return "no error";
}

TEST(Device, AllocatorReusesAndCoalescesFreedMemory) {
    auto dev = Device::open(tiny());
    const uint64_t total = dev->free_bytes(0);
    EXPECT_EQ(total, 64u << 20);
    const Buffer a = dev->alloc(1000, 0), b = dev->alloc(4096, 0), c = dev->alloc(1, 0);
    EXPECT_EQ(a.addr, 0u);
    EXPECT_EQ(b.addr, 1024u);  // 256-byte granules
    EXPECT_EQ(c.addr, 1024u + 4096u);
    dev->free(b);
    EXPECT_EQ(dev->alloc(4000, 0).addr, 1024u);  // first fit reuses the hole
    dev->free(Buffer{0, 1024, 4000});
    dev->free(a);
    dev->free(c);
    EXPECT_EQ(dev->free_bytes(0), total);
    EXPECT_EQ(dev->largest_free_block(0), total);  // neighbours coalesced
}

TEST(Device, ErrorsNameWhatAndWhere) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    EXPECT_EQ(error_of([&] { dev->alloc(100ull << 20, 1); }, &kind),
              "out of HBM on core 1: requested 100.00 MiB (104857600 bytes), 64.00 MiB free "
              "(67108864 bytes), largest free block 67108864 bytes");
    EXPECT_EQ(kind, ErrorKind::OutOfMemory);
    EXPECT_EQ(error_of([&] { dev->alloc(16, 2); }, &kind),
              "alloc: core 2 does not exist (the board has cores 0-1)");
    EXPECT_EQ(kind, ErrorKind::Usage);
    EXPECT_EQ(error_of([&] { dev->alloc(0, 0); }), "alloc: 0 bytes requested");
    const Buffer b = dev->alloc(64, 0);
    std::vector<uint8_t> data(65);
    EXPECT_EQ(error_of([&] { dev->write(b, data.data(), 65); }),
              "write: 65 bytes at offset 0 run past the 64-byte buffer");
    dev->free(b);
    EXPECT_EQ(error_of([&] { dev->free(b); }),
              "free: no live buffer at 0x0 on core 0 (freed twice?)");
    EXPECT_EQ(error_of([&] { dev->read(b, data.data(), 4); }),
              "read: buffer at 0x0 on core 0 is not allocated");
}

TEST(Device, ABufferWhoseEndWrapsAroundIsAUsageError) {
    // Issue #30, class 15: address + size past 2^64 wrapped to a small end, passed the range
    // check and reached memory outside HBM (a segfault). Both ways of leaving the allocation
    // are refused before any byte moves.
    auto dev = Device::open(tiny());
    const Buffer b = dev->alloc(4096, 0);
    std::vector<uint8_t> data(64);
    ErrorKind kind{};
    const Buffer wraps{0, b.addr + 256, UINT64_MAX - 128};
    EXPECT_EQ(error_of([&] { dev->write(wraps, data.data(), 64); }, &kind),
              "write: buffer at 0x100 on core 0 is not allocated");
    EXPECT_EQ(kind, ErrorKind::Usage);
    EXPECT_EQ(error_of([&] { dev->read(wraps, data.data(), 64, UINT64_MAX - 200); }),
              "read: buffer at 0x100 on core 0 is not allocated");
    // Starting past the allocation's end (a view cut from a freed neighbour's address).
    const Buffer past{0, b.addr + 8192, 64};
    EXPECT_EQ(error_of([&] { dev->write(past, data.data(), 64); }),
              "write: buffer at 0x2000 on core 0 is not allocated");
    // A view inside the allocation is fine, up to its last byte.
    dev->write(Buffer{0, b.addr + 4032, 64}, data.data(), 64);
}

TEST(Device, AProgramBuiltInMemoryIsCheckedAtLoad) {
    // Issue #30, item 4: an embedder's program may name a register or flag the core does not
    // have; CoreModel::load refuses it instead of indexing past the register file.
    auto dev = Device::open(tiny());
    isa::Program p;
    isa::Instr add{isa::Opcode::Add};
    add.ops[1].reg = 200;
    p.code = {add, isa::Instr{isa::Opcode::Halt}};
    ErrorKind kind{};
    EXPECT_EQ(error_of([&] { dev->launch({0}, p); }, &kind),
              "launch: core 0: program: instruction 0 (add): operand 1 names register s200");
    EXPECT_EQ(kind, ErrorKind::Usage);
    // A usage error does not stop the board: a good program runs next.
    p.code = {isa::Instr{isa::Opcode::Halt}};
    EXPECT_NO_THROW(dev->launch({0}, p));
}

TEST(Device, TransfersAreTimedOnTheHostLink) {
    auto dev = Device::open(tiny());
    const Buffer b = dev->alloc(1 << 20, 0);
    std::vector<uint8_t> data(1 << 20, 7), back(1 << 20);
    const uint64_t t0 = dev->now_cycle();
    dev->write(b, data.data(), data.size());
    EXPECT_EQ(dev->now_cycle(), t0);  // posted: the host goes on
    dev->synchronize();
    // 2000 ns set-up + 1048576 B / 12 GB/s = 89381.3 ns -> 84018.5 cycles at 940 MHz.
    EXPECT_EQ(dev->now_cycle() - t0, 84019u);
    dev->read(b, back.data(), back.size());  // a host sync: the same cost, waited for
    EXPECT_EQ(dev->now_cycle() - t0, 2 * 84019u);
    EXPECT_EQ(back, data);
    EXPECT_EQ(dev->metrics().h2d_bytes, 1u << 20);
    EXPECT_EQ(dev->metrics().h2d_cycles, 84019u);
    EXPECT_EQ(dev->metrics().d2h_transfers, 1u);
    const hw::HostLink& link = dev->board().host_link(0);
    EXPECT_EQ(link.stats.to_device_bytes.value(), 1u << 20);
    EXPECT_EQ(link.stats.to_host_transfers.value(), 1u);
    EXPECT_EQ(link.stats.busy_cycles.value(), 2 * 84019u);
}

// The timing-only transfers cost what write() and read() cost (the figures of
// TransfersAreTimedOnTheHostLink: 84019 cycles per MiB) and leave the buffer's bytes alone.
TEST(Device, TimingOnlyTransfersAreTimedLikeCopies) {
    auto dev = Device::open(tiny());
    const Buffer b = dev->alloc(1 << 20, 0);
    std::vector<uint8_t> data(1 << 20, 7), back(1 << 20);
    dev->write(b, data.data(), data.size());
    dev->synchronize();
    const uint64_t t0 = dev->now_cycle();
    dev->write_timing(b, 1 << 20);
    EXPECT_EQ(dev->now_cycle(), t0);  // posted, like write()
    dev->synchronize();
    EXPECT_EQ(dev->now_cycle() - t0, 84019u);
    dev->read_timing(b, 1 << 20);  // a host sync, like read()
    EXPECT_EQ(dev->now_cycle() - t0, 2 * 84019u);
    EXPECT_EQ(dev->metrics().h2d_transfers, 2u);
    EXPECT_EQ(dev->metrics().h2d_cycles, 2 * 84019u);
    EXPECT_EQ(dev->metrics().d2h_bytes, 1u << 20);
    EXPECT_EQ(dev->board().host_link(0).stats.busy_cycles.value(), 3 * 84019u);
    dev->read(b, back.data(), back.size());
    EXPECT_EQ(back, data);
}

// Apart from the test above: an exception thrown after a SystemC thread has run trips ASan's
// stale-stack false positive (google/sanitizers#189), so this one throws before any.
TEST(Device, TimingOnlyTransferOutOfTheBufferIsAUsageError) {
    auto dev = Device::open(tiny());
    const Buffer b = dev->alloc(1 << 20, 0);
    EXPECT_THROW(dev->write_timing(b, 1, 1 << 20), DeviceError);
    EXPECT_THROW(dev->read_timing(b, 1, 1 << 20), DeviceError);
}

/// The default board: 4 chips of 2 cores, one host link per chip (cores 2c, 2c+1 on chip c).
hw::BoardConfig v3_8() {
    return hw::BoardConfig::load(test::source_dir() + "/configs/v3-8.json",
                                 {"sim.launch_costs=false"});
}

TEST(Device, HostTransfersToDifferentChipsOverlap) {
    auto dev = Device::open(v3_8());
    ASSERT_EQ(dev->board().chip_of(1), 0u);
    ASSERT_EQ(dev->board().chip_of(2), 1u);
    ASSERT_EQ(dev->board().chip_of(7), 3u);
    std::vector<uint8_t> data(1 << 20, 3);
    const Buffer a = dev->alloc(data.size(), 0), b = dev->alloc(data.size(), 1),
                 c = dev->alloc(data.size(), 2), d = dev->alloc(data.size(), 6);
    const uint64_t t0 = dev->now_cycle();
    // 1 MiB is 84019 cycles on a link (TransfersAreTimedOnTheHostLink). Cores 0 and 1 share
    // chip 0's link, so b runs after a: [t0, t0 + 84019), [t0 + 84019, t0 + 168038). Cores 2 and
    // 6 are chips 1 and 3: each on its own link over [t0, t0 + 84019).
    dev->write(a, data.data(), data.size());
    dev->write(b, data.data(), data.size());
    dev->write(c, data.data(), data.size());
    dev->write(d, data.data(), data.size());
    EXPECT_EQ(dev->board().host_link(0).free_at(), t0 + 168038);
    EXPECT_EQ(dev->board().host_link(1).free_at(), t0 + 84019);
    EXPECT_EQ(dev->board().host_link(2).free_at(), t0);  // unused
    EXPECT_EQ(dev->board().host_link(3).free_at(), t0 + 84019);
    // A launch on core 2 (chip 1) waits for chip 1's link only; a lone `halt` takes 0 cycles
    // without launch costs.
    const Event e2 = dev->launch({2}, isa::assemble("halt"));
    EXPECT_EQ(e2.start_cycle, t0 + 84019);
    EXPECT_EQ(e2.end_cycle, t0 + 84019);
    // A read on core 6 (chip 3) finds its link idle at t0 + 84019: 1 KiB is
    // 2000 ns + 1024 / 12 ns = 2085.3 ns -> 1960.2 -> 1961 cycles.
    std::vector<uint8_t> back(1024);
    dev->read(d, back.data(), back.size());
    EXPECT_EQ(dev->now_cycle(), t0 + 84019 + 1961);
    // Core 0 (chip 0) starts only when chip 0's link has delivered both writes.
    const Event e0 = dev->launch({0}, isa::assemble("halt"));
    EXPECT_EQ(e0.start_cycle, t0 + 168038);
    // Serial on one board-wide link, as the driver used to time it, the four writes alone took
    // 4 x 84019 = 336076 cycles.
    EXPECT_EQ(dev->metrics().h2d_cycles, 4 * 84019u);
    EXPECT_EQ(dev->board().host_link(0).stats.queue_cycles.value(), 84019u);
}

TEST(Device, FaultsAndDeadlocksBecomeErrors) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    const std::string fault =
        error_of([&] { dev->launch({1}, isa::assemble("li s1, 7\ndivu s2, s1, 0\nhalt")); }, &kind);
    EXPECT_EQ(kind, ErrorKind::Fault);
    EXPECT_EQ(fault,
              "device fault on core 1 at pc 1 (divu s2, s1, 0) in sequencer, cycle 1: "
              "division by zero");
    EXPECT_EQ(error_of([&] { dev->launch({0}, isa::assemble("halt")); }),
              "launch: the board stopped on a device fault; open a new device to run again");
}

TEST(Device, DeadlockBecomesAnError) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    const std::string msg = error_of(
        [&] {
            dev->launch({0, 1}, isa::assemble("wait f0, 1\nhalt"));
        },
        &kind);
    EXPECT_EQ(kind, ErrorKind::Deadlock);
    EXPECT_EQ(msg.rfind("deadlock at cycle 0: every running core waits on a flag", 0), 0u) << msg;
}

TEST(Device, LaunchArgumentsPerCore) {
    auto dev = Device::open(tiny());
    const auto ev =
        dev->launch({0, 1}, isa::assemble("li s3, 1\nloop: sub s1, s1, 1\nbne s1, 0, loop\nhalt"),
                    [](size_t i) { return std::vector<uint32_t>{i == 0 ? 5u : 50u}; });
    // li, then (sub, bne) per iteration, halt: 1 + 2n cycles.
    EXPECT_EQ(ev.core_cycles, (std::vector<uint64_t>{11, 101}));
}

/// Counts s1 down to zero: li, then (sub, bne) per iteration, halt: 1 + 2n cycles.
const char* kCountdown = "li s3, 1\nloop: sub s1, s1, 1\nbne s1, 0, loop\nhalt";

isa::Program named(const std::string& src, const std::string& name) {
    isa::Program p = isa::assemble(src);
    p.name = name;
    return p;
}

std::function<std::vector<uint32_t>(size_t)> arg(uint32_t v) {
    return [v](size_t) { return std::vector<uint32_t>{v}; };
}

TEST(DeviceAsync, LaunchesOnDisjointCoresOverlap) {
    auto dev = Device::open(tiny());
    const isa::Program a = named(kCountdown, "short"), b = named(kCountdown, "long");
    const uint64_t t0 = dev->now_cycle();
    const LaunchHandle ha = dev->launch_async({0}, a, arg(50));
    const LaunchHandle hb = dev->launch_async({1}, b, arg(100));
    EXPECT_EQ(ha.id, 1u);
    EXPECT_EQ(hb.id, 2u);
    EXPECT_EQ(dev->queued_launches(), 2u);
    EXPECT_EQ(dev->now_cycle(), t0);  // nothing ran yet
    const Event eb = dev->wait(hb);   // runs both: they start together
    const Event ea = dev->wait(ha);
    // 1 + 2n cycles each (li, then sub+bne per iteration, halt): 101 and 201, both from t0.
    EXPECT_EQ(ea.start_cycle, t0);
    EXPECT_EQ(eb.start_cycle, t0);
    EXPECT_EQ(ea.end_cycle, t0 + 101);
    EXPECT_EQ(eb.end_cycle, t0 + 201);
    EXPECT_EQ(ea.core_cycles, std::vector<uint64_t>{101});
    EXPECT_EQ(eb.cores, std::vector<uint32_t>{1});
    EXPECT_LT(eb.end_cycle - t0, (ea.end_cycle - ea.start_cycle) + (eb.end_cycle - eb.start_cycle));
    EXPECT_EQ(dev->metrics().launches, 2u);
    EXPECT_EQ(dev->metrics().batches, 1u);
    EXPECT_EQ(dev->metrics().exec_cycles, 201u);  // overlapping launches count once
    // The same work as one launch of both cores ends at the same cycle after its start.
    const Event both =
        dev->launch({0, 1}, a, [](size_t i) { return std::vector<uint32_t>{i == 0 ? 50u : 100u}; });
    EXPECT_EQ(both.end_cycle - both.start_cycle, eb.end_cycle - t0);
    EXPECT_EQ(both.core_cycles, (std::vector<uint64_t>{101, 201}));
}

TEST(DeviceAsync, LaunchesSharingACoreRunInOrder) {
    auto dev = Device::open(tiny());
    const isa::Program p = named(kCountdown, "count");
    const uint64_t t0 = dev->now_cycle();
    const LaunchHandle h1 = dev->launch_async({0}, p, arg(50));     // 101 cycles
    const LaunchHandle h2 = dev->launch_async({1}, p, arg(100));    // 201 cycles, with h1
    const LaunchHandle h3 = dev->launch_async({0, 1}, p, arg(10));  // 21 cycles, after both
    const LaunchHandle h4 = dev->launch_async({0}, p, arg(5));      // 11 cycles, after h3
    dev->synchronize();
    EXPECT_EQ(dev->queued_launches(), 0u);
    const Event e1 = dev->wait(h1), e2 = dev->wait(h2), e3 = dev->wait(h3), e4 = dev->wait(h4);
    EXPECT_EQ(e1.start_cycle, t0);
    EXPECT_EQ(e2.start_cycle, t0);
    EXPECT_EQ(e3.start_cycle, t0 + 201);  // after the launch of its batch that ends last
    EXPECT_EQ(e3.end_cycle, t0 + 222);
    EXPECT_EQ(e4.start_cycle, t0 + 222);
    EXPECT_EQ(e4.end_cycle, t0 + 233);
    EXPECT_EQ(dev->metrics().batches, 3u);
    const auto& ks = dev->kernel_stats();
    ASSERT_EQ(ks.size(), 1u);
    EXPECT_EQ(ks[0].name, "count");
    EXPECT_EQ(ks[0].launches, 4u);
    EXPECT_EQ(ks[0].cycles, 101u + 201u + 21u + 11u);
    EXPECT_EQ(ks[0].core_cycles, 101u + 201u + 2 * 21u + 11u);
    // Per launch 2 + 2n instructions (li, n x (sub, bne), halt).
    EXPECT_EQ(ks[0].instructions, 102u + 202u + 2 * 22u + 12u);
}

TEST(DeviceAsync, ReadAndWriteCompleteTheLaunchesOfTheirCore) {
    auto dev = Device::open(tiny());
    const Buffer src = dev->alloc(1024, 0), dst = dev->alloc(1024, 0), other = dev->alloc(64, 1);
    std::vector<uint8_t> data(1024), back(1024);
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 1);
    dev->write(src, data.data(), data.size());
    const isa::Program copy = named(
        "dma.hv [0], [s1], 4, 256, 256, 256, f0\nwait f0, 1\n"
        "dma.vh [s2], [0], 4, 256, 256, 256, f1\nwait f1, 1\nhalt",
        "copy");
    const LaunchHandle h = dev->launch_async({0}, copy, [&](size_t) {
        return std::vector<uint32_t>{uint32_t(src.addr), uint32_t(dst.addr)};
    });
    dev->write(other, data.data(), 64);  // core 1: the launch on core 0 stays queued
    EXPECT_EQ(dev->queued_launches(), 1u);
    EXPECT_EQ(dev->metrics().implicit_syncs, 0u);
    dev->read(dst, back.data(), back.size());  // core 0: runs the copy first
    EXPECT_EQ(dev->queued_launches(), 0u);
    EXPECT_EQ(dev->metrics().implicit_syncs, 1u);
    EXPECT_EQ(back, data);
    const Event ev = dev->wait(h);
    EXPECT_GT(ev.end_cycle, ev.start_cycle);
    ASSERT_EQ(dev->kernel_stats().size(), 1u);
    EXPECT_EQ(dev->kernel_stats()[0].hbm_read_bytes, 1024u);
    EXPECT_EQ(dev->kernel_stats()[0].hbm_write_bytes, 1024u);
    EXPECT_EQ(dev->kernel_stats()[0].flops(), 0u);
}

TEST(DeviceAsync, AFaultSurfacesAtTheWaitNamingItsLaunch) {
    auto dev = Device::open(tiny());
    const isa::Program bad = named("li s1, 7\ndivu s2, s1, 0\nhalt", "div");
    const isa::Program ok = named(kCountdown, "count");
    const LaunchHandle h1 = dev->launch_async({1}, bad);
    const LaunchHandle h2 = dev->launch_async({0}, ok, arg(50));
    const LaunchHandle h3 = dev->launch_async({0, 1}, ok, arg(5));
    const std::string fault =
        "device fault on core 1 at pc 1 (divu s2, s1, 0) in sequencer, cycle 1: division by zero";
    ErrorKind kind{};
    EXPECT_EQ(error_of([&] { dev->synchronize(); }, &kind),
              "launch #1 ('div' on core 1): " + fault);
    EXPECT_EQ(kind, ErrorKind::Fault);
    EXPECT_EQ(
        error_of([&] { dev->wait(h3); }, &kind),
        "launch #3 ('count' on cores 0-1) did not complete: launch #1 ('div' on core 1): " + fault);
    EXPECT_EQ(kind, ErrorKind::Fault);
    EXPECT_EQ(error_of([&] { dev->wait(h1); }, &kind), "launch #1 ('div' on core 1): " + fault);
    EXPECT_EQ(
        error_of([&] { dev->wait(h2); }),
        "launch #2 ('count' on core 0) did not complete: launch #1 ('div' on core 1): " + fault);
    EXPECT_EQ(error_of([&] { dev->launch_async({0}, ok); }, &kind),
              "launch: the board stopped on a device fault; open a new device to run again");
    EXPECT_EQ(kind, ErrorKind::Usage);
}

TEST(DeviceAsync, AFaultIsReportedAtTheWaitOfALaterLaunch) {
    auto dev = Device::open(tiny());
    const LaunchHandle h1 = dev->launch_async({0}, isa::assemble("li s1, 7\ndivu s2, s1, 0\nhalt"));
    const LaunchHandle h2 = dev->launch_async({0}, named("halt", "stop"));
    EXPECT_EQ(error_of([&] { dev->wait(h2); }),
              "launch #2 ('stop' on core 0) did not complete: launch #1 ('unnamed' on core 0): "
              "device fault on core 0 at pc 1 (divu s2, s1, 0) in sequencer, cycle 1: division "
              "by zero");
    EXPECT_EQ(error_of([&] { dev->wait(h1); }),
              "launch #1 ('unnamed' on core 0): device fault on core 0 at pc 1 (divu s2, s1, 0) "
              "in sequencer, cycle 1: division by zero");
}

TEST(DeviceAsync, UnknownAndOldHandlesAreUsageErrors) {
    auto dev = Device::open(tiny());
    ErrorKind kind{};
    EXPECT_EQ(error_of([&] { dev->wait(LaunchHandle{}); }, &kind),
              "wait: launch #0 was never issued by this device");
    EXPECT_EQ(kind, ErrorKind::Usage);
    EXPECT_EQ(error_of([&] { dev->wait(LaunchHandle{7}); }),
              "wait: launch #7 was never issued by this device");
    const LaunchHandle h = dev->launch_async({0}, isa::assemble("halt"));
    dev->wait(h);
    EXPECT_EQ(error_of([&] { dev->wait(h); }, &kind),
              "wait: launch #1 was already waited on (or dropped: the device keeps the outcomes "
              "of the last 4096 launches nobody waited on)");
    EXPECT_EQ(kind, ErrorKind::Usage);
    // launch() waits on its own handle.
    dev->launch({0}, isa::assemble("halt"));
    EXPECT_EQ(error_of([&] { dev->wait(LaunchHandle{2}); }),
              "wait: launch #2 was already waited on (or dropped: the device keeps the outcomes "
              "of the last 4096 launches nobody waited on)");
    // Bad launches fail at once, not at the wait.
    EXPECT_EQ(error_of([&] { dev->launch_async({}, isa::assemble("halt")); }),
              "launch: launch on an empty core set");
    EXPECT_EQ(error_of([&] {
                  dev->launch_async({0, 0}, isa::assemble("halt"));
              }),
              "launch: a core appears twice in the launch set");
    EXPECT_EQ(error_of([&] { dev->launch_async({2}, isa::assemble("halt")); }),
              "launch: core 2 does not exist (the board has cores 0-1)");
    EXPECT_EQ(error_of([&] {
                  dev->launch_async({1}, isa::assemble("halt"),
                                    [](size_t) { return std::vector<uint32_t>(32); });
              }),
              "launch: core 1: 32 launch arguments; at most 31 fit in s1..s31");
    EXPECT_EQ(dev->queued_launches(), 0u);
}

TEST(DeviceStats, GemmKernelCountsMatchTheShapeAndTheCoreCounters) {
    // Without the race detector: this test is about counting, GemmShapes proves the kernel.
    auto dev = Device::open(hw::BoardConfig::load(test::source_dir() + "/configs/tiny.json", {}));
    ProgramCache cache;
    // K and N are multiples of the 8 x 8 array: no padding, so the MXU's MACs are all useful
    // (with padding the MXU counters count the padded tiles' MACs, not M K N).
    const uint32_t M = 20, K = 16, N = 8;
    std::vector<float> a(size_t(M) * K, 1.0f), w(size_t(K) * N, 1.0f);
    const auto r1 = gemm(*dev, cache, a, w, M, K, N, Precision::Fp32Pass3, {0, 1});
    const auto r2 = gemm(*dev, cache, a, w, M, K, N, Precision::Fp32Pass3, {0, 1});
    const auto& ks = dev->kernel_stats();
    ASSERT_EQ(ks.size(), 1u);
    const KernelStats& k = ks[0];
    EXPECT_EQ(k.name, "gemm");
    EXPECT_EQ(k.launches, 2u);
    // 3 passes of M x K x N MACs per launch: 2 x 3 x 20 x 16 x 8 = 15360.
    EXPECT_EQ(k.mxu_macs, 15360u);
    EXPECT_EQ(k.mxu_macs, r1.macs + r2.macs);
    EXPECT_EQ(k.flops(), 2 * k.mxu_macs + k.vpu_flops);
    EXPECT_EQ(k.cycles, (r1.event.end_cycle - r1.event.start_cycle) +
                            (r2.event.end_cycle - r2.event.start_cycle));
    // Capacity: mxus x rows x cols x cycles x cores = 2 x 8 x 8 x cycles x 2 (each launch's
    // utilisation is the gemm's own figure; the kernel's weighs them by cycles).
    EXPECT_EQ(k.mxu_peak_macs, 2u * 8 * 8 * k.cycles * 2);
    EXPECT_DOUBLE_EQ(k.mxu_utilization(), double(r1.macs + r2.macs) / (256.0 * double(k.cycles)));
    uint64_t hbm_r = 0, hbm_w = 0, instrs = 0;
    for (uint32_t c = 0; c < 2; ++c) {
        hbm_r += dev->board().core(c).stats().hbm_read_bytes;
        hbm_w += dev->board().core(c).stats().hbm_write_bytes;
        instrs += dev->board().core(c).stats().instructions;
    }
    EXPECT_EQ(k.hbm_read_bytes, hbm_r);
    EXPECT_EQ(k.hbm_write_bytes, hbm_w);
    EXPECT_EQ(k.instructions, instrs);
    EXPECT_GT(k.hbm_bytes(), 0u);
    EXPECT_DOUBLE_EQ(k.arithmetic_intensity(), double(k.flops()) / double(hbm_r + hbm_w));
}

// ---- Devices one after another in one process ------------------------------------------------

TEST(DeviceReopen, AFaultedDeviceIsFollowedByAFreshOne) {
    {
        auto dev = Device::open(tiny());
        EXPECT_EQ(error_of([&] { dev->launch({1}, isa::assemble("li s1, 7\ndivu s2, s1, 0")); }),
                  "device fault on core 1 at pc 1 (divu s2, s1, 0) in sequencer, cycle 1: "
                  "division by zero");
        // What the message says can be done: a new device runs, while this one still exists.
        auto next = Device::open(tiny());
        const auto ev = next->launch({0}, isa::assemble(kCountdown), arg(3));
        EXPECT_EQ(ev.core_cycles, std::vector<uint64_t>{7});  // 1 + 2 x 3
    }
    auto dev = Device::open(tiny());
    EXPECT_EQ(dev->now_cycle(), 0u);
    // Device.LaunchArgumentsPerCore's launch in a fresh process: 1 + 2n cycles for n = 5, 50,
    // from cycle 0 (tiny board: no launch costs, nothing written before).
    const auto ev = dev->launch({0, 1}, isa::assemble(kCountdown),
                                [](size_t i) { return std::vector<uint32_t>{i == 0 ? 5u : 50u}; });
    EXPECT_EQ(ev.start_cycle, 0u);
    EXPECT_EQ(ev.core_cycles, (std::vector<uint64_t>{11, 101}));
}

TEST(DeviceReopen, GemmsOnDevicesInSequenceMatchTheFirstDeviceOfTheProcess) {
    // A GEMM split over the default board's 8 cores, on the first device of this process (a
    // fresh process's), then on devices opened after a deadlocked and a faulted one: the same
    // cycles, per-kernel counters and result bits.
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    const uint32_t M = 300, K = 200, N = 260;
    std::vector<float> a(size_t(M) * K), w(size_t(K) * N);
    for (auto& x : a) x = u(rng);
    for (auto& x : w) x = u(rng);
    const std::vector<uint32_t> all{0, 1, 2, 3, 4, 5, 6, 7};
    std::optional<GemmResult> first;
    std::optional<KernelStats> first_stats;
    for (int round = 0; round < 3; ++round) {
        if (round == 1) {
            auto stuck = Device::open(tiny());
            ErrorKind kind{};
            error_of([&] { stuck->launch({0, 1}, isa::assemble("wait f0, 1\nhalt")); }, &kind);
            EXPECT_EQ(kind, ErrorKind::Deadlock);
        }
        if (round == 2) {
            auto bad = Device::open(hw::BoardConfig::load("", {}));
            ErrorKind kind{};
            error_of([&] { bad->launch(all, isa::assemble("li s1, 7\ndivu s2, s1, 0")); }, &kind);
            EXPECT_EQ(kind, ErrorKind::Fault);
        }
        auto dev = Device::open(hw::BoardConfig::load("", {}));
        ProgramCache cache;
        const GemmResult r = gemm(*dev, cache, a, w, M, K, N, Precision::Bf16, all);
        if (!first) {
            first = r;
            first_stats = dev->kernel_totals();
            continue;
        }
        EXPECT_EQ(r.event.start_cycle, first->event.start_cycle) << round;
        EXPECT_EQ(r.event.end_cycle, first->event.end_cycle) << round;
        EXPECT_EQ(r.event.core_cycles, first->event.core_cycles) << round;
        EXPECT_EQ(0, std::memcmp(r.c.data(), first->c.data(), r.c.size() * 4)) << round;
        const KernelStats k = dev->kernel_totals();
        EXPECT_EQ(k.cycles, first_stats->cycles) << round;
        EXPECT_EQ(k.instructions, first_stats->instructions) << round;
        EXPECT_EQ(k.mxu_macs, first_stats->mxu_macs) << round;
        EXPECT_EQ(k.hbm_read_bytes, first_stats->hbm_read_bytes) << round;
        EXPECT_EQ(k.hbm_write_bytes, first_stats->hbm_write_bytes) << round;
    }
}

class GemmShapes : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, uint32_t>> {};

TEST_P(GemmShapes, BitExactAgainstTheReferenceInEveryPrecision) {
    const auto [M, K, N] = GetParam();
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    ProgramCache cache;
    std::mt19937 rng(M * 131 + K * 7 + N);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> a(size_t(M) * K), w(size_t(K) * N);
    for (auto& x : a) x = u(rng);
    for (auto& x : w) x = u(rng);
    for (Precision p : {Precision::Bf16, Precision::Fp32Pass3, Precision::Fp32Pass6}) {
        for (const std::vector<uint32_t>& cores :
             {std::vector<uint32_t>{0}, {0, 1, 2, 3, 4, 5, 6, 7}}) {
            const auto r = gemm(*dev, cache, a, w, M, K, N, p, cores);
            const auto want = gemm_reference(a, w, M, K, N, p, 128);
            ASSERT_EQ(0, std::memcmp(r.c.data(), want.data(), want.size() * 4))
                << M << "x" << K << "x" << N << " " << precision_name(p) << " on " << cores.size()
                << " cores";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Driver, GemmShapes,
                         ::testing::Values(std::tuple{1u, 1u, 1u}, std::tuple{7u, 127u, 129u},
                                           std::tuple{127u, 129u, 7u}, std::tuple{129u, 300u, 1u},
                                           std::tuple{300u, 7u, 300u},
                                           std::tuple{1000u, 129u, 127u}));

TEST(Driver, ProgramCacheCountsRecompilation) {
    auto dev = Device::open(tiny());
    ProgramCache cache;
    std::vector<float> a(16 * 8, 1.0f), w(8 * 8, 1.0f);
    gemm(*dev, cache, a, w, 16, 8, 8, Precision::Bf16, {0});
    gemm(*dev, cache, a, w, 16, 8, 8, Precision::Bf16, {0});
    EXPECT_EQ(cache.misses(), 1u);
    EXPECT_EQ(cache.hits(), 1u);
    std::vector<float> w2(8 * 16, 1.0f);
    const auto r = gemm(*dev, cache, a, w2, 16, 8, 16, Precision::Bf16, {0});  // new shape
    EXPECT_EQ(cache.misses(), 2u);
    for (float x : r.c) ASSERT_EQ(x, 8.0f);
    EXPECT_EQ(error_of([&] { parse_precision("fp16"); }),
              "unknown precision 'fp16' (expected bf16, fp32-3pass or fp32-6pass)");
}

}  // namespace
}  // namespace tpu::driver
