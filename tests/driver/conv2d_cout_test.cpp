// SPDX-License-Identifier: Apache-2.0
// conv2d with a Cout tile per MXU (Conv2dTiling::cout_split) and deferred epilogues: the
// planner's choice from the MXU cost model, bit-exact values (race detector on) and cycle for
// cycle the same run as on the cycle-stepped TensorCore (CoreRef).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "driver/kernels/conv2d.h"
#include "hw/board.h"
#include "hw/core/core_model.h"
#include "hw/mem/sparse_memory.h"
#include "hw/reference/core_ref.h"
#include "tests/common/paths.h"
#include "tests/driver/core_ref_check.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::expect_cycle_exact;
using tutil::random_values;

hw::BoardConfig board(const std::string& preset, std::vector<std::string> sets = {}) {
    sets.push_back("sim.race_detector=true");
    return hw::BoardConfig::load(
        preset.empty() ? "" : test::source_dir() + "/configs/" + preset + ".json", sets);
}

/// The validation rows (B = 64, 3 x 3, pad 1, one core of the default board: two 128 x 128
/// MXUs, 16 MiB of VMEM), derived by hand. 7 x 7 x 512: a padded image is 9 x 9 pixels of 256 B
/// per Cin tile, 4 tiles (82 944 B); its fp32 output 49 x 512 B (25 088 B) per Cout tile.
/// Sharing tiles, G = 64 fits (two X slots would not: one block needs one), 4 Cout tiles x 36
/// steps, each MXU streaming 32 images x 7 runs of 7 rows = 1 568 rows, then the swap's drain
/// (R + C - 2 = 254): 144 x 1 822 = 262 368 cycles. A tile per MXU: X 5 308 416 B (one slot),
/// Y 2 slots x 64 x 2 tiles x 25 088 = 6 422 528 B, W 2 x 2 x 32 KiB, bias 2 KiB: 11.9 MB, so
/// G = 64 still; 2 groups x 36 steps of 3 136 rows: 72 x 3 390 = 244 080 cycles, 18 288 fewer.
TEST(Conv2dCoutPlan, EachMxuTakesItsOwnTileWhereThatSavesSwaps) {
    const hw::BoardConfig cfg = hw::BoardConfig::load("", {});
    const Conv2dShape s7{64, 7, 7, 512, 512, 3, 1, 1};
    const Conv2dTiling t7 = plan_conv2d(cfg, s7, 64);
    EXPECT_EQ(t7.cout_split, 2u);
    EXPECT_EQ(t7.block_images, 64u);
    EXPECT_EQ(conv2d_mxu_cycles(cfg, s7, t7), 244080u);
    Conv2dTiling shared = t7;
    shared.cout_split = 1;
    EXPECT_EQ(conv2d_mxu_cycles(cfg, s7, shared), 262368u);
    // 14 x 14 x 256: sharing, G = 32 (2 blocks x 2 tiles x 18 steps of 16 x 196 rows); a tile
    // each needs Y for both tiles, so G = 16 (4 blocks x 18 steps of 16 x 196 rows): 72 steps
    // of 3 136 rows either way, 244 080 cycles, and a tie keeps the shared tile.
    const Conv2dShape s14{64, 14, 14, 256, 256, 3, 1, 1};
    const Conv2dTiling t14 = plan_conv2d(cfg, s14, 64);
    EXPECT_EQ(t14.cout_split, 1u);
    EXPECT_EQ(t14.block_images, 32u);
    EXPECT_EQ(conv2d_mxu_cycles(cfg, s14, t14), 244080u);
    // 28 x 28 x 128: one Cout tile, nothing to split.
    EXPECT_EQ(plan_conv2d(cfg, {64, 28, 28, 128, 128, 3, 1, 1}, 64).cout_split, 1u);
    // ResNet's layer4 at batch 1: sharing, each MXU streams 4 of the 7 runs (28 rows) per
    // tile, 144 x (28 + 254) = 40 608 cycles; a tile each, all 7 (49 rows), 72 x 303 = 21 816.
    const Conv2dShape s1{1, 7, 7, 512, 512, 3, 1, 1};
    const Conv2dTiling t1 = plan_conv2d(cfg, s1, 1);
    EXPECT_EQ(t1.cout_split, 2u);
    EXPECT_EQ(conv2d_mxu_cycles(cfg, s1, t1), 21816u);
    // Cout not a multiple of the tile, or tiles that do not divide among the MXUs: shared.
    EXPECT_EQ(plan_conv2d(cfg, {1, 7, 7, 512, 500, 3, 1, 1}, 1).cout_split, 1u);
    EXPECT_EQ(plan_conv2d(cfg, {1, 7, 7, 512, 384, 3, 1, 1}, 1).cout_split, 1u);
}

