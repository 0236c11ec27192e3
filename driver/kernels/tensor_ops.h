// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "driver/kernels/gemm.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// Data-parallel kernels on device-resident Tensors beyond the elementwise library: matmul with
/// transposes (the library GEMM on HBM operands), copies, bf16 rounding, GELU, dropout and
/// layer normalisation. Every call is one launch over the tensors' core set; each core works on
/// its own replica. Each kernel has a host reference with the device's exact fp32 operation
/// order, so results match bit for bit.
namespace tpu::driver {

// ---- Keys and generators of the streaming kernels (driver/kernels/stream_kernel.h) -----------

/// The elementwise and row kernels of this file.
enum class TensorOp : uint8_t {
    Copy,           ///< src -> dst
    RoundBf16,      ///< x -> out
    Gelu,           ///< x -> out
    GeluGrad,       ///< x, dy -> dx
    Dropout,        ///< x -> mask, out; scalars seed, below_p, keep
    LayerNorm,      ///< x, gamma, beta -> out, mean, rstd; scalars inv_cols, eps
    LayerNormGrad,  ///< x, dy, gamma, mean, rstd -> dx, dgamma, dbeta; scalar inv_cols
};

/// The program-cache key of a TensorOp kernel.
struct TensorOpKey {
    TensorOp op = TensorOp::Copy;  ///< which kernel
    uint64_t units = 0;            ///< elements (elementwise kernels) or rows (layer norms)
    uint32_t cols = 1;             ///< values per row (layer norms; 1 otherwise)
    uint32_t tile = 0;             ///< units per VMEM tile (plan_tensor_op)
    auto operator<=>(const TensorOpKey&) const = default;
    /// The kernel name of per-kernel statistics ("gelu", "layer_norm", ...).
    std::string name() const;
    friend size_t hash_value(const TensorOpKey& k) {
        return hash_fields(k.op, k.units, k.cols, k.tile);
    }
};
/// The key of `op` on `units` units of `cols` values, tiled for `vmem_bytes` of free VMEM.
TensorOpKey plan_tensor_op(TensorOp op, uint64_t units, uint32_t cols, uint64_t vmem_bytes);
/// The operands of `op` in launch-argument order: tensors, then scalars.
std::span<const streaming::Param> tensor_op_params(TensorOp op);
/// Emits kernel `k` into `b` (no halt), operands in tensor_op_params order.
void emit(isa::Builder& b, const TensorOpKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of `k`.
isa::Program generate(const TensorOpKey& k);

/// Key of matmul's packing kernel ("matmul_pack", the fallback path): op(x) (rows x cols fp32,
/// stored transposed when `transposed`) into `parts` bf16 parts of rows_padded x cols_padded.
/// Operands: x, dst.
struct PackKey {
    uint32_t rows = 0, cols = 0;                ///< op(x)
    uint32_t rows_padded = 0, cols_padded = 0;  ///< each part
    bool transposed = false;                    ///< x is stored cols x rows
    uint8_t parts = 1;                          ///< 1, 2 or 3 (Precision)
    uint32_t tile = 0;                          ///< rows per VMEM tile
    auto operator<=>(const PackKey&) const = default;
    std::string name() const { return "matmul_pack"; }
    friend size_t hash_value(const PackKey& k) {
        return hash_fields(k.rows, k.cols, k.rows_padded, k.cols_padded, k.transposed, k.parts,
                           k.tile);
    }
};
/// The packing kernel's key, tiled for `vmem_bytes`.
PackKey plan_pack(uint32_t rows, uint32_t cols, uint32_t rows_padded, uint32_t cols_padded,
                  bool transposed, int parts, uint64_t vmem_bytes);
/// The stand-alone packing program.
isa::Program generate(const PackKey& k);

/// Key of copy_columns (`into` false: rows of `width` values from rows `stride` apart) and
/// copy_into_columns (`into`: into rows `stride` apart). Operands: src, dst.
struct ColumnCopyKey {
    bool into = false;    ///< copy_into_columns
    uint32_t rows = 0;    ///< rows copied
    uint32_t width = 0;   ///< values per row copied
    uint32_t stride = 0;  ///< values per row of the wider tensor
    uint32_t tile = 0;    ///< rows per VMEM tile
    auto operator<=>(const ColumnCopyKey&) const = default;
    std::string name() const { return into ? "copy_into_columns" : "copy_columns"; }
    friend size_t hash_value(const ColumnCopyKey& k) {
        return hash_fields(k.into, k.rows, k.width, k.stride, k.tile);
    }
};
/// The column copy's key, tiled for `vmem_bytes`.
ColumnCopyKey plan_column_copy(bool into, uint32_t rows, uint32_t width, uint32_t stride,
                               uint64_t vmem_bytes);
/// The stand-alone column-copy program.
isa::Program generate(const ColumnCopyKey& k);

/// c = op(a) x op(b) (+ bias), op(x) = x^T when its flag is set: op(a) is M x K, op(b) is
/// K x N, c is M x N fp32 (compact), `bias` (optional) 1 x N, added to each row of the product
/// with one fp32 add as bias_add does (bit-identical to matmul then bias_add, one launch). The
/// fused kernel (driver/kernels/matmul_kernel.h) reads the fp32 operands in tiles; what it cannot
/// hold is packed on the device into the library GEMM's layout (bf16 parts per `precision`,
/// zero padding) in scratch HBM that is freed before returning.
Event matmul(Device& dev, ProgramCache& cache, const Tensor& a, bool transpose_a, const Tensor& b,
             bool transpose_b, const Tensor& c, Precision precision, const Tensor* bias = nullptr);
/// Host reference of matmul (same numerics as gemm_reference after the transposes).
std::vector<float> matmul_reference(const std::vector<float>& a, uint32_t a_rows, uint32_t a_cols,
                                    bool transpose_a, const std::vector<float>& b, uint32_t b_rows,
                                    uint32_t b_cols, bool transpose_b, Precision precision,
                                    uint32_t mxu_rows);

/// dst = src (same shape and cores).
Event copy(Device& dev, ProgramCache& cache, const Tensor& src, const Tensor& dst);
/// dst[r][j] = src[r][first_col + j] for j < dst.cols (a column slice; dst.rows == src.rows).
Event copy_columns(Device& dev, ProgramCache& cache, const Tensor& src, uint32_t first_col,
                   const Tensor& dst);
/// dst[r][first_col + j] = src[r][j] for j < src.cols (writes a column slice of dst, the rest
/// of dst unchanged; dst.rows == src.rows): the inverse of copy_columns.
Event copy_into_columns(Device& dev, ProgramCache& cache, const Tensor& src, const Tensor& dst,
                        uint32_t first_col);
/// out[i] = fp32(bf16_rne(x[i])): keeps a tensor representable in bf16 ("bf16-true").
Event round_bf16(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out);

/// GELU, tanh form: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Device order, each
/// step one fp32 VPU op (k = fp32(sqrt(2/pi)), c = 0.044715f): x2 = x * x; u = x2 * x;
/// u = u * c; u = x + u; u = u * k; h = tanhf(u) + 1; out = (x * h) * 0.5.
Event gelu(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out);
/// dx = dy * d gelu(x) / dx (same tanh form). Order: x2, u, th = tanhf(u) as in gelu;
/// l = (th + 1) * 0.5; s = ((th * th) * -1) + 1; p = ((x2 * 0.134145f) + 1) * k;
/// s = ((s * p) * x) * 0.5; dx = (l + s) * dy.
Event gelu_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                const Tensor& dx);
/// Inverted dropout, 0 <= p < 1: mask[i] = u_i >= p ? 1 / (1 - p) : 0 and out = x * mask.
/// p = 0 copies x and sets mask to 1. The uniforms come from v.rand per VMEM tile of
/// dropout_tile_values() values: element i of tile t = i / tile uses u_i = v.rand(seed_r +
/// t * 0x9E3779B9, i - t * tile) (32-bit wrapping), seed_r = seed + replica index, so the mask is
/// a function of (seed, replica, shape) only and differs per replica. Device order: u; z = u > u
/// (+0.0); q = z + below(p) (the float just under p, so u > q is u >= p); k = u > q; mask =
/// k * fp32(1 / (1 - p)); out = x * mask.
Event dropout(Device& dev, ProgramCache& cache, const Tensor& x, float p, uint32_t seed,
              const Tensor& mask, const Tensor& out);
/// Per row: mean, rstd = 1 / sqrt(var + eps) (biased variance), out = (x - mean) rstd gamma +
/// beta; gamma and beta are 1 x cols, mean and rstd rows x 1 (kept for the backward pass).
/// Order per row (sums in column order from +0.0, inv = fp32(1 / cols) from the host, no
/// divide on the VPU): mean = (sum x) * inv; xc = x - mean; var = (sum xc * xc) * inv + eps;
/// rstd = 1 / sqrtf(var); out = ((xc * rstd) * gamma) + beta.
Event layer_norm(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& gamma,
                 const Tensor& beta, float eps, const Tensor& out, const Tensor& mean,
                 const Tensor& rstd);
/// Backward of layer_norm: dx, dgamma (1 x cols), dbeta (1 x cols). Order per row:
/// xh = (x - mean) * rstd; g = dy * gamma; s1 = (sum g) * inv; s2 = (sum g * xh) * inv;
/// dx = ((g - s1) - xh * s2) * rstd. dgamma = column sums of dy * xh and dbeta of dy, tiled as
/// col_sum: per tile of layer_norm_grad_tile_rows() rows a sum in row order from +0.0, the tile
/// sums added in tile order.
Event layer_norm_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                      const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dgamma, const Tensor& dbeta);

