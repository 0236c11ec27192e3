// SPDX-License-Identifier: Apache-2.0
// Buffer assignment: liveness reuse, in-place updates, the peak bytes per core.
#include <gtest/gtest.h>

#include <algorithm>

#include "compiler_test_util.h"

namespace tpu::compiler {
namespace {

const Shape kSquare{DType::F32, {256, 256}};  // 256 KiB, no tile padding

TEST(CompilerBuffers, AChainOfDotsReusesTempMemoryByLiveness) {
    // y = ((x W1) W2) W3) W4: four output fusions; h1, h2, h3 are temps of 256 x 256 x 4 =
    // 262 144 bytes, live [0, 1], [1, 2] and [2, 3] (fusion indices). A dot reads its operand
    // while it writes its result, so two temps are live at once: h1 and h3 share offset 0 and
    // h2 sits above them. Peak 2 x 262 144 = 524 288 bytes, against 3 x 262 144 = 786 432
    // without reuse.
    Graph g;
    ValueId h = g.input(kSquare, "x");
    for (int i = 1; i <= 4; ++i) {
        const ValueId w = g.parameter(kSquare, "w" + std::to_string(i));
        h = matmul(g, h, w, false, false);
    }
    g.add_output(h, "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 4u);
    EXPECT_EQ(s.memory.temp_bytes, 524288u);
    EXPECT_EQ(s.memory.temp_unshared_bytes, 786432u);
    EXPECT_EQ(s.fusions[0].results[0].buffer.offset, s.fusions[2].results[0].buffer.offset);
    EXPECT_NE(s.fusions[0].results[0].buffer.offset, s.fusions[1].results[0].buffer.offset);
    // Per core: 4 weights + x + y + temps = (4 + 1 + 1) x 262 144 + 524 288 bytes.
    EXPECT_EQ(s.memory.parameter_bytes, 4u * 262144u);
    EXPECT_EQ(s.memory.input_bytes, 262144u);
    EXPECT_EQ(s.memory.output_bytes, 262144u);
    EXPECT_EQ(s.memory.peak_bytes(), 6u * 262144u + 524288u);
    CompileOptions o;
    o.reuse_buffers = false;
    EXPECT_EQ(compile(g, o).memory.temp_bytes, 786432u);
}

TEST(CompilerBuffers, ALoopFusionOverwritesAnOperandItReadsForTheLastTime) {
    // a = x W and s = row sums of a (fusion 0: the dot's fusion computes the sums too);
    // b = a * s per row (fusion 1, a's last read, elementwise in a); y = b W2 (fusion 2). b
    // takes a's buffer; the temps are a (= b), 262 144 bytes, and s, 256 floats = 1 024 bytes:
    // 263 168 bytes.
    Graph g;
    const ValueId x = g.input(kSquare, "x");
    const ValueId w = g.parameter(kSquare, "w"), w2 = g.parameter(kSquare, "w2");
    const ValueId a = matmul(g, x, w, false, false);
    const ValueId sum = reduce(g, a, {1}, Reducer::Sum);
    const ValueId b = mul(g, a, broadcast(g, sum, kSquare.dims, {0}));
    g.add_output(matmul(g, b, w2, false, false), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 3u) << s.to_string();
    const auto of_a = std::find_if(s.fusions[0].results.begin(), s.fusions[0].results.end(),
                                   [&](const FusionValue& r) { return r.value == a; });
    ASSERT_NE(of_a, s.fusions[0].results.end()) << s.to_string();
    const BufferRef& ab = of_a->buffer;
    const BufferRef& bb = s.fusions[1].results[0].buffer;
    EXPECT_EQ(bb.space, BufferRef::Space::Temp);
    EXPECT_EQ(bb.offset, ab.offset);
    EXPECT_EQ(s.memory.temp_bytes, 263168u);
}

TEST(CompilerBuffers, AParameterUpdateIsInPlaceWhenNothingReadsTheOldValueLater) {
    // w' = w - g lr: one loop fusion reads w elementwise and writes w' over it.
    const Shape scalar{DType::F32, {}};
    {
        Graph g;
        const ValueId w = g.parameter(kSquare, "w");
        const ValueId grad = g.input(kSquare, "g"), lr = g.input(scalar, "lr");
        g.add_output(sub(g, w, mul(g, grad, broadcast(g, lr, kSquare.dims, {}))), "w", 0);
        const CompiledStep s = compile(g);
        EXPECT_EQ(s.outputs[0].buffer.space, BufferRef::Space::Parameter);
        EXPECT_EQ(s.memory.output_bytes, 0u);
    }
    {
        // A later fusion still reads the old w: the new value gets its own buffer (the runtime
        // swaps it in after the step).
        Graph g;
        const ValueId w = g.parameter(kSquare, "w");
        const ValueId grad = g.input(kSquare, "g"), lr = g.input(scalar, "lr");
        g.add_output(sub(g, w, mul(g, grad, broadcast(g, lr, kSquare.dims, {}))), "w", 0);
        g.add_output(matmul(g, grad, w, false, false), "y");
        const CompiledStep s = compile(g);
        EXPECT_EQ(s.outputs[0].buffer.space, BufferRef::Space::Output);
        EXPECT_EQ(s.memory.output_bytes, 2u * 262144u);
        // Values stay right either way.
        const Bindings b = test::random_bindings(g, 1);
        std::vector<std::vector<HostArray>> after;
        const auto out = evaluate_compiled(s, b, {}, &after);
        const auto ref = evaluate(decompose(g), b);
        EXPECT_TRUE(test::same_bits(out[0][1], ref[0][1]));
        EXPECT_TRUE(test::same_bits(after[0][0], ref[0][0]));
    }
}

/// The step's one collective fusion.
const Fusion& collective(const CompiledStep& s) {
    for (const Fusion& f : s.fusions)
        if (f.kind == FusionKind::Collective) return f;
    ADD_FAILURE() << "no collective fusion in\n" << s.to_string();
    return s.fusions.at(0);
}

/// Every output of `g`'s compiled step on two replicas equals the evaluator's on the graph.
void expect_values_of_the_graph(const Graph& g, const CompiledStep& s) {
    const Bindings b = test::random_bindings(g, 2);
    const auto out = evaluate_compiled(s, b);
    const auto ref = evaluate(decompose(g), b);
    for (size_t r = 0; r < 2; ++r)
        for (size_t i = 0; i < ref[r].size(); ++i)
            EXPECT_TRUE(test::same_bits(out[r][i], ref[r][i]))
                << "replica " << r << " output " << i;
}

TEST(CompilerBuffers, AnAllReduceReducesInItsOperandsBufferWhenNothingReadsItLater) {
    // a = x W (fusion 0); s = allreduce(a) (fusion 1, a's last read); y = s W2 (fusion 2). The
    // all-reduce is an in-place op (XLA's in-place input/output pair): s takes a's buffer, so the
    // temps are one 262 144-byte buffer, live [0, 2], where they were a [0, 1] and s [1, 2], two
    // buffers live at fusion 1: 524 288 bytes.
    Graph g;
    const ValueId x = g.input(kSquare, "x");
    const ValueId w = g.parameter(kSquare, "w"), w2 = g.parameter(kSquare, "w2");
    const ValueId s = all_reduce(g, matmul(g, x, w, false, false), 0.5);
    g.add_output(matmul(g, s, w2, false, false), "y");
    const CompiledStep st = compile(g);
    ASSERT_EQ(st.fusions.size(), 3u) << st.to_string();
    const Fusion& f = collective(st);
    EXPECT_EQ(f.results[0].buffer.space, BufferRef::Space::Temp);
    EXPECT_EQ(f.results[0].buffer, f.operands[0].buffer);
    EXPECT_EQ(st.memory.temp_bytes, 262144u);
    expect_values_of_the_graph(g, st);
    // Without buffer reuse each value keeps its own buffer (and the kernel copies first).
    CompileOptions o;
    o.reuse_buffers = false;
    const CompiledStep apart = compile(g, o);
    EXPECT_NE(collective(apart).results[0].buffer, collective(apart).operands[0].buffer);
    EXPECT_EQ(apart.memory.temp_bytes, 524288u);
}

TEST(CompilerBuffers, AnAllReducedOutputHoldsItsOperandWhenNothingReadsItLater) {
    // y = allreduce(x W) is an output: its own allocation, and x W (a temp that only the
    // all-reduce reads) is written there, so the all-reduce reduces where it lies; no temps.
    Graph g;
    const ValueId x = g.input(kSquare, "x");
    const ValueId w = g.parameter(kSquare, "w");
    g.add_output(all_reduce(g, matmul(g, x, w, false, false), 0.5), "y");
    const CompiledStep st = compile(g);
    const Fusion& f = collective(st);
    EXPECT_EQ(f.operands[0].buffer.space, BufferRef::Space::Output);
    EXPECT_EQ(f.operands[0].buffer, st.outputs[0].buffer);
    EXPECT_EQ(f.results[0].buffer, st.outputs[0].buffer);
    EXPECT_EQ(st.fusions[0].results[0].buffer, st.outputs[0].buffer);
    EXPECT_EQ(st.memory.temp_bytes, 0u);
    EXPECT_EQ(st.memory.output_bytes, 262144u);
    expect_values_of_the_graph(g, st);
}

TEST(CompilerBuffers, AnAllReduceKeepsItsOperandWhenItIsReadLaterOrOutlivesTheStep) {
    const auto apart = [](const CompiledStep& st) {
        const Fusion& f = collective(st);
        return !(f.results[0].buffer == f.operands[0].buffer);
    };
    {
        // a = x W is read again after the all-reduce (z = a W3): s gets a buffer of its own.
        Graph g;
        const ValueId x = g.input(kSquare, "x");
        const ValueId w = g.parameter(kSquare, "w"), w2 = g.parameter(kSquare, "w2");
        const ValueId w3 = g.parameter(kSquare, "w3");
        const ValueId a = matmul(g, x, w, false, false);
        g.add_output(matmul(g, all_reduce(g, a, 0.5), w2, false, false), "y");
        g.add_output(matmul(g, a, w3, false, false), "z");
        const CompiledStep st = compile(g);
        EXPECT_TRUE(apart(st)) << st.to_string();
        expect_values_of_the_graph(g, st);
    }
    {
        // a is an output too: it must survive the step, so the all-reduce does not take it.
        Graph g;
        const ValueId x = g.input(kSquare, "x");
        const ValueId w = g.parameter(kSquare, "w"), w2 = g.parameter(kSquare, "w2");
        const ValueId a = matmul(g, x, w, false, false);
        g.add_output(a, "a");
        g.add_output(matmul(g, all_reduce(g, a, 0.5), w2, false, false), "y");
        const CompiledStep st = compile(g);
        EXPECT_TRUE(apart(st)) << st.to_string();
        EXPECT_EQ(collective(st).operands[0].buffer.space, BufferRef::Space::Output);
        expect_values_of_the_graph(g, st);
    }
    {
        // Step inputs and parameters are the runtime's buffers: an all-reduced output of each
        // has its own allocation.
        Graph g;
        g.add_output(all_reduce(g, g.input(kSquare, "x"), 1.0), "y");
        g.add_output(all_reduce(g, g.parameter(kSquare, "w"), 1.0), "z");
        const CompiledStep st = compile(g);
        ASSERT_EQ(st.fusions.size(), 2u) << st.to_string();
        for (const Fusion& f : st.fusions) {
            EXPECT_EQ(f.results[0].buffer.space, BufferRef::Space::Output);
            EXPECT_NE(f.operands[0].buffer.space, BufferRef::Space::Output);
        }
        expect_values_of_the_graph(g, st);
    }
}

TEST(CompilerBuffers, AnAllReduceUpdatingItsParameterIsInPlace) {
    // w' = allreduce(w) replaces w, and nothing reads the old w later: written over w, as an
    // elementwise update is (the all-reduce's operand and result are an in-place pair).
    Graph g;
    const ValueId w = g.parameter(kSquare, "w");
    g.add_output(all_reduce(g, w, 0.5), "w", 0);
    const CompiledStep st = compile(g);
    EXPECT_EQ(st.outputs[0].buffer.space, BufferRef::Space::Parameter);
    EXPECT_EQ(st.memory.output_bytes, 0u);
    EXPECT_EQ(collective(st).results[0].buffer, collective(st).operands[0].buffer);
    const Bindings b = test::random_bindings(g, 2);
    std::vector<std::vector<HostArray>> after;
    evaluate_compiled(st, b, {}, &after);
    const auto ref = evaluate(decompose(g), b);
    for (size_t r = 0; r < 2; ++r) EXPECT_TRUE(test::same_bits(after[r][0], ref[r][0]));
}

}  // namespace
}  // namespace tpu::compiler
