// SPDX-License-Identifier: Apache-2.0
// The host evaluator and the decompositions: PyTorch/XLA's lowerings against the driver's
// references (the trainer's numerics today).
#include <cmath>

#include <gtest/gtest.h>

#include "compiler_test_util.h"
#include "driver/kernels/allreduce.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"
#include "hw/core/numerics.h"

namespace tpu::compiler {
namespace {

using test::max_rel_error;
using test::random_values;

/// Evaluates `g` (decomposed) on one replica with the given leaf values.
std::vector<HostArray> run(const Graph& g, std::vector<HostArray> params,
                           std::vector<HostArray> inputs, const EvalOptions& o = {}) {
    Bindings b;
    b.parameters = {std::move(params)};
    b.inputs = {std::move(inputs)};
    return evaluate(decompose(g), b, o)[0];
}

TEST(CompilerEvaluator, LayerNormThroughBatchNormMatchesTheKernelToRounding) {
    const int64_t rows = 8, cols = 64;
    Graph g;
    const Shape xs{DType::F32, {rows, cols}}, fs{DType::F32, {cols}};
    const ValueId x = g.input(xs, "x");
    const ValueId gamma = g.parameter(fs, "gamma"), beta = g.parameter(fs, "beta");
    const auto ln = layer_norm(g, x, gamma, beta, 1e-5);
    g.add_output(ln.y);
    g.add_output(ln.mean);
    g.add_output(ln.rstd);
    const auto xv = random_values(rows * cols, 1), gv = random_values(cols, 2),
               bv = random_values(cols, 3);
    const auto out = run(g, {HostArray::from_floats(fs, gv), HostArray::from_floats(fs, bv)},
                         {HostArray::from_floats(xs, xv)});
    const auto ref =
        driver::layer_norm_reference(xv, gv, bv, 1e-5f, uint32_t(rows), uint32_t(cols));
    // Var = E[X^2] - E[X]^2 (batchnorm_expander) against the kernel's centred sum: equal to
    // fp32 rounding for values of order 1.
    EXPECT_LT(max_rel_error(out[0].floats(), ref.out), 1e-5);
    EXPECT_LT(max_rel_error(out[1].floats(), ref.mean), 1e-6);
    EXPECT_LT(max_rel_error(out[2].floats(), ref.rstd), 1e-5);
    EXPECT_EQ(out[1].shape.dims, (std::vector<int64_t>{rows, 1}));
}

TEST(CompilerEvaluator, SoftmaxGeluAndCrossEntropyAsLoweredMatchTheKernels) {
    const int64_t rows = 4, cols = 40;
    const Shape s{DType::F32, {rows, cols}};
    const auto xv = random_values(rows * cols, 7);
    Graph g;
    const ValueId x = g.input(s, "x"), y = g.input(s, "y");
    g.add_output(softmax(g, x, 1));
    g.add_output(gelu(g, x, true));
    g.add_output(cross_entropy(g, x, y));
    std::vector<float> onehot(size_t(rows * cols), 0.0f);
    for (int64_t r = 0; r < rows; ++r) onehot[size_t(r * cols + (r * 7) % cols)] = 1.0f;
    const auto out = run(g, {}, {HostArray::from_floats(s, xv), HostArray::from_floats(s, onehot)});
    // exp(z) / sum (PyTorch/XLA) against exp(z - log(sum)) (the kernel, which has no divide).
    EXPECT_LT(max_rel_error(out[0].floats(), driver::softmax_reference(xv, rows, cols)), 1e-6);
    EXPECT_LT(max_rel_error(out[1].floats(), driver::gelu_reference(xv)), 1e-6);
    const auto ce = driver::softmax_cross_entropy_reference(xv, onehot, rows, cols);
    double mean = 0;
    for (float l : ce.loss) mean += l;
    EXPECT_NEAR(out[2].data[0], mean / rows, 1e-6);
}

TEST(CompilerEvaluator, OptimizerLoweringsAreBitExactWithTheTrainersKernels) {
    const Shape s{DType::F32, {3, 50}}, scalar{DType::F32, {}};
    const auto w0 = random_values(150, 1), g0 = random_values(150, 2), m0 = random_values(150, 3);
    auto v0 = random_values(150, 4);
    for (float& x : v0) x = std::abs(x);
    v0[5] = 0.0f;  // the vh == 0 branch
    {
        Graph g;
        const ValueId w = g.parameter(s, "w"), v = g.parameter(s, "v"), gr = g.input(s, "g"),
                      lr = g.input(scalar, "lr");
        const auto r = sgd_momentum(g, w, gr, v, lr, 0.9);
        g.add_output(r.w);
        g.add_output(r.v);
        const auto out =
            run(g, {HostArray::from_floats(s, w0), HostArray::from_floats(s, m0)},
                {HostArray::from_floats(s, g0), HostArray::from_floats(scalar, {0.01f})});
        auto wr = w0, vr = m0;
        driver::sgd_momentum_reference(wr, g0, vr, 0.01f, 0.9f);
        EXPECT_TRUE(test::same_bits(out[0], HostArray::from_floats(s, wr)));
        EXPECT_TRUE(test::same_bits(out[1], HostArray::from_floats(s, vr)));
    }
    {
        Graph g;
        const ValueId w = g.parameter(s, "w"), m = g.parameter(s, "m"), v = g.parameter(s, "v"),
                      gr = g.input(s, "g"), lr_c1 = g.input(scalar, "lr_c1"),
                      c2 = g.input(scalar, "c2");
        const auto r = adam(g, w, gr, m, v, lr_c1, c2, 0.9, 0.999, 1e-8);
        g.add_output(r.w);
        g.add_output(r.m);
        g.add_output(r.v);
        const auto k = driver::adam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 3);
        const auto out =
            run(g,
                {HostArray::from_floats(s, w0), HostArray::from_floats(s, m0),
                 HostArray::from_floats(s, v0)},
                {HostArray::from_floats(s, g0), HostArray::from_floats(scalar, {k.lr_c1}),
                 HostArray::from_floats(scalar, {k.c2})});
        auto wr = w0, mr = m0, vr = v0;
        driver::adam_reference(wr, g0, mr, vr, 1e-3f, 0.9f, 0.999f, 1e-8f, 3);
        EXPECT_TRUE(test::same_bits(out[0], HostArray::from_floats(s, wr)));
        EXPECT_TRUE(test::same_bits(out[1], HostArray::from_floats(s, mr)));
        EXPECT_TRUE(test::same_bits(out[2], HostArray::from_floats(s, vr)));
    }
}

TEST(CompilerEvaluator, DotsHaveTheMxusNumericsAtEveryPrecision) {
    // K = 300: three K tiles of the 128-row array, so the order of the pass sums matters.
    const int64_t M = 5, K = 300, N = 7;
    const auto av = random_values(K * M, 11), bv = random_values(N * K, 12);
    for (Precision p : {Precision::Default, Precision::High, Precision::Highest}) {
        Graph g;
        const ValueId a = g.input(Shape{DType::F32, {K, M}}, "a");  // used transposed
        const ValueId b = g.input(Shape{DType::F32, {N, K}}, "b");  // used transposed
        g.add_output(matmul(g, a, b, true, true, p));
        const auto out =
            run(g, {},
                {HostArray::from_floats(g.shape(a), av), HostArray::from_floats(g.shape(b), bv)});
        const auto prec = p == Precision::Default ? driver::Precision::Bf16
                          : p == Precision::High  ? driver::Precision::Fp32Pass3
                                                  : driver::Precision::Fp32Pass6;
        const auto ref = driver::matmul_reference(av, uint32_t(K), uint32_t(M), true, bv,
                                                  uint32_t(N), uint32_t(K), true, prec, 128);
        EXPECT_TRUE(test::same_bits(out[0], HostArray::from_floats(Shape{DType::F32, {M, N}}, ref)))
            << "precision " << int(p);
    }
}

TEST(CompilerEvaluator, EmbeddingGatherReturnsExactRowsAndScatterAddsTheirGradients) {
    const Shape table{DType::F32, {5, 3}}, idx{DType::S32, {4}};
    const auto tv = random_values(15, 3);
    Graph g;
    const ValueId t = g.parameter(table, "wte"), i = g.input(idx, "tokens");
    const ValueId rows = gather_rows(g, t, i);
    g.add_output(rows);
    g.add_output(scatter_add_rows(g, i, rows, 5));
    const std::vector<float> tokens{4, 0, 4, 2};
    const auto out =
        run(g, {HostArray::from_floats(table, tv)}, {HostArray::from_floats(idx, tokens)});
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 3; ++c)
            EXPECT_EQ(out[0].data[size_t(r * 3 + c)], tv[size_t(int(tokens[size_t(r)]) * 3 + c)]);
    // Row 4 was gathered twice: its gradient is the sum of both, in index order from +0.0.
    EXPECT_EQ(out[1].data[12], double((0.0f + tv[12]) + tv[12]));
    EXPECT_EQ(out[1].data[3], 0.0);  // row 1: never gathered
    // The gather clamps an index outside the table as XLA's gather does (5 reads row 4, -1 row
    // 0); the scatter-add of the gradient still refuses it.
    try {
        run(g, {HostArray::from_floats(table, tv)}, {HostArray::from_floats(idx, {0, 1, 5, 2})});
        FAIL() << "index 5 of a 5-row table was scattered";
    } catch (const EvalError& e) {
        EXPECT_STREQ(e.what(), "scatter-add: index 5 outside the table's 5 rows");
    }
    Graph gather_only;
    gather_only.add_output(gather_rows(gather_only, gather_only.parameter(table, "wte"),
                                       gather_only.input(idx, "tokens")));
    const auto clamped = run(gather_only, {HostArray::from_floats(table, tv)},
                             {HostArray::from_floats(idx, {5, -1, 7, 2})});
    const int want[] = {4, 0, 4, 2};
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 3; ++c)
            EXPECT_EQ(clamped[0].data[size_t(r * 3 + c)], tv[size_t(want[r] * 3 + c)]);
}