// ---- Host references: the devices' fp32 operations in the same order ----------------------

/// fp32(bf16_rne(x)) per value.
std::vector<float> round_bf16_reference(const std::vector<float>& x);
std::vector<float> gelu_reference(const std::vector<float>& x);
std::vector<float> gelu_grad_reference(const std::vector<float>& x, const std::vector<float>& dy);

/// Values per VMEM tile of dropout on n values (the random stream restarts per tile).
uint32_t dropout_tile_values(const hw::BoardConfig& cfg, uint64_t n);
/// Mask and output of dropout.
struct DropoutResult {
    std::vector<float> mask;  ///< 0 or 1 / (1 - p)
    std::vector<float> out;   ///< x * mask
};
/// One replica's dropout: `replica_seed` = seed + replica index.
DropoutResult dropout_reference(const std::vector<float>& x, float p, uint32_t replica_seed,
                                uint32_t tile_values);

/// Outputs of layer_norm.
struct LayerNormResult {
    std::vector<float> out;   ///< rows x cols
    std::vector<float> mean;  ///< rows
    std::vector<float> rstd;  ///< rows
};
LayerNormResult layer_norm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                     const std::vector<float>& beta, float eps, uint32_t rows,
                                     uint32_t cols);

/// Rows per VMEM tile of layer_norm_grad (its dgamma and dbeta depend on the tiling).
uint32_t layer_norm_grad_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols);
/// Outputs of layer_norm_grad.
struct LayerNormGradResult {
    std::vector<float> dx;      ///< rows x cols
    std::vector<float> dgamma;  ///< cols
    std::vector<float> dbeta;   ///< cols
};
LayerNormGradResult layer_norm_grad_reference(const std::vector<float>& x,
                                              const std::vector<float>& dy,
                                              const std::vector<float>& gamma,
                                              const std::vector<float>& mean,
                                              const std::vector<float>& rstd, uint32_t rows,
                                              uint32_t cols, uint32_t tile_rows);

}  // namespace tpu::driver
