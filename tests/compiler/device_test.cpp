// SPDX-License-Identifier: Apache-2.0
// Code generation and the device backend (compiler/README.md, "Code generation"): compiled
// steps run as one program per core, bit-exact with the host evaluator.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::Leaf;
using test::randoms;
using test::Record;
using test::run;
using test::same_bits;
using test::TimingOnlyLazy;

TEST(CompilerDevice, LayerNormIsOneProgramBitExactWithTheEvaluator) {
    // 16 x 256 in T(8,128) tiles: two bands of 8 rows, each row two lane chunks.
    const Shape xs{DType::F32, {16, 256}}, vs{DType::F32, {256}};
    const auto st = expect_bit_exact({{"x", xs, {randoms(16 * 256, 1)}},
                                      {"weight", vs, {randoms(256, 2)}, true},
                                      {"bias", vs, {randoms(256, 3)}, true}},
                                     [](Graph& g, const std::vector<ValueId>& v) {
                                         return layer_norm(g, v[0], v[1], v[2], 1e-5).y;
                                     });
    EXPECT_EQ(st.launches, 1u);
    EXPECT_EQ(st.programs_generated, 1u);
}

TEST(CompilerDevice, SoftmaxOnTwoReplicasIsBitExact) {
    // 8 x 384: one band, three lane chunks per row; every replica its own values.
    const Shape xs{DType::F32, {8, 384}};
    expect_bit_exact({{"x", xs, {randoms(8 * 384, 4, -20, 20), randoms(8 * 384, 5, -20, 20)}}},
                     [](Graph& g, const std::vector<ValueId>& v) { return softmax(g, v[0], 1); },
                     {0, 1});
}

TEST(CompilerDevice, ElementwiseLoopFusionIsBitExact) {
    // Every VPU lowering of the loop emitter in one fusion (flat: no broadcast of a vector).
    const Shape s{DType::F32, {3, 1000}};
    expect_bit_exact({{"a", s, {randoms(3000, 6)}}, {"b", s, {randoms(3000, 7)}}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         const ValueId a = v[0], b = v[1];
                         const ValueId half = broadcast(g, literal(g, 0.5), {3, 1000}, {});
                         ValueId y = add(g, mul(g, a, b), exp(g, a));
                         y = sub(g, y, max(g, a, half));
                         y = div(g, y, b);
                         y = add(g, y, min(g, tanh(g, a), neg(g, b)));
                         y = select(g, compare(g, a, b, Comparison::Gt), y, rsqrt(g, mul(g, b, b)));
                         y = add(g, y, log(g, add(g, mul(g, a, a), half)));
                         y = convert(g, convert(g, y, DType::BF16), DType::F32);
                         return select(g, compare(g, a, b, Comparison::Lt), y, div(g, y, half));
                     });
}

TEST(CompilerDevice, RowAndColumnBroadcastsAndSiblingReductions) {
    // 16 x 384 in T(8,128) tiles (two bands, three lane chunks per row), a row vector, a row max
    // and sum of one operand in one pass, and the divide by them. (A rank-3 input would reduce
    // to a rank-2 result, which layout assignment pads into T(8,128) tiles: not yet generated.)
    const Shape xs{DType::F32, {16, 384}}, rs{DType::F32, {384}};
    expect_bit_exact({{"x", xs, {randoms(16 * 384, 8)}}, {"r", rs, {randoms(384, 9)}, true}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         const ValueId x = mul(g, v[0], broadcast(g, v[1], {16, 384}, {1}));
                         const ValueId s = reduce(g, x, {1}, Reducer::Sum);
                         const ValueId m = reduce(g, x, {1}, Reducer::Max);
                         const ValueId d = sub(g, x, broadcast(g, m, {16, 384}, {0}));
                         return div(g, d, broadcast(g, add(g, s, m), {16, 384}, {0}));
                     });
}

TEST(CompilerDevice, VectorReductionsToScalarsAreBitExact) {
    // Untiled: one row of 384 values in three lane chunks; the scalar broadcast back.
    const Shape xs{DType::F32, {384}};
    expect_bit_exact({{"x", xs, {randoms(384, 11)}}}, [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId s = reduce(g, v[0], {0}, Reducer::Sum);
        const ValueId m = reduce(g, v[0], {0}, Reducer::Max);
        return sub(g, v[0], broadcast(g, div(g, s, m), {384}, {}));
    });
}