TEST(CompilerEvaluator, ReductionsSumChunksOfOneVectorRowThenTheChunkResults) {
    // Rows of 1, 127, 128 (one whole chunk: it was lost, every sum 0, until the chunk moved
    // into the outer sum only when a next one starts), 129, 256 and 300 values: each row is cut
    // into chunks of 128 lanes in index order, each summed from +0.0, then the chunk sums are
    // summed from +0.0 when there are several.
    for (int64_t c : {1, 127, 128, 129, 256, 300}) {
        const Shape s{DType::F32, {3, c}};
        Graph g;
        const ValueId x = g.input(s, "x");
        g.add_output(reduce(g, x, {1}, Reducer::Sum));
        g.add_output(reduce(g, x, {1}, Reducer::Max));
        const auto v = random_values(size_t(3 * c), uint32_t(c));
        const auto out = run(g, {}, {HostArray::from_floats(s, v)});
        for (int64_t r = 0; r < 3; ++r) {
            float outer = 0, chunk = 0, mx = -INFINITY;
            for (int64_t i = 0; i < c; ++i) {
                if (i > 0 && i % 128 == 0) outer += chunk, chunk = 0;
                chunk += v[size_t(r * c + i)];
                mx = std::max(mx, v[size_t(r * c + i)]);
            }
            const float want = c > 128 ? outer + chunk : chunk;
            EXPECT_EQ(float(out[0].data[size_t(r)]), want) << c << " values, row " << r;
            EXPECT_EQ(float(out[1].data[size_t(r)]), mx) << c << " values, row " << r;
        }
    }
}

