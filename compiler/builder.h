// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir.h"

/// Typed recording functions on a Graph: one per op kind, plus the PyTorch-level helpers front
/// ends use (linear, matmul, head split). Each checks its shapes where it is recorded and throws
/// CompileError naming the op and the mismatch. Autodiff is not the compiler's: a front end
/// records backward ops with these same functions (the trainer by hand, PyTorch's autograd
/// through the Python front end).
namespace tpu::compiler {

// ---- Elementwise -------------------------------------------------------------------------------

ValueId neg(Graph& g, ValueId a);
ValueId abs(Graph& g, ValueId a);
ValueId exp(Graph& g, ValueId a);
ValueId log(Graph& g, ValueId a);
ValueId rsqrt(Graph& g, ValueId a);
ValueId sqrt(Graph& g, ValueId a);
ValueId tanh(Graph& g, ValueId a);
ValueId erf(Graph& g, ValueId a);
/// `a` as `to` (f32 -> bf16 rounds to nearest even).
ValueId convert(Graph& g, ValueId a, DType to);
ValueId add(Graph& g, ValueId a, ValueId b);
ValueId sub(Graph& g, ValueId a, ValueId b);
ValueId mul(Graph& g, ValueId a, ValueId b);
ValueId div(Graph& g, ValueId a, ValueId b);
ValueId max(Graph& g, ValueId a, ValueId b);
ValueId min(Graph& g, ValueId a, ValueId b);
ValueId pow(Graph& g, ValueId a, ValueId b);
/// a <dir> b, a pred array.
ValueId compare(Graph& g, ValueId a, ValueId b, Comparison dir);
/// pred ? on_true : on_false.
ValueId select(Graph& g, ValueId pred, ValueId on_true, ValueId on_false);

// ---- Scalars, shapes and data movement ------------------------------------------------------

/// A scalar literal (a compile-time value: part of the graph's hash).
ValueId literal(Graph& g, double value, DType dtype = DType::F32);
/// `value` in every element of `shape` (a broadcast literal).
ValueId full(Graph& g, double value, const Shape& shape);
/// result[i] = a[i restricted to `dims`]: operand dim d becomes result dim dims[d].
ValueId broadcast(Graph& g, ValueId a, std::vector<int64_t> result_dims, std::vector<int64_t> dims);
/// The same elements (row-major order) with new dims.
ValueId reshape(Graph& g, ValueId a, std::vector<int64_t> dims);
/// Result dim i is operand dim perm[i].
ValueId transpose(Graph& g, ValueId a, std::vector<int64_t> perm);
/// a[start : limit] per dim.
ValueId slice(Graph& g, ValueId a, std::vector<int64_t> start, std::vector<int64_t> limit);
/// Operands joined along `axis`.
ValueId concatenate(Graph& g, std::vector<ValueId> parts, int64_t axis);
/// 0, 1, 2, ... along `axis` of an array of `dims`.
ValueId iota(Graph& g, std::vector<int64_t> dims, int64_t axis, DType dtype = DType::S32);

// ---- Reductions and contractions --------------------------------------------------------------

/// Sum (from +0.0, index order) or max (from -inf) over `dims`.
ValueId reduce(Graph& g, ValueId a, std::vector<int64_t> dims, Reducer r);
/// General dot.
ValueId dot(Graph& g, ValueId lhs, ValueId rhs, DotDims dims, Precision p = Precision::Default);
/// op(a) x op(b) of 2-D arrays, op(x) = x^T when its flag is set: the transposes are dimension
/// numbers, never data movement.
ValueId matmul(Graph& g, ValueId a, ValueId b, bool transpose_a, bool transpose_b,
               Precision p = Precision::Default);
/// torch.nn.functional.linear: x [..., in] W^T (W [out, in], PyTorch's layout) + b [out]
/// (b may be kNoValue).
ValueId linear(Graph& g, ValueId x, ValueId w, ValueId b, Precision p = Precision::Default);
/// No value (an absent bias).
inline constexpr ValueId kNoValue = ~ValueId(0);
/// NHWC x HWIO convolution.
ValueId conv2d(Graph& g, ValueId x, ValueId w, int64_t stride, int64_t pad,
               Precision p = Precision::Default);
/// Gradient of conv2d for its input: dy (NHWC), w (HWIO), the forward input's NHWC dims.
ValueId conv2d_input_grad(Graph& g, ValueId dy, ValueId w, std::vector<int64_t> input_dims,
                          int64_t stride, int64_t pad, Precision p = Precision::Default);
/// Gradient of conv2d for its filter: x (NHWC) and dy (NHWC), kernel size k.
ValueId conv2d_filter_grad(Graph& g, ValueId x, ValueId dy, int64_t kernel, int64_t stride,
                           int64_t pad, Precision p = Precision::Default);
/// Max or average pooling (average counts padding, PyTorch's count_include_pad=True).
ValueId pool(Graph& g, ValueId x, PoolKind kind, int64_t kernel, int64_t stride, int64_t pad);
/// Max-pool gradient (each window's dy goes to its first maximum).
ValueId max_pool_grad(Graph& g, ValueId x, ValueId dy, int64_t kernel, int64_t stride, int64_t pad);
/// Average-pool gradient.
ValueId avg_pool_grad(Graph& g, ValueId dy, std::vector<int64_t> input_dims, int64_t kernel,
                      int64_t stride, int64_t pad);
/// Mean over H and W of NHWC: torch's adaptive_avg_pool2d(1) (sum, then divided by H W).
ValueId global_avg_pool(Graph& g, ValueId x);

// ---- Indexing, randomness, replicas, host ----------------------------------------------------

/// Rows of `table` picked by s32 `indices` (aten::embedding: exact rows, no matmul).
ValueId gather_rows(Graph& g, ValueId table, ValueId indices);
/// The gradient of gather_rows: `updates` added into a zero table of `rows` rows.
ValueId scatter_add_rows(Graph& g, ValueId indices, ValueId updates, int64_t rows);
/// Uniform [0, 1) f32 of `dims`, from an s32 scalar seed (data, so a new seed is no new graph).
ValueId rng_uniform(Graph& g, ValueId seed, std::vector<int64_t> dims);
/// Sum over replicas times `scale` (1 / replicas: the mean of data-parallel gradients).
ValueId all_reduce(Graph& g, ValueId a, double scale);
/// A host or library function: `target` on `operands`, one result of `result`.
ValueId custom_call(Graph& g, std::string target, std::vector<ValueId> operands,
                    const Shape& result);

// ---- Composites (lowered by the decomposition pass as PyTorch/XLA lowers them) -----------------

ValueId relu(Graph& g, ValueId a);
/// GELU: erf form, or the tanh form when `approximate` (PyTorch's approximate='tanh').
ValueId gelu(Graph& g, ValueId a, bool approximate);
/// dx of gelu given dy and x.
ValueId gelu_grad(Graph& g, ValueId dy, ValueId x, bool approximate);
ValueId softmax(Graph& g, ValueId a, int64_t axis);
/// dx of softmax given dy and its output y.
ValueId softmax_grad(Graph& g, ValueId dy, ValueId y, int64_t axis);
ValueId log_softmax(Graph& g, ValueId a, int64_t axis);
/// dx of log_softmax given dy and its output y.
ValueId log_softmax_grad(Graph& g, ValueId dy, ValueId y, int64_t axis);
/// Layer norm's three results: y, mean and rstd (the last two [..., 1], for backward).
struct LayerNormResult {
    ValueId y, mean, rstd;
};
/// torch.nn.functional.layer_norm over the last dim.
LayerNormResult layer_norm(Graph& g, ValueId x, ValueId gamma, ValueId beta, double eps);
/// Batch norm in training mode: y, batch mean and (biased) batch variance per feature.
struct BatchNormResult {
    ValueId y, mean, var;
};
BatchNormResult batch_norm_training(Graph& g, ValueId x, ValueId scale, ValueId offset, double eps,
                                    int64_t feature);
/// Batch norm with running statistics: the inference affine.
ValueId batch_norm_inference(Graph& g, ValueId x, ValueId scale, ValueId offset, ValueId mean,
                             ValueId var, double eps, int64_t feature);
/// Gradients of batch_norm_training: dx, dscale, doffset.
struct BatchNormGradResult {
    ValueId dx, dscale, doffset;
};
BatchNormGradResult batch_norm_grad(Graph& g, ValueId x, ValueId scale, ValueId mean, ValueId var,
                                    ValueId dy, double eps, int64_t feature);
/// Mean softmax cross-entropy of logits [B, C] against one-hot labels (a scalar).
ValueId cross_entropy(Graph& g, ValueId logits, ValueId onehot);
/// torch.optim.SGD with momentum: (w', v'); lr is a scalar value (data, not an attribute).
struct SgdResult {
    ValueId w, v;
};
SgdResult sgd_momentum(Graph& g, ValueId w, ValueId grad, ValueId v, ValueId lr, double momentum);
/// torch.optim.Adam: (w', m', v'); lr_c1 = lr / (1 - beta1^step) and c2 = 1 / (1 - beta2^step)
/// are scalar values (data: a new step is no new graph).
struct AdamResult {
    ValueId w, m, v;
};
AdamResult adam(Graph& g, ValueId w, ValueId grad, ValueId m, ValueId v, ValueId lr_c1, ValueId c2,
                double beta1, double beta2, double eps);

}  // namespace tpu::compiler
