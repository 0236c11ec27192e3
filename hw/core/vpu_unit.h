// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "hw/core/core_config.h"
#include "isa/isa.h"

/// The VPU: the operand shapes of its instructions and its timing (hw/README.md, "VPU"). Plain
/// C++: the TensorCore calls it, and hw/reference/core_ref.cpp re-derives the timing vector
/// register by vector register with the same shapes. tests/hw/vpu_test.cpp holds the rules.
namespace tpu::hw {

/// One VMEM operand of a VPU instruction.
struct VpuAccess {
    uint32_t addr = 0;   ///< VMEM byte address
    uint64_t bytes = 0;  ///< bytes read or written
    uint32_t align = 4;  ///< element size, which the address must be aligned to
};

/// The operands of one VPU instruction: the one definition of what each opcode reads and
/// writes (fp32 everywhere except the bf16 sides of v.f2bf and v.bf2f).
struct VpuShape {
    uint64_t elements = 0;  ///< elements processed (sets the timing); 0 for a non-VPU opcode
    uint64_t rows = 0;      ///< rows of a 2-D op (reductions, transpose, row/column broadcasts)
    uint64_t cols = 0;      ///< columns of a 2-D op
    /// fp32 in and out, each result element from the input elements at its own index only (so
    /// an input may alias the output exactly).
    bool elementwise = false;
    std::vector<VpuAccess> reads;
    VpuAccess write;
};

/// Shape of `op` with operand values `v` (register + immediate, in operand order).
VpuShape vpu_shape(isa::Opcode op, const std::array<uint32_t, isa::kMaxOperands>& v);

/// When the VPU runs an instruction. Elements are packed into vector registers of
/// `sublanes x lanes`; `alus` registers issue per cycle, and a partial register costs a full
/// slot. The result is complete after the latency of the op's class (isa/opcodes.def timing):
///   issue  = ceil(ceil(elements / (sublanes x lanes)) / alus)
///   done   = start + issue - 1 + latency,  the next instruction may start at start + issue
///   latency = add | mul | transcendental, and for a reduction add + ceil(log2(lanes)) (a
///             lane-reduction tree: each level halves the lanes that still hold partials)
/// Example (default core, 8 x 128 lanes, 2 ALUs, add latency 2): v.add of 8192 elements is
/// 8 registers, 4 issue cycles; started at 10 it is done at 10 + 3 + 2 = 15.
class VpuTimer {
public:
    explicit VpuTimer(const CoreConfig& core) : m_core(core) {}

    /// Issue cycles of `elements` elements.
    uint64_t issue_cycles(uint64_t elements) const;
    /// Latency of `op`'s timing class.
    uint64_t latency(isa::Opcode op) const;
    /// Cycle the VPU may start its next instruction.
    uint64_t free_at() const { return m_free; }
    /// Runs `op` on `elements` elements from `start` (>= free_at()); returns its done cycle.
    uint64_t run(isa::Opcode op, uint64_t elements, uint64_t start);
    /// Forgets earlier instructions: a launch starting at `cycle`.
    void start_at(uint64_t cycle) { m_free = cycle; }

private:
    CoreConfig m_core;
    uint64_t m_free = 0;
};

}  // namespace tpu::hw