TEST(CompilerEvaluator, AllReduceSumsReplicasInTheRingsOrder) {
    const Shape s{DType::F32, {3, 70}};
    Graph g;
    const ValueId x = g.input(s, "grad");
    g.add_output(all_reduce(g, x, 1.0 / 3.0));
    Bindings b;
    std::vector<std::vector<float>> reps;
    for (uint32_t r = 0; r < 3; ++r) {
        reps.push_back(random_values(210, 20 + r));
        b.inputs.push_back({HostArray::from_floats(s, reps.back())});
    }
    const auto out = evaluate(g, b);
    const auto ref = driver::allreduce_reference(reps, float(1.0 / 3.0));
    for (size_t r = 0; r < 3; ++r)
        EXPECT_TRUE(test::same_bits(out[r][0], HostArray::from_floats(s, ref)));
}

TEST(CompilerEvaluator, Bf16RoundsToNearestEvenAndCustomCallsRunOnTheHost) {
    const Shape s{DType::F32, {4}};
    const std::vector<float> xv{1.00390625f, 1.01171875f, -3.0e38f, 0.1f};
    Graph g;
    const ValueId x = g.input(s, "x");
    g.add_output(convert(g, x, DType::BF16));
    g.add_output(custom_call(g, "twice", {x}, s));
    EvalOptions o;
    o.custom_calls["twice"] = [](const std::vector<HostArray>& in, const Shape& out) {
        HostArray r = HostArray::zeros(out);
        for (size_t i = 0; i < r.data.size(); ++i) r.data[i] = 2 * in[0].data[i];
        return r;
    };
    const auto out = run(g, {}, {HostArray::from_floats(s, xv)}, o);
    for (size_t i = 0; i < xv.size(); ++i) {
        EXPECT_EQ(out[0].data[i], double(hw::bf16_round(xv[i])));
        EXPECT_EQ(out[1].data[i], 2.0 * double(xv[i]));
    }
    EXPECT_THROW(run(g, {}, {HostArray::from_floats(s, xv)}), EvalError);  // "twice" unknown
}

}  // namespace
}  // namespace tpu::compiler
