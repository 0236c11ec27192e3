// SPDX-License-Identifier: Apache-2.0
// Buffer assignment: liveness reuse, in-place updates, the peak bytes per core.
#include <gtest/gtest.h>

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
    // a = x W (fusion 0); s = row sums of a (fusion 1); b = a * s per row (fusion 2, a's last
    // read, elementwise in a); y = b W2 (fusion 3). b takes a's buffer; the temps are a (= b),
    // 262 144 bytes, and s, 256 floats = 1 024 bytes: 263 168 bytes.
    Graph g;
    const ValueId x = g.input(kSquare, "x");
    const ValueId w = g.parameter(kSquare, "w"), w2 = g.parameter(kSquare, "w2");
    const ValueId a = matmul(g, x, w, false, false);
    const ValueId sum = reduce(g, a, {1}, Reducer::Sum);
    const ValueId b = mul(g, a, broadcast(g, sum, kSquare.dims, {0}));
    g.add_output(matmul(g, b, w2, false, false), "y");
    const CompiledStep s = compile(g);
    ASSERT_EQ(s.fusions.size(), 4u) << s.to_string();
    const BufferRef& ab = s.fusions[0].results[0].buffer;
    const BufferRef& bb = s.fusions[2].results[0].buffer;
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

}  // namespace
}  // namespace tpu::compiler
