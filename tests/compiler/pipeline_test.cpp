// SPDX-License-Identifier: Apache-2.0
// The whole pipeline: values preserved through every pass (byte buffers at the assigned
// offsets and layouts), the compile cache, and lazy recording cut at mark_step and host reads.
#include <gtest/gtest.h>

#include "compiler/lazy.h"
#include "compiler_test_util.h"

namespace tpu::compiler {
namespace {

using test::mlp_train_step;
using test::random_bindings;
using test::same_bits;

/// evaluate(decompose(g)) against the compiled step run fusion by fusion through its buffers:
/// every output and every parameter after the step (in-place updates) equal.
void expect_preserved(const Graph& g, size_t replicas, const CompileOptions& o = {}) {
    const CompiledStep s = compile(g, o);
    const Bindings b = random_bindings(g, replicas);
    const auto ref = evaluate(decompose(g), b);
    std::vector<std::vector<HostArray>> after;
    const auto got = evaluate_compiled(s, b, {}, &after);
    const auto params = g.leaves(OpKind::Parameter);
    for (size_t r = 0; r < replicas; ++r) {
        for (size_t i = 0; i < g.outputs().size(); ++i)
            EXPECT_TRUE(same_bits(got[r][i], ref[r][i]))
                << "replica " << r << " output " << i << " \"" << g.outputs()[i].name << "\"\n"
                << s.to_string();
        for (size_t p = 0; p < params.size(); ++p) {
            const HostArray* want = &b.parameters[r][p];
            for (size_t i = 0; i < g.outputs().size(); ++i)
                if (g.outputs()[i].updates_parameter == int64_t(p)) want = &ref[r][i];
            EXPECT_TRUE(same_bits(after[r][p], *want)) << "replica " << r << " parameter " << p;
        }
    }
}

TEST(CompilerPipeline, ATrainingStepKeepsItsValuesThroughEveryPass) {
    expect_preserved(mlp_train_step(2), 2);
    CompileOptions o;
    o.multi_output_fusion = false;
    o.may_duplicate = false;
    o.merge_dots = false;
    o.reuse_buffers = false;
    expect_preserved(mlp_train_step(2), 2, o);
}

TEST(CompilerPipeline, ATransformerBlockKeepsItsValuesThroughEveryPass) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {32, 64}}, "x");
    g.add_output(test::bert_block(g, x, 64, 4, 128), "y");
    expect_preserved(g, 1);
}

TEST(CompilerPipeline, ConvolutionsPoolingAndNormsKeepTheirValuesThroughEveryPass) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {2, 8, 8, 3}}, "images");
    const ValueId w = g.parameter(Shape{DType::F32, {3, 3, 3, 8}}, "conv1.weight");
    const Shape c8{DType::F32, {8}};
    const ValueId scale = g.parameter(c8, "bn.weight"), offset = g.parameter(c8, "bn.bias"),
                  mean = g.parameter(c8, "bn.running_mean"), var = g.input(c8, "bn.running_var");
    const ValueId var_pos = add(g, mul(g, var, var), full(g, 0.5, c8));
    ValueId h = conv2d(g, x, w, 1, 1);
    const ValueId hp = relu(g, batch_norm_inference(g, h, scale, offset, mean, var_pos, 1e-5, 3));
    h = pool(g, hp, PoolKind::Max, 2, 2, 0);  // [2, 4, 4, 8]
    const ValueId w2 = g.parameter(Shape{DType::F32, {3, 3, 8, 16}}, "conv2.weight");
    const ValueId h2 = conv2d(g, h, w2, 2, 1);  // [2, 2, 2, 16]
    g.add_output(global_avg_pool(g, h2), "pooled");
    g.add_output(pool(g, h, PoolKind::Avg, 3, 1, 1), "avg");
    // Backward pieces: convolution gradients, pooling gradients, batch norm in training mode.
    const ValueId dy = g.input(Shape{DType::F32, {2, 2, 2, 16}}, "dy");
    g.add_output(conv2d_filter_grad(g, h, dy, 3, 2, 1), "dw2");
    const ValueId dh = conv2d_input_grad(g, dy, w2, {2, 4, 4, 8}, 2, 1);
    g.add_output(max_pool_grad(g, hp, dh, 2, 2, 0), "dpool");
    g.add_output(avg_pool_grad(g, dh, {2, 8, 8, 8}, 2, 2, 0), "davg");
    const auto bn = batch_norm_training(g, h2, full(g, 1.0, Shape{DType::F32, {16}}),
                                        full(g, 0.0, Shape{DType::F32, {16}}), 1e-5, 3);
    g.add_output(bn.y, "bn");
    const auto bg =
        batch_norm_grad(g, h2, full(g, 1.5, Shape{DType::F32, {16}}), bn.mean, bn.var, dy, 1e-5, 3);
    g.add_output(bg.dx, "bn.dx");
    g.add_output(bg.dscale, "bn.dscale");
    expect_preserved(g, 1);
}

