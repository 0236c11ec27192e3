// SPDX-License-Identifier: Apache-2.0
// Fusion decisions, dot merging, the stationary operand and layouts on small graphs.
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compiler_test_util.h"
#include "driver/kernels/gemm.h"

namespace tpu::compiler {
namespace {

using test::fusions_of;
/// Fusions that read `v` (a leaf) from memory.
int readers_of(const CompiledStep& s, ValueId v) {
    int n = 0;
    for (const Fusion& f : s.fusions)
        for (const FusionValue& o : f.operands) n += o.value == v;
    return n;
}

const Fusion& fusion_writing(const CompiledStep& s, ValueId v) {
    for (const Fusion& f : s.fusions)
        for (const FusionValue& r : f.results)
            if (r.value == v) return f;
    throw std::runtime_error("no fusion writes it");
}

TEST(CompilerFusion, BiasAndActivationFuseIntoTheDotThatProducesThem) {
    // relu(x W1^T + b1) W2^T: the bias broadcast, add and relu (max) are the first dot's
    // epilogue; relu's output feeds the second dot from memory (the MXU's operand).
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {1024, 256}}, "x");
    const ValueId w1 = g.parameter(Shape{DType::F32, {256, 256}}, "fc1.weight");
    const ValueId b1 = g.parameter(Shape{DType::F32, {256}}, "fc1.bias");
    const ValueId w2 = g.parameter(Shape{DType::F32, {256, 256}}, "fc2.weight");
    const ValueId h = relu(g, linear(g, x, w1, b1));
    g.add_output(linear(g, h, w2, kNoValue), "y");
    const CompiledStep s = compile(g);
    EXPECT_EQ(fusions_of(s), (std::vector<std::string>{"output:add,dot,maximum", "output:dot"}))
        << s.to_string();
    // Parameters live in the layout their kernel reads: the rhs is stationary (1024 rows stream
    // past 2 x 2 weight tiles; the transposed problem would stream 256 rows past 2 x 8), so
    // fc1.weight [out, in] lies as K-major 128 x 128 MXU tiles of (in, out): dim 1 major, dim 0
    // minor.
    ASSERT_EQ(s.fusions[0].dots.size(), 1u);
    EXPECT_EQ(s.fusions[0].dots[0].stationary, Stationary::Rhs)
        << s.fusions[0].dots[0].rhs_cycles << " " << s.fusions[0].dots[0].lhs_cycles;
    EXPECT_EQ(s.parameters[0].layout.to_string(), "{0,1:T(128,128)}");
    EXPECT_EQ(s.parameters[1].layout.to_string(), "{0}");
    // The activation between the dots: written as the second dot streams it (K minor), in the
    // VPU's 8 x 128 tiles.
    EXPECT_EQ(s.fusions[0].results[0].layout.to_string(), "{1,0:T(8,128)}");
    EXPECT_EQ(s.fusions[0].results[0].buffer.space, BufferRef::Space::Temp);
}

TEST(CompilerFusion, TheStationaryOperandIsThePlannersCheaperOrientation) {
    // The example: 512 x 2048 x 8192. The planner's estimate decides; nothing is
    // re-derived here.
    Graph g;
    const ValueId a = g.input(Shape{DType::F32, {512, 2048}}, "a");
    const ValueId w = g.parameter(Shape{DType::F32, {2048, 8192}}, "w");
    g.add_output(matmul(g, a, w, false, false));
    CompileOptions o;
    const CompiledStep s = compile(g, o);
    ASSERT_EQ(s.fusions.size(), 1u);
    const DotPlan& p = s.fusions[0].dots.at(0);
    EXPECT_EQ(p.m, 512);
    EXPECT_EQ(p.k, 2048);
    EXPECT_EQ(p.n, 8192);
    const auto est = [&](uint32_t rows, uint32_t cols) {
        const auto t = driver::plan_gemm(o.board, rows, 2048, cols, driver::Precision::Bf16);
        return driver::gemm_estimate_cycles(o.board, t, rows);
    };
    EXPECT_EQ(p.rhs_cycles, est(512, 8192));
    EXPECT_EQ(p.lhs_cycles, est(8192, 512));
    // Streaming the longer side (8192 columns of W past a's 512 rows) is cheaper.
    EXPECT_LT(p.lhs_cycles, p.rhs_cycles);
    EXPECT_EQ(p.stationary, Stationary::Lhs);
    // W is then the streamed operand, a parameter: it lies as a held weight does, in the MXU's
    // tiles with K major (a streamed panel of a block is one contiguous run of whole tiles).
    EXPECT_EQ(s.parameters[0].layout.to_string(), "{1,0:T(128,128)}");
}

