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

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "compiler_test_util.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::expect_linears_of_one_input_bit_exact;
using test::randoms;
using test::Record;
using test::same_bits;

/// The leaves of an MLP training step: x, onehot, lr; fc1/fc2 weight and bias; a momentum
/// buffer per parameter.
struct MlpLeaves {
    ValueId x, y, lr;
    std::vector<ValueId> params, momenta;  ///< w1, b1, w2, b2 and theirs
};

/// A data-parallel MLP training step: linear + ReLU, linear, softmax cross-entropy, the backward
/// recorded by hand, gradients averaged over replicas, SGD with momentum. Returns the loss, the
/// new parameters and the new momenta.
std::vector<ValueId> record_mlp_step(Graph& g, const MlpLeaves& l, size_t replicas) {
    const int64_t B = g.shape(l.x).dims[0];
    const ValueId w1 = l.params[0], b1 = l.params[1], w2 = l.params[2], b2 = l.params[3];
    const ValueId pre = linear(g, l.x, w1, b1);
    const ValueId h = relu(g, pre);
    const ValueId logits = linear(g, h, w2, b2);
    std::vector<ValueId> out{cross_entropy(g, logits, l.y)};
    const ValueId dl =
        div(g, sub(g, softmax(g, logits, 1), l.y), full(g, double(B), g.shape(logits)));
    const ValueId dw2 = matmul(g, dl, h, true, false);
    const ValueId db2 = reduce(g, dl, {0}, Reducer::Sum);
    const ValueId dh = matmul(g, dl, w2, false, false);
    const ValueId zero = full(g, 0.0, g.shape(pre));
    const ValueId dpre = select(g, compare(g, pre, zero, Comparison::Gt), dh, zero);
    const ValueId dw1 = matmul(g, dpre, l.x, true, false);
    const ValueId db1 = reduce(g, dpre, {0}, Reducer::Sum);
    const std::vector<ValueId> grads{dw1, db1, dw2, db2};
    std::vector<ValueId> vs;
    for (size_t i = 0; i < l.params.size(); ++i) {
        const ValueId gm = all_reduce(g, grads[i], 1.0 / double(replicas));
        const auto r = sgd_momentum(g, l.params[i], gm, l.momenta[i], l.lr, 0.9);
        out.push_back(r.w);
        vs.push_back(r.v);
    }
    out.insert(out.end(), vs.begin(), vs.end());
    return out;
}

std::vector<Shape> mlp_param_shapes(int64_t I, int64_t H, int64_t C) {
    return {Shape{DType::F32, {H, I}}, Shape{DType::F32, {H}}, Shape{DType::F32, {C, H}},
            Shape{DType::F32, {C}}};
}

/// The step as a graph of its own (for compile and the probe).
Graph mlp_train_step(int64_t B, int64_t I, int64_t H, int64_t C, size_t replicas) {
    Graph g;
    MlpLeaves l;
    l.x = g.input(Shape{DType::F32, {B, I}}, "x");
    l.y = g.input(Shape{DType::F32, {B, C}}, "onehot");
    l.lr = g.input(Shape{DType::F32, {}}, "lr");
    const char* names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    const auto shapes = mlp_param_shapes(I, H, C);
    for (size_t i = 0; i < 4; ++i) l.params.push_back(g.parameter(shapes[i], names[i]));
    for (size_t i = 0; i < 4; ++i) l.momenta.push_back(g.parameter(shapes[i], "momentum"));
    const auto out = record_mlp_step(g, l, replicas);
    g.add_output(out[0], "loss");
    for (size_t i = 0; i < 4; ++i) {
        g.add_output(out[1 + i], "w", int64_t(i));
        g.add_output(out[5 + i], "v", int64_t(4 + i));
    }
    return g;
}

