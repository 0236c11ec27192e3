// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "driver/kernels/allreduce.h"
#include "driver/kernels/kernel.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/ici/ici_costs.h"
#include "tests/common/paths.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;

/// Exact host sums in ring order are not what a ring computes (each chunk is summed starting
/// at a different core), so the test uses values whose sums are exact in fp32: small integers.
std::vector<std::vector<float>> integer_data(size_t cores, uint32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<float>> d(cores, std::vector<float>(n));
    for (auto& v : d)
        for (auto& x : v) x = float(int(rng() % 2001) - 1000);
    return d;
}

class AllReduceSizes
    : public ::testing::TestWithParam<std::tuple<std::vector<uint32_t>, uint32_t>> {};

TEST_P(AllReduceSizes, EveryCoreGetsTheExactSumAndTheKernelIsRaceFree) {
    const auto& [cores, n] = GetParam();
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const auto data = integer_data(cores.size(), n, n);
    const auto r = allreduce(*dev, cores, data);
    std::vector<float> sum(n, 0.0f);
    for (const auto& v : data)
        for (uint32_t i = 0; i < n; ++i) sum[i] += v[i];
    for (size_t c = 0; c < cores.size(); ++c) ASSERT_EQ(r.out[c], sum) << "core " << cores[c];
}

INSTANTIATE_TEST_SUITE_P(
    Driver, AllReduceSizes,
    ::testing::Values(std::tuple{std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}, 1u},
                      std::tuple{std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}, 1000u},
                      std::tuple{std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}, 65536u},
                      std::tuple{std::vector<uint32_t>{2, 5}, 777u},
                      std::tuple{std::vector<uint32_t>{0, 2, 4, 6}, 4096u}));

TEST(AllReduce, CyclesFollowTheRingFormula) {
    // 8 cores, 1 MiB per core: 2 (N-1)/N S / (2 bw) + 2 (N-1) hop, bw = 85.1 B/cycle, hop = 940.
    // The formula is the collective's; the launch's own start and end costs are left out.
    auto dev =
        Device::open(hw::BoardConfig::load("", {"sim.functional=false", "sim.launch_costs=false"}));
    const uint32_t n = 1 << 18;
    const auto r = allreduce(*dev, {0, 1, 2, 3, 4, 5, 6, 7},
                             std::vector<std::vector<float>>(8, std::vector<float>(n)));
    const double bw = 80e9 / 940e6, S = 4.0 * n;
    const double formula = 2.0 * 7 / 8 * S / (2 * bw) + 2 * 7 * 940;
    const double cycles = double(r.event.end_cycle - r.event.start_cycle);
    EXPECT_NEAR(cycles / formula, 1.0, 0.05) << cycles << " vs " << formula;
}

TEST(AllReduce, Errors) {
    auto dev = Device::open(hw::BoardConfig::load("", {}));
    try {
        allreduce(*dev, {0}, {{1.0f}});
        ADD_FAILURE();
    } catch (const DeviceError& e) {
        EXPECT_STREQ(e.what(), "all-reduce needs at least 2 cores");
    }
    EXPECT_THROW(allreduce(*dev, {0, 1}, {{1.0f}, {1.0f, 2.0f}}), DeviceError);
    EXPECT_THROW(
        allreduce(*dev, {0, 1}, std::vector<std::vector<float>>(2, std::vector<float>(3u << 20))),
        DeviceError);
}

// ---- All-reduce of tensors in HBM -----------------------------------------------------------

/// Values spread over many binades, so a different addition order changes the rounded sums.
std::vector<std::vector<float>> spread_data(size_t cores, uint64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> mant(0.0f, 1.0f);
    std::uniform_int_distribution<int> exp(-8, 8);
    std::vector<std::vector<float>> d(cores, std::vector<float>(n));
    for (auto& v : d)
        for (auto& x : v) x = std::ldexp(mant(rng), exp(rng));
    return d;
}