TEST(CompilerDevice, TwoOutputsOfOneValueReadBackTheSameData) {
    // y and a same-dims reshape of y (PyTorch's y.view(y.shape), both alive at the cut): the
    // reshape is simplified away, so both outputs are one value and buffer assignment gives the
    // second the first's buffer. Its data must be that buffer, not an allocation of its own
    // (GPT-2's last_hidden_state read back as zeros through tpusim.torch).
    const auto cfg = hw::BoardConfig::load("", {});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    LazyContext ctx(device);
    std::vector<float> values(8 * 128);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * float(i % 97);
    const LazyTensor x = ctx.input("x", Shape{DType::F32, {8, 128}}, {values});
    const ValueId e = exp(ctx.graph(), ctx.value(x));
    const LazyTensor y = ctx.wrap(e, "y");
    const LazyTensor z = ctx.wrap(reshape(ctx.graph(), e, {8, 128}), "z");
    ctx.mark_step();
    const std::vector<float> got_y = ctx.to_host(y), got_z = ctx.to_host(z);
    EXPECT_NE(got_y[1], 0.0f);
    EXPECT_EQ(got_y, got_z);
}

TEST(CompilerDevice, WritesOfNewTensorsCountTheirHostLinkCycles) {
    // tpusim.torch's TransferToDeviceTime: the device backend writes a tensor when the first
    // step that reads it runs; those writes are the only host-to-device traffic here.
    TimingOnlyLazy t;
    LazyContext& ctx = t.ctx;
    DeviceBackend& device = t.device;
    const Shape s{DType::F32, {8, 128}};
    const std::vector<float> ones(8 * 128, 1.0f);
    const LazyTensor w = ctx.parameter("w", s, {ones});
    for (int step = 0; step < 2; ++step) {
        const LazyTensor x = ctx.input("x", s, {ones});
        const LazyTensor y = ctx.wrap(add(ctx.graph(), ctx.value(w), ctx.value(x)), "y");
        ctx.mark_step();
        EXPECT_EQ(device.stats().h2d_cycles, t.dev->metrics().h2d_cycles);
        // Each write of 8 x 128 f32 (4096 B): 2000 ns set-up + 4096 B / 12 GB/s = 2341.3 ns
        // -> 2201 cycles at 940 MHz. Step 1 writes w and x; step 2 only its new x (w stays).
        EXPECT_EQ(device.stats().h2d_cycles, (step + 2) * 2201u) << step;
    }
}

TEST(CompilerDevice, CompileCacheOverDeviceRunsHitsTheSameGraphAndCompilesANewShape) {
    TimingOnlyLazy t;
    LazyContext& ctx = t.ctx;
    DeviceBackend& device = t.device;
    const auto step = [&](int64_t rows) {
        const LazyTensor x =
            ctx.input("x", Shape{DType::F32, {rows, 128}}, {std::vector<float>(rows * 128, 1.0f)});
        const LazyTensor y = ctx.wrap(softmax(ctx.graph(), ctx.value(x), 1));
        ctx.mark_step();
        return y;
    };
    step(8);
    step(8);
    EXPECT_EQ(ctx.stats().uncached_compiles, 1u);
    EXPECT_EQ(ctx.stats().cached_compiles, 1u);
    EXPECT_EQ(device.stats().programs_generated, 1u) << "the same graph reuses its program";
    step(16);
    EXPECT_EQ(ctx.stats().uncached_compiles, 2u);
    EXPECT_EQ(device.stats().programs_generated, 2u);
    EXPECT_EQ(device.stats().launches, 3u);
    EXPECT_GT(ctx.stats().compile_seconds, 0.0);
    EXPECT_GT(device.stats().codegen_seconds, 0.0);
}