TEST(CompilerPipeline, EmbeddingsActivationsAndTheirGradientsKeepTheirValues) {
    Graph g;
    const ValueId tokens = g.input(Shape{DType::S32, {16}}, "tokens");
    const ValueId wte = g.parameter(Shape{DType::F32, {4, 32}}, "wte");
    const Shape d{DType::F32, {32}};
    const ValueId e = gather_rows(g, wte, tokens);  // [16, 32]
    const auto ln = layer_norm(g, e, g.parameter(d, "ln.weight"), g.parameter(d, "ln.bias"), 1e-5);
    const ValueId a = gelu(g, ln.y, false);
    const ValueId logits = matmul(g, a, wte, false, true);  // tied output projection
    const ValueId lsm = log_softmax(g, logits, 1);
    g.add_output(lsm, "logprobs");
    g.add_output(ln.rstd, "rstd");
    const ValueId dy = g.input(Shape{DType::F32, {16, 4}}, "dlogprobs");
    const ValueId dlogits = log_softmax_grad(g, dy, lsm, 1);
    const ValueId da = matmul(g, dlogits, wte, false, false);
    g.add_output(gelu_grad(g, da, ln.y, false), "dln");
    g.add_output(gelu_grad(g, da, ln.y, true), "dln_tanh");
    g.add_output(softmax_grad(g, dy, softmax(g, logits, 1), 1), "dsoftmax");
    g.add_output(scatter_add_rows(g, tokens, da, 4), "dwte");
    g.add_output(rng_uniform(g, g.input(Shape{DType::S32, {}}, "seed"), {3, 5}), "noise");
    expect_preserved(g, 1);
}

TEST(CompilerPipeline, TheCompileCacheHitsOnTheSameStructureOnly) {
    CompileCache cache;
    const auto step_graph = [](int64_t batch, const std::string& name, float c) {
        Graph g;
        const ValueId x = g.input(Shape{DType::F32, {batch, 32}}, name);
        const ValueId k =
            g.constant(Shape{DType::F32, {batch, 32}}, std::vector<float>(size_t(batch * 32), c));
        g.add_output(exp(g, add(g, x, k)));
        return g;
    };
    const auto a = cache.get(step_graph(8, "x", 1.0f));
    EXPECT_EQ(cache.misses(), 1u);
    EXPECT_GT(cache.compile_seconds(), 0.0);
    // Names and constant values are not structure: a hit, the same compiled step.
    EXPECT_EQ(cache.get(step_graph(8, "renamed", 2.0f)), a);
    EXPECT_EQ(cache.hits(), 1u);
    // A new shape compiles.
    EXPECT_NE(cache.get(step_graph(16, "x", 1.0f)), a);
    EXPECT_EQ(cache.misses(), 2u);
    EXPECT_EQ(cache.size(), 2u);
}

/// A least-squares step on data-parallel replicas: pred = x W^T, W -= lr mean_r(2/B err^T x).
struct Regression {
    static constexpr int64_t kB = 8, kI = 6, kO = 3;
    static ValueId step(Graph& g, ValueId w, ValueId v, ValueId x, ValueId t, ValueId lr,
                        size_t replicas, ValueId* loss, ValueId* v_out) {
        const ValueId err = sub(g, linear(g, x, w, kNoValue), t);
        *loss = reduce(g, mul(g, err, err), {0, 1}, Reducer::Sum);
        const ValueId grad = mul(g, matmul(g, err, x, true, false),
                                 full(g, 2.0 / double(kB), Shape{DType::F32, {kO, kI}}));
        const auto r = sgd_momentum(g, w, all_reduce(g, grad, 1.0 / double(replicas)), v, lr, 0.5);
        *v_out = r.v;
        return r.w;
    }
};

