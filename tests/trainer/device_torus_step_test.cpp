// SPDX-License-Identifier: Apache-2.0
// A compiled training step over every core of a torus board (compiler/README.md, "Collective
// fusions"): its gradients' all-reduces take the torus, and the step stays bit-exact with the
// host evaluator following the device's order of additions (compiler::device_eval_options).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "driver/device.h"
#include "tests/common/paths.h"
#include "trainer/module.h"
#include "trainer/record.h"
#include "trainer/zoo.h"

namespace tpu::trainer {
namespace {

/// One recorded training step of `model`, one row of 784 values per replica (its own values
/// and class); returns replica 0's loss and every parameter after the step (the same on every
/// replica once the gradients are all-reduced).
std::vector<std::vector<float>> train_step(compiler::Backend& backend, Module& model) {
    const size_t replicas = backend.replicas();
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<std::vector<float>> x(replicas, std::vector<float>(784)), onehot;
    for (size_t r = 0; r < replicas; ++r) {
        for (float& v : x[r]) v = u(rng);
        onehot.emplace_back(10, 0.0f)[(r * 7) % 10] = 1.0f;
    }
    compiler::LazyContext ctx(backend);
    Recorder rec(ctx, PrecisionMode::Bf16Mixed, parameter_names(model));
    const compiler::LazyTensor loss =
        record_train_step(ctx, rec, model, 1, 784, 10, x, onehot, 1, replicas);
    ctx.mark_step();
    std::vector<std::vector<float>> out{ctx.to_host(loss)};
    for (const RecordedParameter& p : rec.parameters()) out.push_back(ctx.to_host(p.tensor));
    return out;
}

TEST(ZooTrainStepOnTorus, TheMlpStepOnV3_32IsWholeAndBitExact) {
    // 784-32-10 on 32 replicas of one row: four gradient all-reduces (the [32, 784] weight's
    // rows padded to 896 in its tiles, so the evaluator sums in the layout's order), each the
    // torus over the 8 x 4 board.
    const auto cfg = hw::BoardConfig::load(fmt::format("{}/configs/v3-32.json", test::source_dir()),
                                           {"sim.race_detector=true"});
    std::vector<uint32_t> cores(cfg.cores());
    for (uint32_t i = 0; i < cores.size(); ++i) cores[i] = i;
    const auto make = [] {
        return std::make_unique<Mlp>(std::vector<uint32_t>{784, 32, 10}, OptimizerConfig{}, 3);
    };
    std::unique_ptr<Module> a = make(), b = make();
    compiler::HostBackend host(cores.size(), compiler::device_eval_options(cfg, cores));
    const auto want = train_step(host, *a);
    auto dev = driver::Device::open(cfg);
    compiler::CodegenOptions cg;
    cg.board = cfg;  // host_fallback off: a fusion not generated fails the step
    compiler::DeviceBackend device(*dev, cores, cg);
    const auto got = train_step(device, *b);
    EXPECT_EQ(device.stats().fallback_fusions, 0u);
    EXPECT_EQ(device.stats().host_fusions, 0u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
}

}  // namespace
}  // namespace tpu::trainer
