// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// 2-D max and average pooling and global average pooling on NHWC Tensors, forward and
/// backward, on the VPU: one launch over the tensors' core set (each core pools its own batch),
/// rows streamed through VMEM in double-buffered tiles. Each has a host reference with the
/// device's fp32 operations in the same order.
namespace tpu::driver {

/// One core's NHWC input and the pooling window (square kernel, stride and zero/-inf padding).
struct PoolShape {
    uint32_t batch = 1;     ///< images per core
    uint32_t height = 1;    ///< input rows
    uint32_t width = 1;     ///< input columns
    uint32_t channels = 1;  ///< C (the contiguous dimension)
    uint32_t kernel = 1;    ///< window rows and columns
    uint32_t stride = 1;    ///< window step
    uint32_t pad = 0;       ///< padding on every side, at most kernel / 2 (as PyTorch)

    /// (height + 2 pad - kernel) / stride + 1 (floor, PyTorch's ceil_mode=False).
    uint32_t out_height() const;
    /// (width + 2 pad - kernel) / stride + 1.
    uint32_t out_width() const;
    /// Throws DeviceError(Usage) naming `kernel_name` and the bad field.
    void validate(const char* kernel_name) const;
    auto operator<=>(const PoolShape&) const = default;
};

/// The pooling kernels.
enum class PoolOp : uint8_t {
    Max,         ///< max_pool2d: operands x, y
    Avg,         ///< avg_pool2d: operands x, y
    MaxGrad,     ///< max_pool2d_grad: operands x, dy, dx
    AvgGrad,     ///< avg_pool2d_grad: operands dy, dx
    Global,      ///< global_avg_pool: operands x, y
    GlobalGrad,  ///< global_avg_pool_grad: operands dy, dx
};

/// Program-cache key of a pooling kernel: one output row (forward) or input row (backward), or
/// one image (global), per VMEM tile, so the shape is all the code depends on.
struct PoolKey {
    PoolOp op = PoolOp::Max;  ///< which kernel
    PoolShape shape;          ///< one core's input and window (kernel 1, stride 1, pad 0: global)
    auto operator<=>(const PoolKey&) const = default;
    /// "max_pool2d", "avg_pool2d_grad", "global_avg_pool", ...
    std::string name() const;
    friend size_t hash_value(const PoolKey& k) {
        const PoolShape& s = k.shape;
        return hash_fields(k.op, s.batch, s.height, s.width, s.channels, s.kernel, s.stride, s.pad);
    }
};
/// The key of pooling `op` on `s` (validated; global pools ignore the window), checked to fit
/// in `vmem_bytes` of free VMEM (DeviceError(Usage) naming the kernel when a row or image does
/// not fit twice).
PoolKey plan_pool(PoolOp op, const PoolShape& s, uint64_t vmem_bytes);
/// The operands of `k` in launch-argument order (PoolOp lists them).
std::vector<streaming::Param> pool_params(const PoolKey& k);
/// Emits pooling kernel `k` into `b` (no halt), operands in pool_params order. Window rows, dy
/// rows and dx phases move by strided DMAs from and to HBM, so every operand of the windowed
/// kernels but the forward y must be in HBM; the global kernels' operands may be anywhere.
void emit(isa::Builder& b, const PoolKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of `k`.
isa::Program generate(const PoolKey& k);

/// y[n][oh][ow][c] = max over the window (kh, kw in row-major order) of the input padded with
/// -inf. x is batch * height * width rows x channels, y batch * out_height * out_width rows x
/// channels. Order: acc = -inf; acc = max(acc, tap) per tap in window order (NaN wins).
Event max_pool2d(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                 const Tensor& y);
/// Backward of max_pool2d: each window sends dy to the first tap (window order) that equals
/// its maximum (recomputed from x); dx sums what it receives. Order per input value: from +0.0,
/// the contributions m * dy (m = 1 for the routed tap, 0 for the others) of the windows that
/// hold it, by decreasing output row, then increasing kernel column.
Event max_pool2d_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                      const Tensor& dy, const Tensor& dx);
/// y = (sum over the window of the zero-padded input, window order) * fp32(1 / kernel^2):
/// padding counts in the divisor (PyTorch's count_include_pad=True).
Event avg_pool2d(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                 const Tensor& y);
/// Backward of avg_pool2d: per input value, from +0.0, the sum of dy * fp32(1 / kernel^2) of
/// the windows that hold it, by decreasing output row, then increasing kernel column.
Event avg_pool2d_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& dy,
                      const Tensor& dx);
/// y[n][c] = (sum over h, w in row-major order from +0.0 of x[n][h][w][c]) * fp32(1 / (H W)).
/// x is batch * height * width rows x channels, y batch rows x channels; kernel, stride and pad
/// are ignored. One image per VMEM tile, so an image must fit in VMEM twice.
Event global_avg_pool(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                      const Tensor& y);
/// dx[n][h][w][c] = dy[n][c] * fp32(1 / (H W)).
Event global_avg_pool_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& dy,
                           const Tensor& dx);

// ---- Host references (one replica) ----------------------------------------------------------

std::vector<float> max_pool2d_reference(const PoolShape& s, const std::vector<float>& x);
std::vector<float> max_pool2d_grad_reference(const PoolShape& s, const std::vector<float>& x,
                                             const std::vector<float>& dy);
std::vector<float> avg_pool2d_reference(const PoolShape& s, const std::vector<float>& x);
std::vector<float> avg_pool2d_grad_reference(const PoolShape& s, const std::vector<float>& dy);
std::vector<float> global_avg_pool_reference(const PoolShape& s, const std::vector<float>& x);
std::vector<float> global_avg_pool_grad_reference(const PoolShape& s, const std::vector<float>& dy);

}  // namespace tpu::driver
