// SPDX-License-Identifier: Apache-2.0
// The attention's softmax and its second dot (compiler/README.md, "Code generation", "The
// attention's softmax in the values dot"; issue #29): which fusions the zoo's attention
// compiles to, and their cycles against the HBM bytes each moves, at BERT-base's shape.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "driver/device.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::expect_bit_exact;
using test::randoms;
using test::Record;
using test::zoo_attention;

/// PyTorchSim's attention (../shared/validation/README.md; compiler_test_util.h's bert_block):
/// heads [H, S, d] of the [S, H d] projections, `scores = K Q^T / sqrt(d)` as [H, keys,
/// queries], softmax over the keys (dim 1), `V^T P` as [H, d, queries].
ValueId pytorchsim_attention(Graph& g, ValueId q, ValueId k, ValueId v, int64_t heads) {
    const int64_t seq = g.shape(q).dims[0], dim = g.shape(q).dims[1], d = dim / heads;
    const auto heads_of = [&](ValueId t) {
        return transpose(g, reshape(g, t, {seq, heads, d}), {1, 0, 2});
    };
    DotDims sd;
    sd.lhs_batch = sd.rhs_batch = {0};
    sd.lhs_contracting = sd.rhs_contracting = {2};
    const ValueId s = dot(g, heads_of(k), heads_of(q), sd);
    const ValueId p = softmax(g, div(g, s, full(g, std::sqrt(double(d)), g.shape(s))), 1);
    DotDims od;
    od.lhs_batch = od.rhs_batch = {0};
    od.lhs_contracting = od.rhs_contracting = {1};
    return dot(g, heads_of(v), p, od);  // [H, d, queries]
}

/// The names of a step's fusions' ops, one string per fusion ("dot+divide+...").
std::vector<std::string> fusion_ops(const CompiledStep& s) {
    std::vector<std::string> out;
    for (const Fusion& f : s.fusions) {
        std::string ops;
        for (OpId id : f.ops) {
            const OpKind k = s.graph.op(id).kind;
            if (k == OpKind::Literal || k == OpKind::Broadcast || k == OpKind::Reshape ||
                k == OpKind::Transpose)
                continue;
            ops += (ops.empty() ? "" : "+") + std::string(op_name(k));
        }
        out.push_back(fmt::format("{} {}", fusion_kind_name(f.kind), ops));
    }
    return out;
}

/// Bytes a fusion moves through HBM at least: each operand read once, each result written once.
uint64_t fusion_bytes(const Fusion& f) {
    uint64_t n = 0;
    for (const FusionValue& v : f.operands) n += v.buffer.bytes;
    for (const FusionValue& v : f.results) n += v.buffer.bytes;
    return n;
}

/// Each fusion of the attention on one core, steady state (the third step of a LazyContext,
/// sim.functional=false): its cycles and bytes. Printed, and returned with the step.
struct FusionCycles {
    std::string name, ops;
    uint64_t cycles = 0, bytes = 0;
};
std::vector<FusionCycles> attention_fusion_cycles(int64_t S, int64_t heads, int64_t d,
                                                  bool operand_fusion = true) {
    CompileOptions co;
    co.dot_operand_producers = operand_fusion;
    const auto [step, stats] = test::steady_zoo_attention(S, heads, d, co);
    EXPECT_EQ(stats.fallback_fusions, 0u);
    const CompiledStep& s = *step;
    std::vector<FusionCycles> out;
    for (size_t i = 0; i < s.fusions.size(); ++i) {
        const Fusion& f = s.fusions[i];
        FusionCycles c{f.name, "", stats.last_fusion_cycles.at(i), fusion_bytes(f)};
        for (OpId id : f.ops)
            c.ops += fmt::format("{}{}", c.ops.empty() ? "" : "+", op_name(s.graph.op(id).kind));
        std::cout << fmt::format(
            "[attention {}x{}x{}{}] {} {} cycles, {} bytes = {:.0f} cycles "
            "at 479.5 B/cycle ({})\n",
            heads, S, d, operand_fusion ? "" : " unfused", c.name, c.cycles, c.bytes,
            c.bytes / 479.5, c.ops);
        out.push_back(std::move(c));
    }
    return out;
}

/// The attention `record` over [seq, heads x d] projections on the device (race detector on,
/// one launch) and on the evaluator: the same bits.
void expect_attention_bit_exact(int64_t seq, int64_t heads, int64_t d, bool pytorchsim,
                                Stationary held) {
    const int64_t dim = heads * d;
    const Shape ps{DType::F32, {seq, dim}};
    const Record record = [heads, pytorchsim](Graph& g, const std::vector<ValueId>& v) {
        if (pytorchsim) return pytorchsim_attention(g, v[0], v[1], v[2], heads);
        return zoo_attention(g, v[0], v[1], v[2], v[3], v[4], heads);
    };
    // The normalize is computed in the values dot's fusion, on the operand the kernel streams
    // (the zoo's P, the lhs) or holds (PyTorchSim's P, the rhs).
    Graph g;
    std::vector<ValueId> leaves{g.input(ps, "q"), g.input(ps, "k"), g.input(ps, "v"),
                                g.parameter(Shape{DType::F32, {dim, dim}}, "w"),
                                g.parameter(Shape{DType::F32, {dim}}, "b")};
    g.add_output(record(g, leaves), "o");
    const CompiledStep s = compile(g);
    const auto ops = fusion_ops(s);
    const auto it = std::find_if(ops.begin(), ops.end(), [](const std::string& o) {
        return o.find("divide+dot") != std::string::npos;
    });
    ASSERT_NE(it, ops.end()) << s.summary();
    const Fusion& values = s.fusions[size_t(it - ops.begin())];
    EXPECT_EQ(values.dots.at(0).stationary, held) << s.to_string();
    const float ws = 1.0f / std::sqrt(float(dim));
    expect_bit_exact(
        {{"q", ps, {randoms(size_t(seq * dim), 301, -2.0f, 2.0f)}},
         {"k", ps, {randoms(size_t(seq * dim), 302, -2.0f, 2.0f)}},
         {"v", ps, {randoms(size_t(seq * dim), 303)}},
         {"w", Shape{DType::F32, {dim, dim}}, {randoms(size_t(dim * dim), 304, -ws, ws)}, true},
         {"b", Shape{DType::F32, {dim}}, {randoms(size_t(dim), 305, -ws, ws)}, true}},
        record);
}

