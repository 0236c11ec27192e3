// SPDX-License-Identifier: Apache-2.0
// Loop and input fusions of real steps on the device (compiler/README.md, "Loop and input
// fusions"): reductions over major dims, padded tiles, elementwise ops without a VPU
// instruction; each bit-exact with the host evaluator, race detector on, one launch.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "compiler_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::random_bindings;

/// Runs graph `g` on `replicas` cores (race detector on) and on the host evaluator with the
/// same random data; expects every output bit-exact and returns the device backend's stats.
/// With `host_fallback`, fusions not generated yet run on the host (the probe).
DeviceBackendStats run_on_both(const Graph& g, size_t replicas, bool host_fallback = false,
                               uint32_t seed = 1) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.replicas = uint32_t(replicas);
    cg.host_fallback = host_fallback;
    std::vector<uint32_t> cores;
    for (size_t r = 0; r < replicas; ++r) cores.push_back(uint32_t(r));
    DeviceBackend device(*dev, cores, cg);
    HostBackend host(replicas);
    CompileOptions co;
    co.board = cfg;
    const CompiledStep step = compile(g, co);
    const Bindings b = random_bindings(g, replicas, seed);
    const auto upload = [&](Backend& be, const std::vector<std::vector<HostArray>>& per) {
        std::vector<DataPtr> out;
        if (per.empty()) return out;
        for (size_t i = 0; i < per[0].size(); ++i) {
            std::vector<std::vector<float>> vals;
            for (size_t r = 0; r < replicas; ++r)
                vals.emplace_back(per[r][i].data.begin(), per[r][i].data.end());
            out.push_back(be.upload(per[0][i].shape, vals));
        }
        return out;
    };
    const auto run = [&](Backend& be) {
        const auto outs = be.execute(step, upload(be, b.parameters), upload(be, b.inputs));
        std::vector<std::vector<std::vector<float>>> r(outs.size());
        for (size_t i = 0; i < outs.size(); ++i)
            for (size_t k = 0; k < replicas; ++k) r[i].push_back(be.download(outs[i], k));
        return r;
    };
    const auto got = run(device), want = run(host);
    for (size_t i = 0; i < want.size(); ++i)
        for (size_t k = 0; k < replicas; ++k) {
            const auto& x = got[i][k];
            const auto& y = want[i][k];
            size_t bad = x.size() == y.size() ? x.size() : 0;
            for (size_t e = 0; e < std::min(x.size(), y.size()); ++e)
                if (std::bit_cast<uint32_t>(x[e]) != std::bit_cast<uint32_t>(y[e]) &&
                    !(std::isnan(x[e]) && std::isnan(y[e])) && !(x[e] == 0 && y[e] == 0)) {
                    bad = e;
                    break;
                }
            EXPECT_EQ(bad, x.size())
                << "output " << i << " \"" << g.outputs()[i].name << "\" replica " << k
                << " element " << bad << ": " << (bad < x.size() ? x[bad] : 0) << " vs "
                << (bad < y.size() ? y[bad] : 0) << "\n"
                << step.to_string();
        }
    if (!host_fallback) {
        EXPECT_EQ(device.stats().launches, 1u) << "one launch per step";
    }
    return device.stats();
}

void print_fallbacks(const char* what, const DeviceBackendStats& st) {
    std::printf("[probe] %s: %llu fusions fall back to the host; %llu cycles, %llu launches\n",
                what, static_cast<unsigned long long>(st.fallback_fusions),
                static_cast<unsigned long long>(st.last_step_cycles),
                static_cast<unsigned long long>(st.launches));
    for (const auto& [why, n] : st.fallbacks) std::printf("[probe]   %s\n", why.c_str());
}

