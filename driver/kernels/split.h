// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <initializer_list>

#include "isa/builder.h"

namespace tpu::driver {

/// Emits one VPU instruction (a counted issue, e.g. streaming::Body::vpu).
using VpuFn = std::function<void(isa::Opcode op, std::initializer_list<isa::Arg> args)>;

/// Emits the VPU ops that split `n` fp32 values at `x` into `parts` bf16 parts (hw::split3:
/// hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)) at part(0..2), with the fp32
/// temporaries f, r1, r2 (r2 only for 3 parts). The packing kernel (tensor_ops) and the fused
/// dot kernel (matmul_kernel) convert their fp32 operands with it.
void emit_split(const VpuFn& vpu, int parts, const std::function<isa::Arg(int)>& part, isa::Arg x,
                isa::Arg f, isa::Arg r1, isa::Arg r2, isa::Arg n);

}  // namespace tpu::driver