TEST(CompilerDevice, LivenessReuseIsVisibleInTheDeviceAllocations) {
    // Softmax then a second softmax of its result: streaming fusions whose [rows] temps share
    // the arena. The backend holds exactly what the plan says. (The first softmax is an output
    // too: otherwise its normalize is recomputed inside the second softmax's fusions, which
    // moves fewer bytes than writing it and reading it back three times; CompilerNorm.*.)
    TimingOnlyLazy t;
    LazyContext& ctx = t.ctx;
    DeviceBackend& device = t.device;
    const LazyTensor x =
        ctx.input("x", Shape{DType::F32, {64, 256}}, {std::vector<float>(64 * 256, 0.5f)});
    const ValueId s1 = softmax(ctx.graph(), ctx.value(x), 1);
    const LazyTensor first = ctx.wrap(s1);
    const LazyTensor y = ctx.wrap(softmax(ctx.graph(), mul(ctx.graph(), s1, s1), 1));
    ctx.mark_step();
    const MemoryPlan& m = ctx.last_step()->memory;
    EXPECT_LT(m.temp_bytes, m.temp_unshared_bytes);
    EXPECT_EQ(device.stats().peak_device_bytes, m.peak_bytes());
    EXPECT_EQ(device.stats().device_bytes, m.input_bytes + m.output_bytes)
        << "the arena is freed after the step; the input and the outputs stay";
    (void)y;
    (void)first;
}

TEST(CompilerDevice, CustomCallsRunOnTheHostWithTimedTransfers) {
    const auto cfg = hw::BoardConfig::load("", {});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    EvalOptions host;
    host.custom_calls["twice"] = [](const std::vector<HostArray>& in, const Shape& s) {
        HostArray r = in[0];
        r.shape = s;
        for (double& x : r.data) x *= 2;
        return r;
    };
    DeviceBackend device(*dev, {0}, cg, host);
    LazyContext ctx(device);
    const std::vector<float> xv = randoms(8 * 128, 10);
    const LazyTensor x = ctx.input("x", Shape{DType::F32, {8, 128}}, {xv});
    Graph& g = ctx.graph();
    const ValueId e = exp(g, ctx.value(x));
    const ValueId c = custom_call(g, "twice", {e}, Shape{DType::F32, {8, 128}});
    const LazyTensor y = ctx.wrap(add(g, c, ctx.value(x)));
    const auto before = dev->metrics();
    ctx.mark_step();
    EXPECT_EQ(device.stats().host_fusions, 1u);
    EXPECT_EQ(device.stats().launches, 2u) << "the device programs before and after the call";
    EXPECT_EQ(dev->metrics().d2h_transfers - before.d2h_transfers, 1u) << "its operand";
    EXPECT_GE(dev->metrics().h2d_transfers - before.h2d_transfers, 2u) << "x and its result";
    EXPECT_GT(dev->metrics().d2h_cycles, before.d2h_cycles);
    const auto got = ctx.to_host(y);
    for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(got[i], std::exp(xv[i]) * 2 + xv[i]) << i;
}

