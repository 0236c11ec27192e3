// SPDX-License-Identifier: Apache-2.0
// The compiled all-reduce in its operand's buffer (compiler/README.md, "Collective fusions"):
// when nothing reads the operand after the all-reduce, buffer assignment gives the result the
// operand's buffer and the kernel reduces there with no copy; when a later fusion reads the
// operand, the result has a buffer of its own and the operand is copied into it first. Either
// way the device gives the evaluator's bits, on the ring (four cores of v3-8) and on the torus
// (all of v3-32), race detector on.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compiler/device_backend.h"
#include "device_test_util.h"
#include "tests/common/paths.h"

namespace tpu::compiler {
namespace {

using test::Leaf;
using test::randoms;
using test::Record;

/// A step's results on every replica and its compiled step.
struct Ran {
    std::vector<std::vector<float>> values;
    std::shared_ptr<const CompiledStep> step;
};

Ran run(Backend& backend, const Leaf& x, const Record& record, CompileOptions co = {}) {
    LazyContext ctx(backend, co);
    const LazyTensor t = ctx.input(x.name, x.shape, x.values);
    const LazyTensor y = ctx.wrap(record(ctx.graph(), {ctx.value(t)}), "y");
    ctx.mark_step();
    Ran r;
    for (size_t i = 0; i < backend.replicas(); ++i) r.values.push_back(ctx.to_host(y, i));
    r.step = ctx.last_step();
    return r;
}

/// The step's one collective fusion.
const Fusion& collective(const CompiledStep& s) {
    for (const Fusion& f : s.fusions)
        if (f.kind == FusionKind::Collective) return f;
    ADD_FAILURE() << "no collective fusion in\n" << s.to_string();
    return s.fusions.at(0);
}

/// Runs `record` on `cores` of `cfg` (race detector on) and on the evaluator with the device's
/// order of additions; expects the same bits and one launch. The evaluator runs the step
/// compiled without buffer reuse, every value in a buffer of its own, so a buffer shared when
/// it should not be changes the device's values and not the reference's. Returns the device's
/// step.
std::shared_ptr<const CompiledStep> expect_bit_exact(const hw::BoardConfig& cfg,
                                                     const std::vector<uint32_t>& cores,
                                                     const Record& record, uint32_t seed) {
    Leaf x{"x", test::f32({24, 128}), {}};
    for (size_t r = 0; r < cores.size(); ++r)
        x.values.push_back(randoms(24 * 128, seed + uint32_t(r), -4.0f, 4.0f));
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, cores, cg);
    const uint64_t launches = dev->metrics().launches;
    const Ran got = run(device, x, record);
    EXPECT_EQ(dev->metrics().launches - launches, 1u) << "one launch per step";
    HostBackend host(cores.size(), device_eval_options(cfg, cores));
    CompileOptions apart;
    apart.reuse_buffers = false;
    const Ran want = run(host, x, record, apart);
    EXPECT_EQ(want.step->memory.temp_bytes, want.step->memory.temp_unshared_bytes);
    for (size_t r = 0; r < cores.size(); ++r)
        EXPECT_TRUE(test::same_bits(got.values[r], want.values[r])) << "replica " << r;
    return got.step;
}

/// s = allreduce(exp(x)) / replicas; y = s + x: nothing reads exp(x) after the all-reduce.
ValueId operand_dies(Graph& g, const std::vector<ValueId>& v, double scale) {
    return add(g, all_reduce(g, exp(g, v[0]), scale), v[0]);
}

/// m = exp(x); y = allreduce(m) / replicas + m: the add reads m after the all-reduce (exp is
/// expensive, so the fusion pass does not recompute it in the add's fusion).
ValueId operand_read_later(Graph& g, const std::vector<ValueId>& v, double scale) {
    const ValueId m = exp(g, v[0]);
    return add(g, all_reduce(g, m, scale), m);
}

void expect_in_place_and_copy(const hw::BoardConfig& cfg, const std::vector<uint32_t>& cores) {
    const double scale = 1.0 / double(cores.size());
    {
        SCOPED_TRACE("the operand dies at the all-reduce");
        const auto st = expect_bit_exact(
            cfg, cores,
            [&](Graph& g, const std::vector<ValueId>& v) { return operand_dies(g, v, scale); },
            111);
        const Fusion& f = collective(*st);
        EXPECT_EQ(f.results[0].buffer, f.operands[0].buffer) << st->to_string();
        EXPECT_EQ(f.results[0].buffer.space, BufferRef::Space::Temp);
    }
    {
        SCOPED_TRACE("the operand is read after the all-reduce");
        const auto st = expect_bit_exact(
            cfg, cores,
            [&](Graph& g, const std::vector<ValueId>& v) {
                return operand_read_later(g, v, scale);
            },
            211);
        const Fusion& f = collective(*st);
        EXPECT_NE(f.results[0].buffer, f.operands[0].buffer) << st->to_string();
    }
}

TEST(CompilerDeviceAllReduceInPlace, TheRingReducesInTheDeadOperandsBufferAndCopiesALiveOne) {
    // Four cores of v3-8: not the whole board, so the ring in replica order.
    expect_in_place_and_copy(hw::BoardConfig::load("", {"sim.race_detector=true"}), {0, 1, 2, 3});
}

TEST(CompilerDeviceAllReduceInPlace, TheTorusReducesInTheDeadOperandsBufferAndCopiesALiveOne) {
    // All of v3-32 (8 x 4): the torus at every size (CompilerDeviceTorus).
    const auto cfg = hw::BoardConfig::load(
        fmt::format("{}/configs/v3-32.json", tpu::test::source_dir()), {"sim.race_detector=true"});
    std::vector<uint32_t> cores(cfg.cores());
    for (uint32_t i = 0; i < cores.size(); ++i) cores[i] = i;
    expect_in_place_and_copy(cfg, cores);
}

}  // namespace
}  // namespace tpu::compiler
