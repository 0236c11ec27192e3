// SPDX-License-Identifier: Apache-2.0
// conv2d on the simulated cores against its bit-exact host reference, race detector on.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "driver/kernels/conv2d.h"
#include "hw/board.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

/// One convolution on a fresh board: shape, cores, and extra config overrides.
struct ConvCase {
    Conv2dShape shape;
    uint32_t cores;
    std::vector<std::string> sets;
    std::string name;
};

void PrintTo(const ConvCase& c, std::ostream* os) {
    *os << c.name;
}

class Conv2dShapes : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dShapes, MatchesReferenceBitExactly) {
    const ConvCase& c = GetParam();
    std::vector<std::string> sets = c.sets;
    sets.push_back("sim.race_detector=true");
    auto dev = Device::open(hw::BoardConfig::load("", sets));
    const Conv2dShape& s = c.shape;
    const auto x = tutil::random_values(size_t(s.batch) * s.height * s.width * s.cin, 1);
    const auto w = tutil::random_values(size_t(s.kernel) * s.kernel * s.cin * s.cout, 2);
    const auto b = tutil::random_values(s.cout, 3);
    std::vector<uint32_t> cores(c.cores);
    for (uint32_t i = 0; i < c.cores; ++i) cores[i] = i;
    ProgramCache cache;
    const Conv2dResult r = conv2d(*dev, cache, x, w, b, s, cores);
    const auto want = conv2d_reference(x, w, b, s, dev->config().core.mxu_rows);
    ASSERT_EQ(r.y.size(), want.size());
    EXPECT_BITS_EQ(r.y, want);
    // The reference itself is a convolution: bf16 rounding of the operands only.
    const auto exact = conv2d_reference_fp64(x, w, b, s);
    double err = 0, norm = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
        err += (want[i] - exact[i]) * (want[i] - exact[i]);
        norm += exact[i] * exact[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-2);
    EXPECT_EQ(r.macs, uint64_t(s.batch) * s.out_height() * s.out_width() * s.kernel * s.kernel *
                          s.cin * s.cout);
    EXPECT_GT(r.hbm_bytes, 0u);
    EXPECT_EQ(r.folded, conv2d_folds_taps(s, dev->config().core.mxu_rows));
    // Useful MACs over the whole array's capacity, whichever lowering ran.
    EXPECT_GT(r.mxu_utilization, 0.0);
    EXPECT_LT(r.mxu_utilization, 1.0);
}

Conv2dShape shape(uint32_t n, uint32_t h, uint32_t w, uint32_t cin, uint32_t cout, uint32_t k,
                  uint32_t stride, uint32_t pad) {
    return Conv2dShape{n, h, w, cin, cout, k, stride, pad};
}

