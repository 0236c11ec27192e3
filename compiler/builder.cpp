// SPDX-License-Identifier: Apache-2.0
#include "compiler/builder.h"

#include <fmt/format.h>

namespace tpu::compiler {
namespace {

ValueId unary(Graph& g, OpKind k, ValueId a) {
    return g.add1(k, {a});
}

ValueId binary(Graph& g, OpKind k, ValueId a, ValueId b) {
    return g.add1(k, {a, b});
}

Attrs window_attrs(int64_t kernel, int64_t stride, int64_t pad) {
    Attrs at;
    at.window.kernel = kernel;
    at.window.stride = stride;
    at.window.pad = pad;
    return at;
}

}  // namespace

ValueId neg(Graph& g, ValueId a) {
    return unary(g, OpKind::Neg, a);
}
ValueId abs(Graph& g, ValueId a) {
    return unary(g, OpKind::Abs, a);
}
ValueId exp(Graph& g, ValueId a) {
    return unary(g, OpKind::Exp, a);
}
ValueId log(Graph& g, ValueId a) {
    return unary(g, OpKind::Log, a);
}
ValueId rsqrt(Graph& g, ValueId a) {
    return unary(g, OpKind::Rsqrt, a);
}
ValueId sqrt(Graph& g, ValueId a) {
    return unary(g, OpKind::Sqrt, a);
}
ValueId tanh(Graph& g, ValueId a) {
    return unary(g, OpKind::Tanh, a);
}
ValueId erf(Graph& g, ValueId a) {
    return unary(g, OpKind::Erf, a);
}

ValueId convert(Graph& g, ValueId a, DType to) {
    Attrs at;
    at.dtype = to;
    return g.add1(OpKind::Convert, {a}, at);
}

ValueId add(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Add, a, b);
}
ValueId sub(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Sub, a, b);
}
ValueId mul(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Mul, a, b);
}
ValueId div(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Div, a, b);
}
ValueId max(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Max, a, b);
}
ValueId min(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Min, a, b);
}
ValueId pow(Graph& g, ValueId a, ValueId b) {
    return binary(g, OpKind::Pow, a, b);
}

ValueId compare(Graph& g, ValueId a, ValueId b, Comparison dir) {
    Attrs at;
    at.comparison = dir;
    return g.add1(OpKind::Compare, {a, b}, at);
}

ValueId select(Graph& g, ValueId pred, ValueId on_true, ValueId on_false) {
    return g.add1(OpKind::Select, {pred, on_true, on_false});
}

ValueId literal(Graph& g, double value, DType dtype) {
    Attrs at;
    at.scalar = value;
    at.dtype = dtype;
    return g.add1(OpKind::Literal, {}, at);
}

ValueId full(Graph& g, double value, const Shape& shape) {
    const ValueId s = literal(g, value, shape.dtype);
    if (shape.rank() == 0) return s;
    return broadcast(g, s, shape.dims, {});
}

ValueId broadcast(Graph& g, ValueId a, std::vector<int64_t> result_dims,
                  std::vector<int64_t> dims) {
    Attrs at;
    at.out_dims = std::move(result_dims);
    at.dims = std::move(dims);
    return g.add1(OpKind::Broadcast, {a}, at);
}

ValueId reshape(Graph& g, ValueId a, std::vector<int64_t> dims) {
    Attrs at;
    at.out_dims = std::move(dims);
    return g.add1(OpKind::Reshape, {a}, at);
}

ValueId transpose(Graph& g, ValueId a, std::vector<int64_t> perm) {
    Attrs at;
    at.dims = std::move(perm);
    return g.add1(OpKind::Transpose, {a}, at);
}

ValueId slice(Graph& g, ValueId a, std::vector<int64_t> start, std::vector<int64_t> limit) {
    Attrs at;
    at.dims = std::move(start);
    at.limits = std::move(limit);
    return g.add1(OpKind::Slice, {a}, at);
}

ValueId concatenate(Graph& g, std::vector<ValueId> parts, int64_t axis) {
    Attrs at;
    at.axis = axis;
    return g.add1(OpKind::Concatenate, std::move(parts), at);
}

ValueId iota(Graph& g, std::vector<int64_t> dims, int64_t axis, DType dtype) {
    Attrs at;
    at.out_dims = std::move(dims);
    at.axis = axis;
    at.dtype = dtype;
    return g.add1(OpKind::Iota, {}, at);
}

ValueId reduce(Graph& g, ValueId a, std::vector<int64_t> dims, Reducer r) {
    Attrs at;
    at.dims = std::move(dims);
    at.reducer = r;
    return g.add1(OpKind::Reduce, {a}, at);
}

