// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// Row softmax and its gradient on device-resident Tensors (one launch over the core set, each
/// core on its own replica), streamed through VMEM in double-buffered row tiles, with host
/// references that perform the device's fp32 operations in the same order.
namespace tpu::driver {

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
