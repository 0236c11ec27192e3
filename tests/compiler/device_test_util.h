// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the code generation tests share: leaves with values, a graph recorded on them and run
// through a LazyContext, and the check that the device gives the host evaluator's bits.

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "driver/device.h"
#include "hw/board_config.h"

namespace tpu::compiler::test {

/// An fp32 shape.
inline Shape f32(std::vector<int64_t> dims) {
    return Shape{DType::F32, std::move(dims)};
}

/// conv + BN (inference affine) + optional residual + ReLU: one layer of a ResNet block, as the
/// zoo's ResNets record it.
inline ValueId conv_bn(Graph& g, ValueId x, ValueId w, const ValueId* bn, int64_t stride,
                       int64_t pad, ValueId residual, bool act) {
    ValueId y = conv2d(g, x, w, stride, pad);
    y = batch_norm_inference(g, y, bn[0], bn[1], bn[2], bn[3], 1e-5, 3);
    if (residual != kNoValue) y = add(g, y, residual);
    return act ? relu(g, y) : y;
}

inline std::vector<float> randoms(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

/// Records a graph on the leaves' values; returns its result.
/// Core 0 of a timing-only default board (`sim.functional=false`), its backend and a
/// LazyContext over it: the set-up of tests that time lazily recorded steps.
struct TimingOnlyLazy {
    std::unique_ptr<driver::Device> dev =
        driver::Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
    DeviceBackend device{*dev, {0}, CodegenOptions{.board = dev->config()}};
    LazyContext ctx{device};
};

using Record = std::function<ValueId(Graph&, const std::vector<ValueId>&)>;

/// A parameter or input with its values.
struct Leaf {
    std::string name;
    Shape shape;
    std::vector<std::vector<float>> values;  // one per replica, or one for all
    bool parameter = false;
};

/// Runs `record` on `leaves` through a LazyContext on `backend`; returns every replica's result.
inline std::vector<std::vector<float>> run(Backend& backend, const std::vector<Leaf>& leaves,
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

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) &&
            !(std::isnan(a[i]) && std::isnan(b[i])))
            return false;
    return true;
}

/// Runs on the device (race detector on) and on the host evaluator; expects equal bits and
/// one launch (no host fallback). Returns the backend's stats. `sets`: more config overrides.
inline DeviceBackendStats expect_bit_exact(const std::vector<Leaf>& leaves, const Record& record,
                                           std::vector<uint32_t> cores = {0},
                                           std::vector<std::string> sets = {}) {
    sets.push_back("sim.race_detector=true");
    const auto cfg = hw::BoardConfig::load("", sets);
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, cores, cg);
    const uint64_t launches = dev->metrics().launches;
    const auto got = run(device, leaves, record);
    EXPECT_EQ(dev->metrics().launches - launches, 1u) << "one launch per step";
    HostBackend host(cores.size());
    const auto want = run(host, leaves, record);
    for (size_t r = 0; r < cores.size(); ++r) {
        EXPECT_TRUE(same_bits(got[r], want[r])) << "replica " << r;
        size_t bad = 0;
        for (size_t i = 0; i < got[r].size() && bad < 5; ++i)
            if (std::bit_cast<uint32_t>(got[r][i]) != std::bit_cast<uint32_t>(want[r][i]))
                ADD_FAILURE() << "value " << i << ": " << got[r][i] << " vs " << want[r][i]
                              << (++bad, "");
    }
    return device.stats();
}

/// The probe: runs `record` with host fallback on (race detector on) and returns the stats,
/// which list each fusion that fell back to the host and why (printed too); the results in
/// `out`, if given.
inline DeviceBackendStats probe(const std::vector<Leaf>& leaves, const Record& record,
                                std::vector<std::vector<float>>* out = nullptr) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.host_fallback = true;
    DeviceBackend device(*dev, {0}, cg);
    const auto got = run(device, leaves, record);
    if (out) *out = got;
    for (const auto& [why, n] : device.stats().fallbacks)
        std::cout << "  " << n << "x " << why << "\n";
    return device.stats();
}