TEST(CompilerAttn, TheSoftmaxNormalizeIsComputedAsTheValuesDotLoadsP) {
    // The zoo's attention: `exp(s - max) / sum` has one reader, `P V`, which reads each element
    // of P once (V has d = 64 <= 128 free elements per head): the normalize and the exponential
    // it recomputes join the values dot's fusion, which reads the scores, the max and the sum;
    // P is never written. Per score element: the scores written (4 bytes), read by the max (4),
    // the sum (4) and the values dot (4): 16 bytes instead of 24.
    const Shape ps{DType::F32, {512, 768}};
    const auto build = [&](bool fuse) {
        Graph g;
        g.add_output(zoo_attention(g, g.input(ps, "q"), g.input(ps, "k"), g.input(ps, "v"),
                                   g.parameter(Shape{DType::F32, {768, 768}}, "w"),
                                   g.parameter(Shape{DType::F32, {768}}, "b"), 12),
                     "o");
        CompileOptions co;
        co.dot_operand_producers = fuse;
        return compile(g, co);
    };
    const CompiledStep s = build(true);
    // (The scale `s * 1/sqrt(d)`, a cheap multiply by a literal, is recomputed by each reader
    // of the scores rather than written scaled; the max is the scores dot's second result,
    // CompilerFusion.AReductionOfADotsResultJoinsTheDotsFusion.)
    EXPECT_EQ(fusion_ops(s),
              (std::vector<std::string>{
                  "output dot+multiply+reduce", "input multiply+subtract+exponential+reduce",
                  "output multiply+subtract+exponential+divide+dot", "output dot+add"}))
        << s.summary();
    const Fusion& values = s.fusions[2];
    ASSERT_EQ(values.operands.size(), 4u) << s.to_string();  // v, the scores, max, sum
    const std::vector<int64_t> scores{1, 12, 512, 512};
    int read = 0, written = 0;
    for (const FusionValue& o : values.operands) read += o.shape.dims == scores;
    for (const Fusion& f : s.fusions)
        for (const FusionValue& r : f.results) written += r.shape.dims == scores;
    EXPECT_EQ(read, 1) << s.to_string();     // the scores themselves
    EXPECT_EQ(written, 1) << s.to_string();  // only the scores: P is never written
    // Without operand fusion the normalize is a loop fusion writing P.
    EXPECT_EQ(fusion_ops(build(false)),
              (std::vector<std::string>{
                  "output dot+multiply+reduce", "input multiply+subtract+exponential+reduce",
                  "loop multiply+subtract+exponential+divide", "output dot", "output dot+add"}));
}

TEST(CompilerAttnDevice, TheZooAttentionWithTheNormalizeInItsValuesDotIsBitExact) {
    // Six heads of 64 (a period of two kernels, the vectors' row moving with the loop's pass):
    // the planner holds P (as P^T: its columns are the queries), so the steps take one value
    // per tile column (v.addrow of -max, a broadcast tile of the divide's factor).
    expect_attention_bit_exact(128, 6, 64, false, Stationary::Lhs);
    // Four heads of 128: P streams (its rows are the queries), so the max, the exponential and
    // the divide run on each streamed block as one value per row (v.subcol, v.exp, v.mulcol by
    // the divide's factor).
    expect_attention_bit_exact(128, 4, 128, false, Stationary::Rhs);
}

TEST(CompilerAttnDevice, PyTorchSimsAttentionWithTheNormalizeInItsValuesDotIsBitExact) {
    // `V^T P` over [H, keys, queries]: P is held (its columns are the queries), so the steps
    // take one value per column (v.addrow of -max, a broadcast tile of the divide's factor).
    expect_attention_bit_exact(128, 4, 64, true, Stationary::Rhs);
}

TEST(CompilerAttn, BertBaseAttentionFusionCycles) {
    // BERT-base: 12 heads, seq 512, d 64. One pass of the f32 [12, 512, 512] scores is
    // 12 582 912 bytes = 26 242 cycles at 479.5 B/cycle.
    for (bool fused : {false, true}) {
        const auto fs = attention_fusion_cycles(512, 12, 64, fused);
        uint64_t total = 0;
        for (const FusionCycles& f : fs) total += f.cycles;
        std::cout << fmt::format("[attention 12x512x64{}] total {} cycles\n",
                                 fused ? "" : " unfused", total);
        EXPECT_FALSE(fs.empty());
    }
}

}  // namespace
}  // namespace tpu::compiler
