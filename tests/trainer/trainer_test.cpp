// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "driver/device.h"
#include "driver/kernels/tensor.h"
#include "hw/board_config.h"
#include "tests/common/paths.h"
#include "tests/common/scratch.h"
#include "trainer/data_loader.h"
#include "trainer/dataset.h"
#include "trainer/metrics.h"
#include "trainer/trainer.h"

namespace tpu::trainer {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}

// ---- devices and precision: Lightning's rules and words -------------------------------------

TEST(TrainerDevices, ValidChoices) {
    const std::vector<uint32_t> all{0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_EQ(resolve_devices(std::string("auto"), 8), all);
    EXPECT_EQ(resolve_devices(8, 8), all);
    EXPECT_EQ(resolve_devices(1, 8), std::vector<uint32_t>{0});
    EXPECT_EQ(resolve_devices(std::vector<int>{5}, 8), std::vector<uint32_t>{5});
    EXPECT_EQ(resolve_devices(parse_devices("[5]"), 8), std::vector<uint32_t>{5});
    EXPECT_EQ(resolve_devices(parse_devices("5,"), 8), std::vector<uint32_t>{5});
    EXPECT_EQ(resolve_devices(parse_devices(" 8 "), 8), all);
    EXPECT_EQ(resolve_devices(parse_devices("auto"), 8), all);
}

TEST(TrainerDevices, LightningErrors) {
    auto err = [](const Devices& d) { return error_of([&] { resolve_devices(d, 8); }); };
    const std::string head = "`devices` can only be 'auto', 1, 8 or [<0-7>] for TPUs. Got ";
    EXPECT_EQ(err(9), head + "9");
    EXPECT_EQ(err(0), head + "0");
    EXPECT_EQ(err(-1), head + "-1");
    EXPECT_EQ(err(4), head + "4");
    EXPECT_EQ(err(std::vector<int>{1, 2}), head + "[1, 2]");
    EXPECT_EQ(err(std::vector<int>{8}), head + "[8]");
    EXPECT_EQ(err(std::vector<int>{-1}), head + "[-1]");
    EXPECT_EQ(err(std::string("gpu")), head + "'gpu'");
    EXPECT_EQ(err(parse_devices("[1, 2]")), head + "[1, 2]");
    EXPECT_EQ(error_of([] { parse_devices("abc"); }),
              "Could not parse the selected TPU devices: 'abc'");
    EXPECT_EQ(error_of([] { parse_devices("[1,x]"); }),
              "Could not parse the selected TPU devices: '[1,x]'");
    // On a 4-core board the numbers follow the board.
    EXPECT_EQ(error_of([] { resolve_devices(8, 4); }),
              "`devices` can only be 'auto', 1, 4 or [<0-3>] for TPUs. Got 8");
}

TEST(TrainerDevices, PodSlicesTrainEveryCoreOfEveryHost) {
    // v3-32: 4 hosts of 8 cores. devices counts one host's cores; every core trains.
    std::vector<uint32_t> all(32);
    for (uint32_t i = 0; i < 32; ++i) all[i] = i;
    EXPECT_EQ(resolve_devices(8, 32, 4, 4), all);
    EXPECT_EQ(resolve_devices(std::string("auto"), 32, 4, 4), all);
    EXPECT_EQ(error_of([] { resolve_devices(8, 32, 2, 4); }),
              "`devices=8` x `num_nodes=2` = 16 cores, but the board has 32 cores: a TPU pod "
              "slice trains on every core of every host");
    EXPECT_EQ(error_of([] { resolve_devices(16, 32, 2, 4); }),
              "`num_nodes=2`: the board has 4 TPU hosts (chips / chips_per_host), and a pod "
              "slice runs one node per host");
    EXPECT_EQ(error_of([] { resolve_devices(std::vector<int>{3}, 32, 4, 4); }),
              "`devices=[3]` with `num_nodes=4`: on a TPU pod slice `devices` is 'auto' or the "
              "cores of one host (8)");
    EXPECT_EQ(error_of([] { resolve_devices(8, 32, 0, 4); }),
              "`num_nodes` must be at least 1. Got 0");
    // One node keeps the single-host rule, whatever the board's size.
    EXPECT_EQ(resolve_devices(1, 32, 1, 4), std::vector<uint32_t>{0});
}

TEST(TrainerDevices, AMegacoreDeviceIsAChip) {
    // v4-8 (configs/v4-8.json): 4 chips of 2 TensorCores, one device per chip.
    const std::vector<uint32_t> all{0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_EQ(resolve_devices(4, 8, 1, 1, 2), all);
    EXPECT_EQ(resolve_devices(std::string("auto"), 8, 1, 1, 2), all);
    EXPECT_EQ(resolve_devices(1, 8, 1, 1, 2), (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(resolve_devices(std::vector<int>{3}, 8, 1, 1, 2), (std::vector<uint32_t>{6, 7}));
    EXPECT_EQ(error_of([] { resolve_devices(8, 8, 1, 1, 2); }),
              "`devices` can only be 'auto', 1, 4 or [<0-3>] for TPUs. Got 8");
}

TEST(TrainerPrecision, ValidAndLightningErrors) {
    EXPECT_EQ(parse_precision("32-true"), PrecisionMode::True32);
    EXPECT_EQ(parse_precision("bf16-mixed"), PrecisionMode::Bf16Mixed);
    EXPECT_EQ(parse_precision("bf16-true"), PrecisionMode::Bf16True);
    for (const char* bad : {"16-mixed", "64-true", "bf16", "32", "16-true"})
        EXPECT_EQ(error_of([&] { parse_precision(bad); }),
                  std::string("`precision='") + bad +
                      "'` is not supported in XLA. `precision` must be one of: ('32-true', "
                      "'bf16-mixed', 'bf16-true').");
}

TEST(TrainerPrecision, LightningsOlderWordsRunAsBf16WithItsWarnings) {
    // Issue #30, item 5: a Lightning user's 16, 16-mixed and bf16 run as bf16-mixed with the
    // warning their Lightning gives (trainer/README.md names the versions); "32" is Lightning
    // 2's silent alias; 16-true is refused.
    const PrecisionChoice p16 = resolve_precision("16");
    EXPECT_EQ(p16.mode, PrecisionMode::Bf16Mixed);
    EXPECT_EQ(p16.warning,
              "You passed `Trainer(accelerator='tpu', precision=16)` but AMP is not supported with "
              "TPUs. Using `precision='bf16'` instead.");
    const PrecisionChoice mixed = resolve_precision("16-mixed");
    EXPECT_EQ(mixed.mode, PrecisionMode::Bf16Mixed);
    EXPECT_EQ(mixed.warning,
              "You passed `Trainer(accelerator='tpu', precision='16-mixed')` but AMP with fp16 is "
              "not supported on TPUs. Using `precision='bf16-mixed'` instead.");
    const PrecisionChoice bf16 = resolve_precision("bf16");
    EXPECT_EQ(bf16.mode, PrecisionMode::Bf16Mixed);
    EXPECT_EQ(bf16.warning,
              "`precision=bf16` is supported for historical reasons but its usage is discouraged. "
              "Please set your precision to bf16-mixed instead!");
    EXPECT_EQ(resolve_precision("32").mode, PrecisionMode::True32);
    EXPECT_EQ(resolve_precision("32").warning, "");
    EXPECT_EQ(resolve_precision("bf16-true").mode, PrecisionMode::Bf16True);
    EXPECT_EQ(error_of([] { resolve_precision("16-true"); }),
              "`precision='16-true'`: fp16 is not modelled (the MXU multiplies bf16); use "
              "'bf16-true' or 'bf16-mixed'");
    EXPECT_EQ(error_of([] { resolve_precision("64-true"); }),
              "`precision='64-true'` is not supported in XLA. `precision` must be one of: "
              "('32-true', 'bf16-mixed', 'bf16-true').");
}

// ---- sampler and metrics --------------------------------------------------------------------

TEST(DistributedSampler, EvenShardsPaddedByWrapping) {
    // 10 examples over 4 replicas: 3 each, the last two padded with examples 0 and 1.
    std::vector<uint32_t> seen;
    for (uint32_t r = 0; r < 4; ++r) {
        DistributedSampler s(10, 4, r, false, 0, false);
        const auto idx = s.indices();
        ASSERT_EQ(idx.size(), 3u);
        seen.insert(seen.end(), idx.begin(), idx.end());
    }
    EXPECT_EQ(DistributedSampler(10, 4, 0, false, 0, false).indices(),
              (std::vector<uint32_t>{0, 4, 8}));
    EXPECT_EQ(DistributedSampler(10, 4, 2, false, 0, false).indices(),
              (std::vector<uint32_t>{2, 6, 0}));
    EXPECT_EQ(DistributedSampler(10, 4, 3, false, 0, true).indices(),
              (std::vector<uint32_t>{3, 7}));
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<uint32_t>{0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(DistributedSampler, ShufflesPerEpochDeterministically) {
    DistributedSampler a(1000, 8, 3, true, 7, false), b(1000, 8, 3, true, 7, false);
    EXPECT_EQ(a.indices(), b.indices());
    const auto e0 = a.indices();
    a.set_epoch(1);
    EXPECT_NE(a.indices(), e0);
    // Every example lands on exactly one replica.
    std::vector<int> count(1000, 0);
    for (uint32_t r = 0; r < 8; ++r)
        for (uint32_t i : DistributedSampler(1000, 8, r, true, 7, false).indices()) ++count[i];
    EXPECT_EQ(std::count(count.begin(), count.end(), 1), 1000);
    EXPECT_EQ(error_of([] { DistributedSampler(10, 4, 4, false, 0, false); }),
              "Invalid rank 4, rank should be in the interval [0, 3]");
}

TEST(ProgressBar, LossIsPendingUntilTheFirstReadBack) {
    // Before the first read-back there is no loss; "nan" would read as a diverged run.
    EXPECT_EQ(progress_loss_text(std::nullopt), "loss=\u2026");
    EXPECT_EQ(progress_loss_text(2.302585F), "loss=2.3026");
}

TEST(Metrics, PyTorchXlaFormat) {
    EXPECT_EQ(format_duration(1.2345678), "01s234ms567.800us");
    EXPECT_EQ(format_duration(0.0123456789), "012ms345.679us");
    EXPECT_EQ(format_duration(3.21e-6), "3.210us");
    EXPECT_EQ(format_bytes(512), "512.00B");
    EXPECT_EQ(format_bytes(1.5 * 1024 * 1024), "1.50MB");
    Metrics m;
    m.add_time("ExecuteTime", 1e-3, 0.5);
    m.add_time("ExecuteTime", 3e-3, 0.25);
    m.add_data("InboundData", 2048);
    m.count("MarkStep", 2);
    const std::string r = m.report();
    EXPECT_NE(r.find("Metric: ExecuteTime\n  TotalSamples: 2\n  Accumulator: 004ms000.000us\n"),
              std::string::npos)
        << r;
    EXPECT_NE(r.find("  HostAccumulator: 750ms000.000us\n"), std::string::npos) << r;
    EXPECT_NE(r.find("Metric: InboundData\n  TotalSamples: 1\n  Accumulator: 2.00KB\n"),
              std::string::npos)
        << r;
    EXPECT_NE(r.find("Counter: MarkStep\n  Value: 2\n"), std::string::npos) << r;
    EXPECT_NE(r.find("Percentiles: 1%=001ms000.000us; 5%="), std::string::npos) << r;
}

// ---- training on the simulated board --------------------------------------------------------

hw::BoardConfig board() {
    hw::BoardConfig cfg;
    return cfg;
}

/// The seeds' weight-tying example (Lightning docs, "TPU weight sharing"): layer_3 reuses
/// layer_1's weight.
class WeightSharing : public Module {
public:
    explicit WeightSharing(OptimizerConfig opt) : Module(3), m_opt(opt) {
        layer_1 = &add<Linear>("layer_1", 32, 10, false, rng());
        layer_2 = &add<Linear>("layer_2", 10, 32, false, rng());
        layer_3 = &add<Linear>("layer_3", 32, 10, false, rng());
        layer_3->weight = layer_1->weight;
    }
    Var forward(Runtime& rt, const Var& x) override {
        return (*layer_3)(rt, (*layer_2)(rt, (*layer_1)(rt, x)));
    }
    OptimizerConfig configure_optimizers() const override { return m_opt; }
    Linear *layer_1, *layer_2, *layer_3;

private:
    OptimizerConfig m_opt;
};

/// Host fp64 gradient of the tied model's mean cross-entropy (layer_3 uses W1, so
/// dW1 = x^T dh1 + h2^T dlogits).
void tied_reference(const Dataset& d, uint32_t rows, const std::vector<float>& w1,
                    const std::vector<float>& w2, std::vector<double>& g1,
                    std::vector<double>& g2) {
    const uint32_t F = 32, H = 10;
    std::vector<double> h1(rows * H, 0), h2(rows * F, 0), lg(rows * H, 0), dl(rows * H),
        dh2(rows * F, 0), dh1(rows * H, 0);
    for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t j = 0; j < H; ++j)
            for (uint32_t k = 0; k < F; ++k)
                h1[r * H + j] += d.x[r * F + k] * double(w1[k * H + j]);
        for (uint32_t j = 0; j < F; ++j)
            for (uint32_t k = 0; k < H; ++k) h2[r * F + j] += h1[r * H + k] * double(w2[k * F + j]);
        for (uint32_t j = 0; j < H; ++j)
            for (uint32_t k = 0; k < F; ++k) lg[r * H + j] += h2[r * F + k] * double(w1[k * H + j]);
        double mx = -1e300, s = 0;
        for (uint32_t j = 0; j < H; ++j) mx = std::max(mx, lg[r * H + j]);
        for (uint32_t j = 0; j < H; ++j) s += std::exp(lg[r * H + j] - mx);
        for (uint32_t j = 0; j < H; ++j)
            dl[r * H + j] =
                (std::exp(lg[r * H + j] - mx) / s - (d.labels[r] == j ? 1.0 : 0.0)) / rows;
    }
    g1.assign(F * H, 0);
    g2.assign(H * F, 0);
    for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t k = 0; k < F; ++k)
            for (uint32_t j = 0; j < H; ++j) {
                g1[k * H + j] += h2[r * F + k] * dl[r * H + j];
                dh2[r * F + k] += dl[r * H + j] * double(w1[k * H + j]);
            }
        for (uint32_t k = 0; k < H; ++k)
            for (uint32_t j = 0; j < F; ++j) {
                g2[k * F + j] += h1[r * H + k] * dh2[r * F + j];
                dh1[r * H + k] += dh2[r * F + j] * double(w2[k * F + j]);
            }
        for (uint32_t k = 0; k < F; ++k)
            for (uint32_t j = 0; j < H; ++j) g1[k * H + j] += d.x[r * F + k] * dh1[r * H + j];
    }
}

TEST(TrainerWeightTying, OneBufferPerCoreAndGradientsOfBothUses) {
    auto dev = driver::Device::open(board());
    OptimizerConfig sgd;
    sgd.kind = OptimizerConfig::Kind::Sgd;
    sgd.lr = 1.0f;  // one step moves each weight by exactly its gradient
    sgd.momentum = 0.0f;
    WeightSharing model(sgd);
    const auto names = model.named_parameters();
    ASSERT_EQ(names.size(), 2u);
    EXPECT_EQ(names[0].first, "layer_1.weight");
    EXPECT_EQ(names[1].first, "layer_2.weight");
    EXPECT_EQ(model.all_parameter_slots().size(), 3u);
    const std::vector<float> w1 = model.layer_1->weight->initial_values(),
                             w2 = model.layer_2->weight->initial_values();

    TrainerOptions opts;
    opts.devices = 8;
    opts.enable_progress_bar = false;
    opts.limit_train_batches = 1;
    Trainer trainer(*dev, opts);
    const Dataset data = synthetic(64, 32, 10, 5);
    DataLoader loader{&data, 8, false, false, 0};
    trainer.fit(model, loader);
    // After placement the tied slots still share one buffer on every core.
    ASSERT_TRUE(model.layer_3->weight->placed());
    EXPECT_EQ(model.layer_3->weight.get(), model.layer_1->weight.get());
    for (size_t r = 0; r < 8; ++r) {
        EXPECT_EQ(model.layer_3->weight->value.bufs[r].addr,
                  model.layer_1->weight->value.bufs[r].addr);
        EXPECT_EQ(model.layer_3->weight->value.bufs[r].core, r);
    }
    // The update equals minus the fp64 gradient of both uses (32-true: bf16x3 matmuls).
    std::vector<double> g1, g2;
    tied_reference(data, 64, w1, w2, g1, g2);
    const auto now1 = driver::read_tensor(*dev, model.layer_1->weight->value, 3);
    const auto now2 = driver::read_tensor(*dev, model.layer_2->weight->value, 3);
    double err = 0, norm = 0;
    for (size_t i = 0; i < g1.size(); ++i) {
        err = std::max(err, std::abs((double(w1[i]) - now1[i]) - g1[i]));
        norm = std::max(norm, std::abs(g1[i]));
    }
    for (size_t i = 0; i < g2.size(); ++i) {
        err = std::max(err, std::abs((double(w2[i]) - now2[i]) - g2[i]));
        norm = std::max(norm, std::abs(g2[i]));
    }
    EXPECT_GT(norm, 1e-3);
    EXPECT_LT(err, 1e-4 * norm + 1e-6) << "max abs error " << err << " of max |g| " << norm;
}

/// Loss history of a small MLP trained with SGD on `devices` cores, global batch 64.
/// The losses of 10 steps of a model on 1 or 8 cores (64 examples per step in all).
std::vector<float> loss_curve(driver::Device& dev, int devices, const std::string& precision,
                              Module& model, const Dataset& data) {
    TrainerOptions opts;
    opts.devices = devices;
    opts.precision = precision;
    opts.enable_progress_bar = false;
    opts.log_every_n_steps = 1;
    Trainer trainer(dev, opts);
    // 8 cores x 8 rows see the same 64 examples per step as 1 core x 64 rows: replica r takes
    // examples r, r + 8, ... so step s covers examples 64 s .. 64 s + 63 either way.
    DataLoader loader{&data, uint32_t(64 / devices), false, false, 0};
    trainer.fit(model, loader);
    std::vector<float> out;
    for (const StepLog& s : trainer.history()) out.push_back(s.loss);
    return out;
}

OptimizerConfig sgd(float lr) {
    OptimizerConfig o;
    o.kind = OptimizerConfig::Kind::Sgd;
    o.lr = lr;
    return o;
}

/// 1 and 8 cores agree step by step to `tol` (relative) for models made by `make` on `data`.
void expect_same_curves(const std::function<std::unique_ptr<Module>()>& make, const Dataset& data,
                        const char* what, double tol) {
    auto dev = driver::Device::open(board());
    for (const char* precision : {"32-true", "bf16-mixed"}) {
        const auto m1 = make(), m8 = make();
        const auto one = loss_curve(*dev, 1, precision, *m1, data);
        const auto eight = loss_curve(*dev, 8, precision, *m8, data);
        ASSERT_EQ(one.size(), 10u);
        ASSERT_EQ(eight.size(), 10u);
        EXPECT_LT(one.back(), one.front()) << what << ": the loss must fall";
        double worst = 0;
        for (size_t i = 0; i < one.size(); ++i) {
            EXPECT_NEAR(eight[i], one[i], tol * std::abs(one[i])) << precision << " step " << i;
            worst = std::max(worst, std::abs(double(eight[i]) - one[i]) / std::abs(one[i]));
        }
        std::printf("%s %s: largest relative loss difference, 8 cores vs 1 core, 10 steps: %.3g\n",
                    what, precision, worst);
    }
}

TEST(TrainerDataParallel, CnnEightCoresMatchOneCoreLossCurve) {
    expect_same_curves(
        [] {
            return std::make_unique<Cnn>(ImageShape{28, 28, 1}, 10, sgd(0.05f), 11);
        },
        synthetic(640, 784, 10, 9), "CNN", 1e-4);
}

TEST(TrainerDataParallel, GptEightCoresMatchOneCoreLossCurve) {
    // Looser than the MLP's 1e-5: attention's gradients pass through bf16 MXU operands, where a
    // last-bit fp32 difference of a partial sum can flip a bf16 rounding (2^-8 relative) and
    // grow over the steps; measured 6e-5 (32-true) and 5e-4 (bf16-mixed) after 10 steps.
    // Windows of 16 tokens of a stream with structure (token t mostly follows t - 1 + 1).
    std::vector<uint8_t> stream{0};
    std::mt19937 rng(5);
    while (stream.size() < 640 * 16 + 1)
        stream.push_back(uint8_t(rng() % 4 == 0 ? rng() % 20 : (stream.back() + 1) % 20));
    GptConfig g;
    g.vocab = 20;
    g.layers = 1;
    g.hidden = 32;
    g.heads = 2;
    g.seq = 16;
    expect_same_curves([&] { return std::make_unique<Gpt>(g, sgd(0.5f), 11); },
                       token_windows(stream, 20, 16, 16), "GPT", 1e-3);
}

TEST(TrainerDataParallel, EightCoresMatchOneCoreLossCurve) {
    auto dev = driver::Device::open(board());
    const Dataset data = synthetic(640, 64, 10, 9);
    for (const char* precision : {"32-true", "bf16-mixed"}) {
        Mlp m1({64, 32, 10}, sgd(0.1f), 11), m8({64, 32, 10}, sgd(0.1f), 11);
        const auto one = loss_curve(*dev, 1, precision, m1, data);
        const auto eight = loss_curve(*dev, 8, precision, m8, data);
        ASSERT_EQ(one.size(), 10u);
        ASSERT_EQ(eight.size(), 10u);
        EXPECT_LT(one.back(), one.front()) << "the loss must fall";
        // Not bit-equal: 8 cores sum each gradient as 8 partial sums of 8 rows added around
        // the ring, 1 core sums 64 rows in one pass; fp32 rounding differs in the last bits.
        double worst = 0;
        for (size_t i = 0; i < one.size(); ++i) {
            EXPECT_NEAR(eight[i], one[i], 1e-5 * std::abs(one[i])) << precision << " step " << i;
            worst = std::max(worst, std::abs(double(eight[i]) - one[i]) / std::abs(one[i]));
        }
        std::printf("%s: largest relative loss difference, 8 cores vs 1 core, 10 steps: %.3g\n",
                    precision, worst);
    }
}

TEST(TrainerDataParallel, ReachesHighAccuracyAndKeepsReplicasIdentical) {
    auto dev = driver::Device::open(board());
    OptimizerConfig adam;
    adam.lr = 1e-2f;
    Mlp model({64, 32, 10}, adam, 1);
    TrainerOptions opts;
    opts.devices = std::string("auto");
    opts.precision = "bf16-mixed";
    opts.enable_progress_bar = false;
    opts.max_epochs = 4;
    Trainer trainer(*dev, opts);
    const Dataset all = synthetic(1280, 64, 10, 21);
    const Dataset train = subset(all, 0, 1024), test = subset(all, 1024, 256);
    DataLoader loader{&train, 16, true, true, 0}, test_loader{&test, 16, false, false, 0};
    trainer.fit(model, loader, &test_loader);
    const EvalResult r = trainer.validate(model, test_loader);
    EXPECT_EQ(r.examples, 256u);
    EXPECT_GT(r.accuracy, 0.9);
    EXPECT_EQ(trainer.global_step(), 4u * (1024 / 8 / 16));
    // fit() verified the replicas; check again byte for byte.
    const auto a = driver::read_tensor(*dev, trainer.flat_parameters(), 0);
    for (size_t i = 1; i < 8; ++i)
        EXPECT_EQ(driver::read_tensor(*dev, trainer.flat_parameters(), i), a);
    // The metrics report counts what happened.
    const Metrics& m = trainer.metrics();
    EXPECT_EQ(m.counter("MarkStep"), trainer.global_step());
    EXPECT_GT(m.counter("CachedCompile"), m.counter("UncachedCompile"));
    const std::string rep = trainer.metrics_report();
    for (const char* key :
         {"Metric: CompileTime", "Metric: ExecuteTime", "Metric: TransferToDeviceTime",
          "Metric: TransferFromDeviceTime", "Metric: InboundData", "Metric: OutboundData",
          "Counter: CachedCompile", "Counter: UncachedCompile", "Counter: MarkStep",
          "Counter: HostSync", "Host syncs:"})
        EXPECT_NE(rep.find(key), std::string::npos) << key << "\n" << rep;
    EXPECT_TRUE(trainer.warnings().empty());
}

/// Every layer kind in one model: Linear, LayerNorm, GELU, Dropout, ReLU.
class Blocks : public Module {
public:
    Blocks() : Module(4) {
        fc1 = &add<Linear>("fc1", 16, 32, true, rng());
        norm = &add<LayerNorm>("norm", 32);
        drop = &add<Dropout>("drop", 0.1f, 7u);
        fc2 = &add<Linear>("fc2", 32, 4, true, rng());
    }
    Var forward(Runtime& rt, const Var& x) override {
        return (*fc2)(rt, relu(rt, (*drop)(rt, gelu(rt, (*norm)(rt, (*fc1)(rt, x))))));
    }
    OptimizerConfig configure_optimizers() const override {
        OptimizerConfig o;
        o.lr = 1e-2f;
        return o;
    }
    Linear *fc1, *fc2;
    LayerNorm* norm;
    Dropout* drop;
};

/// An embedding table looked up by one-hot token ids, then GELU and a classifier.
class Embed : public Module {
public:
    Embed() : Module(5) {
        emb = &add<Embedding>("emb", 8, 16, rng());
        fc = &add<Linear>("fc", 16, 4, true, rng());
    }
    Var forward(Runtime& rt, const Var& x) override { return (*fc)(rt, gelu(rt, (*emb)(rt, x))); }
    OptimizerConfig configure_optimizers() const override {
        OptimizerConfig o;
        o.lr = 3e-2f;
        return o;
    }
    Embedding* emb;
    Linear* fc;
};

/// 1 device and `all` devices of the preset `name` agree step by step, with the tolerance
/// and its reason of EightCoresMatchOneCoreLossCurve (one board per process: SystemC).
void expect_one_device_matches_all(const std::string& name, int all) {
    auto dev = driver::Device::open(
        hw::BoardConfig::load(test::source_dir() + "/configs/" + name + ".json", {}));
    const Dataset data = synthetic(640, 64, 10, 9);
    Mlp m1({64, 32, 10}, sgd(0.1f), 11), mn({64, 32, 10}, sgd(0.1f), 11);
    const auto one = loss_curve(*dev, 1, "bf16-mixed", m1, data);
    const auto many = loss_curve(*dev, all, "bf16-mixed", mn, data);
    ASSERT_EQ(one.size(), 10u);
    ASSERT_EQ(many.size(), 10u);
    EXPECT_LT(one.back(), one.front()) << "the loss must fall";
    for (size_t i = 0; i < one.size(); ++i)
        EXPECT_NEAR(many[i], one[i], 1e-5 * std::abs(one[i])) << "step " << i;
}

TEST(TrainerPresets, V6eOneCoreMatchesEight) {
    // The kernels on 256 x 256 MXUs (configs/v6e-8.json).
    expect_one_device_matches_all("v6e-8", 8);
}

TEST(TrainerPresets, V4OneMegacoreMatchesFour) {
    // A device is a chip (configs/v4-8.json): 1 device is cores 0-1 splitting its batch, 4
    // devices are all 8 cores.
    expect_one_device_matches_all("v4-8", 4);
}

TEST(TrainerLayers, EveryLayerTrainsOnEightCores) {
    auto dev = driver::Device::open(board());
    TrainerOptions opts;
    opts.devices = 8;
    opts.enable_progress_bar = false;
    opts.log_every_n_steps = 1;
    opts.max_epochs = 3;
    {
        const Dataset all = synthetic(1280, 16, 4, 8);
        const Dataset train = subset(all, 0, 1024), test = subset(all, 1024, 256);
        Blocks model;
        EXPECT_EQ(model.named_parameters().size(), 6u);  // 2 x (weight, bias), gain, bias
        Trainer tr(*dev, opts);
        tr.fit(model, DataLoader{&train, 16, true, true, 0});
        EXPECT_LT(tr.history().back().loss, 0.5f * tr.history().front().loss);
        EXPECT_GT(tr.validate(model, DataLoader{&test, 16, false, false, 0}).accuracy, 0.9);
    }
    {
        // Token t (one-hot of 8) has class t % 4.
        Dataset tokens{1024, 8, 4, std::vector<float>(1024 * 8, 0.0f), std::vector<uint8_t>(1024)};
        for (uint32_t i = 0; i < 1024; ++i) {
            tokens.x[i * 8 + (i * 5) % 8] = 1.0f;
            tokens.labels[i] = uint8_t(((i * 5) % 8) % 4);
        }
        Embed model;
        Trainer tr(*dev, opts);
        tr.fit(model, DataLoader{&tokens, 16, true, true, 0});
        EXPECT_LT(tr.history().back().loss, 0.2f * tr.history().front().loss);
        EXPECT_EQ(tr.validate(model, DataLoader{&tokens, 16, false, false, 0}).accuracy, 1.0);
    }
}

/// A bigram language model: the logits of the next token are a row of a vocab x vocab table.
class Bigram : public Module {
public:
    explicit Bigram(uint32_t vocab) : Module(3) {
        emb = &add<Embedding>("emb", vocab, vocab, rng());
    }
    Var forward(Runtime& rt, const Var& x) override { return (*emb)(rt, x); }
    OptimizerConfig configure_optimizers() const override {
        OptimizerConfig o;
        o.lr = 0.1f;
        return o;
    }
    Embedding* emb;
};

TEST(TrainerLanguageModel, TokenWindowsTrainEveryPositionAndStopAtMaxSteps) {
    // Token t is always followed by (3 t + 1) mod 7, so a bigram model can predict every token;
    // a window row labelled with the wrong position could not be learnt.
    std::vector<uint8_t> stream{0};
    while (stream.size() < 4000) stream.push_back(uint8_t((3 * stream.back() + 1) % 7));
    const Dataset train = token_windows(stream, 7, 16, 1);
    const Dataset val = token_windows(stream, 7, 16, 16);
    auto dev = driver::Device::open(board());
    TrainerOptions opts;
    opts.devices = 8;
    opts.enable_progress_bar = false;
    opts.precision = "bf16-mixed";
    opts.log_every_n_steps = 10;
    opts.max_epochs = 5;
    opts.max_steps = 60;  // 3984 windows / (8 x 4) = 124 steps in an epoch: stops mid-epoch
    Trainer tr(*dev, opts);
    Bigram model(7);
    tr.fit(model, DataLoader{&train, 4, true, true, 0});
    EXPECT_EQ(tr.global_step(), 60u);
    EXPECT_EQ(tr.history().back().step, 59u);
    EXPECT_EQ(tr.step_times().size(), 60u);
    const EvalResult r = tr.validate(model, DataLoader{&val, 4, false, false, 0});
    EXPECT_EQ(r.examples, val.count);
    EXPECT_EQ(r.accuracy, 1.0);
    EXPECT_LT(r.loss, 0.1);
    // Resuming the count: a second fit with the same max_steps trains nothing more.
    tr.fit(model, DataLoader{&train, 4, true, true, 0});
    EXPECT_EQ(tr.global_step(), 60u);
}

TEST(TrainerProfile, LayersOwnTheirForwardAndBackwardKernels) {
    // MLP 16-8-4 on one core, bf16-mixed, one step of 32 rows. layer_1's forward is one matmul
    // and one bias add; its backward a weight-gradient matmul and a bias column sum (its input
    // needs no gradient). layer_2 adds the input-gradient matmul.
    auto dev = driver::Device::open(board());
    TrainerOptions opts;
    opts.devices = 1;
    opts.enable_progress_bar = false;
    opts.precision = "bf16-mixed";
    opts.limit_train_batches = 1;
    Trainer tr(*dev, opts);
    Mlp model({16, 8, 4}, {}, 2);
    const Dataset data = synthetic(64, 16, 4, 3);
    tr.fit(model, DataLoader{&data, 32, false, true, 0});
    const auto& layers = tr.layer_profiles();
    ASSERT_EQ(layers.size(), 2u);
    EXPECT_EQ(layers[0].name, "layer_1");
    EXPECT_EQ(layers[0].kind, "linear");
    EXPECT_EQ(layers[1].name, "layer_2");
    // The fused matmul loads ragged K x N weight tiles (the array pads them), so each matmul
    // counts M x K x N MACs: layer_1 forward 32 x 16 x 8 and weight gradient 16 x 32 x 8;
    // layer_2 forward 32 x 8 x 4, weight gradient 8 x 32 x 4 and input gradient 32 x 4 x 8.
    EXPECT_EQ(layers[0].work.mxu_macs, 32u * 16 * 8 + 16 * 32 * 8);
    EXPECT_EQ(layers[1].work.mxu_macs, 32u * 8 * 4 + 8 * 32 * 4 + 32 * 4 * 8);
    EXPECT_GT(layers[0].work.hbm_bytes(), 0u);
    EXPECT_LT(layers[0].first_cycle, layers[1].first_cycle);
    // layer_1's backward runs after layer_2's, so it ends last.
    EXPECT_GT(layers[0].last_cycle, layers[1].last_cycle);
    // Every kernel of a layer is counted once: the layers' launches are a part of the total.
    uint64_t launches = 0;
    for (const auto& l : layers) launches += l.work.launches;
    EXPECT_LT(launches, dev->kernel_totals().launches);
    // layer_1: the forward matmul (its bias in the epilogue), the weight and bias gradients.
    EXPECT_GE(layers[0].work.launches, 3u);
    // Forward, then backward after the other layer's: two spans each, none overlapping.
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& l : layers) {
        EXPECT_EQ(l.spans.size(), 2u) << l.name;
        spans.insert(spans.end(), l.spans.begin(), l.spans.end());
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
    tr.clear_layer_profiles();
    EXPECT_TRUE(tr.layer_profiles().empty());
}

TEST(TrainerPredict, EveryExampleOnceInDatasetOrderOnAnyCoreSet) {
    // 37 examples: on cores {2, 5, 7} the shards are 13 each with two padding rows. Row
    // results do not depend on the shard, so both core sets give the same bits.
    auto dev = driver::Device::open(board());
    const Dataset data = synthetic(37, 16, 4, 3);
    std::vector<PredictResult> got;
    for (const std::vector<uint32_t>& cores :
         {std::vector<uint32_t>{0}, std::vector<uint32_t>{2, 5, 7}}) {
        TrainerOptions opts;
        opts.cores = cores;
        opts.precision = "bf16-mixed";
        opts.enable_progress_bar = false;
        Trainer tr(*dev, opts);
        EXPECT_EQ(tr.cores(), cores);
        Mlp model({16, 8, 4}, {}, 2);
        got.push_back(tr.predict(model, DataLoader{&data, 4, false, false, 0}));
        EXPECT_GT(got.back().forward_cycles, 0u);
    }
    ASSERT_EQ(got[0].cols, 4u);
    ASSERT_EQ(got[0].outputs.size(), 37u * 4);
    EXPECT_EQ(std::memcmp(got[0].outputs.data(), got[1].outputs.data(), 37 * 4 * 4), 0);
    TrainerOptions bad;
    bad.cores = {1, 9};
    EXPECT_EQ(error_of([&] { Trainer t(*dev, bad); }),
              "cores: core 9 is not on the board (the board has 8 cores)");
    bad.cores = {3, 3};
    EXPECT_EQ(error_of([&] { Trainer t(*dev, bad); }),
              "cores: core 3 is listed twice (the board has 8 cores)");
}

TEST(TrainerDataParallel, ChangingBatchShapeWarnsOfRecompilation) {
    auto dev = driver::Device::open(board());
    Mlp model({16, 8, 4}, {}, 2);
    TrainerOptions opts;
    opts.devices = 8;
    opts.enable_progress_bar = false;
    Trainer trainer(*dev, opts);
    std::vector<std::string> seen;
    trainer.on_warning([&](const std::string& w) { seen.push_back(w); });
    // 200 examples: 25 per core, batches of 8, 8, 8 and a last one of 1.
    const Dataset data = synthetic(200, 16, 4, 3);
    DataLoader loader{&data, 8, false, false, 0};
    trainer.fit(model, loader);
    EXPECT_EQ(trainer.global_step(), 4u);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].rfind("warning: step 3 compiled ", 0), 0u) << seen[0];
    EXPECT_NE(seen[0].find("its batch has 1 rows per device instead of 8"), std::string::npos)
        << seen[0];
}