INSTANTIATE_TEST_SUITE_P(
    Odd, Conv2dShapes,
    ::testing::Values(
        ConvCase{shape(2, 6, 5, 5, 7, 3, 1, 1), 1, {}, "k3_s1_p1_small_channels"},
        ConvCase{shape(3, 9, 7, 130, 129, 3, 2, 1), 1, {}, "k3_s2_p1_two_tiles_each_way"},
        ConvCase{shape(1, 11, 10, 3, 16, 7, 2, 3), 1, {}, "k7_s2_p3_batch1"},
        ConvCase{shape(2, 4, 4, 200, 130, 1, 1, 0), 1, {}, "k1_s1_p0"},
        ConvCase{shape(2, 5, 5, 8, 8, 1, 2, 0), 1, {}, "k1_s2_p0"},
        ConvCase{shape(1, 8, 9, 17, 33, 3, 1, 0), 1, {}, "k3_s1_p0_batch1"},
        ConvCase{shape(9, 6, 6, 20, 12, 3, 1, 0), 8, {}, "k3_p0_batch9_on_8_cores"},
        ConvCase{shape(16, 7, 7, 64, 40, 3, 1, 1), 8, {}, "k3_p1_batch16_on_8_cores"},
        ConvCase{shape(2, 7, 9, 12, 10, 7, 1, 3), 8, {}, "k7_s1_p3_batch2_on_8_cores"},
        // A small VMEM cuts every image into bands of output rows.
        ConvCase{shape(2, 20, 18, 130, 20, 3, 1, 1),
                 1,
                 {"core.vmem_bytes=262144"},
                 "k3_bands_in_small_vmem"},
        ConvCase{shape(1, 29, 27, 6, 5, 5, 2, 2),
                 1,
                 {"core.vmem_bytes=262144"},
                 "k5_s2_bands_in_small_vmem"},
        ConvCase{shape(3, 5, 4, 9, 6, 3, 1, 1), 1, {"core.mxus=1"}, "one_mxu"},
        // Small channels on 128-row MXUs fold the taps into K (im2col + GEMM); on 8 x 8 arrays
        // the same shapes keep the implicit GEMM, so both lowerings see small channels.
        ConvCase{shape(1, 30, 32, 3, 64, 7, 2, 3), 1, {}, "rgb_stem_k7_s2_folded"},
        ConvCase{shape(3, 9, 8, 3, 20, 7, 2, 3), 2, {}, "rgb_stem_batch3_on_2_cores_folded"},
        // A 200-pixel staging row (9.6 KB a slot) does not fit 8 KiB: one im2col launch per tap.
        ConvCase{shape(1, 6, 200, 1, 5, 3, 1, 1),
                 1,
                 {"core.vmem_bytes=8192", "core.mxu_rows=8", "core.mxu_cols=8"},
                 "folded_per_tap_im2col_in_tiny_vmem"},
        ConvCase{shape(2, 6, 5, 5, 7, 3, 1, 1),
                 1,
                 {"core.mxu_rows=8", "core.mxu_cols=8"},
                 "k3_small_channels_implicit_on_8x8"},
        ConvCase{shape(1, 11, 10, 3, 16, 7, 2, 3),
                 1,
                 {"core.mxu_rows=8", "core.mxu_cols=8"},
                 "k7_s2_implicit_on_8x8"},
        ConvCase{shape(1, 29, 27, 6, 5, 5, 2, 2),
                 1,
                 {"core.vmem_bytes=262144", "core.mxu_rows=8", "core.mxu_cols=8"},
                 "k5_s2_bands_implicit_on_8x8"},
        // Dense 3-channel planes packed in chunks of plane rows (64 KiB of VMEM hold about 14
        // of the 31), the first and last chunks reaching into the padding.
        ConvCase{shape(2, 60, 64, 3, 8, 3, 2, 1),
                 1,
                 {"core.vmem_bytes=65536", "core.mxu_rows=8", "core.mxu_cols=8"},
                 "dense_pack_in_chunks_on_8x8"},
        // One image of 80 runs in one block: its epilogue in 4 pieces (Conv2dTiling::
        // epilogue_pieces; each piece 18 runs or more).
        ConvCase{shape(1, 80, 16, 3, 8, 3, 1, 1),
                 1,
                 {"core.mxu_rows=8", "core.mxu_cols=8"},
                 "epilogue_in_pieces_on_8x8"}),
    [](const auto& info) { return info.param.name; });

/// The calibration shape's plan, derived by hand: a padded image is 30 x 30 pixels of 256
/// bytes (230 400 B) and its fp32 output 28 x 28 x 512 B (401 408 B); two slots of G images of
/// both plus two weight tiles (64 KiB) and the bias (512 B) fit in 16 MiB for G = 8
/// (10 111 488 B), not for G = 16; 8 divides 64.
TEST(Conv2dPlan, CalibrationShapeTakesBlocksOfEightImages) {
    const auto cfg = hw::BoardConfig::load("", {});
    const Conv2dTiling t = plan_conv2d(cfg, shape(64, 28, 28, 128, 128, 3, 1, 1), 64);
    EXPECT_EQ(t.block_images, 8u);
    EXPECT_EQ(t.band_rows, 28u);
    EXPECT_EQ(t.Hq, 30u);
    EXPECT_EQ(t.Wq, 30u);
    EXPECT_EQ(t.phases, 1u);
    EXPECT_EQ(t.mxus, 2u);
    // Stride 2, k = 3: two phases per dimension, each (Ho + 1) x (Wo + 1) pixels.
    const Conv2dTiling t2 = plan_conv2d(cfg, shape(8, 28, 28, 64, 64, 3, 2, 1), 7);
    EXPECT_EQ(t2.phases, 2u);
    EXPECT_EQ(t2.Hq, 15u);
    EXPECT_EQ(t2.block_images, 7u);
}