// On a timing-only board a host fusion moves the same bytes over the host link at the same
// cycles, but the call is not evaluated: the board holds no values (reads are zeros, writes are
// dropped), so evaluating it would only cost host time and memory.
TEST(CompilerDevice, HostFusionsOnATimingOnlyBoardTimeTheirTransfersWithoutEvaluating) {
    struct Seen {
        uint64_t now = 0, calls = 0;
        driver::DeviceMetrics m;
    };
    const auto run_on = [](bool functional) {
        auto cfg = hw::BoardConfig::load("", {});
        cfg.sim.functional = functional;
        auto dev = driver::Device::open(cfg);
        CodegenOptions cg;
        cg.board = cfg;
        Seen seen;
        EvalOptions host;
        host.custom_calls["twice"] = [&seen](const std::vector<HostArray>& in, const Shape& s) {
            ++seen.calls;
            HostArray r = in[0];
            r.shape = s;
            return r;
        };
        DeviceBackend device(*dev, {0}, cg, host);
        LazyContext ctx(device);
        const LazyTensor x = ctx.input("x", Shape{DType::F32, {8, 128}}, {randoms(8 * 128, 10)});
        Graph& g = ctx.graph();
        const ValueId c =
            custom_call(g, "twice", {exp(g, ctx.value(x))}, Shape{DType::F32, {8, 128}});
        const LazyTensor y = ctx.wrap(add(g, c, ctx.value(x)));
        ctx.mark_step();
        dev->synchronize();
        EXPECT_EQ(device.stats().host_fusions, 1u);
        seen.now = dev->now_cycle();
        seen.m = dev->metrics();
        (void)y;
        return seen;
    };
    const Seen f = run_on(true), t = run_on(false);
    EXPECT_EQ(f.calls, 1u);
    EXPECT_EQ(t.calls, 0u);
    EXPECT_EQ(t.now, f.now);
    EXPECT_EQ(t.m.exec_cycles, f.m.exec_cycles);
    EXPECT_EQ(t.m.d2h_transfers, f.m.d2h_transfers);
    EXPECT_EQ(t.m.d2h_bytes, f.m.d2h_bytes);
    EXPECT_EQ(t.m.d2h_cycles, f.m.d2h_cycles);
    EXPECT_EQ(t.m.h2d_transfers, f.m.h2d_transfers);
    EXPECT_EQ(t.m.h2d_bytes, f.m.h2d_bytes);
    EXPECT_EQ(t.m.h2d_cycles, f.m.h2d_cycles);
    EXPECT_GT(t.m.d2h_bytes, 0u) << "the call's operand comes over the link";
}

TEST(CompilerDevice, AFusionNotGeneratedYetRunsOnTheHostWithHostFallback) {
    const auto cfg = hw::BoardConfig::load("", {});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.replicas = 2;
    // sum(x) is an input fusion the streaming engine generates; a power of 0.5 has no VPU
    // lowering, so the reduction fusion that takes (x + sum)^0.5 in as its producer falls back
    // to the host;
    // the max of exp after it is a device fusion again.
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId s = reduce(g, v[0], {1}, Reducer::Sum);
        const ValueId t = add(g, v[0], broadcast(g, s, {8, 128}, {0}));
        const ValueId u = reduce(g, pow(g, t, full(g, 0.5, g.shape(t))), {1}, Reducer::Sum);
        const ValueId w = exp(g, sub(g, v[0], broadcast(g, u, {8, 128}, {0})));
        return reduce(g, w, {1}, Reducer::Max);
    };
    const std::vector<Leaf> leaves = {
        {"x", Shape{DType::F32, {8, 128}}, {randoms(8 * 128, 3), randoms(8 * 128, 4)}}};
    {
        DeviceBackend strict(*dev, {0, 1}, cg);
        EXPECT_THROW(run(strict, leaves, record), NotYetGenerated);
    }
    cg.host_fallback = true;
    DeviceBackend device(*dev, {0, 1}, cg);
    HostBackend host(2);
    const auto want = run(host, leaves, record);
    const auto got = run(device, leaves, record);
    for (size_t r = 0; r < 2; ++r) EXPECT_TRUE(same_bits(got[r], want[r])) << "replica " << r;
    EXPECT_EQ(device.stats().fallback_fusions, 1u);
    EXPECT_EQ(device.stats().host_fusions, 1u);
    EXPECT_EQ(device.stats().launches, 2u) << "the device fusions before and after it";
    ASSERT_EQ(device.stats().fallbacks.size(), 1u);
    EXPECT_NE(device.stats().fallbacks.begin()->first.find("power"), std::string::npos)
        << device.stats().fallbacks.begin()->first;
}

