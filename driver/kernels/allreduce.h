// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "driver/device.h"
#include "isa/isa.h"

/// Ring all-reduce (sum) of fp32 vectors in VMEM over ICI: reduce-scatter then all-gather, half
/// of the data clockwise and half counter-clockwise so both directions of every link work.
namespace tpu::driver {

/// Where the all-reduce keeps its data on every core (same addresses on each core).
struct AllReducePlan {
    uint32_t cores = 0;         ///< ring size N (the launch's core set, in order)
    uint32_t elements = 0;      ///< fp32 values per core; padded to a multiple of 2N inside
    uint32_t x_addr = 0;        ///< VMEM input (kept: the sum lands in y_addr)
    uint32_t y_addr = 0;        ///< VMEM result
    uint32_t scratch_addr = 0;  ///< VMEM scratch for reduce-scatter: 2 (N-1) chunks
};

/// Bytes of each direction's chunk: ceil(elements / 2N) values.
uint32_t allreduce_chunk_bytes(const AllReducePlan& p);
/// VMEM bytes the plan needs at each address (x, y: 2N chunks; scratch: 2(N-1) chunks).
uint64_t allreduce_vmem_bytes(const AllReducePlan& p);
/// A plan packing x, y and scratch from VMEM address 0 for `elements` values on `cores`.
AllReducePlan plan_allreduce(uint32_t cores, uint32_t elements, uint64_t vmem_bytes);
/// The kernel. Launch arguments: s1 = position in the ring, s2 = next core (clockwise),
/// s3 = previous core. Flags: f1/f2 reduce-scatter arrivals, f3/f4 adds, f5/f6 all-gather
/// arrivals, f7 local copies (per direction).
isa::Program allreduce_program(const AllReducePlan& p);

/// Runs an all-reduce of `data[i]` (one vector per core of `cores`) on the device: writes the
/// vectors to VMEM, launches, and returns every core's result and the launch event.
struct AllReduceResult {
    std::vector<std::vector<float>> out;  ///< per core, `elements` values
    Event event;
};
AllReduceResult allreduce(Device& dev, const std::vector<uint32_t>& cores,
                          const std::vector<std::vector<float>>& data);

}  // namespace tpu::driver
