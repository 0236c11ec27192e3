// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "hw/board_config.h"
#include "hw/core/core_model.h"
#include "isa/isa.h"

/// Cycle-stepped reference of one TensorCore's timing (sequencer, unit queues, flags, DMA with
/// the "simple" HBM stand-in, VPU, MXUs), used only by tests to prove CoreModel cycle-exact.
namespace tpu::hw {

/// What a reference run produced.
struct CoreRefResult {
    std::vector<InstrRecord> records;  ///< one per executed instruction, in issue order
    uint64_t finish = 0;               ///< halt's done (core finished), or where the run stopped
    bool halted = false;               ///< false: a wait can never be satisfied, or max_cycles hit
};

/// One core stepped one cycle at a time from explicit hardware state.
///
/// It never evaluates a start or done formula (CoreModel's or MxuTimer's). Each cycle:
///  (1) in-flight work whose last stage ends this cycle completes: its completion flag rises,
///      its written range stops being a hazard, an MXU weight tile becomes usable;
///  (2) every unit does this cycle's work (the DMA port moves dma_vmem_bytes_per_cycle bytes and
///      hands HBM requests out, the VPU issues up to vpu_alus vector registers, an MXU's loader
///      writes one PE row and its input port emits one LHS row) and then looks at the head of its
///      queue and starts it if every start condition holds now;
///  (3) the sequencer issues at most one instruction unless it is stalled (full queue, wait,
///      fence, halt draining), executing scalar, branch and flag instructions itself;
///  (4) the units look at their queue heads again (an instruction dispatched in 0 cycles may
///      start in the cycle it issued);
///  (5) the HBM pipe moves its share of bytes of this cycle, oldest request first.
/// ICI instructions are not modelled (single core); they throw std::invalid_argument.
class CoreRef {
public:
    /// A core with `cfg.core` and the simple HBM model of `cfg.hbm` at `cfg.clock_mhz`
    /// (which must be a whole number of kHz).
    explicit CoreRef(const BoardConfig& cfg);

    /// Runs `program` from pc 0 at `start_cycle` with s1..sN = args until halt; stops early
    /// (halted = false) when a wait can never be satisfied or after `max_cycles` cycles.
    CoreRefResult run(const isa::Program& program, uint64_t start_cycle = 0,
                      const std::vector<uint32_t>& args = {},
                      uint64_t max_cycles = 100'000'000) const;

private:
    BoardConfig m_cfg;
};

}  // namespace tpu::hw
