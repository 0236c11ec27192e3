// SPDX-License-Identifier: Apache-2.0
// The zoo's BERT block as trainer/record.* records it (`tpusim model bert-block --engine
// compiled`): attention over [1, H, S, d] with batch dims {0, 1} (the unit batch of sequences
// folded away), GELU's power in fc_1's epilogue, the heads merged by a reshape the out
// projection reads through (compiler/README.md, "Output fusions of a dot"). Bit-exact with
// the host evaluator on the device, race detector on, one launch; and the probe of which of
// its fusions still fall back.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "compiler_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

std::vector<float> randoms(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) &&
            !(std::isnan(a[i]) && std::isnan(b[i])))
            return false;
    return true;
}

/// The zoo's encoder block (trainer/module.cpp, TransformerBlock::record, post-LN) on x
/// [seq, hidden]: h = ln_1(x + attn(x)), y = ln_2(h + fc_2(act(fc_1(h)))), the attention as
/// MultiheadAttention::record writes it (q k^T over [B, H, S, d] with batch dims {0, 1}, times
/// fp32(1/sqrt(d)), softmax over dim 3, p v, the heads merged back by transpose and reshape).
/// `params` are the leaves in the order of bert_leaves.
ValueId zoo_block(Graph& g, ValueId x, const std::vector<ValueId>& params, int64_t heads,
                  bool gelu_act, int upto = 0) {
    const int64_t rows = g.shape(x).dims[0], dim = g.shape(x).dims[1], d = dim / heads;
    const int64_t seq = rows, batch = 1;
    const auto lin = [&](ValueId in, size_t i) { return linear(g, in, params[i], params[i + 1]); };
    const ValueId qp = lin(x, 0), kp = lin(x, 2), vp = lin(x, 4);
    const auto split = [&](ValueId t) {
        return transpose(g, reshape(g, t, {batch, seq, heads, d}), {0, 2, 1, 3});
    };
    DotDims sd;
    sd.lhs_batch = sd.rhs_batch = {0, 1};
    sd.lhs_contracting = sd.rhs_contracting = {3};
    ValueId s = dot(g, split(qp), split(kp), sd);
    if (upto == 1) return s;
    s = mul(g, s, full(g, double(1.0f / std::sqrt(float(d))), g.shape(s)));
    if (upto == 2) return s;
    const ValueId p = softmax(g, s, 3);
    if (upto == 3) return p;
    DotDims od;
    od.lhs_batch = od.rhs_batch = {0, 1};
    od.lhs_contracting = {3};
    od.rhs_contracting = {2};
    const ValueId o = dot(g, p, split(vp), od);
    if (upto == 4) return o;
    const ValueId merged = reshape(g, transpose(g, o, {0, 2, 1, 3}), {rows, dim});
    const ValueId h = layer_norm(g, add(g, x, lin(merged, 6)), params[8], params[9], 1e-5).y;
    const ValueId f1 = lin(h, 10);
    const ValueId a = gelu_act ? gelu(g, f1, true) : relu(g, f1);
    return layer_norm(g, add(g, h, lin(a, 12)), params[14], params[15], 1e-5).y;
}

struct Leaf {
    std::string name;
    Shape shape;
    std::vector<float> values;
};

std::vector<Leaf> bert_leaves(int64_t seq, int64_t dim, int64_t ffn) {
    const auto sh = [](std::vector<int64_t> d) { return Shape{DType::F32, std::move(d)}; };
    const float ws = 1.0f / std::sqrt(float(dim)), fs = 1.0f / std::sqrt(float(ffn));
    std::vector<Leaf> l;
    uint32_t seed = 300;
    for (const char* n : {"q", "k", "v", "out"}) {
        l.push_back({fmt::format("{}.weight", n), sh({dim, dim}),
                     randoms(size_t(dim * dim), seed++, -ws, ws)});
        l.push_back({fmt::format("{}.bias", n), sh({dim}), randoms(size_t(dim), seed++, -ws, ws)});
    }
    l.push_back({"ln_1.weight", sh({dim}), randoms(size_t(dim), seed++, 0.5f, 1.5f)});
    l.push_back({"ln_1.bias", sh({dim}), randoms(size_t(dim), seed++)});
    l.push_back({"fc_1.weight", sh({ffn, dim}), randoms(size_t(ffn * dim), seed++, -ws, ws)});
    l.push_back({"fc_1.bias", sh({ffn}), randoms(size_t(ffn), seed++, -ws, ws)});
    l.push_back({"fc_2.weight", sh({dim, ffn}), randoms(size_t(ffn * dim), seed++, -fs, fs)});
    l.push_back({"fc_2.bias", sh({dim}), randoms(size_t(dim), seed++, -fs, fs)});
    l.push_back({"ln_2.weight", sh({dim}), randoms(size_t(dim), seed++, 0.5f, 1.5f)});
    l.push_back({"ln_2.bias", sh({dim}), randoms(size_t(dim), seed++)});
    return l;
}

