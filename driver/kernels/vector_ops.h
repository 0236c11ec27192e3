// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/tensor.h"
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

/// The streaming-kernel machinery, shared with tensor_ops.cpp. Not a stable API.
namespace detail {

struct Layout;

/// Emits kernel text for one tile. Registers: s16 tile index, s18 units in the tile, s19 slot
/// base; s15 is free for the body (s13-s15 for custom transfers). Flags f5-f7 are free for
/// prologues and epilogues.
class Body {
public:
    Body(std::string& s, const Layout& l) : m_s(s), m_l(l) {}
    /// Slot area k of the current tile.
    std::string a(int k) const;
    /// Slot area k of the slot whose base is in register `slot` (custom transfers).
    std::string at(const std::string& slot, int k) const;
    /// Slot area k of slot 0 or 1, absolute (prologues).
    std::string slot(int which, int k) const;
    /// Fixed area k.
    std::string f(int k) const;
    /// Bytes from a slot base to slot area k (for operands at an offset inside an area).
    uint64_t off(int k) const;
    /// Absolute VMEM address of fixed area k.
    uint64_t fixed_addr(int k) const;
    /// Units per full tile.
    uint32_t tile_units() const;
    /// A VPU instruction of the body: gets completion flag f2 and is counted in s26, which the
    /// loop waits on before reusing the slot or storing results.
    void vpu(const std::string& ins);
    /// Any other line (labels, branches, scalar arithmetic, waits).
    void line(const std::string& text);
    /// A label unique to this copy of the body (the loop is unrolled twice).
    std::string label(const std::string& name) const;
    /// Sets the suffix label() appends.
    void set_tag(std::string tag) { m_tag = std::move(tag); }

private:
    std::string& m_s;
    const Layout& m_l;
    std::string m_tag;
};

/// A custom transfer of one tile: emits exactly one DMA with completion flag `flag`.
/// Arguments: registers holding the tile's first unit, its units and its slot base.
using TransferFn = std::function<void(Body&, const std::string& first, const std::string& units,
                                      const std::string& slot, const std::string& flag)>;

/// An HBM tensor moved tile by tile (`dma` set: a custom transfer instead of a contiguous one).
struct Stream {
    Stream(int arg_reg, int area_index, TransferFn transfer = {})
        : arg(arg_reg), area(area_index), dma(std::move(transfer)) {}
    int arg;         ///< s-register with the HBM address
    int area;        ///< index into Spec::areas
    TransferFn dma;  ///< optional custom transfer
};

/// A tensor loaded once before the loop (or stored once after it) from a fixed VMEM area.
struct FixedIo {
    int arg;    ///< s-register with the HBM address
    int fixed;  ///< index into Spec::fixed
};

/// A streamed kernel: `units` units (elements or rows) of `areas[k]` fp32 values each per slot
/// area, `ins` loaded and `outs` stored per tile, `body` emitting the VPU work of one tile.
struct Spec {
    std::string name;  ///< also the cache key prefix: must name everything the code depends on
    uint64_t units = 0;
    std::vector<uint32_t> areas;  ///< fp32 values per unit of each slot area
    std::vector<uint32_t> fixed;  ///< fp32 values of each fixed area
    std::vector<Stream> ins, outs;
    std::vector<FixedIo> fixed_ins, fixed_outs;
    std::function<void(Body&)> body;
    /// Before any load; must finish its own work on the slots before returning.
    std::function<void(Body&)> prologue;
    /// After every store has completed (flags f5-f7).
    std::function<void(Body&)> epilogue;
    uint64_t max_tile_units = 0;  ///< 0: no limit beyond the VMEM and tile-value bounds
};

/// Launch arguments of core set index i.
using ArgsFn = std::function<std::vector<uint32_t>(size_t index)>;
/// Plans, compiles (or fetches) and launches `sp` on `cores`, core i with args(i) in s1, ...
Event run(Device& dev, ProgramCache& cache, const Spec& sp, const std::vector<uint32_t>& cores,
          const ArgsFn& args);
/// run() on the tensors' core set: s1.. = the tensors' replica addresses, then `scalars`.
Event run(Device& dev, ProgramCache& cache, const Spec& sp,
          const std::vector<const Tensor*>& tensors, const std::vector<uint32_t>& scalars = {});
/// Units per tile `sp` gets on this configuration.
uint32_t tile_units(const Spec& sp, const hw::BoardConfig& cfg);
/// One event for a sequence of launches on the same cores: first start to last end, core
/// cycles and host seconds summed.
Event merge(const std::vector<Event>& evs);
/// fp32 bit pattern (for immediates and launch arguments).
uint32_t f32_bits(float x);

}  // namespace detail

}  // namespace tpu::driver