ValueId dot(Graph& g, ValueId lhs, ValueId rhs, DotDims dims, Precision p) {
    Attrs at;
    at.dot = std::move(dims);
    at.precision = p;
    return g.add1(OpKind::Dot, {lhs, rhs}, at);
}

ValueId matmul(Graph& g, ValueId a, ValueId b, bool transpose_a, bool transpose_b, Precision p) {
    if (g.shape(a).rank() != 2 || g.shape(b).rank() != 2)
        throw CompileError(fmt::format("matmul: operands {} and {} are not matrices",
                                       g.shape(a).to_string(), g.shape(b).to_string()));
    DotDims d;
    d.lhs_contracting = {transpose_a ? 0 : 1};
    d.rhs_contracting = {transpose_b ? 1 : 0};
    ValueId y = dot(g, a, b, d, p);
    // op(a) x op(b) with transpose_a contracts a's rows, so the result is already [M, N].
    return y;
}

ValueId linear(Graph& g, ValueId x, ValueId w, ValueId b, Precision p) {
    const Shape& xs = g.shape(x);
    if (xs.rank() < 1 || g.shape(w).rank() != 2)
        throw CompileError(fmt::format("linear: input {} and weight {} (expected [out, in])",
                                       xs.to_string(), g.shape(w).to_string()));
    // PyTorch/XLA lowers linear to a dot contracting the input's last dim with the weight's
    // dim 1: the weight's transpose is dimension numbers.
    DotDims d;
    d.lhs_contracting = {xs.rank() - 1};
    d.rhs_contracting = {1};
    ValueId y = dot(g, x, w, d, p);
    if (b == kNoValue) return y;
    const Shape& ys = g.shape(y);
    return add(g, y, broadcast(g, b, ys.dims, {ys.rank() - 1}));
}

ValueId conv2d(Graph& g, ValueId x, ValueId w, int64_t stride, int64_t pad, Precision p) {
    const Shape& ws = g.shape(w);
    Attrs at = window_attrs(ws.rank() == 4 ? ws.dims[0] : 1, stride, pad);
    at.precision = p;
    return g.add1(OpKind::Conv2d, {x, w}, at);
}

ValueId conv2d_input_grad(Graph& g, ValueId dy, ValueId w, std::vector<int64_t> input_dims,
                          int64_t stride, int64_t pad, Precision p) {
    const Shape& ws = g.shape(w);
    Attrs at = window_attrs(ws.rank() == 4 ? ws.dims[0] : 1, stride, pad);
    at.window.input_dims = std::move(input_dims);
    at.precision = p;
    return g.add1(OpKind::Conv2dInputGrad, {dy, w}, at);
}

ValueId conv2d_filter_grad(Graph& g, ValueId x, ValueId dy, int64_t kernel, int64_t stride,
                           int64_t pad, Precision p) {
    Attrs at = window_attrs(kernel, stride, pad);
    at.window.input_dims = g.shape(x).dims;
    at.precision = p;
    return g.add1(OpKind::Conv2dFilterGrad, {x, dy}, at);
}

ValueId pool(Graph& g, ValueId x, PoolKind kind, int64_t kernel, int64_t stride, int64_t pad) {
    Attrs at = window_attrs(kernel, stride, pad);
    at.pool = kind;
    return g.add1(OpKind::Pool, {x}, at);
}

ValueId max_pool_grad(Graph& g, ValueId x, ValueId dy, int64_t kernel, int64_t stride,
                      int64_t pad) {
    return g.add1(OpKind::MaxPoolGrad, {x, dy}, window_attrs(kernel, stride, pad));
}

ValueId avg_pool_grad(Graph& g, ValueId dy, std::vector<int64_t> input_dims, int64_t kernel,
                      int64_t stride, int64_t pad) {
    Attrs at = window_attrs(kernel, stride, pad);
    at.window.input_dims = std::move(input_dims);
    return g.add1(OpKind::AvgPoolGrad, {dy}, at);
}

ValueId global_avg_pool(Graph& g, ValueId x) {
    const Shape& s = g.shape(x);
    if (s.rank() != 4)
        throw CompileError(fmt::format("global_avg_pool: {} is not NHWC", s.to_string()));
    const ValueId sum = reduce(g, x, {1, 2}, Reducer::Sum);
    const Shape& ss = g.shape(sum);
    return div(g, sum, full(g, double(s.dims[1] * s.dims[2]), ss));
}

ValueId gather_rows(Graph& g, ValueId table, ValueId indices) {
    return g.add1(OpKind::Gather, {table, indices});
}

ValueId scatter_add_rows(Graph& g, ValueId indices, ValueId updates, int64_t rows) {
    const Shape& is = g.shape(indices);
    const Shape& us = g.shape(updates);
    Attrs at;
    at.out_dims = {rows};
    for (int64_t d = is.rank(); d < us.rank(); ++d) at.out_dims.push_back(us.dims[size_t(d)]);
    return g.add1(OpKind::ScatterAdd, {indices, updates}, at);
}