Graph zoo_graph(int64_t seq, int64_t dim, int64_t heads, int64_t ffn, bool gelu_act) {
    Graph g;
    const ValueId x = g.input(Shape{DType::F32, {seq, dim}}, "x");
    std::vector<ValueId> ps;
    for (const Leaf& l : bert_leaves(seq, dim, ffn)) ps.push_back(g.parameter(l.shape, l.name));
    g.add_output(zoo_block(g, x, ps, heads, gelu_act), "y");
    return g;
}

/// The fusions of `step` that code generation sends to the host, printed; returns how many.
size_t probe(const std::string& what, const CompiledStep& step) {
    CodegenOptions cg;
    cg.board = hw::BoardConfig::load("", {});
    cg.host_fallback = true;
    const StepProgram p = generate_step(step, cg);
    size_t all = 0;
    for (const ProgramSegment& s : p.segments) {
        if (s.fallback.empty()) continue;
        ++all;
        std::cout << "[probe] " << what << ": " << s.fallback << "\n";
    }
    std::cout << "[probe] " << what << ": " << all << " of " << step.fusions.size()
              << " fusions fall back\n";
    if (all && std::getenv("TPUSIM_PROBE_DUMP")) std::cout << step.to_string();
    return all;
}

/// Runs the block on the device (race detector on, host fallback for the `fallbacks` fusions
/// not generated yet) and on the evaluator; expects equal bits, and one launch when every
/// fusion is generated.
void expect_block_bit_exact(int64_t seq, int64_t dim, int64_t heads, int64_t ffn, bool gelu_act,
                            uint64_t fallbacks, int upto = 0) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.host_fallback = fallbacks > 0;
    DeviceBackend device(*dev, {0}, cg);
    HostBackend host(1);
    const std::vector<Leaf> leaves = bert_leaves(seq, dim, ffn);
    const std::vector<float> xv = randoms(size_t(seq * dim), 299);
    const auto run = [&](Backend& backend) {
        LazyContext ctx(backend);
        std::vector<ValueId> ps;
        const LazyTensor x = ctx.input("x", Shape{DType::F32, {seq, dim}}, {xv});
        std::vector<LazyTensor> ts;
        for (const Leaf& l : leaves) ts.push_back(ctx.parameter(l.name, l.shape, {l.values}));
        for (const LazyTensor& t : ts) ps.push_back(ctx.value(t));
        const LazyTensor y =
            ctx.wrap(zoo_block(ctx.graph(), ctx.value(x), ps, heads, gelu_act, upto));
        ctx.mark_step();
        return ctx.to_host(y, 0);
    };
    const uint64_t launches = dev->metrics().launches;
    const auto got = run(device);
    if (!fallbacks) {
        EXPECT_EQ(dev->metrics().launches - launches, 1u) << "one launch per step";
    }
    EXPECT_EQ(device.stats().fallback_fusions, fallbacks);
    for (const auto& [why, n] : device.stats().fallbacks)
        std::cout << "[fallback] " << n << "x " << why << "\n";
    const auto want = run(host);
    EXPECT_TRUE(same_bits(got, want)) << "max rel error " << test::max_rel_error(got, want);
    if (std::getenv("TPUSIM_BERT_DIFF"))
        for (size_t i = 0, shown = 0; i < got.size() && shown < 10; ++i)
            if (got[i] != want[i]) {
                std::cout << i << ": " << got[i] << " vs " << want[i] << "\n";
                ++shown;
            }
    std::cout << fmt::format("[bert {}x{} {} heads {}] {} cycles\n", seq, dim, heads,
                             gelu_act ? "gelu" : "relu", device.stats().last_step_cycles);
}

TEST(CompilerBertProbe, TheZooBlockAtItsDefaultSize) {
    // Was 6 of 17 fusions on the host (tpusim model bert-block --engine compiled).
    EXPECT_EQ(probe("zoo bert block 512x768, 12 heads, gelu",
                    compile(zoo_graph(512, 768, 12, 3072, true))),
              0u);
    EXPECT_EQ(probe("zoo bert block 512x768, 12 heads, relu",
                    compile(zoo_graph(512, 768, 12, 3072, false))),
              0u);
}

TEST(CompilerBertDevice, TheAttentionIsBitExactStageByStage) {
    // Scores, scaled, probabilities, p v ([1, H, S, d]: the unit batch folded away), with
    // heads of 64 lanes (two per tile, as the zoo's 768 / 12) and of 128 (a whole tile
    // column: the window's bands are the projection's band of tiles apart).
    for (int64_t heads : {4, 2})
        for (int upto = 1; upto <= 4; ++upto) {
            SCOPED_TRACE(fmt::format("{} heads, stage {}", heads, upto));
            expect_block_bit_exact(128, 256, heads, 512, true, 0, upto);
        }
}

TEST(CompilerBertDevice, TheZooBlockWithGeluIsBitExact) {
    expect_block_bit_exact(128, 256, 2, 512, true, 0);
}

TEST(CompilerBertDevice, TheZooBlockWithReluIsBitExact) {
    expect_block_bit_exact(128, 256, 2, 512, false, 0);
}

}  // namespace
}  // namespace tpu::compiler
