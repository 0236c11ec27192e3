// SPDX-License-Identifier: Apache-2.0
#include "hw/core/vpu_unit.h"

#include <algorithm>
#include <bit>

namespace tpu::hw {

using isa::Opcode;

VpuShape vpu_shape(Opcode op, const std::array<uint32_t, isa::kMaxOperands>& v) {
    auto f32 = [](uint32_t a, uint64_t count) { return VpuAccess{a, count * 4, 4}; };
    auto bf16 = [](uint32_t a, uint64_t count) { return VpuAccess{a, count * 2, 2}; };
    VpuShape s;
    uint64_t& n = s.elements;
    switch (op) {
        case Opcode::VAdd:
        case Opcode::VSub:
        case Opcode::VMul:
        case Opcode::VMax:
        case Opcode::VMin:
        case Opcode::VCmpGt:
            s.elementwise = true;
            n = v[3];
            s.reads = {f32(v[1], n), f32(v[2], n)};
            s.write = f32(v[0], n);
            break;
        case Opcode::VSel:
            s.elementwise = true;
            n = v[4];
            s.reads = {f32(v[1], n), f32(v[2], n), f32(v[3], n)};
            s.write = f32(v[0], n);
            break;
        case Opcode::VAddS:
        case Opcode::VMulS:
        case Opcode::VMaxS:
            s.elementwise = true;
            n = v[3];
            s.reads = {f32(v[1], n)};
            s.write = f32(v[0], n);
            break;
        case Opcode::VExp:
        case Opcode::VLog:
        case Opcode::VRsqrt:
        case Opcode::VTanh:
            s.elementwise = true;
            n = v[2];
            s.reads = {f32(v[1], n)};
            s.write = f32(v[0], n);
            break;
        case Opcode::VF2Bf:
            n = v[2];
            s.reads = {f32(v[1], n)};
            s.write = bf16(v[0], n);
            break;
        case Opcode::VBf2F:
            n = v[2];
            s.reads = {bf16(v[1], n)};
            s.write = f32(v[0], n);
            break;
        case Opcode::VRand:
            n = v[2];
            s.write = f32(v[0], n);
            break;
        case Opcode::VRSum:
        case Opcode::VRMax:
        case Opcode::VCSum:
        case Opcode::VTrans:
            s.rows = v[2], s.cols = v[3], n = s.rows * s.cols;
            s.reads = {f32(v[1], n)};
            // One result per row, one per column, or the whole transposed tile.
            s.write = f32(v[0], op == Opcode::VCSum ? s.cols : op == Opcode::VTrans ? n : s.rows);
            break;
        case Opcode::VAddRow:
        case Opcode::VSubCol:
        case Opcode::VMulCol:
            // A row vector (one value per column) or a column vector (one per row).
            s.rows = v[3], s.cols = v[4], n = s.rows * s.cols;
            s.reads = {f32(v[1], n), f32(v[2], op == Opcode::VAddRow ? s.cols : s.rows)};
            s.write = f32(v[0], n);
            break;
        default:
            break;
    }
    return s;
}

uint64_t VpuTimer::issue_cycles(uint64_t elements) const {
    const uint64_t per_vreg = uint64_t(m_core.vpu_sublanes) * m_core.vpu_lanes;
    const uint64_t vregs = (elements + per_vreg - 1) / per_vreg;
    return (vregs + m_core.vpu_alus - 1) / m_core.vpu_alus;
}

uint64_t VpuTimer::latency(Opcode op) const {
    switch (isa::info(op).timing) {
        case isa::Timing::VpuMul:
            return m_core.vpu_mul_latency_cycles;
        case isa::Timing::VpuTrans:
            return m_core.vpu_transcendental_latency_cycles;
        case isa::Timing::VpuReduce:
            return m_core.vpu_add_latency_cycles + std::bit_width(uint64_t(m_core.vpu_lanes) - 1);
        default:
            return m_core.vpu_add_latency_cycles;
    }
}

uint64_t VpuTimer::run(Opcode op, uint64_t elements, uint64_t start) {
    const uint64_t issue = issue_cycles(elements);
    m_free = std::max(m_free, start + issue);
    return start + issue - 1 + latency(op);
}

}  // namespace tpu::hw