/// Runs two MLP training steps on `backend` through a LazyContext (the first compiles with
/// the parameters' layouts unassigned, the second with the layouts the first gave them);
/// returns every replica's loss of each step and the parameters and momenta after them.
std::vector<std::vector<float>> run_mlp(Backend& backend, int64_t B, int64_t I, int64_t H,
                                        int64_t C) {
    const size_t R = backend.replicas();
    LazyContext ctx(backend);
    const auto shapes = mlp_param_shapes(I, H, C);
    std::vector<LazyTensor> params, momenta;
    for (size_t i = 0; i < 4; ++i) {
        params.push_back(
            ctx.parameter(fmt::format("p{}", i), shapes[i],
                          {randoms(size_t(shapes[i].elements()), 90 + uint32_t(i), -0.1f, 0.1f)}));
        momenta.push_back(ctx.parameter(fmt::format("m{}", i), shapes[i],
                                        {std::vector<float>(size_t(shapes[i].elements()), 0.0f)}));
    }
    std::vector<std::vector<float>> got;
    for (uint32_t step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> xs, ys;
        for (size_t r = 0; r < R; ++r) {
            xs.push_back(randoms(size_t(B * I), 100 + step * 7 + uint32_t(r)));
            std::vector<float> y(size_t(B * C), 0.0f);
            for (int64_t b = 0; b < B; ++b) y[size_t(b * C + (b * 7 + step + r) % C)] = 1.0f;
            ys.push_back(y);
        }
        const LazyTensor x = ctx.input("x", Shape{DType::F32, {B, I}}, xs);
        const LazyTensor y = ctx.input("onehot", Shape{DType::F32, {B, C}}, ys);
        const LazyTensor lr = ctx.input("lr", Shape{DType::F32, {}}, {{0.05f}});
        MlpLeaves l{ctx.value(x), ctx.value(y), ctx.value(lr), {}, {}};
        for (size_t i = 0; i < 4; ++i) {
            l.params.push_back(ctx.value(params[i]));
            l.momenta.push_back(ctx.value(momenta[i]));
        }
        const auto out = record_mlp_step(ctx.graph(), l, R);
        const LazyTensor loss = ctx.wrap(out[0], "loss");
        for (size_t i = 0; i < 4; ++i) {
            ctx.assign(params[i], out[1 + i]);
            ctx.assign(momenta[i], out[5 + i]);
        }
        ctx.mark_step();
        for (size_t r = 0; r < R; ++r) got.push_back(ctx.to_host(loss, r));
    }
    for (size_t r = 0; r < R; ++r)
        for (size_t i = 0; i < 4; ++i) {
            got.push_back(ctx.to_host(params[i], r));
            got.push_back(ctx.to_host(momenta[i], r));
        }
    return got;
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
    // Dims of whole tiles: every dot generates (the weight gradients in their parameters'
    // layouts); was 2 of 5 before the transposed tiles.
    EXPECT_EQ(probe("mlp step 128x256x256x128", tiled, 2), 0u);
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {512, 768}}, "x");
    g.add_output(test::bert_block(g, x, 768, 12, 3072), "y");
    probe("bert block", compile(g), 1);
}

TEST(CompilerDotDevice, TheLhsStationaryReadsTiledOperandsAndWritesTiles) {
    // relu(x W^T + b) + r with x 256 x 256 and 1024 output features: the planner holds x and
    // streams W's 1024 rows (C^T = W x^T). x lies as it is, in T(8,128) tiles with K minor
    // (the kernel transposes each held tile in VMEM), W in its T(8,128) tiles with K minor
    // (W^T row-major: streamed as it is), and C in T(8,128) tiles: the kernel writes each
    // transposed-back result tile as 8-row runs of whole tiles. Residual: a Full side read the
    // same way. W is an input here: a streamed parameter lies in the MXU's tiles instead
    // (CompilerDotPerfDevice.AStreamedWeightLiesInMxuTilesBitExact).
    const Shape xs{DType::F32, {256, 256}}, ws{DType::F32, {1024, 256}}, bs{DType::F32, {1024}},
        rs{DType::F32, {256, 1024}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        return add(g, relu(g, linear(g, v[0], v[1], v[2])), v[3]);
    };
    const auto st = expect_bit_exact({{"x", xs, {randoms(256 * 256, 71)}},
                                      {"w", ws, {randoms(1024 * 256, 72)}},
                                      {"b", bs, {randoms(1024, 73)}, true},
                                      {"r", rs, {randoms(256 * 1024, 74)}}},
                                     record);
    EXPECT_EQ(st.programs_generated, 1u);
    Graph g;
    std::vector<ValueId> v{g.input(xs, "x"), g.input(ws, "w"), g.parameter(bs, "b"),
                           g.input(rs, "r")};
    g.add_output(record(g, v), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).stationary, Stationary::Lhs) << s.to_string();
    EXPECT_EQ(s.inputs[0].layout.to_string(), "{1,0:T(8,128)}");
    EXPECT_EQ(s.inputs[1].layout.to_string(), "{1,0:T(8,128)}");
    EXPECT_EQ(s.fusions[0].results[0].layout.to_string(), "{1,0:T(8,128)}");
}