/// The checkpoint tests' runs: 8 cores, three steps, no progress bar.
TrainerOptions checkpoint_options() {
    TrainerOptions opts;
    opts.devices = 8;
    opts.enable_progress_bar = false;
    opts.limit_train_batches = 3;
    return opts;
}

/// Trains `model` with `trainer` on a small synthetic set, then saves a checkpoint to `path`.
void fit_and_save(Trainer& trainer, Module& model, const std::string& path) {
    const Dataset data = synthetic(256, 16, 4, 3);
    DataLoader loader{&data, 8, true, true, 0};
    trainer.fit(model, loader);
    trainer.save_checkpoint(path);
}

TEST(TrainerCheckpoint, SaveIsAtomicAndLoadRestoresParameters) {
    auto dev = driver::Device::open(board());
    const std::string path = test::scratch("ckpt.ckpt");
    const TrainerOptions opts = checkpoint_options();
    Trainer a(*dev, opts);
    Mlp model({16, 8, 4}, {}, 2);
    fit_and_save(a, model, path);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    const auto saved = driver::read_tensor(*dev, a.flat_parameters(), 0);

    Trainer b(*dev, opts);
    Mlp fresh({16, 8, 4}, {}, 99);
    b.load_checkpoint(fresh, path);
    for (size_t r = 0; r < 8; ++r)
        EXPECT_EQ(driver::read_tensor(*dev, b.flat_parameters(), r), saved);
    EXPECT_EQ(b.global_step(), 3u);

    Mlp other({16, 4, 4}, {}, 2);
    Trainer c(*dev, opts);
    EXPECT_EQ(error_of([&] { c.load_checkpoint(other, path); }),
              "checkpoint '" + path +
                  "': parameter 0 is layer_1.weight 16 x 8, the module has layer_1.weight 16 x 4");
    {
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f << "garbage";
    }
    EXPECT_EQ(error_of([&] { c.load_checkpoint(fresh, path); }),
              "checkpoint '" + path + "': not a tpusim checkpoint");
    std::filesystem::remove(path);
    EXPECT_EQ(error_of([&] { c.load_checkpoint(fresh, path); }),
              "checkpoint: cannot open '" + path + "': No such file or directory");
}