TEST(CompilerPipeline, LazyStepsCompileOnNewGraphsAndHitTheCacheAfter) {
    const size_t R = 2;
    HostBackend backend(R);
    LazyContext ctx(backend);
    const Shape ws{DType::F32, {Regression::kO, Regression::kI}};
    const Shape xs{DType::F32, {Regression::kB, Regression::kI}},
        ts{DType::F32, {Regression::kB, Regression::kO}};
    const auto w0 = test::random_values(ws.elements(), 5);
    LazyTensor w = ctx.parameter("w", ws, {w0});
    LazyTensor v = ctx.parameter("v", ws, {std::vector<float>(size_t(ws.elements()), 0.0f)});
    // The same steps on the evaluator, the parameters carried by hand.
    std::vector<HostArray> wr(R, HostArray::from_floats(ws, w0)), vr(R, HostArray::zeros(ws));
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> xv, tv;
        for (size_t r = 0; r < R; ++r) {
            xv.push_back(test::random_values(xs.elements(), 100 + uint32_t(step * R + r)));
            tv.push_back(test::random_values(ts.elements(), 200 + uint32_t(step * R + r)));
        }
        const LazyTensor x = ctx.input("x", xs, xv), t = ctx.input("t", ts, tv);
        const LazyTensor lr = ctx.input("lr", Shape{DType::F32, {}}, {{0.05f}});
        Graph& g = ctx.graph();
        ValueId loss, vnew;
        const ValueId wnew = Regression::step(g, ctx.value(w), ctx.value(v), ctx.value(x),
                                              ctx.value(t), ctx.value(lr), R, &loss, &vnew);
        ctx.assign(w, wnew);
        ctx.assign(v, vnew);
        const LazyTensor l = ctx.wrap(loss, "loss");
        ctx.mark_step();
        EXPECT_FALSE(w.pending());
        losses.push_back(ctx.to_host(l)[0]);
        // Reference: the same graph built directly, evaluated with the carried parameters.
        Graph h;
        const ValueId hw = h.parameter(ws, "w"), hv = h.parameter(ws, "v");
        const ValueId hx = h.input(xs, "x"), ht = h.input(ts, "t"),
                      hl = h.input(Shape{DType::F32, {}}, "lr");
        ValueId hloss, hvnew;
        const ValueId hwnew = Regression::step(h, hw, hv, hx, ht, hl, R, &hloss, &hvnew);
        h.add_output(hwnew);
        h.add_output(hvnew);
        h.add_output(hloss);
        Bindings b;
        for (size_t r = 0; r < R; ++r) {
            b.parameters.push_back({wr[r], vr[r]});
            b.inputs.push_back({HostArray::from_floats(xs, xv[r]),
                                HostArray::from_floats(ts, tv[r]),
                                HostArray::from_floats(Shape{DType::F32, {}}, {0.05f})});
        }
        const auto ref = evaluate(decompose(h), b);
        for (size_t r = 0; r < R; ++r) {
            wr[r] = ref[r][0];
            vr[r] = ref[r][1];
            EXPECT_EQ(ctx.to_host(w, r), wr[r].floats()) << "step " << step << " replica " << r;
            EXPECT_EQ(ctx.to_host(v, r), vr[r].floats());
        }
        EXPECT_EQ(losses.back(), float(ref[0][2].data[0]));
    }
    // Step 1 compiles; step 2 compiles again (the parameters now have the layouts step 1 gave
    // them, part of the graph); step 3 is a cache hit. Data reads of materialized tensors run
    // nothing.
    EXPECT_EQ(ctx.stats().mark_steps, 3u);
    EXPECT_EQ(ctx.stats().uncached_compiles, 2u);
    EXPECT_EQ(ctx.stats().cached_compiles, 1u);
    EXPECT_EQ(ctx.stats().executions, 3u);
    EXPECT_EQ(ctx.stats().host_syncs, 0u);
    EXPECT_GT(ctx.stats().compile_seconds, 0.0);
    // The weights were updated in place: the step's output aliases the parameter.
    const auto& outs = ctx.last_step()->outputs;
    ASSERT_GE(outs.size(), 2u);
    EXPECT_EQ(outs[0].buffer.space, BufferRef::Space::Parameter);
}

TEST(CompilerPipeline, AHostReadCutsOnlyWhatItNeeds) {
    HostBackend backend(1);
    LazyContext ctx(backend);
    const Shape s{DType::F32, {4, 4}};
    const LazyTensor x = ctx.input("x", s, {test::random_values(16, 1)});
    Graph& g = ctx.graph();
    const ValueId e = exp(g, ctx.value(x));
    const LazyTensor y = ctx.wrap(e, "y");
    const LazyTensor z = ctx.wrap(mul(g, e, full(g, 2.0, s)), "z");
    // loss.item(): a graph of y's ops alone; z stays pending and will recompute exp.
    const auto yv = ctx.to_host(y);
    EXPECT_EQ(ctx.stats().host_syncs, 1u);
    EXPECT_EQ(ctx.last_graph().outputs().size(), 1u);
    EXPECT_FALSE(y.pending());
    EXPECT_TRUE(z.pending());
    ctx.mark_step();
    EXPECT_FALSE(z.pending());
    EXPECT_EQ(ctx.stats().executions, 2u);
    bool recomputed = false;
    for (const Op& op : ctx.last_graph().ops()) recomputed |= op.kind == OpKind::Exp;
    EXPECT_TRUE(recomputed);
    const auto zv = ctx.to_host(z);
    for (size_t i = 0; i < 16; ++i) EXPECT_EQ(zv[i], yv[i] * 2.0f);
    EXPECT_THROW(ctx.value(LazyTensor{}), CompileError);
}

}  // namespace
}  // namespace tpu::compiler