TEST(CompilerDotDevice, AnLhsStationaryDotFeedsTheNextOneHoldingItsResult) {
    // fc2(relu(fc1(x))), both with the LHS stationary (ffn1 -> ffn2 of a BERT block): fc1
    // writes h transposed in the MXU's tiles ({0,1:T(128,128)}, C^T in MXU tiles) and fc2
    // holds h as it lies, each held tile one contiguous run (a computed matrix that only dots
    // read, written by a dot: layout_assignment.cpp's held_in_mxu_tiles; it was the default
    // T(8,128), whose held tiles are 16 runs of 4 KiB).
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
    EXPECT_EQ(s.fusions[0].results[0].layout.to_string(), "{0,1:T(128,128)}");
    // Both weights (K whole tiles, read only by dots) stream from their MXU tiles.
    EXPECT_EQ(s.parameters[0].layout.to_string(), "{0,1:T(128,128)}");
    EXPECT_EQ(s.parameters[2].layout.to_string(), "{0,1:T(128,128)}");
}

TEST(CompilerDotDevice, TheMergedQkvReadsItsThreeWeightsAsTheyLie) {
    // q, k, v = three linears of x (dot_merger: one dot of the concatenated weights, its result
    // sliced): the concatenation is never materialised; each part is a dot over its slice,
    // reading its own weight buffer, with its bias in its epilogue. Three outputs.
    expect_linears_of_one_input_bit_exact(256, 256, 512, 3, 91, 92, 95);
    const Shape xs{DType::F32, {256, 256}}, ws{DType::F32, {512, 256}}, bs{DType::F32, {512}};
    Graph g;
    const ValueId x = g.input(xs, "x");
    for (int i = 0; i < 3; ++i)
        g.add_output(linear(g, x, g.parameter(ws, "w"), g.parameter(bs, "b")), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.summary();
    EXPECT_NE(s.summary().find("dot+concatenate+slice+add"), std::string::npos) << s.summary();
}

/// [seq, heads x d] -> [heads, seq, d]: the head split of a projection, as bert_block does it.
ValueId heads_of(Graph& g, ValueId t, int64_t heads) {
    const Shape& s = g.shape(t);
    const int64_t seq = s.dims[0], d = s.dims[1] / heads;
    return transpose(g, reshape(g, t, {seq, heads, d}), {1, 0, 2});
}

TEST(CompilerDotDevice, AttentionScoresPerHeadReadTheProjectionsThroughTheHeadSplit) {
    // K Q^T / sqrt(d) per head over [128, 4 x 64] projections: one dot per head, each reading
    // its 64 lanes of the projections' T(8,128) tiles (two heads per tile: the window starts
    // at lane 0 or 64), K streamed band by band, Q^T held (its tiles transposed in VMEM); the
    // divide in each head's epilogue. No copy of a head is made.
    const Shape ps{DType::F32, {128, 256}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        DotDims sd;
        sd.lhs_batch = {0};
        sd.rhs_batch = {0};
        sd.lhs_contracting = {2};
        sd.rhs_contracting = {2};
        const ValueId scores = dot(g, heads_of(g, v[0], 4), heads_of(g, v[1], 4), sd);
        return div(g, scores, full(g, 8.0, g.shape(scores)));
    };
    expect_bit_exact({{"k", ps, {randoms(128 * 256, 101)}}, {"q", ps, {randoms(128 * 256, 102)}}},
                     record);
    Graph g;
    g.add_output(record(g, {g.input(ps, "k"), g.input(ps, "q")}), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 1u) << s.to_string();
    EXPECT_EQ(s.fusions[0].dots.at(0).batch, 4);
}

TEST(CompilerDotDevice, AttentionValuesPerHeadReadVTransposedThroughTheHeadSplit) {
    // V^T P per head ([4, 64, 128]): V's head window streamed transposed (a tile column per
    // block, its rows from the window's lane), P one [128, 128] matrix per head.
    const Shape vs{DType::F32, {128, 256}}, ps{DType::F32, {4, 128, 128}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        DotDims od;
        od.lhs_batch = {0};
        od.rhs_batch = {0};
        od.lhs_contracting = {1};
        od.rhs_contracting = {1};
        return dot(g, heads_of(g, v[0], 4), v[1], od);
    };
    expect_bit_exact(
        {{"v", vs, {randoms(128 * 256, 103)}}, {"p", ps, {randoms(4 * 128 * 128, 104, 0, 1)}}},
        record);
}

TEST(CompilerDotDevice, TheOutProjectionReadsTheHeadsThroughTheirView) {
    // PyTorchSim's attention: V^T P per head ([4, 64, 128]) viewed as [128, 256] (a reshape
    // that merges dims), then the out-projection with its bias and the residual. Layout
    // assignment lays the heads' array untiled row-major, so the view is the same bytes: the
    // batched dot writes each head's 64 x 128 matrix row-major, the out-projection reads the
    // view as a row-major A. One launch, two output fusions.
    const Shape vs{DType::F32, {128, 256}}, ps{DType::F32, {4, 128, 128}},
        ws{DType::F32, {256, 256}}, bs{DType::F32, {256}};
    const Record record = [](Graph& g, const std::vector<ValueId>& v) {
        DotDims od;
        od.lhs_batch = {0};
        od.rhs_batch = {0};
        od.lhs_contracting = {1};
        od.rhs_contracting = {1};
        const ValueId a = reshape(g, dot(g, heads_of(g, v[0], 4), v[1], od), {128, 256});
        return add(g, linear(g, a, v[2], v[3]), v[0]);
    };
    expect_bit_exact({{"v", vs, {randoms(128 * 256, 105)}},
                      {"p", ps, {randoms(4 * 128 * 128, 106, 0, 1)}},
                      {"w", ws, {randoms(256 * 256, 107, -0.2f, 0.2f)}, true},
                      {"b", bs, {randoms(256, 108)}, true}},
                     record);
    Graph g;
    g.add_output(
        record(g, {g.input(vs, "v"), g.input(ps, "p"), g.parameter(ws, "w"), g.parameter(bs, "b")}),
        "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 2u) << s.to_string();
    EXPECT_EQ(s.fusions[0].results.at(0).layout.to_string(), "{2,1,0}");
}

/// Two MLP training steps on the device (2 replicas, race detector on, host fallback for what
/// the streaming side does not generate yet) and on the evaluator: every loss, parameter and
/// momentum equal, and no dot fusion among the fallbacks.
void expect_mlp_dots_on_device(int64_t B, int64_t I, int64_t H, int64_t C) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.replicas = 2;
    cg.host_fallback = true;
    DeviceBackend device(*dev, {0, 1}, cg);
    HostBackend host(2);
    const auto got = run_mlp(device, B, I, H, C);
    const auto want = run_mlp(host, B, I, H, C);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << i;
    const CompiledStep step = compile(mlp_train_step(B, I, H, C, 2));
    for (const auto& [why, n] : device.stats().fallbacks) {
        std::cout << "[fallback] " << n << "x " << why << "\n";
        const size_t i = std::stoul(why.substr(why.find('.') + 1));
        ASSERT_LT(i, step.fusions.size()) << why;
        EXPECT_NE(step.fusions[i].kind, FusionKind::Output) << why;
    }
    EXPECT_EQ(device.stats().executions, 2u);
    std::cout << "[mlp step " << B << "x" << I << "x" << H << "x" << C << "] launches "
              << device.stats().launches << ", host fusions " << device.stats().host_fusions
              << ", last step " << device.stats().last_step_cycles << " cycles\n";
}

TEST(CompilerDotDevice, EveryDotOfAnMlpTrainingStepRunsOnTheDeviceBitExact) {
    // 128 x 256 -> 256 -> 128 classes: forward dots; dX = dY W reading the weight in its
    // {0,1:T(128,128)} tiles; dW = dY^T X streaming dY as it lies (transposed tiles) and
    // writing the parameter's layout, which the all-reduce and the SGD update (momentum too)
    // share.
    expect_mlp_dots_on_device(128, 256, 256, 128);
}

TEST(CompilerDotDevice, PaddedDimsOfAnMlpTrainingStepAreBitExact) {
    // 784 inputs and 10 classes (MNIST's shapes): K = 784 and N = 10 pad their tiles; the
    // kernel reads a padded K's last lanes band by band, writes a narrow last panel band by
    // band, and leaves garbage only in padding.
    expect_mlp_dots_on_device(128, 784, 256, 10);
}

}  // namespace
}  // namespace tpu::compiler