/// The epilogue lag of the three deep validation rows on the default board (2 MXUs of
/// 128 x 128, queue depth 8), derived by hand: an MXU's share of L images' runs,
/// floor(L runs / 2) runs of run_rows rows, must cover the array latency R + C - 2 = 254 plus a
/// full queue of 8 runs (halo columns: one run per output row, runs = run_rows = Wo).
/// 28 x 28: 254 + 8 x 28 = 478; L = 1 gives 14 x 28 = 392, L = 2 gives 784.
/// 14 x 14: 254 + 8 x 14 = 366; L = 3 gives 21 x 14 = 294, L = 4 gives 392.
/// 7 x 7: 254 + 8 x 7 = 310; each MXU has its own Cout tile there (Conv2dTiling::cout_split,
/// tests/driver/conv2d_cout_test.cpp) and streams every run: L = 6 gives 42 x 7 = 294, L = 7
/// gives 49 x 7 = 343 (sharing a tile it was 13: 45 x 7 = 315).
/// L is at most a quarter of the block's images (8, 32 and 64 here: 2, 8, 16).
TEST(Conv2dPlan, EpilogueLagCoversTheArrayLatency) {
    const auto cfg = hw::BoardConfig::load("", {});
    EXPECT_EQ(plan_conv2d(cfg, shape(64, 28, 28, 128, 128, 3, 1, 1), 64).lag, 2u);
    EXPECT_EQ(plan_conv2d(cfg, shape(64, 14, 14, 256, 256, 3, 1, 1), 64).lag, 4u);
    EXPECT_EQ(plan_conv2d(cfg, shape(64, 7, 7, 512, 512, 3, 1, 1), 64).lag, 7u);
    // Capped: 8 images of 4 x 4 would need 254 + 8 x 4 = 286 rows (L = 18), a quarter is 2.
    EXPECT_EQ(plan_conv2d(cfg, shape(8, 4, 4, 512, 512, 3, 1, 1), 8).lag, 2u);
    EXPECT_EQ(plan_conv2d(cfg, shape(1, 7, 7, 512, 512, 3, 1, 1), 1).lag, 1u);
}

/// A kernel of one block of one image stores its output in pieces of rows during its last
/// step. ResNet's stem at batch 1: 112 runs of 112 rows taking 2 MXUs in turn; a piece's wait
/// must find its matmuls done while the MXUs still hold the array's latency (R + C - 2 = 254)
/// and a full queue (8 runs of 112) of work: 1 150 cycles, 21 runs on two MXUs, so 112 / 21 = 5
/// pieces. Several images per block overlap their epilogues with the next image's runs
/// instead (the lag), and so do several blocks or Cout groups: one piece.
TEST(Conv2dPlan, OneImageKernelsStoreTheirOutputInPieces) {
    const auto cfg = hw::BoardConfig::load("", {});
    const Conv2dTiling stem = plan_conv2d(cfg, shape(1, 224, 224, 3, 64, 7, 2, 3), 1);
    EXPECT_EQ(stem.block_images, 1u);
    EXPECT_EQ(stem.band_rows, 112u);
    EXPECT_EQ(stem.epilogue_pieces, 5u);
    EXPECT_EQ(plan_conv2d(cfg, shape(8, 28, 28, 128, 128, 3, 1, 1), 8).epilogue_pieces, 1u);
    // Four Cout tiles make several groups, each group's epilogue deferred into the next one's
    // steps.
    EXPECT_EQ(plan_conv2d(cfg, shape(1, 56, 56, 64, 512, 3, 1, 1), 1).epilogue_pieces, 1u);
    // Conv2dShapes' epilogue_in_pieces_on_8x8: 80 runs of 16 rows; 14 + 8 x 16 = 142 cycles
    // are 18 runs on two MXUs, so 80 / 18 = 4 pieces.
    const auto small = hw::BoardConfig::load("", {"core.mxu_rows=8", "core.mxu_cols=8"});
    EXPECT_EQ(plan_conv2d(small, shape(1, 80, 16, 3, 8, 3, 1, 1), 1).epilogue_pieces, 4u);
}

