// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// Row softmax and its gradient on device-resident Tensors (one launch over the core set, each
/// core on its own replica), streamed through VMEM in double-buffered row tiles, with host
/// references that perform the device's fp32 operations in the same order.
namespace tpu::driver {

/// Program-cache key of softmax and scaled_softmax. Operands: x, y, then the fp32 scale when
/// `scaled`, then the causal bias (cols x cols) when `causal`.
struct SoftmaxKey {
    uint32_t rows = 0, cols = 0;  ///< x and y are rows x cols
    bool scaled = false;          ///< x is multiplied by a scale first
    bool causal = false;          ///< a causal bias is added (square blocks of cols x cols)
    uint32_t tile = 0;            ///< rows per VMEM tile (plan_softmax)
    auto operator<=>(const SoftmaxKey&) const = default;
    std::string name() const { return "softmax"; }
    friend size_t hash_value(const SoftmaxKey& k) {
        return hash_fields(k.rows, k.cols, k.scaled, k.causal, k.tile);
    }
};
/// The key of a softmax, tiled for `vmem_bytes` of free VMEM (a causal tile divides cols).
SoftmaxKey plan_softmax(uint32_t rows, uint32_t cols, bool scaled, bool causal,
                        uint64_t vmem_bytes);
/// The operands of `k` in launch-argument order.
std::vector<streaming::Param> softmax_params(const SoftmaxKey& k);
/// Emits softmax `k` into `b` (no halt), operands in softmax_params order.
void emit(isa::Builder& b, const SoftmaxKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of `k`.
isa::Program generate(const SoftmaxKey& k);

/// Program-cache key of softmax_grad and scaled_softmax_grad. Operands: y, dy, dx, then the fp32
/// scale when `scaled`.
struct SoftmaxGradKey {
    uint32_t rows = 0, cols = 0;  ///< every tensor is rows x cols
    bool scaled = false;          ///< dx is multiplied by a scale last
    uint32_t tile = 0;            ///< rows per VMEM tile (plan_softmax_grad)
    auto operator<=>(const SoftmaxGradKey&) const = default;
    std::string name() const { return "softmax_grad"; }
    friend size_t hash_value(const SoftmaxGradKey& k) {
        return hash_fields(k.rows, k.cols, k.scaled, k.tile);
    }
};
/// The key of a softmax gradient, tiled for `vmem_bytes` of free VMEM.
SoftmaxGradKey plan_softmax_grad(uint32_t rows, uint32_t cols, bool scaled, uint64_t vmem_bytes);
/// The operands of `k` in launch-argument order.
std::vector<streaming::Param> softmax_grad_params(const SoftmaxGradKey& k);
/// Emits softmax_grad `k` into `b` (no halt), operands in softmax_grad_params order.
void emit(isa::Builder& b, const SoftmaxGradKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of `k`.
isa::Program generate(const SoftmaxGradKey& k);

/// y = softmax(x) per row of a rows x cols tensor, numerically stable (row max subtracted).
/// Device order per row, each step one VPU op over the tile: m = max_j x_j (from -inf);
/// z_j = x_j - m; e_j = expf(z_j); s = sum_j e_j (j order, from +0.0); ls = logf(s);
/// y_j = expf(z_j - ls). The VPU has no divide, so 1 / s is folded into the exponent.
Event softmax(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& y);
/// dx = y * (dy - sum_j dy_j y_j) per row: t_j = dy_j * y_j; s = sum_j t_j (j order, from
/// +0.0); u_j = dy_j - s; dx_j = y_j * u_j.
Event softmax_grad(Device& dev, ProgramCache& cache, const Tensor& y, const Tensor& dy,
                   const Tensor& dx);

/// Attention's softmax: y = softmax(x * scale + mask) per row. x holds square blocks of
/// cols x cols (one per head), so with `causal` row r masks the columns j > r mod cols (a
/// bias of -inf streamed from HBM, see softmax_reference). Order: x_j = x_j * scale; with
/// causal x_j = x_j + bias_j (0 or -inf); then as softmax.
Event scaled_softmax(Device& dev, ProgramCache& cache, const Tensor& x, float scale, bool causal,
                     const Tensor& y);
/// dx = (y * (dy - sum_j dy_j y_j)) * scale: softmax_grad followed by one multiply, the
/// backward of scaled_softmax (the mask needs nothing: y is +0.0 where it masked). dx may be
/// dy (in place).
Event scaled_softmax_grad(Device& dev, ProgramCache& cache, const Tensor& y, const Tensor& dy,
                          float scale, const Tensor& dx);

/// The causal bias of cols x cols that scaled_softmax adds: 0 on and below the diagonal, -inf
/// above it.
std::vector<float> causal_bias(uint32_t cols);

// ---- Host references: the devices' fp32 operations in the same order ----------------------

/// softmax, or with `scale` != 1 / `causal` the scaled_softmax of the same ops.
std::vector<float> softmax_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                                     float scale = 1.0f, bool causal = false);
/// softmax_grad, or scaled_softmax_grad when `scale` != 1.
std::vector<float> softmax_grad_reference(const std::vector<float>& y, const std::vector<float>& dy,
                                          uint32_t rows, uint32_t cols, float scale = 1.0f);

}  // namespace tpu::driver