struct CoutCase {
    std::string preset;  ///< configs/<preset>.json, or "" for the default board
    Conv2dShape shape;
    std::vector<std::string> sets;
    uint32_t split;  ///< the plan's cout_split
    std::string name;
};

void PrintTo(const CoutCase& c, std::ostream* os) {
    *os << c.name;
}

class Conv2dCout : public ::testing::TestWithParam<CoutCase> {};

TEST_P(Conv2dCout, IsBitExact) {
    const CoutCase& c = GetParam();
    auto dev = Device::open(board(c.preset, c.sets));
    const Conv2dShape& s = c.shape;
    const auto x = random_values(size_t(s.batch) * s.height * s.width * s.cin, 1);
    const auto w = random_values(size_t(s.kernel) * s.kernel * s.cin * s.cout, 2);
    const auto b = random_values(s.cout, 3);
    ProgramCache cache;
    const Conv2dResult r = conv2d(*dev, cache, x, w, b, s, std::vector<uint32_t>{0});
    ASSERT_FALSE(r.folded);
    EXPECT_EQ(r.tiling.cout_split, c.split);
    EXPECT_EQ(bits_of(r.y), bits_of(conv2d_reference(x, w, b, s, dev->config().core.mxu_rows)));
}

// One block of two groups (Cout 512 = 4 tiles on 2 MXUs) whose epilogues are deferred into the
// next group's steps; blocks of one image in 256 KiB of VMEM, two groups each (an image: X 2
// Cin tiles of 7 x 7 x 256 B = 25 088 B, Y 25 x 512 B = 12 800 B per Cout tile; a tile each, 2
// X slots + 2 Y slots of 2 tiles + 4 W tiles + bias = 234 496 B; sharing, the 5 images in one
// block would need 321 024 B and 5 is prime, so sharing also takes one image, and a tile each
// halves its swaps: 5 x 2 x 18 x (25 + 254) = 50 220 against 5 x 4 x 18 x (15 + 254) = 96 840
// cycles); four MXUs with a
// tile each (8 tiles: 2 groups), whose counts are kept per class; strides (4 phases); bands of
// one output row of a 13 x 13 image (13 is prime: sharing also takes bands of one row, 13 x 2
// x 18 x (13 + 254) = 124 956 cycles against 13 x 18 x 267 = 62 478).
INSTANTIATE_TEST_SUITE_P(
    Shapes, Conv2dCout,
    ::testing::Values(
        CoutCase{"", {8, 7, 7, 512, 512, 3, 1, 1}, {}, 2, "one_block_two_groups_deferred"},
        CoutCase{"",
                 {5, 5, 5, 256, 512, 3, 1, 1},
                 {"core.vmem_bytes=262144"},
                 2,
                 "five_blocks_in_small_vmem"},
        CoutCase{"v4-8", {2, 7, 7, 128, 1024, 3, 1, 1}, {}, 4, "four_mxus_two_groups"},
        CoutCase{"", {2, 9, 9, 130, 256, 3, 2, 1}, {}, 2, "stride2"},
        CoutCase{"",
                 {1, 13, 13, 130, 256, 3, 1, 1},
                 {"core.vmem_bytes=262144"},
                 2,
                 "bands_in_small_vmem"}),
    [](const auto& info) { return info.param.name; });

TEST(Conv2dCoutCycleExact, SplitAndDeferredKernelsMatchTheCycleSteppedCore) {
    hw::BoardConfig cfg = hw::BoardConfig::load("", {"core.vmem_bytes=262144"});
    cfg.chips = 1;
    cfg.hbm.bytes_per_core = 64 << 20;
    cfg.hbm.model = "simple";
    cfg.sim.functional = false;
    const uint32_t x = 0, w = 8 << 20, bias = 16 << 20, y = 24 << 20;
    // Five blocks of one image, two groups of two Cout tiles each: deferred epilogues (the
    // case five_blocks_in_small_vmem).
    const Conv2dShape s{5, 5, 5, 256, 512, 3, 1, 1};
    const Conv2dTiling t = plan_conv2d(cfg, s, s.batch);
    ASSERT_EQ(t.cout_split, 2u);
    ASSERT_EQ(conv2d_blocks(s, t), 5u);
    expect_cycle_exact(cfg, generate(Conv2dKey{s, t}), {x, w, bias, y, conv2d_blocks(s, t)});
    // Four MXUs, a tile each (counts per class), one block.
    cfg.core.mxus = 4;
    cfg.core.vmem_bytes = 16 << 20;
    const Conv2dShape s4{2, 5, 5, 128, 1024, 3, 1, 1};
    const Conv2dTiling t4 = plan_conv2d(cfg, s4, s4.batch);
    ASSERT_EQ(t4.cout_split, 4u);
    expect_cycle_exact(cfg, generate(Conv2dKey{s4, t4}), {x, w, bias, y, conv2d_blocks(s4, t4)});
}

}  // namespace
}  // namespace tpu::driver
