// SPDX-License-Identifier: Apache-2.0
// Compiled steps on v6e-8's 256 x 256 MXUs (issue 27): the zoo's BERT block with every fusion on
// the device (dots whose activations lie in the compiler's 8 x 128 tiles, weights in the MXU's
// 256 x 256 ones, attention's head windows) and an MLP training step (weight gradients written
// in their parameters' 256 x 256 tiles), bit-exact with the host evaluator (K summed in passes
// of 256), race detector on (tests/driver/many_mxus_test.cpp runs compiled dot layouts on the
// cycle-stepped core).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "compiler_test_util.h"
#include "device_test_util.h"
#include "hw/board_config.h"
#include "tests/common/paths.h"

namespace tpu::compiler {
namespace {

using test::f32;
using test::randoms;
using test::same_bits;

hw::BoardConfig v6e(std::vector<std::string> sets = {}) {
    return hw::BoardConfig::load(tpu::test::source_dir() + "/configs/v6e-8.json", sets);
}

/// The zoo's encoder block (post-LN) on x [seq, hidden], as tests/compiler/device_bert_test.cpp
/// records it (trainer/module.cpp's TransformerBlock): attention over [1, H, S, d] with batch
/// dims {0, 1}, the heads merged back by transpose and reshape, GELU (tanh) between fc_1 and
/// fc_2. `p`: q, k, v, out (weight, bias each), ln_1, fc_1, fc_2, ln_2.
ValueId zoo_block(Graph& g, ValueId x, const std::vector<ValueId>& p, int64_t heads) {
    const int64_t seq = g.shape(x).dims[0], dim = g.shape(x).dims[1], d = dim / heads;
    const auto lin = [&](ValueId in, size_t i) { return linear(g, in, p[i], p[i + 1]); };
    const auto split = [&](ValueId t) {
        return transpose(g, reshape(g, t, {1, seq, heads, d}), {0, 2, 1, 3});
    };
    DotDims sd;
    sd.lhs_batch = sd.rhs_batch = {0, 1};
    sd.lhs_contracting = sd.rhs_contracting = {3};
    ValueId s = dot(g, split(lin(x, 0)), split(lin(x, 2)), sd);
    s = mul(g, s, full(g, double(1.0f / std::sqrt(float(d))), g.shape(s)));
    DotDims od;
    od.lhs_batch = od.rhs_batch = {0, 1};
    od.lhs_contracting = {3};
    od.rhs_contracting = {2};
    const ValueId o = dot(g, softmax(g, s, 3), split(lin(x, 4)), od);
    const ValueId merged = reshape(g, transpose(g, o, {0, 2, 1, 3}), {seq, dim});
    const ValueId h = layer_norm(g, add(g, x, lin(merged, 6)), p[8], p[9], 1e-5).y;
    const ValueId a = gelu(g, lin(h, 10), true);
    return layer_norm(g, add(g, h, lin(a, 12)), p[14], p[15], 1e-5).y;
}

std::vector<test::Leaf> bert_leaves(int64_t seq, int64_t dim, int64_t ffn) {
    const float ws = 1.0f / std::sqrt(float(dim)), fs = 1.0f / std::sqrt(float(ffn));
    std::vector<test::Leaf> l;
    uint32_t seed = 300;
    const auto param = [&](std::string name, std::vector<int64_t> dims, float lo, float hi) {
        size_t n = 1;
        for (int64_t e : dims) n *= size_t(e);
        l.push_back({std::move(name), f32(std::move(dims)), {randoms(n, seed++, lo, hi)}, true});
    };
    l.push_back({"x", f32({seq, dim}), {randoms(size_t(seq * dim), 299, -1.0f, 1.0f)}, false});
    for (const char* n : {"q", "k", "v", "out"}) {
        param(fmt::format("{}.weight", n), {dim, dim}, -ws, ws);
        param(fmt::format("{}.bias", n), {dim}, -ws, ws);
    }
    param("ln_1.weight", {dim}, 0.5f, 1.5f);
    param("ln_1.bias", {dim}, -1.0f, 1.0f);
    param("fc_1.weight", {ffn, dim}, -ws, ws);
    param("fc_1.bias", {ffn}, -ws, ws);
    param("fc_2.weight", {dim, ffn}, -fs, fs);
    param("fc_2.bias", {dim}, -fs, fs);
    param("ln_2.weight", {dim}, 0.5f, 1.5f);
    param("ln_2.bias", {dim}, -1.0f, 1.0f);
    return l;
}

/// The block on v6e-8's core 0 (race detector on, no host fallback) and on the evaluator with
/// the board's MXU size: equal bits, one launch.
void expect_block_bit_exact(int64_t seq, int64_t dim, int64_t heads, int64_t ffn) {
    const hw::BoardConfig cfg = v6e({"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    EvalOptions eo;
    eo.mxu_rows = cfg.core.mxu_rows;
    HostBackend host(1, eo);
    CompileOptions co;
    co.board = cfg;
    const auto leaves = bert_leaves(seq, dim, ffn);
    const test::Record record = [&](Graph& g, const std::vector<ValueId>& v) {
        return zoo_block(g, v[0], {v.begin() + 1, v.end()}, heads);
    };
    const uint64_t launches = dev->metrics().launches;
    const auto got = test::run(device, leaves, record, co);
    EXPECT_EQ(dev->metrics().launches - launches, 1u) << "one launch per step";
    EXPECT_EQ(device.stats().host_fusions, 0u);
    const auto want = test::run(host, leaves, record, co);
    EXPECT_TRUE(same_bits(got[0], want[0]))
        << "max rel error " << test::max_rel_error(got[0], want[0]);
    std::cout << fmt::format("[v6e bert {}x{} {} heads ffn {}] {} cycles\n", seq, dim, heads, ffn,
                             device.stats().last_step_cycles);
}

/// An MLP training step as tests/compiler/device_dot_test.cpp records it: linear + ReLU,
/// linear, softmax cross-entropy, the backward by hand, SGD with momentum. `l`: x, onehot, lr,
/// then w1, b1, w2, b2 and a momentum for each. Returns the loss, new parameters and momenta.
std::vector<ValueId> record_mlp_step(Graph& g, const std::vector<ValueId>& l) {
    const ValueId x = l[0], y = l[1], lr = l[2];
    const int64_t B = g.shape(x).dims[0];
    const ValueId pre = linear(g, x, l[3], l[4]);
    const ValueId h = relu(g, pre);
    const ValueId logits = linear(g, h, l[5], l[6]);
    std::vector<ValueId> out{cross_entropy(g, logits, y)};
    const ValueId dl =
        div(g, sub(g, softmax(g, logits, 1), y), full(g, double(B), g.shape(logits)));
    const ValueId dh = matmul(g, dl, l[5], false, false);
    const ValueId zero = full(g, 0.0, g.shape(pre));
    const ValueId dpre = select(g, compare(g, pre, zero, Comparison::Gt), dh, zero);
    const std::vector<ValueId> grads{
        matmul(g, dpre, x, true, false), reduce(g, dpre, {0}, Reducer::Sum),
        matmul(g, dl, h, true, false), reduce(g, dl, {0}, Reducer::Sum)};
    std::vector<ValueId> vs;
    for (size_t i = 0; i < 4; ++i) {
        const auto r = sgd_momentum(g, l[3 + i], all_reduce(g, grads[i], 1.0), l[7 + i], lr, 0.9);
        out.push_back(r.w);
        vs.push_back(r.v);
    }
    out.insert(out.end(), vs.begin(), vs.end());
    return out;
}

/// Two MLP training steps (B x I -> H -> C) on `backend`: each step's loss, then the
/// parameters and momenta after them.
std::vector<std::vector<float>> run_mlp(Backend& backend, const CompileOptions& co, int64_t B,
                                        int64_t I, int64_t H, int64_t C) {
    LazyContext ctx(backend, co);
    const std::vector<Shape> shapes = {f32({H, I}), f32({H}), f32({C, H}), f32({C})};
    std::vector<LazyTensor> params, momenta;
    for (size_t i = 0; i < 4; ++i) {
        const size_t n = size_t(shapes[i].elements());
        params.push_back(ctx.parameter(fmt::format("p{}", i), shapes[i],
                                       {randoms(n, 90 + uint32_t(i), -0.1f, 0.1f)}));
        momenta.push_back(
            ctx.parameter(fmt::format("m{}", i), shapes[i], {std::vector<float>(n, 0.0f)}));
    }
    std::vector<std::vector<float>> got;
    for (uint32_t step = 0; step < 2; ++step) {
        std::vector<float> y(size_t(B * C), 0.0f);
        for (int64_t b = 0; b < B; ++b) y[size_t(b * C + (b * 7 + step) % C)] = 1.0f;
        std::vector<ValueId> l{
            ctx.value(ctx.input("x", f32({B, I}), {randoms(size_t(B * I), 100 + step * 7)})),
            ctx.value(ctx.input("onehot", f32({B, C}), {y})),
            ctx.value(ctx.input("lr", f32({}), {{0.05f}}))};
        for (const auto* ts : {&params, &momenta})
            for (const LazyTensor& t : *ts) l.push_back(ctx.value(t));
        const auto out = record_mlp_step(ctx.graph(), l);
        const LazyTensor loss = ctx.wrap(out[0], "loss");
        for (size_t i = 0; i < 4; ++i) {
            ctx.assign(params[i], out[1 + i]);
            ctx.assign(momenta[i], out[5 + i]);
        }
        ctx.mark_step();
        got.push_back(ctx.to_host(loss, 0));
    }
    for (size_t i = 0; i < 4; ++i) {
        got.push_back(ctx.to_host(params[i], 0));
        got.push_back(ctx.to_host(momenta[i], 0));
    }
    return got;
}

TEST(CompilerMxu256, AnMlpTrainingStepIsBitExactOnV6e) {
    // 128 x 784 -> 384 -> 10: the weight gradients dW = dY^T X written in their parameters'
    // 256 x 256 tiles stream dY^T from transposed 8 x 128 tiles in blocks of two tile columns
    // (H = 384: a block of 256 rows and a short one of 128); K = 784 and N = 10 pad their tiles.
    const hw::BoardConfig cfg = v6e({"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    EvalOptions eo;
    eo.mxu_rows = cfg.core.mxu_rows;
    HostBackend host(1, eo);
    CompileOptions co;
    co.board = cfg;
    const auto got = run_mlp(device, co, 128, 784, 384, 10);
    EXPECT_EQ(device.stats().host_fusions, 0u);
    const auto want = run_mlp(host, co, 128, 784, 384, 10);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(same_bits(got[i], want[i]))
            << "result " << i << ": max rel error " << test::max_rel_error(got[i], want[i]);
}

TEST(CompilerMxu256, TheZooBlockIsBitExactOnV6e) {
    // Heads of 128 lanes (a whole tile column of the projection) and of 64 (two per tile):
    // the attention's dots read windows of the [seq, hidden] projections, K = d below the
    // array's 256 rows.
    expect_block_bit_exact(128, 256, 2, 512);
    expect_block_bit_exact(128, 256, 4, 512);
}

}  // namespace
}  // namespace tpu::compiler
