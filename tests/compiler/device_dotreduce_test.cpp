// SPDX-License-Identifier: Apache-2.0
// Reductions of a dot's result computed in the dot's fusion (compiler/README.md, "Reductions in
// a dot's fusion"; fusion.cpp reductions_into_dots, codegen_dot.cpp DotReduction): which
// reductions join the dot's fusion, that the kernel's reductions are the evaluator's bit for bit
// (batched: over the rows and over the columns, max and sum, with and without elementwise steps;
// 2-D: a layer norm's two sums over the columns with either operand stationary; and where the
// kernel cannot and a pass after it reduces), and what they save.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "device_test_util.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::fusions_of;
using test::Leaf;
using test::randoms;
using test::Record;

/// s = q k^T per batch ([B, M, K] x [B, N, K] -> [B, M, N]); r = reduce(step(s)) over dim
/// `dim` (1: the rows, 2: the columns); y = s - r broadcast back, so that s is written anyway
/// and every value of r reaches the result.
ValueId scores_minus_reduction(Graph& g, ValueId q, ValueId k, int64_t dim, Reducer red, int step) {
    DotDims dd;
    dd.lhs_batch = dd.rhs_batch = {0};
    dd.lhs_contracting = dd.rhs_contracting = {2};
    const ValueId s = dot(g, q, k, dd);
    const Shape& ss = g.shape(s);
    ValueId x = s;
    if (step == 1) x = div(g, s, full(g, 8.0, ss));
    if (step == 2) x = exp(g, mul(g, s, full(g, 0.125, ss)));
    const ValueId r = reduce(g, x, {dim}, red);
    std::vector<int64_t> kept;
    for (int64_t d = 0; d < 3; ++d)
        if (d != dim) kept.push_back(d);
    return sub(g, s, broadcast(g, r, ss.dims, kept));
}

std::vector<Leaf> leaves(int64_t B, int64_t M, int64_t N, int64_t K) {
    return {{"q", Shape{DType::F32, {B, M, K}}, {randoms(size_t(B * M * K), 11)}},
            {"k", Shape{DType::F32, {B, N, K}}, {randoms(size_t(B * N * K), 12)}}};
}

Record record(int64_t dim, Reducer red, int step) {
    return [=](Graph& g, const std::vector<ValueId>& v) {
        return scores_minus_reduction(g, v[0], v[1], dim, red, step);
    };
}

CompiledStep compile_scores(int64_t dim, bool into_dots, bool batched = true,
                            bool scores_read = true) {
    Graph g;
    const int64_t B = 4, M = 128, N = 256, K = 64;
    const ValueId q = g.input(Shape{DType::F32, {B, M, K}}, "q");
    const ValueId k = g.input(Shape{DType::F32, {B, N, K}}, "k");
    if (!batched) {
        const ValueId s =
            matmul(g, reshape(g, q, {B * M, K}), reshape(g, k, {B * N, K}), false, true);
        g.add_output(sub(g, s, broadcast(g, reduce(g, s, {1}, Reducer::Max), {B * M, B * N}, {0})),
                     "y");
    } else if (!scores_read) {
        DotDims dd;
        dd.lhs_batch = dd.rhs_batch = {0};
        dd.lhs_contracting = dd.rhs_contracting = {2};
        g.add_output(reduce(g, dot(g, q, k, dd), {dim}, Reducer::Max), "y");
    } else {
        g.add_output(scores_minus_reduction(g, q, k, dim, Reducer::Max, 1), "y");
    }
    CompileOptions co;
    co.reductions_into_dots = into_dots;
    return compile(g, co);
}

TEST(CompilerFusion, AReductionOfADotsResultJoinsTheDotsFusion) {
    // Over a matrix dim (rows or columns), through a divide by a literal: the dot's fusion
    // writes the scores and the reduction; the subtract reads both.
    for (int64_t dim : {1, 2}) {
        const CompiledStep s = compile_scores(dim, true);
        EXPECT_EQ(fusions_of(s),
                  (std::vector<std::string>{"output:divide,dot,reduce", "loop:subtract"}))
            << s.summary();
        EXPECT_EQ(s.fusions[0].results.size(), 2u) << s.to_string();
        EXPECT_EQ(fusions_of(compile_scores(dim, false)),
                  (std::vector<std::string>{"output:dot", "input:divide,reduce", "loop:subtract"}));
    }
    // Over the batch dim: not one batch's matrix.
    EXPECT_EQ(fusions_of(compile_scores(0, true)),
              (std::vector<std::string>{"output:dot", "input:divide,reduce", "loop:subtract"}));
    // Scores read by the reduction alone are not written anyway: the reduction stays a fusion
    // of its own (the dot kernel stores its whole result).
    EXPECT_EQ(fusions_of(compile_scores(2, true, true, false)),
              (std::vector<std::string>{"output:dot", "input:reduce"}));
    // A 2-D dot's too.
    EXPECT_EQ(fusions_of(compile_scores(1, true, false)),
              (std::vector<std::string>{"output:dot,reduce,reshape", "loop:subtract"}));
}