/// Runs allreduce() on `data` (one vector per core) and checks every replica bit for bit
/// against allreduce_reference(); returns the launch event.
Event run_hbm(Device& dev, const std::vector<uint32_t>& cores,
              const std::vector<std::vector<float>>& data, float scale,
              AllReduceSchedule schedule = AllReduceSchedule::Auto) {
    const auto n = static_cast<uint32_t>(data[0].size());
    ProgramCache cache;
    Tensor t = alloc_tensor(dev, cores, 1, n);
    for (size_t i = 0; i < cores.size(); ++i) write_tensor(dev, t, i, data[i]);
    const Event e = allreduce(dev, cache, t, scale, schedule);
    const auto want = bits_of(allreduce_reference(data, scale));
    for (size_t i = 0; i < cores.size(); ++i) {
        const auto got = bits_of(read_tensor(dev, t, i));
        EXPECT_EQ(got.size(), want.size());
        for (uint64_t k = 0; k < want.size(); ++k)
            if (got[k] != want[k]) {
                ADD_FAILURE() << "replica " << i << " (core " << cores[i] << ") value " << k << ": "
                              << std::bit_cast<float>(got[k]) << " vs "
                              << std::bit_cast<float>(want[k]);
                break;
            }
    }
    free_tensor(dev, t);
    return e;
}

void expect_usage(const std::function<void()>& f, const std::string& message) {
    try {
        f();
        ADD_FAILURE() << "no error; expected: " << message;
    } catch (const DeviceError& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Usage);
        EXPECT_EQ(std::string(e.what()), message);
    }
}

const std::vector<uint32_t> kEight{0, 1, 2, 3, 4, 5, 6, 7};

class AllReduceHbmSizes
    : public ::testing::TestWithParam<std::tuple<std::vector<uint32_t>, uint32_t, float>> {};

TEST_P(AllReduceHbmSizes, EveryReplicaEqualsTheReferenceBitForBit) {
    const auto& [cores, n, scale] = GetParam();
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    run_hbm(*dev, cores, spread_data(cores.size(), n, n + 7), scale);
}

INSTANTIATE_TEST_SUITE_P(
    Driver, AllReduceHbmSizes,
    ::testing::Values(std::tuple{kEight, 1u, 1.0f}, std::tuple{kEight, 7u, 0.125f},
                      std::tuple{kEight, 1000u, 1.0f}, std::tuple{kEight, 1024u, 0.125f},
                      std::tuple{kEight, 262144u, 0.125f},  // 1 MiB: 1 piece per chunk
                      std::tuple{std::vector<uint32_t>{2, 5}, 1000u, 0.5f},
                      std::tuple{std::vector<uint32_t>{6, 1, 4}, 7777u, 1.0f / 3.0f}));

TEST(AllReduceHbm, TheReferenceOrderMatters) {
    // The data really tells addition orders apart: summing in ring order 0..N-1 from core 0
    // differs from the reference somewhere.
    const auto data = spread_data(8, 1000, 1007);
    const auto ref = allreduce_reference(data, 1.0f);
    int differ = 0;
    for (uint64_t i = 0; i < 1000; ++i) {
        float acc = data[0][i];
        for (size_t c = 1; c < 8; ++c) acc = acc + data[c][i];
        differ += acc != ref[i];
    }
    EXPECT_GT(differ, 10);
}

TEST(AllReduceHbm, TwentyFourMiBPerCoreStreamsThroughVmem) {
    // 24 MiB per core is more than VMEM holds: 24 pieces per chunk, receive slots reused.
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const uint32_t n = 6u << 20;
    const AllReduceHbmPlan p = plan_allreduce_hbm(8, n, dev->config());
    EXPECT_EQ(p.pieces, 24u);
    EXPECT_EQ(p.groups, 1u);
    EXPECT_LT(p.recv_slots, 14u * 24u);
    EXPECT_TRUE(p.barrier);
    run_hbm(*dev, kEight, spread_data(8, n, 3), 0.125f);
}

TEST(AllReduceHbm, GroupsAndARaggedTail) {
    // 18 MiB on 2 cores: 73 pieces per chunk split into 2 groups of 37, the last group short.
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const uint32_t n = 4718592 + 4099;
    const AllReduceHbmPlan p = allreduce_partition(2, n);
    EXPECT_EQ(p.groups, 2u);
    EXPECT_EQ(p.pieces, 37u);
    EXPECT_TRUE(plan_allreduce_hbm(2, n, dev->config()).barrier);
    run_hbm(*dev, {3, 7}, spread_data(2, n, 5), 0.5f);
    run_hbm(*dev, {3, 7}, spread_data(2, n, 6), 0.5f, AllReduceSchedule::Pipelined);
}