TEST(Trainer, OptimizerAndBatchLimitsAreValidated) {
    OptimizerConfig opt;
    opt.lr = NAN;
    EXPECT_EQ(error_of([&] { opt.validate(); }), "Invalid learning rate: nan");
    opt.lr = 0.1f;
    opt.momentum = -1.0f;
    EXPECT_EQ(error_of([&] { opt.validate(); }), "Invalid momentum value: -1");
    opt.momentum = 0.9f;
    opt.beta2 = 1.0f;
    EXPECT_EQ(error_of([&] { opt.validate(); }), "Invalid beta parameter at index 1: 1");
    auto dev = driver::Device::open(board());
    TrainerOptions opts;
    opts.limit_train_batches = -5;
    EXPECT_EQ(error_of([&] { Trainer t(*dev, opts); }),
              "`limit_train_batches` must be a number of batches >= 1 or -1 (all). Got -5");
    opts.limit_train_batches = 1;
    opts.limit_val_batches = 0;
    EXPECT_EQ(error_of([&] { Trainer t(*dev, opts); }),
              "`limit_val_batches` must be a number of batches >= 1 or -1 (all). Got 0");
}

TEST(Trainer, ValidationLossIsTheMeanOverExamples) {
    // 200 examples on 8 cores: 25 per core, batches of 8, 8, 8 and 1 row per core. Weighted by
    // batch size the loss equals the one of a single batch of 25 rows; an unweighted mean of the
    // four batch means would count the one-row batch as much as a full one.
    auto dev = driver::Device::open(board());
    TrainerOptions opts;
    opts.devices = 8;
    opts.enable_progress_bar = false;
    opts.precision = "32-true";
    Trainer trainer(*dev, opts);
    Mlp model({16, 8, 4}, {}, 2);
    const Dataset data = synthetic(200, 16, 4, 3);
    const EvalResult whole = trainer.validate(model, DataLoader{&data, 25, false, false, 0});
    const EvalResult split = trainer.validate(model, DataLoader{&data, 8, false, false, 0});
    EXPECT_EQ(whole.examples, 200u);
    EXPECT_EQ(split.examples, 200u);
    EXPECT_NEAR(split.loss, whole.loss, 1e-5 * whole.loss);
}

