// SPDX-License-Identifier: Apache-2.0
// The zoo's recorded training steps run whole on the device (compiler/README.md, "Training steps
// on the device"): no host fallback, race detector on, every output and updated parameter
// bit-exact with the host evaluator of the same compiled step.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "driver/device.h"
#include "trainer/module.h"
#include "trainer/record.h"
#include "trainer/trainer.h"
#include "trainer/zoo.h"

namespace tpu::trainer {
namespace {

/// One recorded training step of `model` on `rows` random rows of 784 values and 10 classes;
/// returns the loss and then every parameter's values after the step.
std::vector<std::vector<float>> train_step(compiler::Backend& backend, Module& model,
                                           uint32_t rows) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> x(size_t(rows) * 784), onehot(size_t(rows) * 10, 0.0f);
    for (float& v : x) v = u(rng);
    for (uint32_t r = 0; r < rows; ++r) onehot[size_t(r) * 10 + (r * 3) % 10] = 1.0f;
    compiler::LazyContext ctx(backend);
    Recorder rec(ctx, PrecisionMode::Bf16Mixed, parameter_names(model));
    const compiler::LazyTensor loss =
        record_train_step(ctx, rec, model, rows, 784, 10, {x}, {onehot}, 1);
    ctx.mark_step();
    std::vector<std::vector<float>> out{ctx.to_host(loss)};
    for (const RecordedParameter& p : rec.parameters()) out.push_back(ctx.to_host(p.tensor));
    return out;
}

void expect_whole_and_bit_exact(const std::function<std::unique_ptr<Module>()>& make,
                                uint32_t rows) {
    std::unique_ptr<Module> a = make(), b = make();
    compiler::HostBackend host;
    const auto want = train_step(host, *a, rows);
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    compiler::CodegenOptions cg;
    cg.board = cfg;  // host_fallback off: a fusion not generated fails the step
    compiler::DeviceBackend device(*dev, {0}, cg);
    const auto got = train_step(device, *b, rows);
    EXPECT_EQ(device.stats().fallback_fusions, 0u);
    EXPECT_EQ(device.stats().host_fusions, 0u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
}

TEST(ZooTrainStepOnDevice, TheMlpStepIsWholeAndBitExact) {
    // 784-512-256-10 on a batch of one: the bias gradients reduce a unit dim, the loss's rows
    // are one row of 10 classes.
    expect_whole_and_bit_exact(
        [] {
            return std::make_unique<Mlp>(std::vector<uint32_t>{784, 512, 256, 10},
                                         OptimizerConfig{}, 3);
        },
        1);
}

TEST(ZooTrainStepOnDevice, TheCnnStepIsWholeAndBitExact) {
    // conv32-pool-conv64-pool-fc128-fc10 on two images: the convolutions' input gradients with
    // ReLU's mask, their bias gradients over untiled NHWC rows (14 x 14 x 2 = 392 rows), the
    // pool gradient reading the flattened features' gradient.
    expect_whole_and_bit_exact(
        [] {
            return std::make_unique<Cnn>(ImageShape{28, 28, 1}, 10, OptimizerConfig{}, 3);
        },
        2);
}

}  // namespace
}  // namespace tpu::trainer