TEST(AllReduceHbm, SmallVmemReusesSlotsWithoutRaces) {
    // 1 MiB per core = 4 pieces of 16 KiB per chunk, 56 pieces per direction. 1 MiB of VMEM:
    // 9 own slots per direction (288 KiB) and 23 receive slots, so slots go round the ring
    // with credits. The step barrier would need 2 x 4 + 20 slots, so Auto pipelines.
    auto dev = Device::open(
        hw::BoardConfig::load("", {"sim.race_detector=true", "core.vmem_bytes=1048576"}));
    const AllReduceHbmPlan p = plan_allreduce_hbm(8, 262144, dev->config());
    EXPECT_EQ(p.pieces, 4u);
    EXPECT_EQ(p.own_slots, 9u);
    EXPECT_EQ(p.recv_slots, 23u);
    EXPECT_FALSE(p.barrier);
    expect_usage(
        [&] { plan_allreduce_hbm(8, 262144, dev->config(), AllReduceSchedule::StepBarrier); },
        "all-reduce of 262144 values over 8 cores: a step barrier needs 28 receive slots of "
        "16384 bytes; VMEM holds 23");
    run_hbm(*dev, kEight, spread_data(8, 262144, 11), 1.0f);
}

TEST(AllReduceHbm, AKernelTooLargeToUnrollLoopsOverItsStepsAndStaysExact) {
    // 128 cores need ~15k instructions unrolled, more than the 8k of instruction memory; a
    // 1024-instruction one makes 16 cores loop the same way. Both schedules, race-free.
    auto dev = Device::open(hw::BoardConfig::load(
        "",
        {"sim.race_detector=true", "chips=8", "core.imem_bytes=32768", "core.vmem_bytes=1048576"}));
    std::vector<uint32_t> sixteen(16);
    for (uint32_t i = 0; i < 16; ++i) sixteen[i] = i;
    for (uint32_t n : {262144u, 20000u}) {
        AllReduceHbmPlan p = plan_allreduce_hbm(16, n, dev->config());
        EXPECT_EQ(p.imem_instrs, 1024u);
        const size_t rolled = allreduce_hbm_program(p).code.size();
        p.imem_instrs = 0;
        const size_t unrolled = allreduce_hbm_program(p).code.size();
        EXPECT_LE(rolled, 1024u) << n;
        EXPECT_GT(unrolled, 1024u) << n;
        run_hbm(*dev, sixteen, spread_data(16, n, 13), 0.125f);
    }
    EXPECT_FALSE(plan_allreduce_hbm(16, 262144, dev->config()).barrier);
    EXPECT_TRUE(plan_allreduce_hbm(16, 20000, dev->config()).barrier);
}

TEST(AllReduceHbm, OneCoreOnlyScales) {
    auto dev = Device::open(hw::BoardConfig::load("", {}));
    run_hbm(*dev, {4}, spread_data(1, 5000, 1), 0.25f);
    const Event e = run_hbm(*dev, {4}, spread_data(1, 10, 2), 1.0f);
    EXPECT_EQ(e.end_cycle, e.start_cycle);
}

TEST(AllReduceHbm, ProgramsAreCached) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
    ProgramCache cache;
    Tensor t = alloc_tensor(*dev, kEight, 3, 100);
    allreduce(*dev, cache, t, 1.0f);
    allreduce(*dev, cache, t, 0.125f);  // the scale is a launch argument
    EXPECT_EQ(cache.misses(), 1u);
    EXPECT_EQ(cache.hits(), 1u);
}

TEST(AllReduceHbm, CyclesFollowTheRingFormula) {
    // 8 cores, 4 MiB per core from HBM: 2 (N-1)/N S / (2 bw) + 2 (N-1) hop.
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
    ProgramCache cache;
    Tensor t = alloc_tensor(*dev, kEight, 1024, 1024);
    const Event e = allreduce(*dev, cache, t);
    const double bw = 80e9 / 940e6, S = 4.0 * (1 << 20);
    const double formula = 2.0 * 7 / 8 * S / (2 * bw) + 2 * 7 * 940;
    const double cycles = double(e.end_cycle - e.start_cycle);
    EXPECT_NEAR(cycles / formula, 1.0, 0.05) << cycles << " vs " << formula;
}

