// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/evaluator.h"

namespace tpu::compiler::test {

/// Each fusion of a compiled step as "kind:op,op,..." (its distinct op kinds, sorted, without
/// literals and broadcasts), in execution order.
inline std::vector<std::string> fusions_of(const CompiledStep& s) {
    std::vector<std::string> out;
    for (const Fusion& f : s.fusions) {
        std::set<std::string> names;
        for (OpId id : f.ops) {
            const OpKind k = s.graph.op(id).kind;
            if (k != OpKind::Literal && k != OpKind::Broadcast)
                names.insert(std::string(op_name(k)));
        }
        out.push_back(fmt::format("{}:{}", fusion_kind_name(f.kind), fmt::join(names, ",")));
    }
    return out;
}

/// `n` values uniform in [-1, 1) from `seed` (24 random bits each: the same on every platform).
inline std::vector<float> random_values(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(rng() >> 8) * (2.0f / 16777216.0f) - 1.0f;
    return v;
}

/// Random bindings for every parameter and input of `g`, `replicas` replicas (different data
/// per replica). s32 leaves get indices in [0, 4).
inline Bindings random_bindings(const Graph& g, size_t replicas, uint32_t seed = 1) {
    Bindings b;
    b.parameters.resize(replicas);
    b.inputs.resize(replicas);
    for (size_t r = 0; r < replicas; ++r)
        for (OpKind k : {OpKind::Parameter, OpKind::Input})
            for (ValueId v : g.leaves(k)) {
                const Shape& s = g.shape(v);
                auto vals = random_values(s.elements(), seed++);
                if (s.dtype == DType::S32)
                    for (float& x : vals) x = std::floor((x + 1.0f) * 2.0f);
                (k == OpKind::Parameter ? b.parameters : b.inputs)[r].push_back(
                    HostArray::from_floats(s, vals));
            }
    return b;
}

/// Equal values element by element (NaN equals NaN; +0.0 equals -0.0, as XLA's x + 0 -> x
/// rewrite may turn one into the other), with the first difference in the message.
inline ::testing::AssertionResult same_bits(const HostArray& a, const HostArray& b) {
    if (!(a.shape == b.shape))
        return ::testing::AssertionFailure()
               << a.shape.to_string() << " vs " << b.shape.to_string();
    for (size_t i = 0; i < a.data.size(); ++i) {
        const double x = a.data[i], y = b.data[i];
        if (!(x == y || (std::isnan(x) && std::isnan(y))))
            return ::testing::AssertionFailure() << "element " << i << ": " << x << " vs " << y
                                                 << " (" << a.shape.to_string() << ")";
    }
    return ::testing::AssertionSuccess();
}

/// Largest |a - b| / max(1, |b|).
inline double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        e = std::max(e,
                     std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i]))));
    return e;
}

/// The transformer block of the validation rows (../shared/validation/README.md, "bert-block"):
/// PyTorchSim's encoder block on x [seq, hidden] with separate Q, K, V linears (bias), its
/// attention (scores = K Q^T / sqrt(d), softmax over dim -2, V^T P, the [heads, d, seq] result
/// viewed as [seq, hidden]), the output projection + bias + residual + LayerNorm, ffn1 + ReLU,
/// ffn2 + bias + residual + LayerNorm. Parameters in PyTorch's layouts (Linear weight [out, in]).
inline ValueId bert_block(Graph& g, ValueId x, int64_t hidden, int64_t heads, int64_t ffn) {
    const int64_t seq = g.shape(x).dims[0], d = hidden / heads;
    const Shape b{DType::F32, {hidden}};
    const auto lin = [&](const std::string& name, ValueId in, int64_t out_dim, int64_t in_dim) {
        const ScopeGuard s(g, name);
        const ValueId W = g.parameter(Shape{DType::F32, {out_dim, in_dim}}, name + ".weight");
        const ValueId B = g.parameter(Shape{DType::F32, {out_dim}}, name + ".bias");
        return linear(g, in, W, B);
    };
    const auto ln = [&](const std::string& name, ValueId in) {
        const ScopeGuard s(g, name);
        const ValueId gamma = g.parameter(b, name + ".weight");
        const ValueId beta = g.parameter(b, name + ".bias");
        return layer_norm(g, in, gamma, beta, 1e-5).y;
    };
    ValueId q, k, v;
    {
        const ScopeGuard s(g, "attn");
        q = lin("q", x, hidden, hidden);
        k = lin("k", x, hidden, hidden);
        v = lin("v", x, hidden, hidden);
    }
    ValueId a;
    {
        const ScopeGuard s(g, "attn.core");
        const auto heads_of = [&](ValueId t) {
            return transpose(g, reshape(g, t, {seq, heads, d}), {1, 0, 2});  // [heads, seq, d]
        };
        const ValueId qh = heads_of(q), kh = heads_of(k), vh = heads_of(v);
        DotDims sd;  // key @ query^T: [heads, seq(k), seq(q)]
        sd.lhs_batch = {0};
        sd.rhs_batch = {0};
        sd.lhs_contracting = {2};
        sd.rhs_contracting = {2};
        const ValueId scores = dot(g, kh, qh, sd);
        const ValueId scaled = div(g, scores, full(g, std::sqrt(double(d)), g.shape(scores)));
        const ValueId p = softmax(g, scaled, 1);
        DotDims od;  // value^T @ p: [heads, d, seq(q)]
        od.lhs_batch = {0};
        od.rhs_batch = {0};
        od.lhs_contracting = {1};
        od.rhs_contracting = {1};
        a = reshape(g, dot(g, vh, p, od), {seq, hidden});
    }
    ValueId h = lin("attn.out", a, hidden, hidden);
    {
        const ScopeGuard s(g, "attn.out");
        h = add(g, h, x);
    }
    h = ln("ln_1", h);
    ValueId f = lin("ffn1", h, ffn, hidden);
    {
        const ScopeGuard s(g, "ffn1");
        f = relu(g, f);
    }
    ValueId y = lin("ffn2", f, hidden, ffn);
    {
        const ScopeGuard s(g, "ffn2");
        y = add(g, y, h);
    }
    return ln("ln_2", y);
}

/// One data-parallel training step of a 2-layer MLP with softmax cross-entropy: the forward,
/// the backward recorded by hand, gradients averaged over replicas, SGD with momentum in place.
inline Graph mlp_train_step(size_t replicas) {
    const int64_t B = 16, I = 48, H = 64, C = 10;
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
    // d loss / d logits = (softmax - y) / B.
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

}  // namespace tpu::compiler::test