/// PyTorch/XLA's layer norm of [rows, cols] (through batch norm training).
Graph torch_layer_norm(int64_t rows, int64_t cols) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {rows, cols}}, "x");
    const ValueId gamma = g.parameter(Shape{DType::F32, {cols}}, "weight");
    const ValueId beta = g.parameter(Shape{DType::F32, {cols}}, "bias");
    g.add_output(layer_norm(g, x, gamma, beta, 1e-5).y, "y");
    return g;
}

TEST(CompilerFusion, LayerNormThroughBatchNormIsOneStatsPassOneNormalizeAndTwoTinyFusions) {
    const Graph g = torch_layer_norm(512, 768);
    const CompiledStep s = compile(g);
    // batchnorm_expander: Sum[X] and Sum[X^2] are sibling reductions of one operand, one
    // multi-output fusion; E[X] = Sum / N and Var = E[X^2] - E[X]^2, rsqrt(Var + eps) are tiny
    // [512] fusions (a divide or rsqrt is expensive and the normalize's broadcast would
    // recompute it per element); the normalize streams x again.
    EXPECT_EQ(fusions_of(s),
              (std::vector<std::string>{"input:multiply,reduce,reshape", "loop:divide",
                                        "loop:add,divide,multiply,rsqrt,subtract",
                                        "loop:add,multiply,reshape,subtract"}))
        << s.to_string();
    EXPECT_EQ(s.fusions[0].results.size(), 2u);               // Sum[X], Sum[X^2]
    EXPECT_EQ(readers_of(s, g.leaves(OpKind::Input)[0]), 2);  // x streams twice
    // Without multi-output fusion the two sums stream x separately.
    CompileOptions o;
    o.multi_output_fusion = false;
    const CompiledStep s2 = compile(g, o);
    EXPECT_EQ(readers_of(s2, g.leaves(OpKind::Input)[0]), 3);
}

TEST(CompilerFusion, DependentReductionsStayTheirOwnStreamingFusions) {
    // A two-pass layer norm (variance of x - mean, as JAX's profile on TPU v4 shows: mean,
    // variance and normalize stream x, plus two tiny fusions): the variance's reduction depends
    // on the mean's, so no multi-output fusion can join them.
    const int64_t rows = 512, cols = 768;
    Graph g;
    const Shape xs{DType::F32, {rows, cols}}, rs{DType::F32, {rows}};
    const ValueId x = g.input(xs, "x");
    const ValueId gamma = g.parameter(Shape{DType::F32, {cols}}, "weight");
    const ValueId beta = g.parameter(Shape{DType::F32, {cols}}, "bias");
    const ValueId n = full(g, double(cols), rs);
    const ValueId mean = div(g, reduce(g, x, {1}, Reducer::Sum), n);
    const ValueId xc = sub(g, x, broadcast(g, mean, xs.dims, {0}));
    const ValueId var = div(g, reduce(g, mul(g, xc, xc), {1}, Reducer::Sum), n);
    const ValueId rstd = rsqrt(g, add(g, var, full(g, 1e-5, rs)));
    const ValueId y = add(
        g, mul(g, mul(g, xc, broadcast(g, rstd, xs.dims, {0})), broadcast(g, gamma, xs.dims, {1})),
        broadcast(g, beta, xs.dims, {1}));
    g.add_output(y, "y");
    const CompiledStep s = compile(g);
    EXPECT_EQ(fusions_of(s), (std::vector<std::string>{
                                 "input:reduce", "loop:divide", "input:multiply,reduce,subtract",
                                 "loop:add,divide,rsqrt", "loop:add,multiply,subtract"}))
        << s.to_string();
    EXPECT_EQ(readers_of(s, x), 3);
}