TEST(AllReduceHbm, Errors) {
    auto dev = Device::open(hw::BoardConfig::load("", {}));
    ProgramCache cache;
    expect_usage([&] { allreduce(*dev, cache, Tensor{}); }, "all-reduce of an empty tensor");
    Tensor t = alloc_tensor(*dev, {0, 1, 2}, 2, 8);
    Tensor moved = t;
    moved.cores = {0, 2, 1};
    expect_usage([&] { allreduce(*dev, cache, moved); },
                 "all-reduce: replica 1 lives on core 1, not core 2");
    Tensor short_of_one = t;
    short_of_one.bufs.pop_back();
    expect_usage([&] { allreduce(*dev, cache, short_of_one); },
                 "all-reduce: the tensor has 2 buffers for 3 cores");
    Tensor twice = t;
    twice.cores = {0, 1, 0};
    twice.bufs[2] = t.bufs[0];
    expect_usage([&] { allreduce(*dev, cache, twice); }, "all-reduce: core 0 appears twice");
    Tensor wider = t;
    wider.cols = 9;
    expect_usage([&] { allreduce(*dev, cache, wider); },
                 "all-reduce: replica 0 holds 64 bytes, not 72");
    expect_usage(
        [&] {
            allreduce_reference({{1.0f}, {1.0f, 2.0f}}, 1.0f);
        },
        "all-reduce: replicas differ in length");
    const auto tiny = hw::BoardConfig::load("", {"core.vmem_bytes=262144"});
    expect_usage([&] { plan_allreduce_hbm(8, 8u << 20, tiny); },
                 "all-reduce of 8388608 values over 8 cores needs 5505024 bytes of VMEM per "
                 "core; the core has 262144");
}

TEST(AllReduceHbm, ProgramsMatchTheirGoldenHashes) {
    // The images the assembly-text kernels emitted for these plans (issue 25: the builder
    // versions were compared with them on 2 500 plans before the text was deleted). A
    // deliberate change to the kernel updates the hashes and says why.
    struct Row {
        const char* board;
        std::vector<std::string> sets;
        uint32_t cores, n;
        AllReduceSchedule schedule;
        uint64_t hash;
    };
    const std::vector<std::string> loops = {"chips=8", "core.imem_bytes=32768",
                                            "core.vmem_bytes=1048576"};
    const std::vector<Row> rows = {
        {"v3-8", {}, 8, 1, AllReduceSchedule::Auto, 0x9687197b7e7a3e35},
        {"v3-8", {}, 8, 1000, AllReduceSchedule::Auto, 0x16d6b0380bfb8211},
        {"v3-8", {}, 8, 4194304, AllReduceSchedule::Auto, 0x8c47b2c5d6e00808},
        {"v3-8", {}, 8, 16777216, AllReduceSchedule::Auto, 0x1d6a9216b4ffe017},  // pipelined
        {"v3-8", {}, 2, 100000, AllReduceSchedule::Pipelined, 0x65aa24163e791407},
        {"v3-8",
         {"core.vmem_bytes=1048576"},
         8,
         262144,
         AllReduceSchedule::Auto,
         0x94f135b6b5514592},                                                      // credits
        {"v3-8", loops, 16, 262144, AllReduceSchedule::Auto, 0x47fcd472e4a57289},  // step loops
        {"v3-8", loops, 16, 20000, AllReduceSchedule::Auto, 0x168fbe079e3751c6},
        {"v3-32", {}, 32, 4194304, AllReduceSchedule::Auto, 0x57e7f45dcaa21612},
        {"v3-128", {}, 128, 4194304, AllReduceSchedule::Auto, 0x6bc40174fa9783a7},
        {"v4-8", {}, 8, 20000, AllReduceSchedule::Auto, 0x09772bb67dbfc05f},
    };
    for (const Row& r : rows) {
        const auto cfg = hw::BoardConfig::load(
            fmt::format("{}/configs/{}.json", test::source_dir(), r.board), r.sets);
        const auto p = plan_allreduce_hbm(r.cores, r.n, cfg, r.schedule);
        EXPECT_EQ(isa::image_hash(generate(p)), r.hash)
            << r.board << " " << r.cores << " cores, " << r.n << " values";
    }
    const std::vector<std::tuple<uint32_t, uint32_t, uint64_t>> vmem = {
        {2, 777, 0xb68ae8ec1b49ec51},
        {2, 65536, 0x2a233683c704097d},
        {8, 777, 0xf341d8851f7f6895},
        {8, 65536, 0x9db9b039e97055c5},
    };
    for (const auto& [cores, n, hash] : vmem)
        EXPECT_EQ(isa::image_hash(generate(plan_allreduce(cores, n, 16u << 20))), hash)
            << cores << " cores, " << n << " values";
}