TEST(CompilerFusion, AReductionStaysApartFromADotTheCodeGeneratorDoesNotCover) {
    // ViT's heads at batch 2: sequences of 17 tokens in [B S, H d] projections, split over two
    // batch dims, which the dot emitter does not read (a host fallback). The max stays a fusion
    // of its own, so that it runs on the device and only the scores cross the host link.
    const auto step = [](int64_t seq) {
        Graph g;
        const Shape ps{DType::F32, {2 * seq, 192}};
        const auto heads = [&](ValueId x) {
            return transpose(g, reshape(g, x, {2, seq, 3, 64}), {0, 2, 1, 3});
        };
        DotDims dd;
        dd.lhs_batch = dd.rhs_batch = {0, 1};
        dd.lhs_contracting = dd.rhs_contracting = {3};
        const ValueId s = dot(g, heads(g.input(ps, "q")), heads(g.input(ps, "k")), dd);
        const ValueId m = reduce(g, s, {3}, Reducer::Max);
        g.add_output(sub(g, s, broadcast(g, m, g.shape(s).dims, {0, 1, 2})), "y");
        return compile(g);
    };
    const CompiledStep st = step(17);
    EXPECT_EQ(fusions_of(st),
              (std::vector<std::string>{"output:dot,reshape", "input:reduce", "loop:subtract"}))
        << st.summary();
    EXPECT_EQ(st.fusions[1].name, "fusion.1");
    EXPECT_EQ(st.fusions[2].name, "fusion.2");
    // Sequences of 16 (whole bands of 8 rows): the dot is generated and computes the max.
    EXPECT_EQ(fusions_of(step(16)),
              (std::vector<std::string>{"output:dot,reduce,reshape", "loop:subtract"}));
}

/// A layer norm after a projection with a residual, `layer_norm(x W^T + b + x)` (BERT's
/// out-projection and ffn2): x [M, K], W [N, K] with N = K.
ValueId projected_layer_norm(Graph& g, const std::vector<ValueId>& v) {
    const ValueId h = add(g, linear(g, v[0], v[1], v[2]), v[0]);
    return layer_norm(g, h, v[3], v[4], 1e-5).y;
}

std::vector<Leaf> projection_leaves(int64_t M, int64_t N) {
    const Shape vec{DType::F32, {N}};
    return {{"x", Shape{DType::F32, {M, N}}, {randoms(size_t(M * N), 21)}},
            {"w", Shape{DType::F32, {N, N}}, {randoms(size_t(N * N), 22, -0.05f, 0.05f)}, true},
            {"b", vec, {randoms(size_t(N), 23)}, true},
            {"gamma", vec, {randoms(size_t(N), 24, 0.5f, 1.5f)}, true},
            {"beta", vec, {randoms(size_t(N), 25)}, true}};
}

TEST(CompilerFusion, ALayerNormsStatisticsAreItsProjectionsFusionsResults) {
    // Sum[x] and Sum[x^2] of the batch-norm expansion read the projection's result (through the
    // [1, M, N] view): both join its fusion, which leaves the two tiny fusions and the normalize.
    Graph g;
    std::vector<ValueId> v;
    for (const Leaf& l : projection_leaves(512, 768))
        v.push_back(l.parameter ? g.parameter(l.shape, l.name) : g.input(l.shape, l.name));
    g.add_output(projected_layer_norm(g, v), "y");
    const CompiledStep s = compile(g);
    EXPECT_EQ(fusions_of(s),
              (std::vector<std::string>{"output:add,dot,multiply,reduce,reshape", "loop:divide",
                                        "loop:add,divide,multiply,rsqrt,subtract",
                                        "loop:add,multiply,reshape,subtract"}))
        << s.summary();
    // Its results: the projection's, the normalize reads it, and the two sums.
    int reductions = 0;
    for (OpId id : s.fusions[0].ops) reductions += s.graph.op(id).kind == OpKind::Reduce;
    EXPECT_EQ(reductions, 2);
    EXPECT_EQ(s.fusions[0].results.size(), 3u) << s.to_string();
}

