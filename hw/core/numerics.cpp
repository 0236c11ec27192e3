// SPDX-License-Identifier: Apache-2.0
#include "hw/core/numerics.h"

namespace tpu::hw {

float vpu_uniform(uint32_t seed, uint64_t index) {
    uint64_t z = (uint64_t(seed) << 32 ^ index) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tpu::hw