TEST(Trainer, ValidationPaddingWeighsNothingInAnyFigure) {
    // Issue #30, class 14. 203 examples on 8 cores: 26 positions per core, 5 of them the
    // sampler's repeats. They run (their cycles count, as on a TPU) but their labels are zero,
    // so the loss, like the accuracy and the count, is that of the 203 examples: one core,
    // which pads nothing, gives the same figures up to the order of fp32 sums.
    auto dev = driver::Device::open(board());
    const Dataset data = synthetic(203, 16, 4, 3);
    EvalResult on[2];
    for (const int devices : {8, 1}) {
        TrainerOptions opts;
        opts.devices = devices;
        opts.enable_progress_bar = false;
        opts.precision = "32-true";
        Trainer t(*dev, opts);
        Mlp model({16, 8, 4}, {}, 2);
        on[devices == 1] = t.validate(model, DataLoader{&data, 8, false, false, 0});
    }
    EXPECT_EQ(on[0].examples, 203u);
    EXPECT_EQ(on[1].examples, 203u);
    EXPECT_EQ(on[0].accuracy, on[1].accuracy);
    EXPECT_NEAR(on[0].loss, on[1].loss, 1e-5 * on[1].loss);
}

TEST(Trainer, AFitThatTakesNoStepSaysWhichLimitInLightningsWords) {
    // Issue #30, class 8: max_steps=0 (or a resumed run at its limit) trains nothing; Lightning
    // says so rather than reporting a loss.
    auto dev = driver::Device::open(board());
    const Dataset data = synthetic(64, 16, 4, 3);
    TrainerOptions opts;
    opts.enable_progress_bar = false;
    opts.max_steps = 0;
    Trainer t(*dev, opts);
    Mlp model({16, 8, 4}, {}, 2);
    t.fit(model, DataLoader{&data, 8, true, false, 0});
    EXPECT_EQ(t.fit_steps(), 0u);
    EXPECT_TRUE(t.history().empty());
    EXPECT_EQ(t.stop_reason(), "`Trainer.fit` stopped: `max_steps=0` reached.");
    opts.max_steps = -1;
    Trainer u(*dev, opts);
    u.fit(model, DataLoader{&data, 8, true, false, 0});
    EXPECT_EQ(u.fit_steps(), 1u);  // 64 examples over 8 cores: one batch of 8 per core
    EXPECT_EQ(u.stop_reason(), "`Trainer.fit` stopped: `max_epochs=1` reached.");
}

