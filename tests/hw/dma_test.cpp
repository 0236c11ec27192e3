// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "hw/board_config.h"
#include "hw/core/dma_engine.h"
#include "hw/core/ici_engine.h"
#include "hw/mem/hbm_timing.h"

namespace tpu::hw {
namespace {

TEST(DmaEngine, VmemCopyOccupiesThePortThenOneCycleMore) {
    DmaEngine dma(CoreConfig{}, nullptr);  // 512 B per cycle on the VMEM port
    dma.start_at(5);
    // 1000 B: ceil(1000 / 512) = 2 cycles on the port, done one cycle later.
    EXPECT_EQ(dma.copy_vmem(5, 1000), 8u);
    EXPECT_EQ(dma.free_at(), 7u);
}

TEST(DmaEngine, HbmRequestsArePacedByTheVmemPort) {
    BoardConfig cfg;
    cfg.hbm.model = "simple";
    SimpleHbmTiming hbm(cfg);
    DmaEngine dma(cfg.core, &hbm);
    // 4 KiB in 512-B requests sent at cycles 0..7. The simple HBM moves 16 channels x 16 B x 2
    // per 1136-ps tCK = 479.48 B per 940-MHz cycle, so the pipe, not the port, limits: the last
    // byte has moved at 4096 / 479.48 = 8.54 -> 9, plus ceil(100 ns x 0.94) = 94 of latency.
    EXPECT_EQ(dma.transfer_hbm(0, 1, 4096, 0, 0, false), 103u);
    EXPECT_EQ(dma.free_at(), 8u);  // ceil(4096 / 512)
}

TEST(IciEngine, OneDescriptorPerCycleAndInOrderDeliveryPerDestination) {
    IciEngine ici;
    ici.start_at(100);
    EXPECT_EQ(ici.issue(100, 5, 1000), 1000u);  // data to core 5 arrives at 1000
    EXPECT_EQ(ici.free_at(), 101u);             // the next descriptor one cycle later
    EXPECT_EQ(ici.issue(101, 5, 990), 1000u);   // a signal to 5 does not overtake the data
    EXPECT_EQ(ici.issue(102, 6, 990), 990u);    // another destination is independent
    ici.start_at(2000);                         // a new launch forgets old deliveries
    EXPECT_EQ(ici.issue(2000, 5, 2500), 2500u);
}

}  // namespace
}  // namespace tpu::hw
