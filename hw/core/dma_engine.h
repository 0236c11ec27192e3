// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "hw/core/core_config.h"

namespace tpu::hw {

class HbmTimingModel;

/// Timing of a core's DMA engine (hw/README.md, "DMA engine"). Plain C++: the TensorCore calls
/// it once the transfer's start (queue, hazards) is known; CoreRef re-derives it tick by tick.
///
/// With P = dma_vmem_bytes_per_cycle and B = rows x row_bytes:
///   dma.vv (VMEM -> VMEM):  done = start + ceil(B / P) + 1;  the engine is free at
///                           start + ceil(B / P)
///   dma.hv / dma.vh:        each row is cut into requests of at most dma_chunk_bytes; the
///                           request with b bytes of the transfer ahead of it reaches HBM at
///                           start + floor(b / P) (the VMEM port paces them, counted in whole
///                           bytes so no floating-point drift accumulates); done = the latest
///                           HBM completion (at least start); free at start + ceil(B / P).
/// Example (default core, P = 512, 512 B chunks): 4 KiB from HBM sends 8 requests at start + 0,
/// 1, ..., 7 and is free again at start + 8.
class DmaEngine {
public:
    /// The engine of a core with `core`'s DMA parameters, in front of `hbm`.
    DmaEngine(const CoreConfig& core, HbmTimingModel* hbm) : m_core(core), m_hbm(hbm) {}

    /// A VMEM -> VMEM copy of `bytes` from `start`; returns its done cycle.
    uint64_t copy_vmem(uint64_t start, uint64_t bytes);
    /// A 2-D transfer between HBM (rows at `hbm_addr + r x hbm_stride`) and VMEM from `start`;
    /// returns the cycle its last HBM request completes.
    uint64_t transfer_hbm(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t hbm_addr,
                          uint64_t hbm_stride, bool to_hbm);
    /// Cycle the engine may start its next transfer.
    uint64_t free_at() const { return m_free; }
    /// Forgets earlier transfers: a launch starting at `cycle`.
    void start_at(uint64_t cycle) { m_free = cycle; }

private:
    CoreConfig m_core;
    HbmTimingModel* m_hbm;
    uint64_t m_free = 0;
};

}  // namespace tpu::hw
