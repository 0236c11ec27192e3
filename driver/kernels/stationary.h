// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

namespace tpu::driver {

/// Which dot operand the MXU holds while the other streams through it (the dot kernel's choice
/// and the compiler's layout decision name the same thing).
enum class Stationary : uint8_t {
    Rhs,  ///< C = A W: W's tiles in the arrays, A's rows stream (the library GEMM's orientation)
    Lhs,  ///< the transposed problem C^T = W^T A^T: A's tiles in the arrays, W's columns stream
};

}  // namespace tpu::driver
