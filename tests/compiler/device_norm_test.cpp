// SPDX-License-Identifier: Apache-2.0
// Softmax and layer norm as XLA compiles them (compiler/README.md, "Fusion" and "Loop and input
// fusions"): which fusions, how many bytes each streams through HBM, and every generated fusion
// bit-exact with the host evaluator on the device (race detector on, one launch).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <set>

#include <fmt/format.h>

#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::fusions_of;
using test::random_bindings;

/// Bytes a step's fusions move through HBM: every operand read once and every result written
/// once (each fusion streams its arrays in one pass).
uint64_t streamed_bytes(const CompiledStep& s) {
    uint64_t n = 0;
    for (const Fusion& f : s.fusions) {
        for (const FusionValue& v : f.operands) n += uint64_t(v.shape.elements()) * 4;
        for (const FusionValue& v : f.results) n += uint64_t(v.shape.elements()) * 4;
    }
    return n;
}

/// Runs `g` on one core (race detector on) and on the host evaluator with the same random data;
/// expects every output bit-exact and one launch; returns the step's device cycles.
uint64_t run_bit_exact(const Graph& g, uint32_t seed = 1) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    HostBackend host(1);
    CompileOptions co;
    co.board = cfg;
    const CompiledStep step = compile(g, co);
    const Bindings b = random_bindings(g, 1, seed);
    const auto upload = [&](Backend& be, const std::vector<std::vector<HostArray>>& per) {
        std::vector<DataPtr> out;
        if (per.empty()) return out;
        for (const HostArray& a : per[0])
            out.push_back(be.upload(a.shape, {std::vector<float>(a.data.begin(), a.data.end())}));
        return out;
    };
    const auto run = [&](Backend& be) {
        const auto outs = be.execute(step, upload(be, b.parameters), upload(be, b.inputs));
        std::vector<std::vector<float>> r;
        for (const auto& o : outs) r.push_back(be.download(o, 0));
        return r;
    };
    const auto got = run(device), want = run(host);
    for (size_t i = 0; i < want.size(); ++i) {
        const auto& x = got[i];
        const auto& y = want[i];
        size_t bad = x.size() == y.size() ? x.size() : 0;
        for (size_t e = 0; e < std::min(x.size(), y.size()); ++e)
            if (std::bit_cast<uint32_t>(x[e]) != std::bit_cast<uint32_t>(y[e]) &&
                !(std::isnan(x[e]) && std::isnan(y[e]))) {
                bad = e;
                break;
            }
        EXPECT_EQ(bad, x.size()) << "output " << i << " element " << bad << "\n"
                                 << step.to_string();
    }
    EXPECT_EQ(device.stats().launches, 1u) << "one launch per step";
    EXPECT_EQ(device.stats().fallback_fusions, 0u);
    return device.stats().last_step_cycles;
}

TEST(CompilerNorm, SoftmaxRecomputesItsExponentialsInTheNormalize) {
    // PyTorch/XLA's softmax (softmax_builder.cpp): max, exp(x - max), its sum, exp / sum.
    // PriorityFusion (xla/service/gpu/transforms/priority_fusion.cc) fuses exp(x - max) into
    // both of its consumers when that is faster: the sum's fusion and the divide's recompute it
    // from x instead of one of them writing it for the other. Three passes over x:
    // 4 + 4 + (4 + 4) = 16 bytes per element (the exponentials written and read back were 20).
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {512, 512}}, "x");
    g.add_output(softmax(g, x, 1), "y");
    const CompiledStep s = compile(g);
    EXPECT_EQ(fusions_of(s),
              (std::vector<std::string>{"input:reduce", "input:exponential,reduce,subtract",
                                        "loop:divide,exponential,subtract"}))
        << s.to_string();
    EXPECT_EQ(s.fusions[1].results.size(), 1u) << "the sum only";
    // x read by three fusions and y written: 4 x 512 x 512 values; the [512] max written
    // once and read twice, the sum written once and read once: 5 x 512.
    EXPECT_EQ(streamed_bytes(s), (4u * 512 * 512 + 5u * 512) * 4) << s.to_string();
}

TEST(CompilerNorm, AttentionSoftmaxOverKeysRecomputesToo) {
    // softmax(dim=-2) of [heads, keys, queries] (the validation rows' attention): the same
    // three passes, the reductions over the middle dim.
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {4, 256, 256}}, "scores");
    g.add_output(softmax(g, x, 1), "p");
    const CompiledStep s = compile(g);
    EXPECT_EQ(fusions_of(s),
              (std::vector<std::string>{"input:reduce", "input:exponential,reduce,subtract",
                                        "loop:divide,exponential,subtract"}))
        << s.to_string();
}

