// SPDX-License-Identifier: Apache-2.0
// Tier (a): the power and energy estimate's arithmetic (hw/power/power_model.h), with the
// derivation of every figure from the default coefficients.
#include <gtest/gtest.h>

#include "hw/board_config.h"
#include "hw/power/power_model.h"

namespace tpu::hw {
namespace {

TEST(PowerModel, AnIdleBoardDrawsTheStaticPowerOfEveryBlock) {
    const BoardConfig cfg;  // v3-8-like: 4 chips x 2 cores, 940 MHz
    const PowerModel p(cfg);
    // Per core: 2 MXUs x 2.9867 + 2 VPU ALUs x 0.7413 + 16 MiB x 0.4042 + 16 HBM channels x 0.315
    // = 5.9734 + 1.4826 + 6.4672 + 5.04 = 18.9632 W.
    EXPECT_NEAR(p.core_static_w(), 18.9632, 1e-9);
    // Per chip besides its cores: ICI 8.96 + the rest 37.113 + the clocked chip 39.0006
    // = 85.0736 W.
    EXPECT_NEAR(p.chip_static_w(), 85.0736, 1e-9);
    // A chip: 2 x 18.9632 + 85.0736 = 123.0 W: NeuSim's TPU v3 leakage (84 W) plus the clock
    // tree and links, the minimum Cloud TPU v3 measures per chip (123 W). The board: 4 chips.
    EXPECT_NEAR(p.board_static_w(), 4 * 123.0, 1e-9);
    EXPECT_GE(p.board_static_w() / cfg.chips, 123.0 - 1e-9);
    EXPECT_LE(p.board_static_w() / cfg.chips, 262.0);
    // Nothing happened: the energy of an idle second is the static power.
    const Energy e = p.board_energy(Activity{}, cfg.clock().hz());
    EXPECT_NEAR(e.total(), p.board_static_w(), 1e-9);
    EXPECT_EQ(e.host_link, 0.0);
}

TEST(PowerModel, DynamicEnergyIsTheActivityTimesItsCoefficients) {
    const BoardConfig cfg;
    const PowerModel p(cfg);
    Activity a;
    a.mxu_macs = 1e12;   // 1e12 x 1.967 pJ = 1.967 J
    a.vpu_flops = 1e11;  // 0.296 J
    a.hbm_bytes = 1e10;  // 0.3125 J
    a.ici_bytes = 1e9;   // 0.0247 J
    a.host_bytes = 1e9;  // 0.04 J
    const Energy e = p.dynamic(a);
    EXPECT_NEAR(e.mxu, 1.967, 1e-12);
    EXPECT_NEAR(e.vpu, 0.296, 1e-12);
    EXPECT_NEAR(e.hbm, 0.3125, 1e-12);
    EXPECT_NEAR(e.ici, 0.0247, 1e-12);
    EXPECT_NEAR(e.host_link, 0.04, 1e-12);
    // VMEM bytes: the HBM bytes' way in or out, 2/128 + 4/128 per MAC, 12 per VPU op:
    // 1e10 + 1e12 x 0.046875 + 1e11 x 12 = 1.256875e12 bytes x 4.19 pJ = 5.2663 J.
    EXPECT_NEAR(p.vmem_bytes(a), 1.256875e12, 1.0);
    EXPECT_NEAR(e.vmem, 1.256875e12 * 4.19e-12, 1e-12);
    EXPECT_EQ(e.other, 0.0);
}

TEST(PowerModel, AFullyBusyCoreAddsItsMxusPower) {
    // Both MXUs of a core at full use for one second: 2 x 16384 MACs x 0.94e9 = 3.080e13 MACs,
    // 60.587 W of MXU power, plus 1.444e12 VMEM bytes (6.050 W) on top of its static 18.96 W.
    const BoardConfig cfg;
    const PowerModel p(cfg);
    Activity a;
    a.mxu_macs = 2.0 * 16384 * 0.94e9;
    const Energy e = p.work_energy(a, cfg.clock().hz());
    EXPECT_NEAR(e.mxu - p.static_energy(cfg.clock().hz(), 0).mxu, 60.5874, 1e-3);
    EXPECT_NEAR(p.dynamic(a).vmem, 6.0497, 1e-3);
    // work_energy charges the core's share (1/2) of its chip's shared blocks: 85.0736 / 2 W.
    EXPECT_NEAR(e.ici + e.other, 85.0736 / 2, 1e-9);
}

TEST(PowerModel, EnergiesOfDisjointWorkAddUp) {
    // Linear in counts and time: two halves of a run cost what the whole does.
    const BoardConfig cfg;
    const PowerModel p(cfg);
    Activity a, b;
    a.mxu_macs = 3e9;
    a.hbm_bytes = 7e8;
    b.vpu_flops = 5e8;
    b.ici_bytes = 2e7;
    Activity both = a;
    both += b;
    Energy sum = p.work_energy(a, 1e6);
    sum += p.work_energy(b, 3e6);
    EXPECT_NEAR(sum.total(), p.work_energy(both, 4e6).total(), 1e-12);
}

}  // namespace
}  // namespace tpu::hw
