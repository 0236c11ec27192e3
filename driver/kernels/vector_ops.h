// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// The VPU kernel library: elementwise ops, row/column reductions, softmax cross-entropy and
/// optimizer updates on fp32 tensors in one core's HBM, streamed through VMEM in
/// double-buffered tiles. Every kernel has a host reference with the same fp32 operation order,
/// so results match bit for bit.
namespace tpu::driver {

// ---- Keys and generators ----------------------------------------------------------------------

/// The kernels of this file (each a streaming kernel, driver/kernels/stream_kernel.h).
enum class VectorOp : uint8_t {
    Add,                  ///< a, b -> out
    Mul,                  ///< a, b -> out
    Scale,                ///< a, scalar s -> out
    Relu,                 ///< x -> out
    AddRelu,              ///< a, b -> out
    ReluGrad,             ///< x, dy -> dx
    BiasAdd,              ///< x, bias -> out (rows x cols)
    RowSum,               ///< x -> out (rows)
    ColSum,               ///< x -> out (cols)
    SoftmaxCrossEntropy,  ///< logits, labels -> loss, dlogits; scalar inv_rows
    SgdMomentum,          ///< w, g, v (w, v in place); scalars lr, momentum
    Adam,                 ///< w, g, m, v (w, m, v in place); the seven AdamScalars
};

/// The program-cache key of a vector_ops kernel: everything its program depends on.
struct VectorKey {
    VectorOp op = VectorOp::Add;  ///< which kernel
    uint64_t units = 0;           ///< elements (elementwise kernels) or rows (row kernels)
    uint32_t cols = 1;            ///< values per row (row kernels; 1 for the elementwise ones)
    uint32_t tile = 0;            ///< units per VMEM tile (plan_vector)
    auto operator<=>(const VectorKey&) const = default;
    /// The kernel name of per-kernel statistics ("add", "bias_add", ...).
    std::string name() const;
    friend size_t hash_value(const VectorKey& k) {
        return hash_fields(k.op, k.units, k.cols, k.tile);
    }
};

/// The key of `op` on `units` units of `cols` values, tiled for `vmem_bytes` of free VMEM.
/// Throws DeviceError(Usage) when two tile slots of one unit do not fit.
VectorKey plan_vector(VectorOp op, uint64_t units, uint32_t cols, uint64_t vmem_bytes);
/// The operands of `op` in launch-argument order (also the names to bind): tensors, then scalars.
std::span<const streaming::Param> vector_params(VectorOp op);
/// Emits kernel `k` into `b` (no halt), operands in vector_params order, resources from b's pools.
void emit(isa::Builder& b, const VectorKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of `k`: launch arguments named as vector_params, emit, halt.
isa::Program generate(const VectorKey& k);

// ---- Device kernels -------------------------------------------------------------------------
// All buffers must live on the same core (the launch runs there) and hold the fp32 values the
// shape needs; violations throw DeviceError(Usage). Each returns the launch event. Programs are
// cached under their VectorKey; buffer addresses and scalars are launch arguments.

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

// ---- Data-parallel overloads on Tensors -------------------------------------------------------
// One launch over the tensors' core set; core i works on replica i with the same program (the
// replica addresses are its launch arguments), so results equal the Buffer kernels per replica.
// Core sets and shapes must match (DeviceError(Usage) naming the kernel and the tensor).

/// out = a + b elementwise.
Event add(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b, const Tensor& out);
/// out = a * b elementwise.
Event mul(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b, const Tensor& out);
/// out = a * s.
Event scale(Device& dev, ProgramCache& cache, const Tensor& a, float s, const Tensor& out);
/// out = max(x, +0.0).
Event relu(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out);
/// out = relu(a + b) in one pass (a residual join): each value rounded once by the add, then
/// max(., +0.0), so the same bits as add then relu with the sum never stored.
Event add_relu(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b,
               const Tensor& out);
/// dx = x > 0 ? dy : +0.0.
Event relu_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                const Tensor& dx);
/// out[r][j] = x[r][j] + bias[j]; bias is 1 x cols.
Event bias_add(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& bias,
               const Tensor& out);
/// out (rows x 1) = row sums of x.
Event row_sum(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out);
/// out (1 x cols) = column sums of x (tiled as the Buffer col_sum).
Event col_sum(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out);
/// loss_per_row is rows x 1; logits, labels_onehot and dlogits rows x classes.
Event softmax_cross_entropy(Device& dev, ProgramCache& cache, const Tensor& logits,
                            const Tensor& labels_onehot, const Tensor& loss_per_row,
                            const Tensor& dlogits);
/// In place on w and v (see the Buffer version).
Event sgd_momentum(Device& dev, ProgramCache& cache, const Tensor& w, const Tensor& g,
                   const Tensor& v, float lr, float momentum);
/// In place on w, m and v (see the Buffer version).
Event adam(Device& dev, ProgramCache& cache, const Tensor& w, const Tensor& g, const Tensor& m,
           const Tensor& v, float lr, float beta1, float beta2, float eps, uint32_t step);

/// Throws DeviceError(Usage) "<kernel>: <label> is R x C on N cores; expected r x c on n cores"
/// unless `t` has that shape and `like`'s core set.
void check_tensor(const Tensor& t, uint32_t rows, uint32_t cols, const Tensor& like,
                  const char* kernel, const char* label);

/// Rows per VMEM tile of col_sum (its result depends on the tiling, see col_sum).
uint32_t col_sum_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols);

/// Adam's per-step scalars, computed once on the host in this order and passed to the kernel
/// as fp32 immediates: one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2, c2 =
/// float(1 / (1 - beta2^step)), eps, lr_c1 = float(lr / (1 - beta1^step)) (the powers and
/// quotients in double).
struct AdamScalars {
    float beta1 = 0, one_minus_b1 = 0, beta2 = 0, one_minus_b2 = 0;
    float c2 = 0, eps = 0, lr_c1 = 0;
};
AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, uint32_t step);

// ---- Host references: the same fp32 operations in the same order as the kernels ------------

std::vector<float> add_reference(const std::vector<float>& a, const std::vector<float>& b);
std::vector<float> mul_reference(const std::vector<float>& a, const std::vector<float>& b);
std::vector<float> scale_reference(const std::vector<float>& a, float s);
/// isnan(x) ? quiet NaN : (x > 0 ? x : +0.0), like v.maxs.
std::vector<float> relu_reference(const std::vector<float>& x);
std::vector<float> add_relu_reference(const std::vector<float>& a, const std::vector<float>& b);
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
/// torch.optim.Adam's update, w -= lr c1 m / (sqrt(v c2) + eps), in VPU operations. With s =
/// adam_scalars(...): m = m * beta1 + g * one_minus_b1; v = v * beta2 + (g * g) *
/// one_minus_b2; vh = v * c2; sq = vh != 0 ? vh * (1.0f / sqrtf(vh)) : vh; r1 = 1.0f /
/// sqrtf(sq + eps); w = w - (m * (r1 * r1)) * lr_c1. (The VPU has rsqrt but no sqrt or
/// divide.)
void adam_reference(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                    std::vector<float>& v, float lr, float beta1, float beta2, float eps,
                    uint32_t step);

namespace detail {

/// One event for a sequence of launches on the same cores: first start to last end, core
/// cycles and host seconds summed.
Event merge(const std::vector<Event>& evs);
/// fp32 bit pattern (for immediates and launch arguments).
uint32_t f32_bits(float x);

}  // namespace detail

}  // namespace tpu::driver
