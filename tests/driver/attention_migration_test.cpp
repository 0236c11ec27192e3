// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the builder attention kernels emit the same binaries as the
// text kernels they replace, for the keys the planner picks on the shapes the tests, the zoo
// (bert-block: 12 heads x 512 x 64; gpt: 4 heads x 64 x 32) and `tpusim validate` (12, 16 and
// 32 heads x 512 x 64) use, on several boards, and for random blocks.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "driver/kernels/attention.h"
#include "hw/board.h"

namespace tpu::driver::text_attention {
isa::Program attention_program_text(const AttentionKey& k);
}  // namespace tpu::driver::text_attention

namespace tpu::driver {
namespace {

std::string describe(const AttentionKey& k) {
    return fmt::format("{} S{} D{} G{} blocks{} C{} causal{} scaled{}", k.name(), k.seq, k.dhead,
                       k.heads_per_block, k.blocks, k.key_cols, k.causal, k.scaled);
}

TEST(AttentionMigration, BuilderProgramsEqualTheTextKernels) {
    std::vector<AttentionKey> keys;
    const std::vector<std::vector<std::string>> boards = {
        {}, {"core.vmem_bytes=4194304"}, {"core.mxu_rows=8", "core.mxu_cols=8"}};
    std::vector<AttentionShape> shapes = {
        {1, 12, 512, 64}, {1, 16, 512, 64}, {1, 32, 512, 64}, {1, 4, 64, 32},  {2, 4, 64, 32},
        {4, 4, 64, 32},   {8, 12, 512, 64}, {2, 3, 5, 4},     {1, 2, 130, 16}, {3, 2, 200, 1},
        {1, 1, 1, 1},     {2, 2, 129, 128}, {1, 8, 256, 64},  {2, 12, 128, 64}};
    std::mt19937 rng(5);
    std::uniform_int_distribution<uint32_t> d(1, 300);
    for (int i = 0; i < 40; ++i)
        shapes.push_back({d(rng) % 4 + 1, d(rng) % 6 + 1, d(rng), d(rng) % 128 + 1});
    for (const auto& o : boards) {
        const auto cfg = hw::BoardConfig::load("", o);
        for (AttentionShape s : shapes)
            for (bool causal : {false, true}) {
                s.causal = causal;
                for (bool backward : {false, true})
                    if (auto k = plan_attention(cfg, s, backward)) keys.push_back(*k);
            }
    }
    // Random blocks (more heads per block, ragged key tiles), both scale settings.
    for (int i = 0; i < 60; ++i) {
        AttentionKey k{.backward = i % 2 == 1,
                       .seq = d(rng) % 200 + 1,
                       .dhead = d(rng) % 128 + 1,
                       .heads_per_block = d(rng) % 3 + 1,
                       .blocks = d(rng) % 3 + 1,
                       .key_cols = i % 3 ? 128u : 8u,
                       .causal = i % 4 == 0,
                       .scaled = i % 5 != 0};
        if (k.backward) k.causal = false;
        if (k.key_cols == 8) k.dhead = k.dhead % 8 + 1;
        keys.push_back(k);
    }
    int checked = 0;
    for (const AttentionKey& k : keys) {
        const auto want = isa::encode_program(text_attention::attention_program_text(k));
        ASSERT_EQ(isa::encode_program(generate(k)), want) << describe(k);
        ++checked;
    }
    EXPECT_GT(checked, 300);
}

}  // namespace
}  // namespace tpu::driver