TEST(CompilerNorm, LayerNormIsTwoPassesOverX) {
    // PyTorch's layer norm through batch-norm training (aten math_native_layer_norm) and
    // batchnorm_expander.cc: Sum[X] and Sum[X^2] read x once (sibling multi-output fusion),
    // E[X] and rsqrt(Var + eps) are tiny [rows] fusions, the normalize reads x again.
    // Unchanged by the recompute rule: x * x is read by its reduction only.
    Graph g;
    const int64_t rows = 512, cols = 768;
    const ValueId x = g.input(Shape{DType::F32, {rows, cols}}, "x");
    const ValueId w = g.parameter(Shape{DType::F32, {cols}}, "ln.weight");
    const ValueId b = g.parameter(Shape{DType::F32, {cols}}, "ln.bias");
    g.add_output(layer_norm(g, x, w, b, 1e-5).y, "y");
    const CompiledStep s = compile(g);
    EXPECT_EQ(fusions_of(s),
              (std::vector<std::string>{"input:multiply,reduce,reshape", "loop:divide",
                                        "loop:add,divide,multiply,rsqrt,subtract",
                                        "loop:add,multiply,reshape,subtract"}))
        << s.to_string();
    EXPECT_EQ(s.fusions[0].results.size(), 2u) << "Sum[X] and Sum[X^2] in one pass";
}

TEST(CompilerNorm, SoftmaxFusionsAreBitExactOnTheDevice) {
    {
        Graph g;  // rows of 768: six lane chunks, bands of 8 rows
        g.add_output(softmax(g, g.input(Shape{DType::F32, {64, 768}}, "x"), 1), "y");
        run_bit_exact(g);
    }
    {
        Graph g;  // a padded lane chunk (300 = 2 x 128 + 44)
        g.add_output(softmax(g, g.input(Shape{DType::F32, {40, 300}}, "x"), 1), "y");
        run_bit_exact(g, 2);
    }
    {
        // The minor dim of [1, heads, S, C] scores with S = 200: its [1, 3, 200] max and sum in
        // T(8,128) tiles, moved in runs that end at a lane chunk (128) or a group (200).
        Graph g;
        g.add_output(softmax(g, g.input(Shape{DType::F32, {1, 3, 200, 256}}, "s"), 3), "p");
        run_bit_exact(g, 5);
    }
    {
        Graph g;  // attention's softmax over the keys of [heads, keys, queries]
        g.add_output(softmax(g, g.input(Shape{DType::F32, {3, 64, 256}}, "s"), 1), "p");
        run_bit_exact(g, 3);
    }
}

TEST(CompilerNorm, LayerNormFusionsAreBitExactOnTheDevice) {
    Graph g;
    const int64_t rows = 64, cols = 768;
    const ValueId x = g.input(Shape{DType::F32, {rows, cols}}, "x");
    const ValueId w = g.parameter(Shape{DType::F32, {cols}}, "ln.weight");
    const ValueId b = g.parameter(Shape{DType::F32, {cols}}, "ln.bias");
    g.add_output(layer_norm(g, x, w, b, 1e-5).y, "y");
    run_bit_exact(g, 4);
}

/// Device cycles of `g`'s one step (no race detector: timing only).
uint64_t cycles_of(const Graph& g) {
    const auto cfg = hw::BoardConfig::load("", {"sim.functional=false"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, {0}, cg);
    CompileOptions co;
    co.board = cfg;
    const CompiledStep step = compile(g, co);
    const Bindings b = random_bindings(g, 1, 1);
    std::vector<DataPtr> ps, is;
    for (const HostArray& a : b.parameters.at(0))
        ps.push_back(device.upload(a.shape, {std::vector<float>(a.data.begin(), a.data.end())}));
    for (const HostArray& a : b.inputs.at(0))
        is.push_back(device.upload(a.shape, {std::vector<float>(a.data.begin(), a.data.end())}));
    device.execute(step, ps, is);
    return device.stats().last_step_cycles;
}

TEST(CompilerNorm, TheAttentionSoftmaxStreamsAtTheRowsRate) {
    // The BERT block's softmax reduces the minor dim of [1, heads, seq, seq] scores; its max
    // and sum are [1, heads, seq] arrays in T(8,128) tiles, whose values each band reads or
    // writes. The same softmax over [heads x seq, seq] rows has untiled [rows] vectors. Both
    // stream the same bytes (16 per element) and should take the same time: moving a tile's
    // vector values in runs of a lane chunk keeps the sequencer off the critical path (per
    // band it was about 45 sequencer cycles for 34 cycles of HBM: 1.3x the time in the BERT block).
    Graph a, r;
    const ValueId s = a.input(Shape{DType::F32, {1, 4, 512, 512}}, "s");
    a.add_output(softmax(a, s, 3), "p");
    r.add_output(softmax(r, r.input(Shape{DType::F32, {2048, 512}}, "s"), 1), "p");
    const CompiledStep step = compile(a);
    ASSERT_EQ(step.fusions.size(), 3u);
    EXPECT_FALSE(step.fusions[0].results.at(0).layout.tile.empty()) << step.to_string();
    const uint64_t tiled = cycles_of(a), rows = cycles_of(r);
    EXPECT_LE(double(tiled), 1.03 * double(rows)) << tiled << " vs " << rows;
}

}  // namespace
}  // namespace tpu::compiler
