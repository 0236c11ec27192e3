// SPDX-License-Identifier: Apache-2.0
// A kernel program against the cycle-stepped core (hw/reference/core_ref.h), for the driver
// tests that check a kernel's schedule on a board of their own.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "hw/board_config.h"
#include "hw/core/core_model.h"
#include "hw/mem/sparse_memory.h"
#include "hw/reference/core_ref.h"
#include "isa/isa.h"

namespace tpu::driver::tutil {

/// Runs `prog` with `args` on CoreModel and on CoreRef (timing only): every executed
/// instruction must issue, start and finish in the same cycle, and both must halt at the same
/// cycle.
inline void expect_cycle_exact(const hw::BoardConfig& cfg, const isa::Program& prog,
                               const std::vector<uint32_t>& args) {
    hw::SparseMemory hbm("hbm", cfg.hbm.bytes_per_core), vmem("vmem", cfg.core.vmem_bytes);
    hw::CoreModel core(0, cfg, hbm, vmem, nullptr);
    core.record(true);
    core.load(prog);
    core.start(0, args);
    const hw::CoreModel::Status st = core.run_alone();
    const hw::CoreRefResult ref = hw::CoreRef(cfg).run(prog, 0, args);
    ASSERT_TRUE(ref.halted);
    ASSERT_EQ(st.block, hw::CoreModel::Block::Halted);
    const auto& fast = core.records();
    ASSERT_EQ(fast.size(), ref.records.size());
    EXPECT_GT(fast.size(), 200u);
    for (size_t i = 0; i < fast.size(); ++i)
        ASSERT_EQ(fast[i], ref.records[i]) << "record " << i << " (pc " << fast[i].pc << ")";
    EXPECT_EQ(st.cycle, ref.finish);
}

}  // namespace tpu::driver::tutil
