// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "driver/kernels/gemm.h"

/// The fused matmul kernel behind tensor_ops::matmul: fp32 operands read from HBM in tiles,
/// converted (and transposed) to bf16 parts in VMEM, C written compact fp32.
namespace tpu::driver {

/// Shape and tiling of one fused matmul kernel (every core runs the same one on its replica).
struct MatmulTiling {
    uint32_t M = 0, K = 0, N = 0;  ///< op(a) is M x K, op(b) K x N
    bool ta = false, tb = false;   ///< a, b stored transposed
    Precision precision = Precision::Bf16;
    uint32_t R = 128, C = 128;  ///< MXU array
    uint32_t mxus = 2;          ///< MXUs used (column panels per group)
    uint32_t block_rows = 0;    ///< LHS rows per block (T)
    bool bias = false;          ///< C += a 1 x N fp32 row (launch argument s4) before it leaves
};

/// The fused kernel's tiling: the longest even blocks of rows (at most 4096, as plan_gemm) whose
/// VMEM areas fit; nullopt when even 8 rows do not fit. `bias`: the kernel adds a bias row.
std::optional<MatmulTiling> plan_matmul(const hw::BoardConfig& cfg, uint32_t M, uint32_t K,
                                        uint32_t N, bool ta, bool tb, Precision precision,
                                        bool bias = false);
/// The kernel, its K loop unrolled (each step's slot, flags and K tile fixed) in up to three
/// column-group variants: about 40 instructions per K step and variant, so K beyond about 6 000
/// outgrows core.imem_bytes. Launch arguments: s1 = a, s2 = b, s3 = c (HBM, fp32 row-major,
/// compact), and with `bias` s4 = the 1 x N fp32 bias, added to each C panel in VMEM (one fp32
/// add after the last pass, as bias_add would) just before it is stored.
isa::Program matmul_program(const MatmulTiling& t);
/// Cache key of matmul_program.
std::string matmul_key(const MatmulTiling& t);

/// Emits the VPU ops that split `n` fp32 values at `x` into `parts` bf16 parts (hw::split3:
/// hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)) at part(0..2), with the fp32
/// temporaries f, r1, r2 (r2 only for 3 parts). Operands are assembly text.
void emit_split(const std::function<void(const std::string&)>& vpu, int parts,
                const std::function<std::string(int)>& part, const std::string& x,
                const std::string& f, const std::string& r1, const std::string& r2,
                const std::string& n);

}  // namespace tpu::driver
