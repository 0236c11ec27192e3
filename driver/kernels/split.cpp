// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/split.h"

namespace tpu::driver {

void emit_split(const VpuFn& vpu, int parts, const std::function<isa::Arg(int)>& part, isa::Arg x,
                isa::Arg f, isa::Arg r1, isa::Arg r2, isa::Arg n) {
    using isa::Opcode;
    vpu(Opcode::VF2Bf, {part(0), x, n});
    if (parts >= 2) {
        vpu(Opcode::VBf2F, {f, part(0), n});
        vpu(Opcode::VSub, {r1, x, f, n});
        vpu(Opcode::VF2Bf, {part(1), r1, n});
    }
    if (parts == 3) {
        vpu(Opcode::VBf2F, {f, part(1), n});
        vpu(Opcode::VSub, {r2, r1, f, n});
        vpu(Opcode::VF2Bf, {part(2), r2, n});
    }
}

}  // namespace tpu::driver