/// Passes per output on 128-row MXUs: folded ceil(k k Cin / 128), implicit k k ceil(Cin / 128);
/// folding needs a 4x cut.
TEST(Conv2dPlan, FoldsTheTapsIntoKWhenThatQuartersTheMxuPasses) {
    EXPECT_TRUE(conv2d_folds_taps(shape(1, 224, 224, 3, 64, 7, 2, 3), 128));  // 2 vs 49
    EXPECT_TRUE(conv2d_folds_taps(shape(1, 28, 28, 1, 32, 3, 1, 1), 128));    // 1 vs 9
    EXPECT_TRUE(conv2d_folds_taps(shape(1, 28, 28, 28, 32, 3, 1, 1), 128));   // 2 vs 9
    EXPECT_FALSE(conv2d_folds_taps(shape(1, 28, 28, 32, 32, 3, 1, 1), 128));  // 3 vs 9
    EXPECT_FALSE(conv2d_folds_taps(shape(1, 56, 56, 64, 64, 3, 1, 1), 128));  // 5 vs 9
    EXPECT_FALSE(conv2d_folds_taps(shape(1, 28, 28, 128, 128, 3, 1, 1), 128));
    EXPECT_FALSE(conv2d_folds_taps(shape(1, 56, 56, 3, 64, 1, 1, 0), 128));  // 1 vs 1
    EXPECT_FALSE(conv2d_folds_taps(shape(1, 9, 9, 5, 7, 3, 1, 1), 8));       // 6 vs 9
}

/// Cin < R: the planes hold Cin channels a pixel (conv2d_pixel_channels), packed from whole
/// input rows. 30 x 30 x 64 fp32 in, stride 2, pad 1: four phase planes of 16 x 16 pixels of 64
/// bf16 (a 128-channel pixel would write twice as much), and every input byte read once, in
/// one DMA of whole rows (not a request per pixel and phase).
TEST(Conv2dPack, SmallCinPlanesAreDenseAndReadWholeRows) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const Conv2dShape s = shape(1, 30, 30, 64, 64, 3, 2, 1);
    ASSERT_FALSE(conv2d_folds_taps(s, 128));
    EXPECT_EQ(conv2d_pixel_channels(s, 128), 64u);
    EXPECT_EQ(conv2d_pixel_channels(shape(1, 8, 8, 300, 64, 3, 1, 1), 128), 128u);
    const auto x = tutil::random_values(30 * 30 * 64, 1);
    const auto w = tutil::random_values(9 * 64 * 64, 2);
    const auto b = tutil::random_values(64, 3);
    ProgramCache cache;
    const Conv2dResult r = conv2d(*dev, cache, x, w, b, s, {0});
    EXPECT_BITS_EQ(r.y, conv2d_reference(x, w, b, s, 128));
    const KernelStats* pack = nullptr;
    for (const KernelStats& k : dev->kernel_stats())
        if (k.name == "conv2d_pack_x") pack = &k;
    ASSERT_NE(pack, nullptr);
    EXPECT_EQ(pack->hbm_read_bytes, 30u * 30 * 64 * 4);
    EXPECT_EQ(pack->hbm_write_bytes, 4u * 16 * 16 * 64 * 2);
    EXPECT_EQ(conv2d_packed_x_bytes(s, r.tiling), pack->hbm_write_bytes);
}

TEST(Conv2dPlan, BadShapesNameTheField) {
    const auto cfg = hw::BoardConfig::load("", {});
    EXPECT_EQ(tutil::error_of([&] { plan_conv2d(cfg, shape(1, 4, 4, 0, 3, 3, 1, 1), 1); }, true),
              "conv2d: cin must be at least 1");
    EXPECT_EQ(tutil::error_of([&] { plan_conv2d(cfg, shape(1, 4, 4, 2, 3, 7, 1, 1), 1); }, true),
              "conv2d: kernel 7 is larger than the padded input 6x6 (height 4 + 2 x pad 1, "
              "width 4 + 2 x pad 1)");
}

TEST(Conv2dPlan, SizesAreCheckedIn64Bits) {
    // Issue #30, class 1: 2 x pad 2147483648 wraps to 0 in 32 bits, so a 3x3 input padded by
    // 2^31 passed as a 3x3 one (and `op conv2d --check` said "bit-exact"). In 64 bits the
    // padded plane is 2^32 + 3 pixels wide: beyond what a kernel addresses.
    const auto cfg = hw::BoardConfig::load("", {});
    const std::string e = tutil::error_of(
        [&] { plan_conv2d(cfg, shape(1, 3, 3, 1, 1, 3, 1, 2147483648u), 1); }, true);
    EXPECT_EQ(e.rfind("conv2d: the padded input (over 4294967296 bytes)", 0), 0u) << e;
    // A huge stride would make the padded plane (H + 2 pad + stride) wrap the same way.
    EXPECT_NE(
        tutil::error_of([&] { plan_conv2d(cfg, shape(1, 3, 3, 1, 1, 3, 4294967295u, 0), 1); }, true)
            .find("exceeds the 4 GiB a kernel addresses"),
        std::string::npos);
}

}  // namespace
}  // namespace tpu::driver