TEST(AllReduceHbm, ComposesAfterAnotherKernelInOneProgram) {
    // One program per core: out = a + b (the vector add kernel), then the all-reduce of out
    // in place, as the compiler puts a gradient all-reduce at the end of a step's program.
    // Race detector on; values bit-exact against the two references chained.
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const auto& cfg = dev->config();
    const uint32_t n = 100000;
    const float scale = 0.125f;
    isa::Builder b("add_allreduce", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg a = b.arg("a"), bb = b.arg("b"), out = b.arg("out");
    const isa::Reg position = b.arg("position"), next = b.arg("next"), prev = b.arg("prev");
    const isa::Reg sc = b.arg("scale");
    using streaming::Operand;
    emit(b, plan_vector(VectorOp::Add, n, 1, b.vmem_free()),
         std::vector{Operand::hbm(a), Operand::hbm(bb), Operand::hbm(out)});
    emit_allreduce(b, plan_allreduce_hbm(8, n, cfg, AllReduceSchedule::Auto, b.vmem_free()),
                   AllReduceOperands::ring(out, sc, position, next, prev));
    b.emit(isa::Opcode::Halt, {});
    const isa::Program prog = b.finish();

    const auto xa = spread_data(8, n, 21), xb = spread_data(8, n, 22);
    Tensor ta = alloc_tensor(*dev, kEight, 1, n), tb = alloc_tensor(*dev, kEight, 1, n);
    Tensor tout = alloc_tensor(*dev, kEight, 1, n);
    std::vector<std::vector<float>> sums(8, std::vector<float>(n));
    for (size_t i = 0; i < 8; ++i) {
        write_tensor(*dev, ta, i, xa[i]);
        write_tensor(*dev, tb, i, xb[i]);
        for (uint32_t k = 0; k < n; ++k) sums[i][k] = xa[i][k] + xb[i][k];
    }
    launch(*dev, kEight, prog, [&](size_t i, LaunchArgs& args) {
        args.set("a", ta.bufs[i])
            .set("b", tb.bufs[i])
            .set("out", tout.bufs[i])
            .set("position", static_cast<uint32_t>(i))
            .set("next", kEight[(i + 1) % 8])
            .set("prev", kEight[(i + 7) % 8])
            .set_f32("scale", scale);
    });
    const auto want = bits_of(allreduce_reference(sums, scale));
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(bits_of(read_tensor(*dev, tout, i)), want) << i;
}

// ---- Torus all-reduce ------------------------------------------------------------------------

hw::BoardConfig preset_config(const char* board, std::vector<std::string> sets = {}) {
    return hw::BoardConfig::load(fmt::format("{}/configs/{}.json", test::source_dir(), board),
                                 std::move(sets));
}

std::vector<uint32_t> all_cores(const hw::BoardConfig& cfg) {
    std::vector<uint32_t> c(cfg.cores());
    for (uint32_t i = 0; i < c.size(); ++i) c[i] = i;
    return c;
}

/// Runs the torus all-reduce of `k` (allreduce() when `via_planner`) and checks every replica
/// bit for bit against allreduce_torus_reference.
void run_torus(Device& dev, const TorusAllReduceKey& k, uint32_t seed, float scale,
               bool via_planner) {
    const auto cores = all_cores(dev.config());
    const auto data = spread_data(cores.size(), k.elements, seed);
    ProgramCache cache;
    Tensor t = alloc_tensor(dev, cores, 1, k.elements);
    for (size_t i = 0; i < cores.size(); ++i) write_tensor(dev, t, i, data[i]);
    if (via_planner)
        allreduce(dev, cache, t, scale);
    else
        allreduce_torus(dev, cache, t, scale, k);
    const hw::TorusShape s = hw::torus_shape(dev.config().ici, dev.config().cores());
    const auto want = bits_of(allreduce_torus_reference(data, scale, k, {s.x, s.y, s.z}));
    for (size_t i = 0; i < cores.size(); ++i)
        ASSERT_EQ(bits_of(read_tensor(dev, t, i)), want) << "replica " << i;
    free_tensor(dev, t);
}

TEST(TorusAllReduce, V3_32EqualsItsReferenceBitForBit) {
    // The planner picks the torus on v3-32 (8 x 4); ragged sizes clip every phase's ranges
    // (40 values leave most chunks empty). Race detector on: the phases' handshakes keep a
    // fast neighbour's next phase off the flags and VMEM a slow core still uses.
    auto dev = Device::open(preset_config("v3-32", {"sim.race_detector=true"}));
    const auto cores = all_cores(dev->config());
    for (uint32_t n : {40u, 1000u, 100003u}) {
        SCOPED_TRACE(n);
        const auto k = plan_allreduce_torus(dev->config(), cores, n);
        ASSERT_TRUE(k.has_value());
        ASSERT_EQ(k->phases.size(), 2u);
        EXPECT_EQ(k->phases[0].cores, 8u);
        EXPECT_EQ(k->phases[1].cores, 4u);
        run_torus(*dev, *k, n, n == 1000 ? 1.0f : 0.03125f, true);
    }
    // The order of additions is not the ring's: spread values round differently.
    const auto data = spread_data(32, 1000, 5);
    const auto k = plan_allreduce_torus(dev->config(), cores, 1000);
    EXPECT_NE(bits_of(allreduce_torus_reference(data, 1.0f, *k, {8, 4, 1})),
              bits_of(allreduce_reference(data, 1.0f)));
    EXPECT_EQ(bits_of(allreduce_reference(dev->config(), cores, data, 1.0f)),
              bits_of(allreduce_torus_reference(data, 1.0f, *k, {8, 4, 1})));
}

TEST(TorusAllReduce, V4_8AndThreeDimensionalToriEqualTheirReferenceBitForBit) {
    // v4-8's 4 x 2 torus (forced: its ring bound is lower for large tensors), a 2 x 2 x 2 and
    // a 4 x 2 x 2 torus (three phases along x, y, z; a dimension of 2 sends both directions
    // to its one neighbour).
    const std::vector<std::vector<std::string>> boards = {
        {"sim.race_detector=true"},
        {"sim.race_detector=true", "ici.torus_x=2", "ici.torus_y=2"},
        {"sim.race_detector=true", "chips=8", "chips_per_host=8", "ici.torus_x=4", "ici.torus_y=2"},
    };
    for (const auto& sets : boards) {
        auto dev = Device::open(preset_config("v4-8", sets));
        const hw::TorusShape s = hw::torus_shape(dev->config().ici, dev->config().cores());
        SCOPED_TRACE(fmt::format("{} x {} x {}", s.x, s.y, s.z));
        for (uint32_t n : {777u, 70000u}) {
            const auto k = plan_allreduce_torus(dev->config(), all_cores(dev->config()), n, true);
            ASSERT_TRUE(k.has_value()) << n;
            EXPECT_EQ(k->phases.size(), s.dims());
            run_torus(*dev, *k, n + 3, 0.5f, false);
        }
    }
}

TEST(TorusAllReduce, PhasesThatReuseTheirSlotsWaitForEveryCredit) {
    // v4-8 (forced torus), 5 MiB per core: the x reduce-scatter sends 3 steps x 10 pieces of
    // 64 KiB per direction; 4 MiB of VMEM hold 3 own slots (384 KiB) and 29 receive slots per
    // direction, not 30, but more than a step barrier needs (2 x 10 + 8): slots are handed
    // back with credits, and a phase ends only once all its credits are in (the next phase
    // resets the flag). Race detector on.
    auto dev =
        Device::open(preset_config("v4-8", {"sim.race_detector=true", "core.vmem_bytes=4194304"}));
    const auto k = plan_allreduce_torus(dev->config(), all_cores(dev->config()), 1310720, true);
    ASSERT_TRUE(k.has_value());
    const AllReduceHbmPlan& x = k->phases[0];
    EXPECT_EQ(x.pieces, 10u);
    EXPECT_EQ(x.recv_slots, 29u);
    run_torus(*dev, *k, 17, 0.25f, false);
}

TEST(TorusAllReduce, AProgramTooLargeToUnrollLoopsOverItsStepsAndStaysExact) {
    // v3-128 with 2 048 instructions of memory: the three phases unrolled take more, so each
    // loops over its steps of one shape (as v3-2048 needs with its 64-core rings).
    auto dev =
        Device::open(preset_config("v3-128", {"sim.race_detector=true", "core.imem_bytes=65536"}));
    const auto k = plan_allreduce_torus(dev->config(), all_cores(dev->config()), 10000);
    ASSERT_TRUE(k.has_value());
    EXPECT_LE(generate(*k).code.size(), 2048u);
    TorusAllReduceKey unlimited = *k;
    for (auto& p : unlimited.phases) p.imem_instrs = 0;
    EXPECT_GT(generate(unlimited).code.size(), 2048u);
    run_torus(*dev, *k, 23, 0.125f, true);
}

TEST(TorusAllReduce, ThePlannerTakesTheSmallerBound) {
    const auto v3_32 = preset_config("v3-32"), v4_8 = preset_config("v4-8");
    const uint32_t n = 4194304;  // 16 MiB per core
    EXPECT_TRUE(plan_allreduce_torus(v3_32, all_cores(v3_32), n).has_value());
    // v4-8 (4 x 2, B = 42.857 bytes/cycle, hop 1050): the y dimension of 2 shares one link,
    // torus 293 601 + 97 867 + 8 400 = 399 868 cycles against the ring's 357 235.
    EXPECT_FALSE(plan_allreduce_torus(v4_8, all_cores(v4_8), n).has_value());
    EXPECT_TRUE(plan_allreduce_torus(v4_8, all_cores(v4_8), 20000).has_value());  // hops rule
    // A ring board, or not the whole board in core order: the ring.
    const auto v3_8 = preset_config("v3-8");
    EXPECT_FALSE(plan_allreduce_torus(v3_8, all_cores(v3_8), n).has_value());
    auto reversed = all_cores(v3_32);
    std::reverse(reversed.begin(), reversed.end());
    EXPECT_FALSE(plan_allreduce_torus(v3_32, reversed, n).has_value());
}

TEST(TorusAllReduce, SixteenMiBPerCoreIsWithinTenPercentOfItsBound) {
    // hw/README.md, "All-reduce bounds": B = 80 GB/s / 940 MHz = 85.106 bytes/cycle, hop 940,
    // S = 16 MiB, S / 2B = 98 566. v3-32 (8 x 4): 2 x 31/32 x 98 566 + 2 (7 + 3) x 940 =
    // 209 772; v3-128 (16 x 8): 2 x 127/128 x 98 566 + 2 (15 + 7) x 940 = 236 952. Measured
    // with the launch costs (about 1 300 cycles), timing-only: 222 718 (1.062) and 246 604
    // (1.041); the rest is each phase's first HBM load and last store, its v.add per piece and
    // the handshakes between phases.
    for (const auto& [board, bound] : {std::pair{"v3-32", 209772.0}, {"v3-128", 236952.0}}) {
        SCOPED_TRACE(board);
        auto dev = Device::open(preset_config(board, {"sim.functional=false"}));
        const auto& cfg = dev->config();
        const hw::TorusShape s = hw::torus_shape(cfg.ici, cfg.cores());
        const uint32_t n = 4194304;
        EXPECT_NEAR(hw::allreduce_torus_bound(hw::ici_costs(cfg), {s.x, s.y, s.z}, 4ull * n), bound,
                    1.0);
        ProgramCache cache;
        Tensor t = alloc_tensor(*dev, all_cores(cfg), 1, n);
        const Event e = allreduce(*dev, cache, t);
        const double ratio = double(e.end_cycle - e.start_cycle) / bound;
        EXPECT_GT(ratio, 1.0);
        EXPECT_LE(ratio, 1.10);
        free_tensor(*dev, t);
    }
}

}  // namespace
}  // namespace tpu::driver