/// `parts` linears of one input x [M, K] (weights [N, K] from seeds `w_seed` + i, biases [N]
/// from `b_seed` + i), which dot_merger merges into one dot of the concatenated weights, run on
/// the device (race detector on) and on the evaluator: the same bits for every part, one launch,
/// no host fallback. `sets`: more config overrides.
inline void expect_linears_of_one_input_bit_exact(int64_t M, int64_t K, int64_t N, uint32_t parts,
                                                  uint32_t x_seed, uint32_t w_seed, uint32_t b_seed,
                                                  std::vector<std::string> sets = {}) {
    const Shape xs{DType::F32, {M, K}}, ws{DType::F32, {N, K}}, bs{DType::F32, {N}};
    const auto run_parts = [&](Backend& backend) {
        LazyContext ctx(backend);
        const LazyTensor x = ctx.input("x", xs, {randoms(size_t(M * K), x_seed)});
        std::vector<LazyTensor> outs;
        for (uint32_t i = 0; i < parts; ++i) {
            const LazyTensor w = ctx.parameter("w" + std::to_string(i), ws,
                                               {randoms(size_t(N * K), w_seed + i, -0.2f, 0.2f)});
            const LazyTensor b =
                ctx.parameter("b" + std::to_string(i), bs, {randoms(size_t(N), b_seed + i)});
            outs.push_back(ctx.wrap(linear(ctx.graph(), ctx.value(x), ctx.value(w), ctx.value(b))));
        }
        ctx.mark_step();
        std::vector<std::vector<float>> got;
        for (const LazyTensor& t : outs) got.push_back(ctx.to_host(t));
        return got;
    };
    sets.push_back("sim.race_detector=true");
    const auto cfg = hw::BoardConfig::load("", sets);
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    HostBackend host(1);
    const auto got = run_parts(device), want = run_parts(host);
    ASSERT_EQ(got.size(), size_t(parts));
    for (size_t i = 0; i < parts; ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << "part " << i;
    EXPECT_EQ(device.stats().launches, 1u);
    EXPECT_EQ(device.stats().fallbacks.size(), 0u);
}

/// The zoo's attention (MultiheadAttention::record, as device_bert_test.cpp's zoo_block) on
/// [S, H d] projections: q k^T over [1, H, S, d] with batch dims {0, 1}, times 1/sqrt(d),
/// softmax, p v, the heads merged back to [S, H d] (a transpose and a reshape) and read by the
/// out projection `w` [H d, H d] with its bias `b`.
inline ValueId zoo_attention(Graph& g, ValueId q, ValueId k, ValueId v, ValueId w, ValueId b,
                             int64_t heads) {
    const int64_t seq = g.shape(q).dims[0], dim = g.shape(q).dims[1], d = dim / heads;
    const auto split = [&](ValueId t) {
        return transpose(g, reshape(g, t, {1, seq, heads, d}), {0, 2, 1, 3});
    };
    DotDims sd;
    sd.lhs_batch = sd.rhs_batch = {0, 1};
    sd.lhs_contracting = sd.rhs_contracting = {3};
    ValueId s = dot(g, split(q), split(k), sd);
    s = mul(g, s, full(g, double(1.0f / std::sqrt(float(d))), g.shape(s)));
    const ValueId p = softmax(g, s, 3);
    DotDims od;
    od.lhs_batch = od.rhs_batch = {0, 1};
    od.lhs_contracting = {3};
    od.rhs_contracting = {2};
    const ValueId o = dot(g, p, split(v), od);
    return linear(g, reshape(g, transpose(g, o, {0, 2, 1, 3}), {seq, dim}), w, b);
}

/// The zoo's attention over [seq, heads x d] projections with its out projection, on the
/// device (race detector on, one launch) and on the evaluator: the same bits. The inputs are
/// drawn from seeds `seed` + 1 .. 5.
inline void expect_zoo_attention_bit_exact(int64_t seq, int64_t heads, int64_t d, uint32_t seed) {
    const int64_t dim = heads * d;
    const Shape ps{DType::F32, {seq, dim}};
    const Record record = [heads](Graph& g, const std::vector<ValueId>& v) {
        return zoo_attention(g, v[0], v[1], v[2], v[3], v[4], heads);
    };
    const float ws = 1.0f / std::sqrt(float(dim));
    expect_bit_exact(
        {{"q", ps, {randoms(size_t(seq * dim), seed + 1)}},
         {"k", ps, {randoms(size_t(seq * dim), seed + 2)}},
         {"v", ps, {randoms(size_t(seq * dim), seed + 3)}},
         {"w",
          Shape{DType::F32, {dim, dim}},
          {randoms(size_t(dim * dim), seed + 4, -ws, ws)},
          true},
         {"b", Shape{DType::F32, {dim}}, {randoms(size_t(dim), seed + 5, -ws, ws)}, true}},
        record);
}

/// The zoo's attention over constant [S, heads d] projections, three steps on one core of a
/// timing-only board with fusion timing on (host fallback on, so a fusion not generated is
/// counted, not thrown): the steady-state step and the backend's statistics of it.
struct SteadyAttention {
    std::shared_ptr<const CompiledStep> step;
    DeviceBackendStats stats;
};
inline SteadyAttention steady_zoo_attention(int64_t S, int64_t heads, int64_t d,
                                            CompileOptions co = {}) {
    const auto cfg = hw::BoardConfig::load("", {"sim.functional=false"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.host_fallback = true;
    DeviceBackend device(*dev, {0}, cg);
    device.time_fusions(true);
    co.board = cfg;
    LazyContext ctx(device, co);
    const Shape ps{DType::F32, {S, heads * d}};
    const LazyTensor w = ctx.parameter("w", Shape{DType::F32, {heads * d, heads * d}},
                                       {std::vector<float>(size_t(heads * d * heads * d), 0.01f)});
    const LazyTensor b =
        ctx.parameter("b", Shape{DType::F32, {heads * d}}, {std::vector<float>(size_t(heads * d))});
    for (int step = 0; step < 3; ++step) {
        const std::vector<float> half(size_t(S * heads * d), 0.5f);
        const LazyTensor q = ctx.input("q", ps, {half});
        const LazyTensor k = ctx.input("k", ps, {half});
        const LazyTensor v = ctx.input("v", ps, {half});
        const LazyTensor out =
            ctx.wrap(zoo_attention(ctx.graph(), ctx.value(q), ctx.value(k), ctx.value(v),
                                   ctx.value(w), ctx.value(b), heads),
                     "o");
        ctx.mark_step();
        (void)out;
    }
    return {ctx.last_step(), device.stats()};
}

/// The steady-state cycles of the zoo attention's two batched dot fusions (scores, values) on
/// one core: steady_zoo_attention's third step (values not computed). Expects every fusion on
/// the device and three dots (the scores, the values, the out projection).
inline std::pair<uint64_t, uint64_t> zoo_attention_dot_cycles(int64_t S, int64_t heads,
                                                              int64_t d) {
    const auto [step, stats] = steady_zoo_attention(S, heads, d);
    const CompiledStep& s = *step;
    std::vector<uint64_t> dots;
    for (size_t i = 0; i < s.fusions.size(); ++i)
        if (s.fusions[i].hero != kNoOp && s.graph.op(s.fusions[i].hero).kind == OpKind::Dot)
            dots.push_back(stats.last_fusion_cycles.at(i));
    EXPECT_EQ(stats.fallback_fusions, 0u);
    EXPECT_EQ(dots.size(), 3u) << s.to_string();
    return {dots.at(0), dots.at(1)};
}

/// The steady-state cycles of BERT's ffn compiled as one step on one core, per dot fusion:
/// h = act(x W1^T + b1), y = h W2^T + b2 + x with act GELU (erf) or, with `relu`, ReLU (what
/// `tpusim validate`'s bert-block rows run); x [M, H] an input, W1 [F, H], W2 [H, F]
/// parameters. The third step's (the first converts the parameters to their kernels' layouts,
/// the second compiles again with the layouts they now carry). Values are not computed
/// (sim.functional=false): cycles only. Returns {fc_1, fc_2}.
inline std::pair<uint64_t, uint64_t> steady_ffn_cycles(int64_t M, int64_t H, int64_t F,
                                                       bool relu) {
    const auto cfg = hw::BoardConfig::load("", {"sim.functional=false"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    device.time_fusions(true);
    CompileOptions co;
    co.board = cfg;
    LazyContext ctx(device, co);
    const Shape xs{DType::F32, {M, H}}, w1s{DType::F32, {F, H}}, b1s{DType::F32, {F}},
        w2s{DType::F32, {H, F}}, b2s{DType::F32, {H}};
    const LazyTensor w1 = ctx.parameter("w1", w1s, {std::vector<float>(size_t(F * H), 0.01f)});
    const LazyTensor b1 = ctx.parameter("b1", b1s, {std::vector<float>(size_t(F), 0.0f)});
    const LazyTensor w2 = ctx.parameter("w2", w2s, {std::vector<float>(size_t(F * H), 0.01f)});
    const LazyTensor b2 = ctx.parameter("b2", b2s, {std::vector<float>(size_t(H), 0.0f)});
    for (int step = 0; step < 3; ++step) {
        const LazyTensor x = ctx.input("x", xs, {std::vector<float>(size_t(M * H), 1.0f)});
        Graph& g = ctx.graph();
        const ValueId pre = linear(g, ctx.value(x), ctx.value(w1), ctx.value(b1));
        const ValueId h = relu ? compiler::relu(g, pre) : gelu(g, pre, true);
        const ValueId y = add(g, linear(g, h, ctx.value(w2), ctx.value(b2)), ctx.value(x));
        const LazyTensor out = ctx.wrap(y, "y");
        ctx.mark_step();
        (void)out;
    }
    EXPECT_EQ(device.stats().launches, 3u);
    const CompiledStep& s = *ctx.last_step();
    std::vector<uint64_t> dots;
    for (size_t i = 0; i < s.fusions.size(); ++i)
        if (s.fusions[i].hero != kNoOp && s.graph.op(s.fusions[i].hero).kind == OpKind::Dot)
            dots.push_back(device.stats().last_fusion_cycles.at(i));
    EXPECT_EQ(dots.size(), 2u) << s.to_string();
    return {dots.at(0), dots.at(1)};
}

/// nn.Linear on [B, S, in] as aten records it: a view to [B S, in], the [out, in] weight
/// transposed into the dot, the bias added, a view back to [B, S, out].
inline ValueId aten_linear(Graph& g, ValueId x, ValueId w, ValueId b) {
    const auto& xs = g.shape(x).dims;
    const int64_t out = g.shape(w).dims[0];
    DotDims d;
    d.lhs_contracting = {1};
    d.rhs_contracting = {0};
    ValueId y = dot(g, reshape(g, x, {xs[0] * xs[1], xs[2]}), transpose(g, w, {1, 0}), d);
    y = add(g, y, broadcast(g, b, {xs[0] * xs[1], out}, {1}));
    return reshape(g, y, {xs[0], xs[1], out});
}

}  // namespace tpu::compiler::test
