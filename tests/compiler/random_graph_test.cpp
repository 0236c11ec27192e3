// SPDX-License-Identifier: Apache-2.0
// Seeded random graphs through the whole pipeline: every fusion decision, duplication,
// multi-output merge, layout and buffer offset must leave every value as the plain evaluation
// computes it, and the compiled step must never have a cycle.
#include <random>

#include <gtest/gtest.h>

#include "compiler_test_util.h"

namespace tpu::compiler {
namespace {

/// A random graph over [8, 16] arrays: elementwise ops, reductions broadcast back, dots with a
/// parameter (plain and transposed; dots of one operand merge), softmax, layer norm,
/// all-reduce, reshapes and transposes, slices and concatenations; a few outputs and an
/// in-place parameter update.
Graph random_graph(uint32_t seed) {
    std::mt19937 rng(seed);
    const Shape s{DType::F32, {8, 16}}, w{DType::F32, {16, 16}}, v{DType::F32, {16}};
    Graph g;
    std::vector<ValueId> vals{g.input(s, "x0"), g.input(s, "x1")};
    std::vector<ValueId> params;
    for (int i = 0; i < 3; ++i) params.push_back(g.parameter(w, "w" + std::to_string(i)));
    const ValueId gamma = g.parameter(v, "gamma"), beta = g.parameter(v, "beta");
    const auto pick = [&] { return vals[rng() % vals.size()]; };
    const int n = 6 + int(rng() % 14);
    for (int i = 0; i < n; ++i) {
        ValueId r = 0;
        switch (rng() % 14) {
            case 0:
                r = add(g, pick(), pick());
                break;
            case 1:
                r = mul(g, pick(), pick());
                break;
            case 2:
                r = max(g, pick(), sub(g, pick(), pick()));
                break;
            case 3:
                r = tanh(g, pick());
                break;
            case 4:
                r = exp(g, mul(g, pick(), full(g, 0.25, s)));
                break;
            case 5:
                r = broadcast(g, reduce(g, pick(), {1}, rng() % 2 ? Reducer::Sum : Reducer::Max),
                              s.dims, {0});
                break;
            case 6:
                r = matmul(g, pick(), params[rng() % params.size()], false, rng() % 2 == 0);
                break;
            case 7:
                r = softmax(g, pick(), 1);
                break;
            case 8:
                r = layer_norm(g, pick(), gamma, beta, 1e-5).y;
                break;
            case 9:
                r = all_reduce(g, pick(), 0.5);
                break;
            case 10:
                r = relu(g, add(g, matmul(g, pick(), params[0], false, false), pick()));
                break;
            case 11:
                // A permutation of the elements through reshapes and a transpose.
                r = reshape(g, transpose(g, reshape(g, pick(), {8, 4, 4}), {0, 2, 1}), {8, 16});
                break;
            case 12:
                r = concatenate(
                    g, {slice(g, pick(), {0, 0}, {8, 8}), slice(g, pick(), {0, 8}, {8, 16})}, 1);
                break;
            default:
                r = div(g, pick(), add(g, abs(g, pick()), full(g, 1.0, s)));
                break;
        }
        vals.push_back(r);
    }
    g.add_output(vals.back(), "last");
    g.add_output(vals[vals.size() / 2], "middle");
    // An SGD-like update of a weight from a reduction of the last value.
    const ValueId grad = matmul(g, vals.back(), vals[2 + rng() % (vals.size() - 2)], true, false);
    const int64_t p = int64_t(rng() % params.size());
    g.add_output(sub(g, params[size_t(p)], mul(g, grad, full(g, 0.01, w))), "update", p);
    return g;
}

TEST(CompilerRandomGraphs, EveryPassKeepsEveryValue) {
    for (uint32_t seed = 1; seed <= 80; ++seed) {
        const Graph g = random_graph(seed);
        for (bool mof : {true, false}) {
            CompileOptions o;
            o.multi_output_fusion = mof;
            o.may_duplicate = seed % 3 != 0;
            CompiledStep s;
            try {
                s = compile(g, o);
            } catch (const CompileError& e) {
                FAIL() << "seed " << seed << " mof " << mof << ": " << e.what() << "\n"
                       << g.to_string();
            }
            const Bindings b = test::random_bindings(g, 2, seed);
            const auto ref = evaluate(decompose(g), b);
            std::vector<std::vector<HostArray>> after;
            const auto got = evaluate_compiled(s, b, {}, &after);
            for (size_t r = 0; r < 2; ++r)
                for (size_t i = 0; i < g.outputs().size(); ++i)
                    ASSERT_TRUE(test::same_bits(got[r][i], ref[r][i]))
                        << "seed " << seed << " output " << i << "\n"
                        << g.to_string() << s.to_string();
            // The updated parameter, in place or swapped in.
            const int64_t p = g.outputs().back().updates_parameter;
            ASSERT_TRUE(test::same_bits(after[0][size_t(p)], ref[0].back())) << "seed " << seed;
        }
    }
}

}  // namespace
}  // namespace tpu::compiler