TEST(CompilerDotReduceDevice, OverTheRowsAndTheColumnsMaxAndSumAreBitExact) {
    // Four batches of [128, 256]: one block and one group a batch, two 128-column panels, so the
    // column reductions combine two chunks and the row reductions fold 16 bands.
    for (int64_t dim : {1, 2})
        for (Reducer red : {Reducer::Max, Reducer::Sum})
            for (int step : {0, 1, 2}) {
                SCOPED_TRACE(::testing::Message() << "dim " << dim << " sum "
                                                  << (red == Reducer::Sum) << " step " << step);
                const auto st = expect_bit_exact(leaves(4, 128, 256, 64), record(dim, red, step));
                EXPECT_EQ(st.fallback_fusions, 0u);
            }
}

TEST(CompilerDotReduceDevice, OnePanelAndAPassAfterTheKernelAreBitExact) {
    // One 96-column panel: a column reduction is the tile's one chunk. 4096 rows of 128: a
    // batch's matrix as one block does not fit in VMEM beside the reduction's areas, so the
    // kernel stores the scores and a pass after it reduces them (plan_dot_reduction's false).
    expect_bit_exact(leaves(3, 64, 96, 32), record(2, Reducer::Sum, 1));
    expect_bit_exact(leaves(3, 64, 96, 32), record(1, Reducer::Max, 0));
    expect_bit_exact(leaves(2, 4096, 128, 32), record(1, Reducer::Sum, 2));
}

TEST(CompilerDotReduceDevice, ALayerNormsSumsInItsProjectionAreBitExact) {
    // BERT-base's out projection (512 x 768 x 768: the LHS stationary, one block of all 768
    // columns, six chunk results a row), a narrow one (one chunk), BERT-xlarge's (2048
    // columns, in pieces of the block, each piece's chunks added in column order), and one
    // whose RHS is stationary (each block's tiles' sums added at their rows).
    const Record record = projected_layer_norm;
    expect_bit_exact(projection_leaves(512, 768), record);
    expect_bit_exact(projection_leaves(256, 128), record);
    expect_bit_exact(projection_leaves(512, 2048), record);
    expect_bit_exact(projection_leaves(8192, 256), record);
    // BERT-xlarge's out projection proper: it reads the attention's [H, d, S] output merged to
    // [S, H d] through a transpose (one block of 2048 columns whose epilogue runs in pieces of
    // the columns, each piece's chunk results added in column order).
    const Record merged = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId a = reshape(g, transpose(g, v[5], {2, 0, 1}), {512, 2048});
        const ValueId h = add(g, linear(g, a, v[1], v[2]), v[0]);
        return layer_norm(g, h, v[3], v[4], 1e-5).y;
    };
    std::vector<Leaf> leaves = projection_leaves(512, 2048);
    leaves.push_back(
        {"heads", Shape{DType::F32, {16, 128, 512}}, {randoms(size_t(16 * 128 * 512), 26)}});
    expect_bit_exact(leaves, merged);
}

TEST(CompilerDotReduce, TheAttentionsMaxCostsNoPassOfItsOwn) {
    // BERT-base's zoo attention, steady state: with the max in the scores dot's fusion the
    // attention saves at least the max's pass over the 12 MiB of scores (26.2 k cycles at the
    // HBM peak, less the fusion boundary), and the scores fusion costs at most 5% more.
    CompileOptions off;
    off.reductions_into_dots = false;
    const auto [s_on, on] = test::steady_zoo_attention(512, 12, 64);
    const auto [s_off, base] = test::steady_zoo_attention(512, 12, 64, off);
    ASSERT_EQ(s_on->fusions.size() + 1, s_off->fusions.size());
    EXPECT_EQ(on.fallback_fusions, 0u);
    uint64_t total_on = 0, total_off = 0;
    for (uint64_t c : on.last_fusion_cycles) total_on += c;
    for (uint64_t c : base.last_fusion_cycles) total_off += c;
    const uint64_t pass = uint64_t(12.0 * 512 * 512 * 4 / 479.5);
    EXPECT_LT(total_on + pass, total_off) << total_on << " vs " << total_off;
    EXPECT_LT(double(on.last_fusion_cycles.at(0)), 1.05 * double(base.last_fusion_cycles.at(0)));
}

}  // namespace
}  // namespace tpu::compiler