TEST(TrainerCheckpoint, HeaderFieldsAreCheckedBeforeUse) {
    auto dev = driver::Device::open(board());
    const std::string path = test::scratch("ckpt-hdr.ckpt");
    const TrainerOptions opts = checkpoint_options();
    Trainer a(*dev, opts);
    Mlp model({16, 8, 4}, {}, 2);
    fit_and_save(a, model, path);
    const std::string good = test::slurp(path);
    // The header is the line after the magic "TPUCKPT1\n".
    const size_t from = good.find('\n') + 1, to = good.find('\n', from);
    const std::string header = good.substr(from, to - from);
    auto with = [&](const std::string& find, const std::string& replace, const std::string& tail) {
        std::string h = header;
        const size_t at = h.find(find);
        EXPECT_NE(at, std::string::npos) << find;
        if (at != std::string::npos) h.replace(at, find.size(), replace);
        std::ofstream(path, std::ios::binary | std::ios::trunc)
            << good.substr(0, from) << h << good.substr(to) << tail;
        Trainer t(*dev, opts);
        Mlp fresh({16, 8, 4}, {}, 99);
        return error_of([&] { t.load_checkpoint(fresh, path); });
    };
    const std::string c = "checkpoint '" + path + "': ";
    EXPECT_EQ(with("\"adam_step\":3", "\"adam_step\":-1e20", ""),
              c + "'adam_step' is -1e+20, expected a whole number from 0 to 3");
    EXPECT_EQ(with("\"adam_step\":3", "\"adam_step\":4", ""),
              c + "'adam_step' is 4, expected a whole number from 0 to 3");
    EXPECT_EQ(with("\"epoch\":1", "\"epoch\":-5", ""),
              c + "'epoch' is -5, expected a whole number from 0 to 3");
    EXPECT_EQ(with("\"global_step\":3", "\"global_step\":\"3\"", ""),
              c + "'global_step' is \"3\", expected a whole number from 0 to 9007199254740992");
    EXPECT_EQ(with("\"offset\":0", "\"offset\":100000", ""),
              c + "parameter 0 (layer_1.weight) is at offset 100000, the module's layout puts it "
                  "at 0");
    EXPECT_EQ(with("\"rows\":16", "\"rows\":\"x\"", ""),
              c + "parameter 0: 'rows' is \"x\", expected a whole number from 0 to 4294967295");
    EXPECT_EQ(with("\"values\"", "\"valuez\"", ""), c + "'values' is missing");
    EXPECT_NE(with("", "", "extra").find("bytes of values after its header"), std::string::npos);
    EXPECT_EQ(with("", "", ""), "no error");
    // Issue #30, class 9: a malformed header gets words, not nlohmann's exception text, and a
    // key given twice is refused (nlohmann would keep the last one silently).
    EXPECT_EQ(with("{", "{x", ""),
              c + "the header (line 2) is not valid JSON at column 2: syntax error while parsing "
                  "object key - invalid literal; last read: '{x'; expected string literal");
    EXPECT_EQ(with("\"epoch\":1", "\"epoch\":1,\"epoch\":1", ""),
              c + "the header gives 'epoch' twice");
    EXPECT_EQ(with("\"rows\":16", "\"rows\":16,\"rows\":16", ""),
              c + "the header gives 'parameters.rows' twice");
}

}  // namespace
}  // namespace tpu::trainer