/// Saved activations of a transformer block's backward are inputs here: what the probe measures
/// is which fusions its ops form, not where the values come from.
Graph bert_block_backward(int64_t seq, int64_t hidden, int64_t heads, int64_t ffn, bool gelu_ffn) {
    Graph g;
    const int64_t d = hidden / heads;
    const Shape sh{DType::F32, {seq, hidden}}, hv{DType::F32, {hidden}};
    const ValueId dy = g.input(sh, "dy");
    // ln_2 backward (layer norm's own backward: dgamma, dbeta over the rows; dx per row).
    const ValueId y2 = g.input(sh, "ln_2.in");
    const ValueId gamma2 = g.parameter(hv, "ln_2.weight");
    const auto ln = layer_norm(g, y2, gamma2, g.parameter(hv, "ln_2.bias"), 1e-5);
    const auto rows = [&](ValueId v) {
        return broadcast(g, reshape(g, v, {seq}), {seq, hidden}, {0});
    };
    const ValueId xhat = mul(g, sub(g, y2, rows(ln.mean)), rows(ln.rstd));
    g.add_output(reduce(g, mul(g, dy, xhat), {0}, Reducer::Sum), "ln_2.dweight");
    g.add_output(reduce(g, dy, {0}, Reducer::Sum), "ln_2.dbias");
    const ValueId dxhat = mul(g, dy, broadcast(g, gamma2, {seq, hidden}, {1}));
    const ValueId inv_n = full(g, 1.0 / double(hidden), Shape{DType::F32, {seq}});
    const ValueId m1 = mul(g, reduce(g, dxhat, {1}, Reducer::Sum), inv_n);
    const ValueId m2 = mul(g, reduce(g, mul(g, dxhat, xhat), {1}, Reducer::Sum), inv_n);
    const ValueId dln = mul(g, broadcast(g, reshape(g, ln.rstd, {seq}), {seq, hidden}, {0}),
                            sub(g, sub(g, dxhat, broadcast(g, m1, {seq, hidden}, {0})),
                                mul(g, xhat, broadcast(g, m2, {seq, hidden}, {0}))));
    // ffn2 and ffn1 backward: bias gradients over the rows, the activation's gradient.
    const ValueId f = g.input(Shape{DType::F32, {seq, ffn}}, "ffn1.out");
    const ValueId w2 = g.parameter(Shape{DType::F32, {hidden, ffn}}, "ffn2.weight");
    g.add_output(matmul(g, dln, f, true, false), "ffn2.dweight");
    g.add_output(reduce(g, dln, {0}, Reducer::Sum), "ffn2.dbias");
    const ValueId df = matmul(g, dln, w2, false, false);
    const ValueId pre = g.input(Shape{DType::F32, {seq, ffn}}, "ffn1.pre");
    const ValueId dpre =
        gelu_ffn ? gelu_grad(g, df, pre, false)
                 : select(g, compare(g, pre, full(g, 0.0, g.shape(pre)), Comparison::Gt), df,
                          full(g, 0.0, g.shape(pre)));
    g.add_output(reduce(g, dpre, {0}, Reducer::Sum), "ffn1.dbias");
    g.add_output(matmul(g, dpre, g.input(sh, "ln_1.out"), true, false), "ffn1.dweight");
    // The attention's softmax over the keys (dim 1 of [heads, seq(k), seq(q)]) and its scale.
    const Shape ps{DType::F32, {heads, seq, seq}};
    const ValueId p = g.input(ps, "attn.p");
    const ValueId dp = g.input(ps, "attn.dp");
    const ValueId ds = div(g, softmax_grad(g, dp, p, 1), full(g, std::sqrt(double(d)), ps));
    g.add_output(ds, "attn.dscores");
    return g;
}

/// A CNN block's training pieces: convolution, batch norm in training mode (its statistics
/// over N, H, W), ReLU, global average pooling, and batch norm's gradient.
Graph cnn_block() {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {4, 8, 8, 16}}, "images");
    const ValueId w = g.parameter(Shape{DType::F32, {3, 3, 16, 32}}, "conv.weight");
    const Shape c{DType::F32, {32}};
    const ValueId scale = g.parameter(c, "bn.weight");
    const ValueId h = conv2d(g, x, w, 1, 1);
    const auto bn = batch_norm_training(g, h, scale, g.parameter(c, "bn.bias"), 1e-5, 3);
    g.add_output(global_avg_pool(g, relu(g, bn.y)), "pooled");
    const ValueId dy = g.input(Shape{DType::F32, {4, 8, 8, 32}}, "dy");
    const auto bg = batch_norm_grad(g, h, scale, bn.mean, bn.var, dy, 1e-5, 3);
    g.add_output(bg.dx, "dx");
    g.add_output(bg.dscale, "dscale");
    g.add_output(bg.doffset, "doffset");
    return g;
}

