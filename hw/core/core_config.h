// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "sim/reflect.h"

namespace tpu::hw {

// first_instr_cycles is assumed: sequencer fetch, decode and scalar register read.
#define TPU_CORE_FIELDS(F, S)                                                                      \
    F(uint32_t, mxus, 2, "", "matrix units per core", .min = 1, .max = 8)                          \
    F(uint32_t, mxu_rows, 128, "PEs",                                                              \
      "MXU PE rows: K of a weight tile, and the weight-load cycles", .min = 1, .max = 1024)        \
    F(uint32_t, mxu_cols, 128, "PEs", "MXU PE columns: N of a weight tile", .min = 1, .max = 1024) \
    F(bool, mxu_swap_drains, true, "",                                                             \
      "a matmul on newly loaded weights starts only once the previous matmul has left the "        \
      "array (false: the swap rides the first row's wavefront with no bubble)")                    \
    F(uint32_t, vpu_sublanes, 8, "", "VPU sublanes: rows of a vector register", .min = 1)          \
    F(uint32_t, vpu_lanes, 128, "", "VPU lanes: columns of a vector register", .min = 1)           \
    F(uint32_t, vpu_alus, 2, "", "VPU ALUs, each retiring one vector register per cycle",          \
      .min = 1)                                                                                    \
    F(uint32_t, vpu_add_latency_cycles, 2, "cycles",                                               \
      "latency of add, sub, max, min, compare and select", .min = 1)                               \
    F(uint32_t, vpu_mul_latency_cycles, 2, "cycles", "latency of multiply", .min = 1)              \
    F(uint32_t, vpu_transcendental_latency_cycles, 7, "cycles",                                    \
      "latency of exp, log, rsqrt and tanh", .min = 1)                                             \
    F(uint64_t, vmem_bytes, 16ull << 20, "bytes", "vector memory per core", .min = 4096,           \
      .pow2 = true)                                                                                \
    F(uint32_t, smem_bytes, 16u << 10, "bytes", "scalar memory per core", .min = 64, .pow2 = true) \
    F(uint32_t, imem_bytes, 256u << 10, "bytes",                                                   \
      "instruction memory per core (32 B per instruction)", .min = 1024, .pow2 = true)             \
    F(uint32_t, queue_depth, 8, "", "instruction queue entries per unit", .min = 1)                \
    F(uint32_t, dispatch_cycles, 1, "cycles", "from sequencer issue to the unit queue", .min = 1)  \
    F(uint32_t, first_instr_cycles, 16, "cycles",                                                  \
      "from the program landing in instruction memory to the first issue", .min = 0)               \
    F(uint32_t, fusion_setup_cycles, 200, "cycles",                                                \
      "sequencer cycles a compiled program spends between two fusions, setting up the next "     \
      "one's descriptors, flags and loop state (assumed: 0.37 us tiny fusions in a TPU v4 "        \
      "profile; compiler/README.md, Code generation)",                                             \
      .min = 0)                                                                                    \
    F(uint32_t, dma_chunk_bytes, 512, "bytes", "DMA request size sent to HBM", .min = 32,          \
      .pow2 = true)                                                                                \
    F(uint32_t, dma_vmem_bytes_per_cycle, 512, "bytes/cycle",                                      \
      "VMEM port bandwidth of the DMA engine", .min = 1)

/// One TensorCore: sequencer, MXUs, VPU, memories, unit queues.
struct CoreConfig {
    TPU_REFLECT(TPU_CORE_FIELDS)
};

}  // namespace tpu::hw
