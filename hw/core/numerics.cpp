// SPDX-License-Identifier: Apache-2.0
#include "hw/core/numerics.h"

#include <bit>

namespace tpu::hw {

uint16_t f32_to_bf16(float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
        return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign and top payload
    // Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even; a carry into
    // the exponent is the correct rounding up, and past the largest finite value gives inf.
    const uint32_t lsb = (u >> 16) & 1u;
    return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

float bf16_to_f32(uint16_t h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

std::array<uint16_t, 3> split3(float x) {
    const uint16_t hi = f32_to_bf16(x);
    const float r1 = x - bf16_to_f32(hi);
    const uint16_t mid = f32_to_bf16(r1);
    const float r2 = r1 - bf16_to_f32(mid);
    return {hi, mid, f32_to_bf16(r2)};
}

float vpu_uniform(uint32_t seed, uint64_t index) {
    uint64_t z = (uint64_t(seed) << 32 ^ index) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tpu::hw