/// A BERT block's forward (bert_block).
Graph bert_forward(int64_t seq, int64_t hidden, int64_t heads, int64_t ffn) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {seq, hidden}}, "x");
    g.add_output(test::bert_block(g, x, hidden, heads, ffn), "y");
    return g;
}

TEST(CompilerDeviceStream, ABiasGradientSumsTheBatchInSublanePartials) {
    // db = sum over the batch of [B, N]: bands of 8 rows accumulate into one register of
    // partials per lane chunk, then each column's 8 partials (evaluator: the same order).
    // 40 x 300: five bands, three lane chunks of which the last is padded (300 = 2 x 128 + 44).
    Graph g;
    const ValueId dy = g.input(Shape{DType::F32, {40, 300}}, "dy");
    g.add_output(reduce(g, dy, {0}, Reducer::Sum), "db");
    g.add_output(reduce(g, mul(g, dy, dy), {0}, Reducer::Max), "max_sq");
    // Over both dims (a loss): the column results as above, then the row of them in chunks of
    // 128 lanes (128, 128, 44), then the three chunk results.
    g.add_output(reduce(g, dy, {0, 1}, Reducer::Sum), "total");
    g.add_output(reduce(g, dy, {0, 1}, Reducer::Max), "total_max");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, PaddedRowsAndLanesOfASmallBatch) {
    // 10 rows (a band and a padded one) x 10 classes (one padded lane chunk): the bias
    // gradient of the padded band adds its 2 rows of data only; a max over the classes reads
    // the padding lanes as -inf, a sum as +0.0.
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {10, 10}}, "x");
    g.add_output(reduce(g, x, {0}, Reducer::Sum), "db");
    g.add_output(reduce(g, x, {1}, Reducer::Max), "rowmax");
    g.add_output(reduce(g, exp(g, x), {1}, Reducer::Sum), "rowsum");
    g.add_output(add(g, x, broadcast(g, g.parameter(Shape{DType::F32, {10}}, "b"), {10, 10}, {1})),
                 "biased");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, BatchNormTrainingStatisticsOverNHWC) {
    // Sum[X] and Sum[X^2] over N, H, W of NHWC [2, 4, 8, 16] -> [16] in one pass (64 rows of
    // 16 padded channels), then batch norm's normalize with the statistics, and its gradient.
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {2, 4, 8, 16}}, "x");
    const Shape c{DType::F32, {16}};
    const auto bn =
        batch_norm_training(g, x, g.parameter(c, "bn.weight"), g.parameter(c, "bn.bias"), 1e-5, 3);
    g.add_output(bn.y, "y");
    g.add_output(bn.mean, "mean");
    g.add_output(bn.var, "var");
    // The gradient: its sums over N, H, W, and dx, whose loop fusion computes var + eps on the
    // [C] row once per slot, on the row's broadcast pattern.
    const auto bg = batch_norm_grad(g, x, g.parameter(c, "bn.weight2"), bn.mean, bn.var,
                                    g.input(Shape{DType::F32, {2, 4, 8, 16}}, "dy"), 1e-5, 3);
    g.add_output(bg.dx, "dx");
    g.add_output(bg.dscale, "dscale");
    g.add_output(bg.doffset, "doffset");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, CrossEntropyOverTenClasses) {
    // The MLP's loss: log-softmax over 10 classes (padded lanes) of a batch of 16.
    Graph g;
    const ValueId logits = g.input(Shape{DType::F32, {16, 10}}, "logits");
    const ValueId onehot = g.input(Shape{DType::F32, {16, 10}}, "onehot");
    g.add_output(cross_entropy(g, logits, onehot), "loss");
    g.add_output(softmax(g, logits, 1), "p");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, ElementwiseOpsWithoutAVpuInstruction) {
    // sqrt, abs, erf, an integer power and every comparison, as the device builds them from
    // its instructions (the evaluator follows: compiler/README.md, "Numerics"); the data has
    // zeros, negatives, and equal pairs so that every branch of every formula is taken.
    Graph g;
    const Shape s{DType::F32, {16, 256}};
    const ValueId a = g.input(s, "a"), b = g.input(s, "b");
    const ValueId a2 = mul(g, a, full(g, 4.0, s));
    ValueId y = add(g, sqrt(g, a2), abs(g, b));
    y = add(g, y, erf(g, a2));
    y = add(g, y, pow(g, a, full(g, 3.0, s)));
    y = add(g, y, mul(g, pow(g, b, full(g, 2.0, s)), pow(g, b, full(g, 1.0, s))));
    const ValueId r = max(g, a, full(g, 0.0, s));  // zeros: a == r wherever a <= 0
    for (Comparison c : {Comparison::Eq, Comparison::Ne, Comparison::Le, Comparison::Ge})
        y = select(g, compare(g, a, r, c), y, sub(g, y, b));
    g.add_output(y, "y");
    g.add_output(pow(g, b, full(g, 0.0, s)), "ones");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, GeluBothFormsAndTheirGradients) {
    // PyTorch/XLA's GELU: erf form (vpu_erf) and tanh form (x^3 as two products), forward and
    // backward, on a [32, 512] activation.
    Graph g;
    const Shape s{DType::F32, {32, 512}};
    const ValueId x = g.input(s, "x"), dy = g.input(s, "dy");
    g.add_output(gelu(g, x, false), "gelu");
    g.add_output(gelu(g, x, true), "gelu_tanh");
    g.add_output(gelu_grad(g, dy, x, false), "dgelu");
    g.add_output(gelu_grad(g, dy, x, true), "dgelu_tanh");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, TheErfFormulaIsWithinItsPublishedBound) {
    // A&S 7.1.26 is within 1.5e-7 of erf; fp32 roundings add a few 1e-7.
    double worst = 0;
    for (int i = -4000; i <= 4000; ++i) {
        const float x = float(i) * 1e-3f;
        worst = std::max(worst, std::abs(double(vpu_erf(x)) - std::erf(double(x))));
    }
    EXPECT_LT(worst, 1e-6);
    EXPECT_EQ(vpu_erf(std::numeric_limits<float>::infinity()), 1.0f);
    EXPECT_EQ(vpu_erf(-std::numeric_limits<float>::infinity()), -1.0f);
}

