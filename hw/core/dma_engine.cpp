// SPDX-License-Identifier: Apache-2.0
#include "hw/core/dma_engine.h"

#include <algorithm>

#include "hw/mem/hbm_timing.h"

namespace tpu::hw {

namespace {
uint64_t ceil_div(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}
}  // namespace

uint64_t DmaEngine::copy_vmem(uint64_t start, uint64_t bytes) {
    const uint64_t occupancy = ceil_div(bytes, m_core.dma_vmem_bytes_per_cycle);
    m_free = start + occupancy;
    return start + occupancy + 1;
}

uint64_t DmaEngine::transfer_hbm(uint64_t start, uint64_t rows, uint64_t row_bytes,
                                 uint64_t hbm_addr, uint64_t hbm_stride, bool to_hbm) {
    const uint64_t port = m_core.dma_vmem_bytes_per_cycle;
    // Every request of the transfer at once: nothing else reaches the HBM model between them.
    const uint64_t done = m_hbm->access_rows(start, rows, row_bytes, hbm_addr, hbm_stride,
                                             m_core.dma_chunk_bytes, uint32_t(port), to_hbm);
    m_free = start + ceil_div(rows * row_bytes, port);
    return done;
}

}  // namespace tpu::hw
