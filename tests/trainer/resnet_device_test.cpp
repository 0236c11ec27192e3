// SPDX-License-Identifier: Apache-2.0
// The zoo's ResNets compiled whole for the device (compiler/README.md, "ResNet compiled whole"):
// every fusion generated, one program, the recorded forward bit-exact with the host evaluator
// with the race detector on.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>

#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "driver/device.h"
#include "hw/board_config.h"
#include "trainer/record.h"
#include "trainer/zoo.h"

namespace tpu::trainer {
namespace {

std::vector<float> forward(compiler::Backend& backend, ZooModel& m) {
    compiler::LazyContext ctx(backend);
    Recorder r(ctx, PrecisionMode::Bf16Mixed, parameter_names(*m.module));
    const uint32_t rows = m.input.rows_per_example();
    const compiler::LazyTensor y = record_forward_step(ctx, r, *m.module, rows, m.input.features,
                                                       {recorded_input_values(m.input, 0, 1)});
    ctx.mark_step();
    return ctx.to_host(y);
}

class ResNetOnTheDevice : public ::testing::TestWithParam<const char*> {};

TEST_P(ResNetOnTheDevice, GeneratesWholeAndMatchesTheHostBitExact) {
    // 64 x 64 images: layer1's convolutions have 256 pixels (ResNet-50's 1 x 1 ones are dots
    // of their rows), layer3's 16 and layer4's 4, fewer than the MXU's 128 rows (held as the
    // stationary side of a dot of im2col rows).
    ZooOptions o;
    o.image = 64;
    o.seed = 3;
    ZooModel m = make_zoo_model(GetParam(), o, 1);
    compiler::HostBackend host;
    const std::vector<float> want = forward(host, m);
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    compiler::CodegenOptions cg;
    cg.board = cfg;
    compiler::DeviceBackend device(*dev, {0}, cg);
    const std::vector<float> got = forward(device, m);
    EXPECT_EQ(device.stats().host_fusions, 0u);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ResNetOnTheDevice, ::testing::Values("resnet18", "resnet50"));

}  // namespace
}  // namespace tpu::trainer
