// SPDX-License-Identifier: Apache-2.0
// Dot output fusions of training steps and attention (compiler/README.md, "Output fusions of a
// dot"): bit-exact with the host evaluator on the device, race detector on, one launch; and the
// probe of which dot fusions of an MLP training step and a BERT block still fall back.
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "compiler_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

std::vector<float> randoms(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

using Record = std::function<ValueId(Graph&, const std::vector<ValueId>&)>;

struct Leaf {
    std::string name;
    Shape shape;
    std::vector<std::vector<float>> values;  // one per replica, or one for all
    bool parameter = false;
};

/// Runs `record` on `leaves` through a LazyContext on `backend`; returns every replica's result.
std::vector<std::vector<float>> run(Backend& backend, const std::vector<Leaf>& leaves,
                                    const Record& record, CompileOptions co = {}) {
    LazyContext ctx(backend, co);
    std::vector<LazyTensor> ts;
    std::vector<ValueId> vs;
    for (const Leaf& l : leaves)
        ts.push_back(l.parameter ? ctx.parameter(l.name, l.shape, l.values)
                                 : ctx.input(l.name, l.shape, l.values));
    for (const LazyTensor& t : ts) vs.push_back(ctx.value(t));
    const LazyTensor y = ctx.wrap(record(ctx.graph(), vs), "y");
    ctx.mark_step();
    std::vector<std::vector<float>> out;
    for (size_t r = 0; r < backend.replicas(); ++r) out.push_back(ctx.to_host(y, r));
    return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) &&
            !(std::isnan(a[i]) && std::isnan(b[i])))
            return false;
    return true;
}

/// Runs on the device (race detector on) and on the host evaluator; expects equal bits and
/// one launch. Returns the backend's stats.
DeviceBackendStats expect_bit_exact(const std::vector<Leaf>& leaves, const Record& record,
                                    std::vector<uint32_t> cores = {0}) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, cores, cg);
    const uint64_t launches = dev->metrics().launches;
    const auto got = run(device, leaves, record);
    EXPECT_EQ(dev->metrics().launches - launches, 1u) << "one launch per step";
    HostBackend host(cores.size());
    const auto want = run(host, leaves, record);
    for (size_t r = 0; r < cores.size(); ++r)
        EXPECT_TRUE(same_bits(got[r], want[r])) << "replica " << r;
    return device.stats();
}

/// A data-parallel MLP training step: linear + ReLU, linear, softmax cross-entropy, the backward
/// recorded by hand, gradients averaged over replicas, SGD with momentum in place.
Graph mlp_train_step(int64_t B, int64_t I, int64_t H, int64_t C, size_t replicas) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {B, I}}, "x");
    const ValueId y = g.input(Shape{DType::F32, {B, C}}, "onehot");
    const ValueId lr = g.input(Shape{DType::F32, {}}, "lr");
    const ValueId w1 = g.parameter(Shape{DType::F32, {H, I}}, "fc1.weight");
    const ValueId b1 = g.parameter(Shape{DType::F32, {H}}, "fc1.bias");
    const ValueId w2 = g.parameter(Shape{DType::F32, {C, H}}, "fc2.weight");
    const ValueId b2 = g.parameter(Shape{DType::F32, {C}}, "fc2.bias");
    std::vector<ValueId> bufs;
    for (ValueId p : {w1, b1, w2, b2}) bufs.push_back(g.parameter(g.shape(p), "momentum"));
    const ValueId pre = linear(g, x, w1, b1);
    const ValueId h = relu(g, pre);
    const ValueId logits = linear(g, h, w2, b2);
    g.add_output(cross_entropy(g, logits, y), "loss");
    const ValueId dl =
        div(g, sub(g, softmax(g, logits, 1), y), full(g, double(B), g.shape(logits)));
    const ValueId dw2 = matmul(g, dl, h, true, false);
    const ValueId db2 = reduce(g, dl, {0}, Reducer::Sum);
    const ValueId dh = matmul(g, dl, w2, false, false);
    const ValueId zero = full(g, 0.0, g.shape(pre));
    const ValueId dpre = select(g, compare(g, pre, zero, Comparison::Gt), dh, zero);
    const ValueId dw1 = matmul(g, dpre, x, true, false);
    const ValueId db1 = reduce(g, dpre, {0}, Reducer::Sum);
    const std::vector<ValueId> params{w1, b1, w2, b2}, grads{dw1, db1, dw2, db2};
    for (size_t i = 0; i < params.size(); ++i) {
        const ValueId gm = all_reduce(g, grads[i], 1.0 / double(replicas));
        const auto r = sgd_momentum(g, params[i], gm, bufs[i], lr, 0.9);
        g.add_output(r.w, "w", int64_t(i));
        g.add_output(r.v, "v", int64_t(4 + i));
    }
    return g;
}