TEST(CompilerDeviceStream, AttentionSoftmaxOverTheKeysReducesAMiddleDim) {
    // PyTorchSim's block takes the softmax over dim -2 of [heads, keys, queries]: per head a
    // reduction over the rows, each head's row of results into the tiled [heads, queries]
    // result, and broadcast back per band. 3 heads (a padded band of results) x 16 keys x 200
    // queries (a padded lane chunk).
    Graph g;
    const ValueId s = g.input(Shape{DType::F32, {3, 16, 200}}, "scores");
    g.add_output(softmax(g, s, 1), "p");
    g.add_output(
        softmax_grad(g, g.input(Shape{DType::F32, {3, 16, 200}}, "dp"), softmax(g, s, 1), 1), "ds");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, ReductionResultsOfRankTwoLieInPaddedTiles) {
    // Softmax over the last dim of [3, 24, 200]: the max and the sum are [3, 24] arrays in
    // T(8,128) tiles (3 rows padded to 8, 24 lanes padded to 128); each band's 8 values are
    // found at its rows' place in the whole array, loaded or stored once.
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {3, 24, 200}}, "x");
    g.add_output(softmax(g, x, 2), "p");
    g.add_output(reduce(g, x, {2}, Reducer::Sum), "rowsum");
    run_on_both(g, 1);
}

TEST(CompilerDeviceStream, ProbeOfRealSteps) {
    // Which fusions of real steps are generated (compiler/README.md, "Loop and input
    // fusions"): with host fallback, every other fusion runs on the host and is counted.
    const auto mlp = run_on_both(test::mlp_train_step(2), 2, true);
    print_fallbacks("MLP training step (2 replicas)", mlp);
    const auto fwd = run_on_both(bert_forward(64, 128, 2, 256), 1, true);
    print_fallbacks("BERT block forward (64 x 128, 2 heads)", fwd);
    const auto bwd = run_on_both(bert_block_backward(64, 128, 2, 256, false), 1, true);
    print_fallbacks("BERT block backward (ReLU)", bwd);
    const auto bwdg = run_on_both(bert_block_backward(64, 128, 2, 256, true), 1, true);
    print_fallbacks("BERT block backward (GELU)", bwdg);
    const auto cnn = run_on_both(cnn_block(), 1, true);
    print_fallbacks("CNN block (conv, batch norm training and its gradient)", cnn);
}

}  // namespace
}  // namespace tpu::compiler
