// SPDX-License-Identifier: Apache-2.0
// Transformers models at batch 128 as tpusim.torch records them (python/README.md, "Timing
// transformers models"; compiler/README.md, "Batches of sequences whole on the device"): the
// fusions that still ran on the host, each reproduced and run bit-exact on the device against
// the evaluator, race detector on, one launch.
#include <gtest/gtest.h>

#include <cmath>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "device_test_util.h"
#include "hw/board_config.h"

namespace tpu::compiler {
namespace {

using test::aten_linear;
using test::expect_bit_exact;
using test::f32;
using test::Leaf;
using test::randoms;
using test::Record;

/// The step `record` over `leaves` compiles to on the default board (its leaves' layouts).
CompiledStep compiled(const std::vector<Leaf>& leaves, const Record& record) {
    Graph g;
    std::vector<ValueId> v;
    for (const Leaf& l : leaves)
        v.push_back(l.parameter ? g.parameter(l.shape, l.name) : g.input(l.shape, l.name));
    g.add_output(record(g, v));
    CompileOptions co;
    co.board = hw::BoardConfig::load("", {});
    return compile(g, co);
}

TEST(CompilerPyHost3, AGeluDotOf4096RowsSplitsItsRowsSoItsEpilogueFits) {
    // BERT's fc_1 at batch 128 of 32 tokens: [4096, 192] x [192, 768] with erf's GELU in the
    // epilogue. The erf takes the epilogue's scratch tiles, each a block of rows of one
    // 128-column panel: at the 4096-row block the kernel plans by its own estimate, the areas
    // alone exceed VMEM (before: "a dot whose epilogue does not fit in VMEM beside it", a host
    // fusion); a shorter block (more passes over the held weight) fits.
    constexpr int64_t B = 128, S = 32, D = 192, F = 768;
    const float ws = 1.0f / std::sqrt(float(D));
    const std::vector<Leaf> leaves{{"x", f32({B, S, D}), {randoms(size_t(B * S * D), 71)}},
                                   {"w", f32({F, D}), {randoms(size_t(F * D), 72, -ws, ws)}, true},
                                   {"b", f32({F}), {randoms(size_t(F), 73, -ws, ws)}, true}};
    const auto st = expect_bit_exact(leaves, [](Graph& g, const std::vector<ValueId>& v) {
        return gelu(g, aten_linear(g, v[0], v[1], v[2]), false);
    });
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerPyHost3, APositionTableRepeatedOverTheBatchIsReadAsTheSumItsFusionWrites) {
    // GPT-2 at batch B: hidden = wte(ids) + wpe(positions), the [S, D] table broadcast over the
    // batch, read by ln_1 and by the first c_proj's residual add. Fusion kept the sum's
    // recomputation out of the dot's epilogue only for broadcasts along the rows; a table
    // repeated along the batch is no side of the epilogue either (before: "a broadcast
    // f32[32,192] -> f32[2,32,192] in the epilogue", a host fusion), so the epilogue reads the
    // sum where the embeddings' fusion writes it.
    constexpr int64_t B = 4, S = 32, D = 192;
    const float ws = 1.0f / std::sqrt(float(D));
    const std::vector<Leaf> leaves{
        {"inputs_embeds", f32({B * S, D}), {randoms(size_t(B * S * D), 81)}},
        {"wpe", f32({S, D}), {randoms(size_t(S * D), 82)}, true},
        {"ln.weight", f32({D}), {randoms(size_t(D), 83)}, true},
        {"ln.bias", f32({D}), {randoms(size_t(D), 84)}, true},
        {"c_attn.weight", f32({D, D}), {randoms(size_t(D * D), 85, -ws, ws)}, true},
        {"c_attn.bias", f32({D}), {randoms(size_t(D), 86, -ws, ws)}, true},
        {"c_proj.weight", f32({D, D}), {randoms(size_t(D * D), 87, -ws, ws)}, true},
        {"c_proj.bias", f32({D}), {randoms(size_t(D), 88, -ws, ws)}, true}};
    // The attention between c_attn and c_proj left out: c_proj's residual is what matters.
    const auto record = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId hidden =
            add(g, reshape(g, v[0], {B, S, D}), broadcast(g, v[1], {B, S, D}, {1, 2}));
        const ValueId ln = layer_norm(g, hidden, v[2], v[3], 1e-5).y;
        const ValueId a = aten_linear(g, ln, v[4], v[5]);
        return add(g, aten_linear(g, a, v[6], v[7]), hidden);
    };
    const auto st = expect_bit_exact(leaves, record);
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerPyHost3, ViTsPatchConvolutionReadsItsNchwInputAndOihwFilterAsTheyLie) {
    // ViT's 16 x 16 patches of a batch of two 64 x 64 RGB images, as tpusim.torch records
    // nn.Conv2d: the NCHW input and OIHW filter transposed to NHWC and HWIO in the
    // convolution's fusion (ViT's views of the result, back to NCHW and on to [B, 16, 192],
    // go to its readers' fusions at batch 2). Layout assignment lays both leaves out in the order
    // the transposes read them (x physically NHWC, w HWIO: the runtime writes them so), so the
    // transposes move no data and the folded convolution (im2col of 3-channel taps, one dot)
    // reads them as it reads any NHWC input (before: "a convolution of operands computed in its
    // fusion", a host fusion).
    constexpr int64_t B = 2, C = 3, H = 64, P = 16, D = 192;
    const float ws = 1.0f / std::sqrt(float(C * P * P));
    const std::vector<Leaf> leaves{
        {"pixel_values", f32({B, C, H, H}), {randoms(size_t(B * C * H * H), 91)}},
        {"projection.weight",
         f32({D, C, P, P}),
         {randoms(size_t(D * C * P * P), 92, -ws, ws)},
         true},
        {"projection.bias", f32({D}), {randoms(size_t(D), 93, -ws, ws)}, true}};
    const auto record = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId x = transpose(g, v[0], {0, 2, 3, 1});
        const ValueId w = transpose(g, v[1], {2, 3, 1, 0});
        ValueId y = conv2d(g, x, w, P, 0);
        return add(g, y, broadcast(g, v[2], g.shape(y).dims, {3}));
    };
    const auto st = expect_bit_exact(leaves, record);
    EXPECT_EQ(st.host_fusions, 0u);
    // The leaves' layouts: the transposes' orders.
    const CompiledStep step = compiled(leaves, record);
    for (const LeafBuffer& l : step.inputs) EXPECT_EQ(l.layout.to_string(), "{1,3,2,0}");
    for (const LeafBuffer& l : step.parameters) {
        if (l.shape.rank() == 4) {
            EXPECT_EQ(l.layout.to_string(), "{0,1,3,2}");
        }
    }
}