/// The fusions of `step` code generation sends to the host (CodegenOptions::host_fallback),
/// each "<kind> <reason>", printed; returns how many are output (dot) fusions.
size_t probe(const std::string& what, const CompiledStep& step, size_t replicas) {
    CodegenOptions cg;
    cg.board = hw::BoardConfig::load("", {});
    cg.replicas = uint32_t(replicas);
    cg.host_fallback = true;
    const StepProgram p = generate_step(step, cg);
    size_t dots = 0, all = 0;
    for (const ProgramSegment& s : p.segments) {
        if (s.fallback.empty()) continue;
        const Fusion& f = step.fusions[size_t(s.host_fusion)];
        ++all;
        dots += f.kind == FusionKind::Output;
        std::cout << "[probe] " << what << ": " << fusion_kind_name(f.kind) << " " << s.fallback
                  << "\n";
    }
    std::cout << "[probe] " << what << ": " << all << " of " << step.fusions.size()
              << " fusions fall back, " << dots << " of them dot fusions\n";
    return dots;
}

TEST(CompilerDotProbe, TheDotsOfAnMlpStepAndABertBlock) {
    const CompiledStep mlp = compile(mlp_train_step(128, 784, 256, 10, 2));
    if (std::getenv("TPUSIM_PROBE_DUMP")) std::cout << mlp.to_string();
    probe("mlp step 128x784x256x10", mlp, 2);
    probe("mlp step 16x48x64x10", compile(mlp_train_step(16, 48, 64, 10, 2)), 2);
    const CompiledStep tiled = compile(mlp_train_step(128, 256, 256, 128, 2));
    if (std::getenv("TPUSIM_PROBE_DUMP")) std::cout << tiled.to_string();
    probe("mlp step 128x256x256x128", tiled, 2);
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {512, 768}}, "x");
    g.add_output(test::bert_block(g, x, 768, 12, 3072), "y");
    probe("bert block", compile(g), 1);
}

TEST(CompilerDotDevice, TheLhsStationaryReadsTiledOperandsAndWritesTiles) {
    // relu(x W^T + b) + r with x 256 x 256 and 1024 output features: the planner holds x and
    // streams W's 1024 rows (C^T = W x^T), so x lies transposed in T(8,128) tiles (K major),
    // W in its T(8,128) tiles with K minor, and C in T(8,128) tiles: the kernel writes each
    // transposed-back result tile as 8-row runs of whole tiles. Residual: a Full side read the
    // same way.
    const Shape xs{DType::F32, {256, 256}}, ws{DType::F32, {1024, 256}}, bs{DType::F32, {1024}},
        rs{DType::F32, {256, 1024}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return add(g, relu(g, linear(g, v[0], v[1], v[2])), v[3]);
    };
    const auto st = expect_bit_exact({{"x", xs, {randoms(256 * 256, 71)}},
                                      {"w", ws, {randoms(1024 * 256, 72)}, true},
                                      {"b", bs, {randoms(1024, 73)}, true},
                                      {"r", rs, {randoms(256 * 1024, 74)}}},
                                     record);
    EXPECT_EQ(st.programs_generated, 1u);
    Graph g;
    std::vector<ValueId> v{g.input(xs, "x"), g.parameter(ws, "w"), g.parameter(bs, "b"),
                           g.input(rs, "r")};
    g.add_output(record(g, v), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(s.inputs[0].layout.to_string(), "{0,1:T(8,128)}");
    EXPECT_EQ(s.parameters[0].layout.to_string(), "{1,0:T(8,128)}");
    EXPECT_EQ(s.fusions[0].results[0].layout.to_string(), "{1,0:T(8,128)}");
}

TEST(CompilerDotDevice, AnLhsStationaryDotWritesTheTransposedTilesTheNextOneHolds) {
    // fc2(relu(fc1(x))), both with the LHS stationary (ffn1 -> ffn2 of a BERT block): fc2 holds
    // h = relu(fc1(x)) as A^T, so fc1 writes C^T in T(8,128) tiles ({0,1:T(8,128)}): each
    // result tile, after its epilogue, is transposed back and stored as whole bands.
    const Shape xs{DType::F32, {256, 256}}, w1s{DType::F32, {1024, 256}},
        w2s{DType::F32, {1024, 1024}}, bs{DType::F32, {1024}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return linear(g, relu(g, linear(g, v[0], v[1], v[2])), v[3], v[4]);
    };
    expect_bit_exact({{"x", xs, {randoms(256 * 256, 81)}},
                      {"w1", w1s, {randoms(1024 * 256, 82, -0.2f, 0.2f)}, true},
                      {"b1", bs, {randoms(1024, 83)}, true},
                      {"w2", w2s, {randoms(1024 * 1024, 84, -0.2f, 0.2f)}, true},
                      {"b2", bs, {randoms(1024, 85)}, true}},
                     record);
    Graph g;
    std::vector<ValueId> v{g.input(xs, "x"), g.parameter(w1s, "w1"), g.parameter(bs, "b1"),
                           g.parameter(w2s, "w2"), g.parameter(bs, "b2")};
    g.add_output(record(g, v), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 2u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(s.fusions[1].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(s.fusions[0].results[0].layout.to_string(), "{0,1:T(8,128)}");
}

}  // namespace
}  // namespace tpu::compiler
