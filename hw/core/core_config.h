// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "sim/reflect.h"

namespace tpu::hw {

/// One TensorCore: sequencer, MXUs, VPU, memories, unit queues.
struct CoreConfig {
    uint32_t mxus = 2;        ///< matrix units per core
    uint32_t mxu_rows = 128;  ///< PE rows = K per weight tile (also weight-load cycles)
    uint32_t mxu_cols = 128;  ///< PE columns = N per weight tile
    /// Weights swap array-wide: a matmul on a new tile starts once the previous matmul has
    /// left the array (off: the swap travels with the first row's wavefront, no bubble).
    bool mxu_swap_drains = true;
    uint32_t vpu_sublanes = 8;            ///< VPU sublanes (rows of a vector register)
    uint32_t vpu_lanes = 128;             ///< VPU lanes (columns of a vector register)
    uint32_t vpu_alus = 2;                ///< VPU ALUs; each retires one vector register per cycle
    uint32_t vpu_add_latency_cycles = 2;  ///< add/sub/max/min/compare/select latency
    uint32_t vpu_mul_latency_cycles = 2;  ///< multiply latency
    uint32_t vpu_transcendental_latency_cycles = 7;  ///< exp/log/rsqrt/tanh latency
    uint64_t vmem_bytes = 16ull << 20;               ///< vector memory per core
    uint32_t smem_bytes = 16u << 10;                 ///< scalar memory per core
    uint32_t imem_bytes = 256u << 10;  ///< instruction memory per core (32-byte instructions)
    uint32_t queue_depth = 8;          ///< instruction queue entries per unit
    uint32_t dispatch_cycles = 1;      ///< cycles from issue in the sequencer to the unit queue
    /// Cycles from the program being in instruction memory to the first instruction issuing:
    /// sequencer fetch, decode and scalar register read (assumed).
    uint32_t first_instr_cycles = 16;
    uint32_t dma_chunk_bytes = 512;           ///< DMA request size sent to HBM
    uint32_t dma_vmem_bytes_per_cycle = 512;  ///< VMEM port bandwidth of the DMA engine

    void visit(sim::Visitor& v) {
        v("mxus", mxus, "matrix units per core", {.min = 1, .max = 8});
        v("mxu_rows", mxu_rows, "MXU PE rows (K of a weight tile; weight-load cycles)",
          {.min = 1, .max = 1024});
        v("mxu_cols", mxu_cols, "MXU PE columns (N of a weight tile)", {.min = 1, .max = 1024});
        v("mxu_swap_drains", mxu_swap_drains,
          "a matmul on newly loaded weights starts only once the previous matmul has left the "
          "array (false: the swap rides the first row's wavefront with no bubble)");
        v("vpu_sublanes", vpu_sublanes, "VPU sublanes per vector register", {.min = 1});
        v("vpu_lanes", vpu_lanes, "VPU lanes per vector register", {.min = 1});
        v("vpu_alus", vpu_alus, "VPU ALUs, each retiring one vector register per cycle",
          {.min = 1});
        v("vpu_add_latency_cycles", vpu_add_latency_cycles,
          "latency of add, sub, max, min, compare and select", {.min = 1});
        v("vpu_mul_latency_cycles", vpu_mul_latency_cycles, "latency of multiply", {.min = 1});
        v("vpu_transcendental_latency_cycles", vpu_transcendental_latency_cycles,
          "latency of exp, log, rsqrt and tanh", {.min = 1});
        v("vmem_bytes", vmem_bytes, "vector memory per core in bytes", {.min = 4096, .pow2 = true});
        v("smem_bytes", smem_bytes, "scalar memory per core in bytes", {.min = 64, .pow2 = true});
        v("imem_bytes", imem_bytes, "instruction memory per core in bytes (32 B per instruction)",
          {.min = 1024, .pow2 = true});
        v("queue_depth", queue_depth, "instruction queue entries per unit", {.min = 1});
        v("dispatch_cycles", dispatch_cycles, "cycles from sequencer issue to the unit queue",
          {.min = 1});
        v("first_instr_cycles", first_instr_cycles,
          "cycles from the program landing in instruction memory to the first issue", {.min = 0});
        v("dma_chunk_bytes", dma_chunk_bytes, "bytes per DMA request to HBM",
          {.min = 32, .pow2 = true});
        v("dma_vmem_bytes_per_cycle", dma_vmem_bytes_per_cycle,
          "VMEM port bandwidth of the DMA engine", {.min = 1});
    }
};

}  // namespace tpu::hw