TEST(CompilerPyHost3, ViTsSequencesOf17TokensAtBatch2AreUntiledRowsOfTheLinears) {
    // ViT's [B, 17, 192] activations at batch 2: each linear views them as [B 17, 192], which
    // in T(8,128) tiles (each sequence padded to 24 rows) would be a relayout (before: "a dot
    // result in layout {2,1,0:T(8,128)}" and, for the layer norms between, "a f32[2,17,192]
    // array in layout {2,1,0:T(8,128)} (padded tiles)": host fusions). They lie untiled
    // row-major, the view the same bytes; the layer norm's fusions stream rows of 192 values,
    // each padded to two lane chunks in VMEM (strided DMAs), the padding masked in the minor
    // reductions as in a tile.
    constexpr int64_t B = 2, S = 17, D = 192, F = 384;
    const float ws = 1.0f / std::sqrt(float(D));
    const std::vector<Leaf> leaves{
        {"x", f32({B, S, D}), {randoms(size_t(B * S * D), 101)}},
        {"o.weight", f32({D, D}), {randoms(size_t(D * D), 102, -ws, ws)}, true},
        {"o.bias", f32({D}), {randoms(size_t(D), 103, -ws, ws)}, true},
        {"ln.weight", f32({D}), {randoms(size_t(D), 104)}, true},
        {"ln.bias", f32({D}), {randoms(size_t(D), 105)}, true},
        {"fc1.weight", f32({F, D}), {randoms(size_t(F * D), 106, -ws, ws)}, true},
        {"fc1.bias", f32({F}), {randoms(size_t(F), 107, -ws, ws)}, true}};
    const auto record = [](Graph& g, const std::vector<ValueId>& v) {
        const ValueId h = add(g, aten_linear(g, v[0], v[1], v[2]), v[0]);  // the residual
        const ValueId n = layer_norm(g, h, v[3], v[4], 1e-12).y;
        return gelu(g, aten_linear(g, n, v[5], v[6]), false);
    };
    const auto st = expect_bit_exact(leaves, record);
    EXPECT_EQ(st.host_fusions, 0u);
}