TEST(CompilerDevice, AStepTooLargeForOneLaunchIsCutIntoProgramsThatEachFit) {
    // 40 parameters, each read by its own reduction fusion: with the input, the output and the
    // temp arena 43 allocations, more than the 31 arguments of one launch. With instruction
    // memory to spare that is two programs (the first as many fusions as fit); with the
    // default 256 KiB, 80 fusions of about 250 instructions (32 bytes each) are about 640 KiB,
    // so each of the two is halved until it fits: four programs each.
    const Shape s{DType::F32, {8, 128}};
    std::vector<Leaf> leaves = {{"x", s, {randoms(8 * 128, 1)}}};
    for (uint32_t i = 0; i < 40; ++i)
        leaves.push_back({fmt::format("p{}", i), s, {randoms(8 * 128, 100 + i)}, true});
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        ValueId h = v[0];
        for (size_t i = 1; i < v.size(); ++i) {
            const ValueId r = reduce(g, mul(g, h, v[i]), {1}, Reducer::Max);
            h = sub(g, h, broadcast(g, r, {8, 128}, {0}));
        }
        return h;
    };
    HostBackend host(1);
    const auto want = run(host, leaves, record);
    for (const auto& [imem, launches] : {std::pair{"4194304", 2u}, std::pair{"262144", 8u}}) {
        const auto cfg = hw::BoardConfig::load(
            "", {"sim.race_detector=true", fmt::format("core.imem_bytes={}", imem)});
        auto dev = driver::Device::open(cfg);
        CodegenOptions cg;
        cg.board = cfg;
        DeviceBackend device(*dev, {0}, cg);
        EXPECT_TRUE(same_bits(run(device, leaves, record)[0], want[0])) << imem;
        EXPECT_EQ(device.stats().launches, launches) << imem;
    }
}

TEST(CompilerDevice, LinearBiasAndReluAreOneDotKernelBitExact) {
    // relu(x W^T + b): one output fusion, the dot kernel reading x in T(8,128) tiles and W in
    // its stationary T(128,128) layout, the bias a Column side, ReLU a scalar max on each tile.
    const Shape xs{DType::F32, {64, 256}}, ws{DType::F32, {384, 256}}, bs{DType::F32, {384}};
    const auto st = expect_bit_exact({{"x", xs, {randoms(64 * 256, 21)}},
                                      {"w", ws, {randoms(384 * 256, 22)}, true},
                                      {"b", bs, {randoms(384, 23)}, true}},
                                     [](Graph& g, const std::vector<ValueId>& v) {
                                         return relu(g, linear(g, v[0], v[1], v[2]));
                                     });
    EXPECT_EQ(st.programs_generated, 1u);
}

TEST(CompilerDevice, ADotOfTwoActivationsReadsBothInTheirTiles) {
    // a b with both operands computed (inputs here): the stationary b lies in T(8,128) tiles
    // too, K rows before N (the planner streams a's 1024 rows past b's 2 x 2 tiles, one column
    // panel per MXU, rather than b's 256 columns past a's 2 x 8).
    const Shape as{DType::F32, {1024, 256}}, bs{DType::F32, {256, 256}};
    expect_bit_exact({{"a", as, {randoms(1024 * 256, 41)}}, {"b", bs, {randoms(256 * 256, 42)}}},
                     [](Graph& g, const std::vector<ValueId>& v) {
                         return relu(g, matmul(g, v[0], v[1], false, false));
                     });
    Graph g;
    g.add_output(relu(g, matmul(g, g.input(as, "a"), g.input(bs, "b"), false, false)), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u);
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Rhs);
    EXPECT_EQ(s.inputs[1].layout.to_string(), "{1,0:T(8,128)}");
}

TEST(CompilerDevice, TwoLinearsAndAResidualAreOneProgramBitExact) {
    // x + fc2(t(fc1(x))) / 3 at HIGHEST precision on two replicas, t(z) = z tanh(0.8 z) + z:
    // two output fusions in one program, the first writing its result in the tiles the second
    // reads; the residual a Full side in the result's layout; scalars, mul, add, tanh and a
    // divide in the epilogues.
    const Shape xs{DType::F32, {32, 256}}, ws{DType::F32, {256, 256}}, bs{DType::F32, {256}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId z = linear(g, v[0], v[1], v[2], Precision::Highest);
        const ValueId k = broadcast(g, literal(g, 0.8), {32, 256}, {});
        const ValueId h = add(g, mul(g, z, tanh(g, mul(g, k, z))), z);
        const ValueId y = linear(g, h, v[3], v[4], Precision::Highest);
        const ValueId three = broadcast(g, literal(g, 3.0), {32, 256}, {});
        return add(g, div(g, y, three), v[0]);
    };
    const auto st = expect_bit_exact({{"x", xs, {randoms(32 * 256, 31), randoms(32 * 256, 32)}},
                                      {"w1", ws, {randoms(256 * 256, 33, -0.2f, 0.2f)}, true},
                                      {"b1", bs, {randoms(256, 34)}, true},
                                      {"w2", ws, {randoms(256 * 256, 35, -0.2f, 0.2f)}, true},
                                      {"b2", bs, {randoms(256, 36)}, true}},
                                     record, {0, 1});
    EXPECT_EQ(st.programs_generated, 1u);
    // What ran: two output fusions, each with its epilogue, the activation between them in
    // T(8,128) tiles.
    Graph g;
    std::vector<ValueId> v{g.input(xs, "x"), g.parameter(ws, "w1"), g.parameter(bs, "b1"),
                           g.parameter(ws, "w2"), g.parameter(bs, "b2")};
    g.add_output(record(g, v), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 2u) << s.to_string();
    EXPECT_EQ(s.fusions[0].kind, FusionKind::Output);
    EXPECT_EQ(s.fusions[1].kind, FusionKind::Output);
    EXPECT_EQ(s.fusions[0].results.at(0).layout.to_string(), "{1,0:T(8,128)}");
    EXPECT_NE(s.summary().find("divide"), std::string::npos) << s.summary();
}

