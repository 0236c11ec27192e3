// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <bit>
#include <cstdint>

/// The numerics contract (hw/README.md, "Numerics"): bf16 conversion and fp32 splitting.
namespace tpu::hw {

// Inline: the driver packs and the MXU converts millions of values per GEMM.

/// fp32 -> bf16, round to nearest, ties to even. NaN stays NaN (quietened, sign kept);
/// infinities and denormals are kept (no flush to zero); values that round past the largest
/// finite bf16 become infinity.
inline uint16_t f32_to_bf16(float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
        return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign and top payload
    // Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even; a carry into
    // the exponent is the correct rounding up, and past the largest finite value gives inf.
    const uint32_t lsb = (u >> 16) & 1u;
    return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}
/// bf16 -> fp32 (exact).
inline float bf16_to_f32(uint16_t h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
/// x rounded to bf16 precision, as fp32.
inline float bf16_round(float x) {
    return bf16_to_f32(f32_to_bf16(x));
}

/// fp32 split into three bf16 parts for multi-pass matmuls: hi = bf16(x),
/// mid = bf16(x - hi), lo = bf16(x - hi - mid), differences in fp32.
inline std::array<uint16_t, 3> split3(float x) {
    const uint16_t hi = f32_to_bf16(x);
    const float r1 = x - bf16_to_f32(hi);
    const uint16_t mid = f32_to_bf16(r1);
    const float r2 = r1 - bf16_to_f32(mid);
    return {hi, mid, f32_to_bf16(r2)};
}

/// v.rand's counter-based uniform in [0, 1): splitmix64 of (seed << 32 ^ index), top 24 bits.
/// One definition for the device and the host references of kernels that use it.
float vpu_uniform(uint32_t seed, uint64_t index);

}  // namespace tpu::hw
