// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>

/// The numerics contract (hw/README.md, "Numerics"): bf16 conversion and fp32 splitting.
namespace tpu::hw {

/// fp32 -> bf16, round to nearest, ties to even. NaN stays NaN (quietened, sign kept);
/// infinities and denormals are kept (no flush to zero); values that round past the largest
/// finite bf16 become infinity.
uint16_t f32_to_bf16(float x);
/// bf16 -> fp32 (exact).
float bf16_to_f32(uint16_t h);
/// x rounded to bf16 precision, as fp32.
inline float bf16_round(float x) {
    return bf16_to_f32(f32_to_bf16(x));
}

/// fp32 split into three bf16 parts for multi-pass matmuls: hi = bf16(x),
/// mid = bf16(x - hi), lo = bf16(x - hi - mid), differences in fp32.
std::array<uint16_t, 3> split3(float x);

/// v.rand's counter-based uniform in [0, 1): splitmix64 of (seed << 32 ^ index), top 24 bits.
/// One definition for the device and the host references of kernels that use it.
float vpu_uniform(uint32_t seed, uint64_t index);

}  // namespace tpu::hw