TEST(CompilerDevice, AnAllReduceBetweenFusionsIsInTheStepsOneProgram) {
    // y = allreduce(2 x, 1/4) + x on four replicas: a loop fusion, the ring all-reduce of its
    // result in place (ring in replica order, the evaluator's order of additions), a second loop
    // fusion; then a second all-reduce, so the handshake counts on. One launch, bit-exact.
    const Shape xs{DType::F32, {64, 384}};
    std::vector<std::vector<float>> per_replica;
    for (uint32_t r = 0; r < 4; ++r) per_replica.push_back(randoms(64 * 384, 51 + r));
    const auto st =
        expect_bit_exact({{"x", xs, per_replica}},
                         [](Graph& g, const std::vector<ValueId>& v) {
                             const ValueId two = broadcast(g, literal(g, 2.0), {64, 384}, {});
                             const ValueId s = all_reduce(g, mul(g, v[0], two), 0.25);
                             const ValueId t = add(g, s, v[0]);
                             return all_reduce(g, exp(g, t), 1.0);
                         },
                         {0, 1, 2, 3});
    EXPECT_EQ(st.programs_generated, 1u);
}

TEST(CompilerDevice, AnAllReduceOnOneReplicaIsItsScaleAndOnTwoItsRing) {
    // One replica: a streaming copy times the scale. Two: next and prev are the same core, so
    // each handshake signals it twice.
    const Shape xs{DType::F32, {16, 256}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return all_reduce(g, exp(g, v[0]), 0.5);
    };
    expect_bit_exact({{"x", xs, {randoms(16 * 256, 61)}}}, record);
    expect_bit_exact({{"x", xs, {randoms(16 * 256, 62), randoms(16 * 256, 63)}}}, record, {2, 5});
}

TEST(CompilerDevice, FusionKindsNotYetGeneratedAreClearErrors) {
    TimingOnlyLazy t;
    LazyContext& ctx = t.ctx;
    // A dot with three batch dims (one batch of matrices is generated: device_dot_test.cpp;
    // two, attention's {B, H}: device_bdims_test.cpp): not yet generated, and said so.
    const Shape s{DType::F32, {2, 2, 2, 8, 128}};
    const LazyTensor a = ctx.input("a", s, {std::vector<float>(8192)});
    const LazyTensor b = ctx.input("b", s, {std::vector<float>(8192)});
    const LazyTensor y = ctx.wrap(dot(ctx.graph(), ctx.value(a), ctx.value(b),
                                      DotDims{.lhs_batch = {0, 1, 2},
                                              .rhs_batch = {0, 1, 2},
                                              .lhs_contracting = {4},
                                              .rhs_contracting = {4}}));
    try {
        ctx.mark_step();
        FAIL() << "expected a CompileError";
    } catch (const NotYetGenerated& e) {
        EXPECT_NE(std::string(e.what()).find("a dot with batch dims"), std::string::npos)
            << e.what();
    }
    (void)y;
}

}  // namespace
}  // namespace tpu::compiler
