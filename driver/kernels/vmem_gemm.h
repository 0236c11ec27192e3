// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "isa/isa.h"

/// A single-core GEMM whose operands are already in VMEM in MXU tile layouts: the building
/// block of the library GEMM and of the MXU benchmarks.
namespace tpu::driver {

/// Shape and VMEM placement of C (M x N, fp32) = A (M x K, bf16) x W (K x N, bf16) on one core.
/// With R x C MXUs, KT = ceil(K / R) and NT = ceil(N / C):
///  - A is KT panels, panel k (M rows x Kk = min(R, K - k R) bf16, row-major) at
///    a_addr + k * M * R * 2;
///  - W is KT x NT tiles, tile (k, n) (Kk x Nn bf16, row-major) at w_addr + (n KT + k) R C 2;
///  - C is NT panels, panel n (M x Nn fp32, row-major) at c_addr + n * M * C * 4.
struct VmemGemm {
    uint32_t M = 0, K = 0, N = 0;  ///< problem shape
    uint32_t a_addr = 0;           ///< VMEM address of A's panels
    uint32_t w_addr = 0;           ///< VMEM address of W's tiles
    uint32_t c_addr = 0;           ///< VMEM address of C's panels
    uint32_t mxus = 1;             ///< MXUs to use; column panels are dealt round-robin
    uint8_t done_flag = 0;         ///< raised once per C panel; the program waits for all
};

/// VMEM bytes each operand occupies in the layouts above.
struct VmemGemmBytes {
    uint64_t a, w, c;
};
VmemGemmBytes vmem_gemm_bytes(const VmemGemm& g, uint32_t R, uint32_t C);

/// The program: for each group of `mxus` column panels, for each k, on each MXU: load the
/// weight tile (the next tile loads into the shadow buffer while the current one streams) and
/// stream A's panel k, accumulating from k = 1; then wait for every panel and halt.
isa::Program vmem_gemm_program(const VmemGemm& g, uint32_t R, uint32_t C);

/// Host-side packing into and out of the layouts (row-major inputs).
std::vector<uint16_t> pack_a(const std::vector<uint16_t>& a, uint32_t M, uint32_t K, uint32_t R);
std::vector<uint16_t> pack_w(const std::vector<uint16_t>& w, uint32_t K, uint32_t N, uint32_t R,
                             uint32_t C);
std::vector<float> unpack_c(const std::vector<float>& c, uint32_t M, uint32_t N, uint32_t C);

}  // namespace tpu::driver