TEST(CompilerFusion, QkvProjectionsMergeIntoOneDot) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {512, 256}}, "x");
    std::vector<ValueId> ws;
    for (const char* name : {"q", "k", "v"}) {
        const ScopeGuard sg(g, name);
        const ValueId w = g.parameter(Shape{DType::F32, {256, 256}}, std::string(name) + ".weight");
        const ValueId b = g.parameter(Shape{DType::F32, {256}}, std::string(name) + ".bias");
        ws.push_back(w);
        g.add_output(linear(g, x, w, b), name);
    }
    const CompiledStep s = compile(g);
    // dot_merger.cc: the weights concatenated (inside the fusion: the kernel reads three
    // buffers as one operand), one dot, its result sliced; each slice's bias is epilogue.
    EXPECT_EQ(fusions_of(s), (std::vector<std::string>{"output:add,concatenate,dot,slice"}))
        << s.to_string();
    EXPECT_EQ(s.fusions[0].results.size(), 3u);
    EXPECT_EQ(s.fusions[0].operands.size(), 7u);  // x, 3 weights, 3 biases
    EXPECT_EQ(s.fusions[0].layers, (std::vector<std::string>{"q", "k", "v"}));
    EXPECT_EQ(s.fusions[0].dots.at(0).n, 768);
    for (size_t i = 0; i < ws.size(); ++i)
        EXPECT_EQ(s.parameters[2 * i].layout.to_string(), "{0,1:T(128,128)}");
    // Above the size limit the dots stay apart.
    CompileOptions o;
    o.dot_merge_max_bytes = 1;
    EXPECT_EQ(compile(g, o).fusions.size(), 3u);
}

TEST(CompilerFusion, AttentionHeadsAreDimsNotCopies) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {128, 256}}, "x");
    g.add_output(test::bert_block(g, x, 256, 4, 512), "y");
    const CompiledStep s = compile(g);
    // No fusion only moves data: every reshape and transpose of a head split or merge sits in
    // a fusion that computes.
    for (const Fusion& f : s.fusions) {
        bool computes = false;
        for (OpId id : f.ops) {
            const OpClass c = op_class(s.graph.op(id).kind);
            computes |= c != OpClass::Movement && c != OpClass::Literal;
        }
        EXPECT_TRUE(computes) << f.name << " only moves data\n" << s.to_string();
    }
    // The scores dot reads the projections' [seq, hidden] outputs themselves.
    const Fusion& qkv = s.fusions[0];
    ASSERT_EQ(qkv.results.size(), 3u) << s.to_string();
    const Fusion& scores = s.fusions[1];
    ASSERT_EQ(scores.kind, FusionKind::Output);
    for (const FusionValue& o : scores.operands) {
        EXPECT_EQ(o.shape.dims, (std::vector<int64_t>{128, 256}));
        EXPECT_EQ(&fusion_writing(s, o.value), &qkv);
    }
    // Six MXU fusions (QKV, scores with the softmax's max, P V, out-projection and ffn2 with the
    // next layer norm's statistics, ffn1), the softmax's sum (its normalize is computed in P V's
    // fusion as the dot loads P: CompilerAttn.TheSoftmaxNormalizeIsComputedAsTheValuesDotLoadsP),
    // and per layer norm two tiny fusions and a normalize.
    int kinds[5] = {0, 0, 0, 0, 0};
    for (const Fusion& f : s.fusions) ++kinds[int(f.kind)];
    EXPECT_EQ(kinds[int(FusionKind::Output)], 6) << s.summary();
    EXPECT_EQ(kinds[int(FusionKind::Input)], 1) << s.summary();
    EXPECT_EQ(kinds[int(FusionKind::Loop)], 6) << s.summary();
}

}  // namespace
}  // namespace tpu::compiler
