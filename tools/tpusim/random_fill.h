// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>

namespace tpu::cli {

/// Fills `out` with uniform values in [-1, 1): element i is the top 24 bits of splitmix64 of
/// (seed, i), scaled, so the loop has no carried state and vectorises. Input generation for
/// `tpusim gemm` and the benchmarks (std::mt19937 with a distribution cost more host time than
/// a timing-only GEMM of the same size).
inline void fill_uniform(std::span<float> out, uint32_t seed) {
    const uint64_t base = uint64_t(seed) << 32;
    for (size_t i = 0; i < out.size(); ++i) {
        uint64_t z = (base ^ i) + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        out[i] = float(int32_t(z >> 40)) * (1.0f / 8388608.0f) - 1.0f;
    }
}

}  // namespace tpu::cli