ValueId rng_uniform(Graph& g, ValueId seed, std::vector<int64_t> dims) {
    Attrs at;
    at.out_dims = std::move(dims);
    return g.add1(OpKind::RngUniform, {seed}, at);
}

ValueId all_reduce(Graph& g, ValueId a, double scale) {
    Attrs at;
    at.scalar = scale;
    return g.add1(OpKind::AllReduce, {a}, at);
}

ValueId custom_call(Graph& g, std::string target, std::vector<ValueId> operands,
                    const Shape& result) {
    Attrs at;
    at.target = std::move(target);
    at.out_dims = result.dims;
    at.dtype = result.dtype;
    return g.add1(OpKind::CustomCall, std::move(operands), at);
}

ValueId relu(Graph& g, ValueId a) {
    return g.add1(OpKind::Relu, {a});
}

ValueId gelu(Graph& g, ValueId a, bool approximate) {
    Attrs at;
    at.approximate = approximate;
    return g.add1(OpKind::Gelu, {a}, at);
}

ValueId gelu_grad(Graph& g, ValueId dy, ValueId x, bool approximate) {
    Attrs at;
    at.approximate = approximate;
    return g.add1(OpKind::GeluGrad, {dy, x}, at);
}

namespace {

ValueId along(Graph& g, OpKind k, std::vector<ValueId> operands, int64_t axis) {
    Attrs at;
    at.axis = axis;
    return g.add1(k, std::move(operands), at);
}

}  // namespace

ValueId softmax(Graph& g, ValueId a, int64_t axis) {
    return along(g, OpKind::Softmax, {a}, axis);
}
ValueId softmax_grad(Graph& g, ValueId dy, ValueId y, int64_t axis) {
    return along(g, OpKind::SoftmaxGrad, {dy, y}, axis);
}
ValueId log_softmax(Graph& g, ValueId a, int64_t axis) {
    return along(g, OpKind::LogSoftmax, {a}, axis);
}
ValueId log_softmax_grad(Graph& g, ValueId dy, ValueId y, int64_t axis) {
    return along(g, OpKind::LogSoftmaxGrad, {dy, y}, axis);
}

LayerNormResult layer_norm(Graph& g, ValueId x, ValueId gamma, ValueId beta, double eps) {
    Attrs at;
    at.eps = eps;
    const auto r = g.add(OpKind::LayerNorm, {x, gamma, beta}, at);
    return {r[0], r[1], r[2]};
}

BatchNormResult batch_norm_training(Graph& g, ValueId x, ValueId scale, ValueId offset, double eps,
                                    int64_t feature) {
    Attrs at;
    at.eps = eps;
    at.axis = feature;
    const auto r = g.add(OpKind::BatchNormTraining, {x, scale, offset}, at);
    return {r[0], r[1], r[2]};
}

ValueId batch_norm_inference(Graph& g, ValueId x, ValueId scale, ValueId offset, ValueId mean,
                             ValueId var, double eps, int64_t feature) {
    Attrs at;
    at.eps = eps;
    at.axis = feature;
    return g.add1(OpKind::BatchNormInference, {x, scale, offset, mean, var}, at);
}

BatchNormGradResult batch_norm_grad(Graph& g, ValueId x, ValueId scale, ValueId mean, ValueId var,
                                    ValueId dy, double eps, int64_t feature) {
    Attrs at;
    at.eps = eps;
    at.axis = feature;
    const auto r = g.add(OpKind::BatchNormGrad, {x, scale, mean, var, dy}, at);
    return {r[0], r[1], r[2]};
}

ValueId cross_entropy(Graph& g, ValueId logits, ValueId onehot) {
    return g.add1(OpKind::CrossEntropy, {logits, onehot});
}

SgdResult sgd_momentum(Graph& g, ValueId w, ValueId grad, ValueId v, ValueId lr, double momentum) {
    Attrs at;
    at.momentum = momentum;
    const auto r = g.add(OpKind::SgdMomentum, {w, grad, v, lr}, at);
    return {r[0], r[1]};
}

AdamResult adam(Graph& g, ValueId w, ValueId grad, ValueId m, ValueId v, ValueId lr_c1, ValueId c2,
                double beta1, double beta2, double eps) {
    Attrs at;
    at.beta1 = beta1;
    at.beta2 = beta2;
    at.eps = eps;
    const auto r = g.add(OpKind::Adam, {w, grad, m, v, lr_c1, c2}, at);
    return {r[0], r[1], r[2]};
}

}  // namespace tpu::compiler
