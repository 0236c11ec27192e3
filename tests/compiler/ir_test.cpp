// SPDX-License-Identifier: Apache-2.0
// The IR: recording checks, the printer, the structural hash, layouts.
#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/ir.h"

namespace tpu::compiler {
namespace {

const Shape kX{DType::F32, {2, 3}};
const Shape kW{DType::F32, {4, 3}};

/// relu(x W^T), with the linear in scope "fc".
Graph small_graph(const std::string& wname = "w") {
    Graph g;
    const ValueId x = g.input(kX, "x");
    const ValueId w = g.parameter(kW, wname);
    ValueId y;
    {
        const ScopeGuard s(g, "fc");
        y = linear(g, x, w, kNoValue);
    }
    g.add_output(relu(g, y), "y");
    return g;
}

std::string body(const std::string& listing) {
    return listing.substr(listing.find('\n') + 1);
}

TEST(CompilerIr, PrinterListsOpsLikeHlo) {
    EXPECT_EQ(
        body(small_graph().to_string()),
        "  %0 = f32[2,3] input(0) \"x\"\n"
        "  %1 = f32[4,3] parameter(0) \"w\"\n"
        "  %2 = f32[2,4] dot(%0, %1), lhs_contracting_dims={1}, rhs_contracting_dims={1}  # fc\n"
        "  %3 = f32[2,4] relu(%2)\n"
        "  output %3 \"y\"\n"
        "}\n");
}

TEST(CompilerIr, MultiResultOpsPrintATuple) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {4, 8}}, "x");
    const ValueId gamma = g.parameter(Shape{DType::F32, {8}}, "g");
    const ValueId beta = g.parameter(Shape{DType::F32, {8}}, "b");
    layer_norm(g, x, gamma, beta, 1e-5);
    EXPECT_NE(g.to_string().find("%3, %4, %5 = (f32[4,8], f32[4,1], f32[4,1]) layer-norm(%0, %1, "
                                 "%2), epsilon=1e-05"),
              std::string::npos)
        << g.to_string();
}

TEST(CompilerIr, ShapeErrorsNameTheOpTheDimsAndTheScope) {
    Graph g;
    const ValueId x = g.input(kX, "x");
    const ValueId w = g.parameter(kW, "w");
    const ScopeGuard s(g, "block.fc");
    try {
        matmul(g, x, w, false, false);
        FAIL() << "a 2x3 by 4x3 matmul was recorded";
    } catch (const CompileError& e) {
        EXPECT_STREQ(e.what(),
                     "dot: lhs contracting dim 1 has 3 elements, rhs contracting dim 0 "
                     "has 4 (in block.fc)");
    }
    EXPECT_THROW(add(g, x, w), CompileError);
    EXPECT_THROW(reshape(g, x, {5}), CompileError);
    EXPECT_THROW(transpose(g, x, {0, 0}), CompileError);
    EXPECT_THROW(reduce(g, x, {2}, Reducer::Sum), CompileError);
    EXPECT_THROW(exp(g, convert(g, x, DType::S32)), CompileError);
    EXPECT_THROW(g.add_output(99), CompileError);
    EXPECT_THROW(g.add_output(x, "x", 3), CompileError);  // there is one parameter
    EXPECT_THROW(g.constant(kX, {1.0f}), CompileError);   // 6 values needed
    EXPECT_THROW(g.parameter(kX, "p", Layout{{0, 0}, {}}), CompileError);
}

TEST(CompilerIr, HashIsStructuralNotNamesOrConstantValues) {
    const uint64_t h = small_graph().hash();
    EXPECT_EQ(small_graph("another name").hash(), h);
    Graph a, b;
    a.add_output(a.constant(kX, std::vector<float>(6, 1.0f)));
    b.add_output(b.constant(kX, std::vector<float>(6, 2.0f)));
    EXPECT_EQ(a.hash(), b.hash());
    // A new shape, a new attribute, a new layout or a new literal is a new graph.
    Graph c;
    c.add_output(c.constant(Shape{DType::F32, {3, 2}}, std::vector<float>(6, 1.0f)));
    EXPECT_NE(c.hash(), a.hash());
    Graph d, e;
    d.add_output(literal(d, 0.5));
    e.add_output(literal(e, 0.25));
    EXPECT_NE(d.hash(), e.hash());
    Graph f;
    f.add_output(f.parameter(kX, "x", row_major(2)));
    Graph f2;
    f2.add_output(f2.parameter(kX, "x"));
    EXPECT_NE(f.hash(), f2.hash());
    EXPECT_EQ(small_graph().fingerprint(), small_graph("w2").fingerprint());
}

TEST(CompilerIr, TiledLayoutsPadAndOrderAsXla) {
    const Layout t8{{1, 0}, {8, 128}};
    // f32[5,130] in 8x128 tiles: 1 x 2 tiles of 8 x 128 floats = 8 x 256 x 4 bytes.
    EXPECT_EQ(layout_bytes(Shape{DType::F32, {5, 130}}, t8), 8192u);
    // f32[16,256]: tiles (row-major grid 2 x 2) of 1024 elements; (9, 130) lies in tile (1, 1)
    // = the fourth, at (9 % 8) x 128 + 130 % 128 = 130 inside it: 3 x 1024 + 130.
    EXPECT_EQ(physical_index(Shape{DType::F32, {16, 256}}, t8, {9, 130}), 3202u);
    // Column-major f32[2,3]: dim 1 major, so (1, 2) is at 2 x 2 + 1.
    EXPECT_EQ(physical_index(kX, Layout{{0, 1}, {}}, {1, 2}), 5u);
    EXPECT_EQ(layout_bytes(Shape{DType::BF16, {3}}, row_major(1)), 6u);
    EXPECT_EQ(Layout({{1, 0}, {8, 128}}).to_string(), "{1,0:T(8,128)}");
}

TEST(CompilerIr, ExtractKeepsWhatTheOutputsNeedAndRenumbersLeaves) {
    Graph g;
    const ValueId a = g.parameter(kX, "a");
    const ValueId b = g.parameter(kX, "b");
    const ValueId c = g.input(kX, "c");
    const ValueId ab = add(g, a, b);
    const ValueId bc = mul(g, b, c);
    g.add_output(ab, "ab");
    std::vector<ValueId> map;
    const Graph e = g.extract({Output{bc, "bc", 0}}, &map);  // bc replaces parameter 0 (a)
    // a is kept: the output updates it. b is parameter 1, c input 0.
    EXPECT_EQ(e.leaves(OpKind::Parameter).size(), 2u);
    EXPECT_EQ(e.outputs().size(), 1u);
    EXPECT_EQ(e.outputs()[0].updates_parameter, 0);
    EXPECT_EQ(map[e.outputs()[0].value], bc);
    EXPECT_EQ(e.ops().size(), 4u);  // a, b, c, multiply
}

}  // namespace
}  // namespace tpu::compiler