/// ViT's embeddings as tpusim.torch records them at batch B: the patch convolution on the NCHW
/// input, its [B, D, 4, 4] result viewed as [B, 16, D] patches, the class token broadcast over
/// the batch and concatenated before them; `pos`: the position embeddings added.
ValueId vit_embeddings(Graph& g, const std::vector<ValueId>& v, int64_t B, bool pos) {
    constexpr int64_t P = 16;
    const int64_t D = g.shape(v[1]).dims[0], S = g.shape(v[4]).dims[1];
    ValueId y = conv2d(g, transpose(g, v[0], {0, 2, 3, 1}), transpose(g, v[1], {2, 3, 1, 0}), P, 0);
    y = add(g, y, broadcast(g, v[2], g.shape(y).dims, {3}));
    y = transpose(g, reshape(g, transpose(g, y, {0, 3, 1, 2}), {B, D, S - 1}), {0, 2, 1});
    const ValueId cls = B == 1 ? v[3] : broadcast(g, reshape(g, v[3], {D}), {B, 1, D}, {2});
    const ValueId e = concatenate(g, {cls, y}, 1);
    return pos ? add(g, e,
                     B == 1 ? v[4] : broadcast(g, reshape(g, v[4], {S, D}), {B, S, D}, {1, 2}))
               : e;
}

std::vector<Leaf> vit_embedding_leaves(int64_t B) {
    constexpr int64_t C = 3, H = 64, P = 16, D = 192, S = (H / P) * (H / P) + 1;
    const float ws = 1.0f / std::sqrt(float(C * P * P));
    return {{"pixel_values", f32({B, C, H, H}), {randoms(size_t(B * C * H * H), 111)}},
            {"projection.weight",
             f32({D, C, P, P}),
             {randoms(size_t(D * C * P * P), 112, -ws, ws)},
             true},
            {"projection.bias", f32({D}), {randoms(size_t(D), 113, -ws, ws)}, true},
            {"cls_token", f32({1, 1, D}), {randoms(size_t(D), 114)}, true},
            {"position_embeddings", f32({1, S, D}), {randoms(size_t(S * D), 115)}, true}};
}

/// The embeddings, then a layer norm and a linear over them with the residual: the leaves of
/// vit_embedding_leaves and the norm's and the linear's parameters (192 features).
std::vector<Leaf> vit_block_leaves(int64_t B) {
    constexpr int64_t D = 192, F = D;
    auto leaves = vit_embedding_leaves(B);
    const float ws = 1.0f / std::sqrt(float(D));
    leaves.push_back({"ln.weight", f32({D}), {randoms(size_t(D), 116)}, true});
    leaves.push_back({"ln.bias", f32({D}), {randoms(size_t(D), 117)}, true});
    leaves.push_back({"fc.weight", f32({F, D}), {randoms(size_t(F * D), 118, -ws, ws)}, true});
    leaves.push_back({"fc.bias", f32({F}), {randoms(size_t(F), 119, -ws, ws)}, true});
    return leaves;
}
Record vit_block(int64_t B, bool pos) {
    return [B, pos](Graph& g, const std::vector<ValueId>& v) {
        const ValueId e = vit_embeddings(g, v, B, pos);
        return add(g, aten_linear(g, layer_norm(g, e, v[5], v[6], 1e-12).y, v[7], v[8]), e);
    };
}

TEST(CompilerPyHost3, ViTsEmbeddingsAtBatch1CopyTheClassTokenAndThePatchesOnTheDevice) {
    // At batch 1 the class token's concatenation, with the position embeddings' add, was a loop
    // fusion the streaming emitter does not compute (before: 1 host fusion, "%11 used both as a
    // row and as a column vector"). The concatenation now roots a fusion of its own with the
    // patches' NCHW view (codegen_concat.cpp: each row DMA'd from where it lies, T(8,128) rows
    // of 192 as runs of 128 and 64 values); the conv's bias joins the convolution's epilogue and
    // the add streams the copy's result.
    const auto record = [](Graph& g, const std::vector<ValueId>& v) {
        return vit_embeddings(g, v, 1, true);
    };
    const auto st = expect_bit_exact(vit_embedding_leaves(1), record);
    EXPECT_EQ(st.host_fusions, 0u);
}

