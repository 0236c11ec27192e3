// SPDX-License-Identifier: Apache-2.0
// Zoo models compiled whole for the device, the recorded forward bit-exact with the host
// evaluator with the race detector on: the ResNets (compiler/README.md, "ResNet compiled
// whole": every fusion generated, one program) and the GPT (compiler/README.md, "Gather
// fusions": the token embedding is a gather on the device, so no fusion runs on the host).
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

TEST(GptOnTheDevice, TheEmbeddingGatherRunsOnTheDeviceAndTheStepMatchesTheHostBitExact) {
    ZooOptions o;  // the zoo's GPT: 2 layers, hidden 128, 4 heads, 64 tokens, vocab 86 (tied)
    o.seed = 3;
    ZooModel m = make_zoo_model("gpt", o, 1);
    compiler::HostBackend host;
    const std::vector<float> want = forward(host, m);
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    compiler::CodegenOptions cg;
    cg.board = cfg;
    cg.host_fallback = true;  // so that a fusion left to the host is counted, not an error
    compiler::DeviceBackend device(*dev, {0}, cg);
    const std::vector<float> got = forward(device, m);
    for (const auto& [why, n] : device.stats().fallbacks) ADD_FAILURE() << n << " x " << why;
    EXPECT_EQ(device.stats().host_fusions, 0u);
    // Two launches: the step touches more allocations (the parameters of two blocks, the
    // tokens, the logits, the temp arena) than the 30 addresses one launch carries
    // (compiler/README.md, "One program per step"); it was two before the gather came to the
    // device too.
    EXPECT_EQ(device.stats().launches, 2u);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace tpu::trainer
