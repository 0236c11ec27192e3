// SPDX-License-Identifier: Apache-2.0
// conv2d on device-resident Tensors: packed on the device, bit-exact per replica, race detector
// on; and the cycles of the Fashion-MNIST CNN's two convolutions.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "driver/kernels/conv2d.h"
#include "hw/board.h"
#include "tests/driver/conv2d_case.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

std::vector<uint32_t> first_cores(uint32_t n) {
    std::vector<uint32_t> c(n);
    for (uint32_t i = 0; i < n; ++i) c[i] = i;
    return c;
}

/// Runs the Tensor conv2d on `cores` cores, each replica with its own x, w and bias, and
/// checks every replica against conv2d_reference bit for bit; returns the event.
Event check_tensor_conv(const Conv2dShape& s, uint32_t cores) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const std::vector<uint32_t> set = first_cores(cores);
    const uint32_t k = s.kernel, M = s.batch * s.out_height() * s.out_width();
    Tensor x = alloc_tensor(*dev, set, s.batch * s.height * s.width, s.cin);
    Tensor w = alloc_tensor(*dev, set, k * k * s.cin, s.cout);
    Tensor b = alloc_tensor(*dev, set, 1, s.cout);
    Tensor y = alloc_tensor(*dev, set, M, s.cout);
    std::vector<std::vector<float>> xs, ws, bs;
    for (uint32_t i = 0; i < cores; ++i) {
        xs.push_back(tutil::random_values(x.elements(), 10 + i));
        ws.push_back(tutil::random_values(w.elements(), 100 + i));
        bs.push_back(tutil::random_values(b.elements(), 1000 + i));
        write_tensor(*dev, x, i, xs[i]);
        write_tensor(*dev, w, i, ws[i]);
        write_tensor(*dev, b, i, bs[i]);
    }
    const uint64_t free_before = dev->free_bytes(0);
    ProgramCache cache;
    const Event ev = conv2d(*dev, cache, s, x, w, b, y);
    EXPECT_EQ(dev->free_bytes(0), free_before) << "scratch HBM is freed";
    for (uint32_t i = 0; i < cores; ++i)
        EXPECT_BITS_EQ(read_tensor(*dev, y, i),
                       conv2d_reference(xs[i], ws[i], bs[i], s, dev->config().core.mxu_rows));
    return ev;
}

class Conv2dTensor : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dTensor, EveryReplicaMatchesTheReferenceBitExactly) {
    check_tensor_conv(GetParam().shape, GetParam().cores);
}

INSTANTIATE_TEST_SUITE_P(
    Odd, Conv2dTensor,
    ::testing::Values(ConvCase{{2, 6, 5, 5, 7, 3, 1, 1}, 1, "k3_s1_p1"},
                      ConvCase{{2, 9, 7, 130, 129, 3, 2, 1}, 1, "k3_s2_p1_two_tiles_each_way"},
                      ConvCase{{1, 11, 10, 3, 16, 5, 2, 2}, 1, "k5_s2_p2"},
                      ConvCase{{1, 3, 5, 3, 4, 3, 2, 0}, 1, "k3_s2_p0_one_output_row"},
                      ConvCase{{2, 4, 4, 200, 130, 1, 1, 0}, 1, "k1_s1_p0"},
                      ConvCase{{2, 5, 5, 8, 8, 1, 2, 0}, 1, "k1_s2_p0"},
                      ConvCase{{2, 7, 9, 1, 32, 3, 1, 1}, 8, "cin1_on_8_cores"},
                      ConvCase{{1, 7, 7, 12, 10, 7, 1, 3}, 8, "k7_s1_p3_on_8_cores"}),
    [](const auto& info) { return info.param.name; });

/// Cycles of conv2d on one core, timing-only (the cycles equal those with the arithmetic on).
uint64_t conv_cycles(const Conv2dShape& s) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.functional=false"}));
    const std::vector<uint32_t> set = first_cores(1);
    const uint32_t k = s.kernel;
    Tensor x = alloc_tensor(*dev, set, s.batch * s.height * s.width, s.cin);
    Tensor w = alloc_tensor(*dev, set, k * k * s.cin, s.cout);
    Tensor b = alloc_tensor(*dev, set, 1, s.cout);
    Tensor y = alloc_tensor(*dev, set, s.batch * s.out_height() * s.out_width(), s.cout);
    ProgramCache cache;
    const Event ev = conv2d(*dev, cache, s, x, w, b, y);
    return ev.end_cycle - ev.start_cycle;
}

// The Fashion-MNIST CNN's convolutions at 16 images per core (driver/README.md,
// "Convolution", has the figures and their breakdown).
TEST(Conv2dTensor, CnnConv1Cycles) {
    const uint64_t c = conv_cycles({16, 28, 28, 1, 32, 3, 1, 1});
    RecordProperty("cycles", std::to_string(c));
    fmt::print("conv 1 -> 32, 28 x 28, batch 16: {} cycles\n", c);
    // Folded (Cin = 1): 16 x 28 x 28 = 12 544 output rows in one MXU pass, 6 272 per MXU, is
    // the floor (the implicit GEMM would stream them nine times).
    EXPECT_TRUE(conv2d_folds_taps({16, 28, 28, 1, 32, 3, 1, 1}, 128));
    EXPECT_GT(c, 12544u / 2);
}

TEST(Conv2dTensor, CnnConv2Cycles) {
    const uint64_t c = conv_cycles({16, 14, 14, 32, 64, 3, 1, 1});
    RecordProperty("cycles", std::to_string(c));
    fmt::print("conv 32 -> 64, 14 x 14, batch 16: {} cycles\n", c);
    // Implicit GEMM (3 folded passes would not be a 4x cut of 9): nine taps of 3 136 rows,
    // 1 568 per MXU, plus a 254-cycle drain each, is the floor.
    EXPECT_FALSE(conv2d_folds_taps({16, 14, 14, 32, 64, 3, 1, 1}, 128));
    EXPECT_GT(c, 9u * (1568 + 254));
}

}  // namespace
}  // namespace tpu::driver