TEST(CompilerPyHost3, ViTsClassTokenConcatenatedAtBatch3IsCopiedIntoUntiledSequences) {
    // At batch B the concatenation's [B, 17, 192] result lies untiled row-major (the linear's
    // residual add reads it as its [B 17, 192] result's rows; the layer norm's streams its
    // rows): each sequence's 16 patch rows are one strided DMA in
    // and out; the class token, broadcast over the batch, is read again for each sequence (a
    // DMA's rows may not overlap). The position embeddings' add is left out: streaming a
    // [17, 192] table repeated over untiled sequences is not generated yet.
    constexpr int64_t B = 3;
    const auto st = expect_bit_exact(vit_block_leaves(B), vit_block(B, false));
    EXPECT_EQ(st.host_fusions, 0u);
    // The concatenation alone: its result is the step's output (tiled: each sequence padded to
    // 24 rows), with the position embeddings' add left out.
    const auto alone = [](Graph& g, const std::vector<ValueId>& v) {
        return vit_embeddings(g, v, B, false);
    };
    EXPECT_EQ(expect_bit_exact(vit_embedding_leaves(B), alone).host_fusions, 0u);
}

TEST(CompilerPyHost3, ViTsPositionTableIsAddedToUntiledSequencesOnTheDeviceAtBatchB) {
    // At batch B the [1, 17, 192] position embeddings, viewed as [17, 192] and broadcast over
    // the batch, are added to the concatenation's untiled [B, 17, 192] sequences, in the add's
    // fusion and in the layer norm's that recompute it (before: 3 host fusions, "reshape of a
    // tile repeated along major dims"). The table lies untiled like the sequences (layout
    // assignment), its 17 rows are loaded once, each padded to 256 values like theirs, and
    // row r of the [B 17, 192] rows reads table row r mod 17, a copy per run of table rows.
    // Batch 8: 136 rows in tiles of 128 rows (32768 values of 256-value rows) and 8, the second
    // tile starting at table row 9 (128 mod 17), a run cut by the tile's end.
    for (const int64_t B : {2, 3, 8}) {
        constexpr int64_t D = 192;
        const auto leaves = vit_block_leaves(B);
        const Record record = vit_block(B, true);
        const auto st = expect_bit_exact(leaves, record);
        EXPECT_EQ(st.host_fusions, 0u) << "batch " << B;
        // The table lies untiled row-major: 17 rows of 192 values, no tile padding.
        const CompiledStep step = compiled(leaves, record);
        for (const LeafBuffer& l : step.parameters)
            if (l.name == "position_embeddings") {
                EXPECT_EQ(l.layout.to_string(), "{2,1,0}");
                EXPECT_EQ(l.bytes, uint64_t(17 * D * 4));
            }
    }
}

TEST(CompilerPyHost3, ConcatenationsAlongEitherDimAreCopiedRunByRunInTheirTiles) {
    // Along the rows of T(8,128) tiles: each part's tiles are one contiguous run, longer than a
    // VMEM slot (64 KiB), copied in pieces, the second part's last tile partial (300 rows).
    // Along the lanes: [64, 100] ++ [64, 60] -> [64, 160], whose first lane chunk holds 100 of
    // the first part's values and 28 of the second's: runs that split at the chunk's edge.
    const auto joined = [](int64_t dim) -> Record {
        return [dim](Graph& g, const std::vector<ValueId>& v) {
            return concatenate(g, {v[0], v[1]}, dim);
        };
    };
    const std::vector<Leaf> rows{{"a", f32({256, 128}), {randoms(256 * 128, 121)}},
                                 {"b", f32({300, 128}), {randoms(300 * 128, 122)}}};
    EXPECT_EQ(expect_bit_exact(rows, joined(0)).host_fusions, 0u);
    const std::vector<Leaf> lanes{{"a", f32({64, 100}), {randoms(64 * 100, 123)}},
                                  {"b", f32({64, 60}), {randoms(64 * 60, 124)}}};
    EXPECT_EQ(expect_bit_exact(lanes, joined(1)).host_fusions, 0u);
}

}  // namespace
}  // namespace tpu::compiler
