// SPDX-License-Identifier: Apache-2.0
// The host timeline (trainer/host_timeline.h): exact phase cycles of the model, and each of
// Lightning's TPU performance pitfalls seen through the Trainer's C++ API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "driver/device.h"
#include "hw/board_config.h"
#include "trainer/dataset.h"
#include "trainer/host_timeline.h"
#include "trainer/trainer.h"

namespace tpu::trainer {
namespace {

/// Round numbers at 1000 MHz, where a microsecond is 1000 cycles.
hw::RuntimeConfig round_costs() {
    hw::RuntimeConfig c;
    c.trace_op_us = 10;
    c.step_overhead_us = 100;
    c.compile_base_ms = 1;
    c.compile_op_ms = 0.5;
    c.dispatch_us = 50;
    c.host_read_us = 20;
    c.cpu_fallback_us = 300;
    return c;
}

TEST(HostTimeline, PhasesOverlapTheDeviceUntilAReadForcesAWait) {
    HostTimeline t(round_costs(), sim::ClockDomain{1000.0});
    HostStep s;
    s.ops = 10;                 // trace: 100 + 10 x 10 = 200 us = 200'000 cycles
    s.device_cycles = 200'000;  // 200 us on the device
    s.compiled = true;          // compile: 1 + 10 x 0.5 = 6 ms = 6'000'000 cycles
    const StepWall w0 = t.add(s);
    EXPECT_EQ(w0.trace_end, 200'000u);
    EXPECT_EQ(w0.lock_end, 200'000u);  // nothing ran before
    EXPECT_EQ(w0.compile_end, 6'200'000u);
    EXPECT_EQ(w0.dispatch_end, 6'250'000u);  // + 50 us
    EXPECT_EQ(w0.device_end, 6'450'000u);
    EXPECT_EQ(w0.host_end, 6'250'000u);  // no read: the host runs ahead
    EXPECT_EQ(w0.wall_cycles, 6'450'000u);
    // A cache hit: the host traced during the device's 200 us, waits for the lock at 6'450'000
    // and dispatches: max(200, 200) + 50 us.
    s.compiled = false;
    const StepWall w1 = t.add(s);
    EXPECT_EQ(w1.trace_begin, 6'250'000u);
    EXPECT_EQ(w1.lock_end, 6'450'000u);
    EXPECT_EQ(w1.wall_cycles, 250'000u);
    EXPECT_EQ(w1.device_idle, 50'000u);  // the dispatch
    // A step with .item(): same wall time, but the host is held until the device is done.
    s.reads = 1;
    const StepWall w2 = t.add(s);
    EXPECT_EQ(w2.wall_cycles, 250'000u);
    EXPECT_EQ(w2.host_end, w2.device_end + 20'000u);
    // So the next step cannot overlap: read 20 + trace 200 + dispatch 50 + device 200 us.
    s.reads = 0;
    const StepWall w3 = t.add(s);
    EXPECT_EQ(w3.wall_cycles, 470'000u);
    EXPECT_EQ(t.wall_cycles(), 6'450'000u + 250'000u + 250'000u + 470'000u);
    EXPECT_EQ(t.device_cycles(), 4 * 200'000u);
    EXPECT_EQ(t.device_idle_cycles(), t.wall_cycles() - t.device_cycles());
}

TEST(HostTimeline, DeviceBoundStepsHideTheHostAndFallbacksWaitForTheDevice) {
    HostTimeline t(round_costs(), sim::ClockDomain{1000.0});
    HostStep s;
    s.ops = 10;
    s.device_cycles = 1'000'000;  // 1 ms: longer than the 200 us trace
    t.add(s);
    // Steady state: max(200 us, 1 ms) + 50 us dispatch.
    EXPECT_EQ(t.add(s).wall_cycles, 1'050'000u);
    // Step 1 was dispatched at 1'300'000 and runs to 2'300'000. A CPU fallback in step 2 needs
    // the device's values: traced by 1'500'000, it waits for the device, then dispatches the
    // graph so far and runs the op on the host: 50 + 300 us.
    s.cpu_fallbacks = {"aten::nonzero"};
    const StepWall w = t.add(s);
    EXPECT_EQ(w.trace_end, 1'300'000u + 200'000u);
    EXPECT_EQ(w.fallback_end, 2'300'000u + 350'000u);
    EXPECT_EQ(w.lock_end, w.fallback_end);
    EXPECT_EQ(w.wall_cycles, 350'000u + 50'000u + 1'000'000u);
}

// ---- Lightning's TPU pitfalls through the Trainer -------------------------------------------

/// One Device per test process (SystemC elaborates one design per process): the trainings of
/// a test share it, each with its own Trainer (and so its own compile cache).
struct Training {
    std::vector<StepTime> steps;
    const Metrics* metrics = nullptr;
    std::unique_ptr<Trainer> trainer;
    std::unique_ptr<Module> model;
    Dataset data;
};

/// Trains an MLP 64-32-10 on synthetic data with `rows` examples per device.
void train(driver::Device& dev, Training& r, uint32_t rows, uint32_t log_every, uint32_t examples,
           bool drop_last, std::unique_ptr<Module> model = nullptr) {
    TrainerOptions opts;
    opts.devices = 8;
    opts.precision = "bf16-mixed";
    opts.enable_progress_bar = false;
    opts.log_every_n_steps = log_every;
    r.trainer = std::make_unique<Trainer>(dev, opts);
    r.trainer->on_warning([](const std::string&) {});
    OptimizerConfig sgd;
    sgd.kind = OptimizerConfig::Kind::Sgd;
    r.model =
        model ? std::move(model) : std::make_unique<Mlp>(std::vector<uint32_t>{64, 32, 10}, sgd, 3);
    r.data = synthetic(examples, 64, 10, 5);
    const DataLoader loader{&r.data, rows, false, drop_last, 0};
    r.trainer->fit(*r.model, loader);
    r.steps = r.trainer->step_times();
    r.metrics = &r.trainer->metrics();
}

TEST(HostTimelinePitfalls, SmallBatchIsHostBound) {
    // 16 examples per device: the device needs far less than the host's tracing and dispatch,
    // so the host sets the pace: step n is dispatched trace + dispatch after step n-1 was, and
    // the wall clock from one device end to the next is trace + dispatch + D_n - D_(n-1) (no
    // read, no compile), while the device idles. With 8x the rows the host's work per step is
    // the same: about 8x the examples per second.
    auto dev = driver::Device::open(hw::BoardConfig{});
    Training small, large;
    train(*dev, small, 16, 1000, 8 * 16 * 4, true);
    train(*dev, large, 128, 1000, 8 * 128 * 4, true);
    const HostTimeline& t = small.trainer->host_timeline();
    const double dispatch = std::llround(t.config().dispatch_us * t.clock().mhz());
    for (const Training* r : {&small, &large}) {
        ASSERT_EQ(r->steps.size(), 4u);
        const StepTime& s = r->steps[2];
        EXPECT_FALSE(s.compiled);
        EXPECT_EQ(double(s.wall_cycles), double(t.trace_cycles(s.ops)) + dispatch +
                                             double(s.cycles) - double(r->steps[1].cycles));
        EXPECT_GT(s.wall_cycles, 2 * s.cycles) << "host-bound";
    }
    EXPECT_NEAR(double(large.steps[2].wall_cycles), double(small.steps[2].wall_cycles),
                0.01 * double(small.steps[2].wall_cycles));
    EXPECT_LT(large.steps[2].cycles, 8 * small.steps[2].cycles);
}

TEST(HostTimelinePitfalls, ItemEveryStepStopsTheOverlap) {
    // log_every_n_steps=1 reads the loss (.item()) every step: the host waits for the device,
    // then traces the next step, so a steady step costs read + trace + dispatch + device time
    // instead of max(trace, device) + dispatch.
    auto dev = driver::Device::open(hw::BoardConfig{});
    Training every, rarely;
    train(*dev, every, 16, 1, 8 * 16 * 4, true);
    train(*dev, rarely, 16, 1000, 8 * 16 * 4, true);
    const HostTimeline& t = every.trainer->host_timeline();
    const auto cyc = [&](double us) { return double(std::llround(us * t.clock().mhz())); };
    const StepTime& e = every.steps[2];
    EXPECT_EQ(double(e.wall_cycles), cyc(t.config().host_read_us) + double(t.trace_cycles(e.ops)) +
                                         cyc(t.config().dispatch_us) + double(e.cycles));
    EXPECT_GT(e.wall_cycles, rarely.steps[2].wall_cycles);
    EXPECT_EQ(every.trainer->train_host_syncs(), 4u);
    EXPECT_EQ(rarely.trainer->train_host_syncs(), 1u);  // the epoch's last step logs
}

TEST(HostTimelinePitfalls, FirstStepsCompileAndAChangingShapeRecompiles) {
    // 8 x 16 x 3 + 8 x 8 examples: three full steps, then one of 8 rows per device.
    auto dev = driver::Device::open(hw::BoardConfig{});
    Training r;
    train(*dev, r, 16, 1000, 8 * 16 * 3 + 8 * 8, false);
    ASSERT_EQ(r.steps.size(), 4u);
    const HostTimeline& t = r.trainer->host_timeline();
    EXPECT_TRUE(r.steps[0].compiled);
    EXPECT_FALSE(r.steps[1].compiled);
    EXPECT_FALSE(r.steps[2].compiled);
    EXPECT_TRUE(r.steps[3].compiled);  // the new shape
    EXPECT_EQ(r.trainer->compiled_steps(), 2u);
    // The first step pays trace + compile + dispatch before the device starts.
    const StepWall& w0 = t.steps()[0];
    EXPECT_EQ(w0.compile_end - w0.lock_end, t.compile_cycles(r.steps[0].ops));
    EXPECT_EQ(t.steps()[3].compile_end - t.steps()[3].lock_end, t.compile_cycles(r.steps[3].ops));
    EXPECT_GT(r.steps[3].wall_cycles, t.compile_cycles(r.steps[3].ops));
    // One CompileTime sample per compiled graph, valued at the timeline's compile time.
    const MetricSamples* c = r.metrics->metric("CompileTime");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->value.size(), r.metrics->counter("UncachedCompile"));
    EXPECT_DOUBLE_EQ(c->value[0], t.clock().seconds(double(t.compile_cycles(r.steps[0].ops))));
    EXPECT_EQ(r.trainer->warnings().size(), 1u);
}

/// The MLP with one op its training step runs on the CPU, as a PyTorch/XLA model does with an op
/// XLA cannot lower (the Python front end records them this way).
class WithFallback : public Mlp {
public:
    using Mlp::Mlp;
    Var training_step(Runtime& rt, const Batch& batch) override {
        rt.cpu_fallback("aten::nonzero");
        return Mlp::training_step(rt, batch);
    }
};

TEST(HostTimelinePitfalls, ACpuFallbackIsCountedAndWaitsForTheDevice) {
    OptimizerConfig sgd;
    sgd.kind = OptimizerConfig::Kind::Sgd;
    auto dev = driver::Device::open(hw::BoardConfig{});
    Training with, without;
    train(*dev, with, 16, 1000, 8 * 16 * 4, true,
          std::make_unique<WithFallback>(std::vector<uint32_t>{64, 32, 10}, sgd, 3));
    train(*dev, without, 16, 1000, 8 * 16 * 4, true);
    EXPECT_EQ(with.metrics->counter("aten::nonzero"), 4u);
    EXPECT_EQ(without.metrics->counter("aten::nonzero"), 0u);
    const HostTimeline& t = with.trainer->host_timeline();
    const auto cyc = [&](double us) { return uint64_t(std::llround(us * t.clock().mhz())); };
    // Each fallback waits for the device and costs a dispatch and the CPU round trip.
    const StepWall& w = t.steps()[2];
    EXPECT_EQ(w.fallback_end - std::max(w.trace_end, t.steps()[1].device_end),
              cyc(t.config().dispatch_us + t.config().cpu_fallback_us));
    EXPECT_GT(with.steps[2].wall_cycles, without.steps[2].wall_cycles);
    EXPECT_NE(with.trainer->metrics_report().find("CPU fallbacks: 4 (aten::nonzero x 4)"),
              std::string::npos)
        << with.trainer->metrics_report();
}

}  // namespace
}  // namespace tpu::trainer
