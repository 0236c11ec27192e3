// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "driver/device.h"
#include "driver/program_cache.h"

/// The VPU kernel library: elementwise ops, row/column reductions, softmax cross-entropy and
/// optimizer updates on fp32 tensors in one core's HBM, streamed through VMEM in
/// double-buffered tiles. Every kernel has a host reference with the same fp32 operation order,
/// so results match bit for bit.
namespace tpu::driver {

// ---- Device kernels -------------------------------------------------------------------------
// All buffers must live on the same core (the launch runs there) and hold the fp32 values the
// shape needs; violations throw DeviceError(Usage). Each returns the launch event. Programs are
// cached under the kernel name and shape; buffer addresses and scalars are launch arguments.

/// out[i] = a[i] + b[i], i < n.
Event add(Device& dev, ProgramCache& cache, const Buffer& a, const Buffer& b, const Buffer& out,
          uint64_t n);
/// out[i] = a[i] * b[i], i < n.
Event mul(Device& dev, ProgramCache& cache, const Buffer& a, const Buffer& b, const Buffer& out,
          uint64_t n);
/// out[i] = a[i] * s, i < n.
Event scale(Device& dev, ProgramCache& cache, const Buffer& a, float s, const Buffer& out,
            uint64_t n);
/// out[i] = max(x[i], +0.0) (NaN stays NaN), i < n.
Event relu(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint64_t n);
/// dx[i] = x[i] > 0 ? dy[i] : +0.0, i < n.
Event relu_grad(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& dy,
                const Buffer& dx, uint64_t n);
/// out[r][j] = x[r][j] + bias[j] for a rows x cols row-major matrix.
Event bias_add(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& bias,
               const Buffer& out, uint32_t rows, uint32_t cols);
/// out[r] = sum of x[r][:] (index order from +0.0).
Event row_sum(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint32_t rows,
              uint32_t cols);
/// out[j] = sum of x[:][j]: per tile of col_sum_tile_rows() rows a sum in row order from +0.0,
/// the tile sums then added in tile order (the first one stored).
Event col_sum(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint32_t rows,
              uint32_t cols);
/// Per row r of logits (rows x classes) and one-hot labels: loss[r] = -sum_j y_j log p_j and
/// dlogits = (softmax - y) * fp32(1 / rows). See softmax_cross_entropy_reference for the order.
Event softmax_cross_entropy(Device& dev, ProgramCache& cache, const Buffer& logits,
                            const Buffer& labels_onehot, const Buffer& loss_per_row,
                            const Buffer& dlogits, uint32_t rows, uint32_t classes);
/// In place: v = v * momentum + g; w = w - v * lr.
Event sgd_momentum(Device& dev, ProgramCache& cache, const Buffer& w, const Buffer& g,
                   const Buffer& v, uint64_t n, float lr, float momentum);
/// In place, step >= 1 (see adam_reference for the exact formula and order).
Event adam(Device& dev, ProgramCache& cache, const Buffer& w, const Buffer& g, const Buffer& m,
           const Buffer& v, uint64_t n, float lr, float beta1, float beta2, float eps,
           uint32_t step);

/// Rows per VMEM tile of col_sum (its result depends on the tiling, see col_sum).
uint32_t col_sum_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols);

/// Adam's per-step scalars, computed once on the host in this order and passed to the kernel
/// as fp32 immediates: one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2, c2 =
/// float(1 / (1 - beta2^step)), eps2 = eps * eps, lr_c1 = float(lr / (1 - beta1^step)) (the
/// powers and quotients in double).
struct AdamScalars {
    float beta1 = 0, one_minus_b1 = 0, beta2 = 0, one_minus_b2 = 0;
    float c2 = 0, eps2 = 0, lr_c1 = 0;
};
AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, uint32_t step);

// ---- Host references: the same fp32 operations in the same order as the kernels ------------

std::vector<float> add_reference(const std::vector<float>& a, const std::vector<float>& b);
std::vector<float> mul_reference(const std::vector<float>& a, const std::vector<float>& b);
std::vector<float> scale_reference(const std::vector<float>& a, float s);
/// isnan(x) ? quiet NaN : (x > 0 ? x : +0.0), like v.maxs.
std::vector<float> relu_reference(const std::vector<float>& x);
std::vector<float> relu_grad_reference(const std::vector<float>& x, const std::vector<float>& dy);
std::vector<float> bias_add_reference(const std::vector<float>& x, const std::vector<float>& bias,
                                      uint32_t rows, uint32_t cols);
std::vector<float> row_sum_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols);
/// `tile_rows` = col_sum_tile_rows() of the device configuration.
std::vector<float> col_sum_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                                     uint32_t tile_rows);

/// Loss per row and dlogits of softmax_cross_entropy.
struct SoftmaxCeResult {
    std::vector<float> loss;     ///< rows
    std::vector<float> dlogits;  ///< rows x classes
};
/// Per row, each step one VPU instruction: m = max_j l_j (from -inf); z_j = l_j - m;
/// e_j = expf(z_j); s = sum_j e_j (from +0.0, j order); ls = logf(s); lp_j = z_j - ls;
/// loss = (sum_j y_j * lp_j) * -1.0f; p_j = expf(lp_j); d_j = (p_j - y_j) * fp32(1 / rows).
SoftmaxCeResult softmax_cross_entropy_reference(const std::vector<float>& logits,
                                                const std::vector<float>& labels_onehot,
                                                uint32_t rows, uint32_t classes);
/// v = v * momentum + g; w = w - v * lr.
void sgd_momentum_reference(std::vector<float>& w, const std::vector<float>& g,
                            std::vector<float>& v, float lr, float momentum);
/// With s = adam_scalars(...): m = m * beta1 + g * one_minus_b1; v = v * beta2 + (g * g) *
/// one_minus_b2; r = 1.0f / sqrtf(v * c2 + eps2); w = w - (m * r) * lr_c1. (eps sits inside
/// the square root because the VPU has rsqrt but no divide.)
void adam_reference(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                    std::vector<float>& v, float lr, float beta1, float beta2, float eps,
                    uint32_t step);

}  // namespace tpu::driver
