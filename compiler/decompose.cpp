// SPDX-License-Identifier: Apache-2.0
// Stage 1: composites lowered as PyTorch/XLA and XLA lower them (compiler/README.md,
// "Decompositions"). Each lowering follows the public source named above it, op for op, so
// the order of arithmetic (and with it every rounding) is theirs.
#include <cmath>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/rewriter.h"

namespace tpu::compiler {
namespace {

using detail::OpScope;
using detail::Rewriter;

/// `value` broadcast to the shape of `like` (XLA's ScalarBroadcast / PyTorch/XLA's ScalarOp).
ValueId scalar_like(Graph& g, double value, ValueId like) {
    return full(g, value, g.shape(like));
}

/// `v` ([C]) broadcast along `feature` of `like`'s shape.
ValueId feature_broadcast(Graph& g, ValueId v, ValueId like, int64_t feature) {
    return broadcast(g, v, g.shape(like).dims, {feature});
}

/// `v` (the reduction of `like` over `dim`) broadcast back to `like`'s shape.
ValueId reduced_broadcast(Graph& g, ValueId v, ValueId like, int64_t dim) {
    std::vector<int64_t> keep;
    for (int64_t d = 0; d < g.shape(like).rank(); ++d)
        if (d != dim) keep.push_back(d);
    return broadcast(g, v, g.shape(like).dims, keep);
}

std::vector<int64_t> all_but(int64_t rank, int64_t feature) {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank; ++d)
        if (d != feature) dims.push_back(d);
    return dims;
}

/// Elements per feature of `x` as a literal of x's type (batchnorm_expander's
/// DynamicElementCountPerFeature, static here).
ValueId count_per_feature(Graph& g, ValueId x, int64_t feature, ValueId feature_like) {
    const Shape& s = g.shape(x);
    return scalar_like(g, double(s.elements() / s.dims[size_t(feature)]), feature_like);
}

// xla/service/batchnorm_expander.cc, HandleBatchNormTraining.
BatchNormResult expand_batch_norm_training(Graph& g, ValueId x, ValueId scale, ValueId offset,
                                           double eps, int64_t f) {
    const int64_t rank = g.shape(x).rank();
    const ValueId epsilon = scalar_like(g, eps, x);
    const auto reduce_dims = all_but(rank, f);
    const ValueId elements = count_per_feature(g, x, f, scale);
    const ValueId scale_b = feature_broadcast(g, scale, x, f);
    const ValueId offset_b = feature_broadcast(g, offset, x, f);
    const ValueId x2 = mul(g, x, x);                                // X^2
    const ValueId sum = reduce(g, x, reduce_dims, Reducer::Sum);    // Sum[X]
    const ValueId sum2 = reduce(g, x2, reduce_dims, Reducer::Sum);  // Sum[X^2]
    const ValueId mean = div(g, sum, elements);                     // E[X]
    const ValueId mean_b = feature_broadcast(g, mean, x, f);
    const ValueId square_mean = div(g, sum2, elements);    // E[X^2]
    const ValueId mean_square = mul(g, mean, mean);        // E^2[X]
    const ValueId var = sub(g, square_mean, mean_square);  // Var[X]
    const ValueId var_b = feature_broadcast(g, var, x, f);
    const ValueId var_eps = add(g, var_b, epsilon);  // Var[X] + eps
    const ValueId rstd = rsqrt(g, var_eps);
    const ValueId centred = sub(g, x, mean_b);  // X - E[X]
    const ValueId normalized = mul(g, centred, rstd);
    const ValueId scaled = mul(g, normalized, scale_b);
    return {add(g, scaled, offset_b), mean, var};
}

// xla/service/batchnorm_expander.cc, HandleBatchNormInference.
ValueId expand_batch_norm_inference(Graph& g, ValueId x, ValueId scale, ValueId offset,
                                    ValueId mean, ValueId var, double eps, int64_t f) {
    const ValueId epsilon = scalar_like(g, eps, scale);
    const ValueId true_scale = mul(g, scale, rsqrt(g, add(g, var, epsilon)));
    const ValueId true_shift = sub(g, offset, mul(g, mean, true_scale));
    return add(g, mul(g, x, feature_broadcast(g, true_scale, x, f)),
               feature_broadcast(g, true_shift, x, f));
}

// xla/service/batchnorm_expander.cc, HandleBatchNormGrad.
BatchNormGradResult expand_batch_norm_grad(Graph& g, ValueId x, ValueId scale, ValueId mean,
                                           ValueId var, ValueId dy, double eps, int64_t f) {
    const auto reduce_dims = all_but(g.shape(x).rank(), f);
    const Shape& xs = g.shape(x);
    // Elements per feature, broadcast to the activation (the expander's elements_per_feature).
    const ValueId n = scalar_like(g, double(xs.elements() / xs.dims[size_t(f)]), x);
    const ValueId eps_x = scalar_like(g, eps, x);
    const ValueId eps_f = scalar_like(g, eps, scale);
    const ValueId scale_b = feature_broadcast(g, scale, x, f);
    const ValueId var_b = feature_broadcast(g, var, x, f);
    const ValueId mean_b = feature_broadcast(g, mean, x, f);
    const ValueId rstd_b = rsqrt(g, add(g, var_b, eps_x));
    const ValueId rstd = rsqrt(g, add(g, var, eps_f));
    const ValueId centred = sub(g, x, mean_b);  // X - E[X]
    const ValueId dy_centred = mul(g, dy, centred);
    const ValueId sum_dy_centred = reduce(g, dy_centred, reduce_dims, Reducer::Sum);
    const ValueId grad_beta = reduce(g, dy, reduce_dims, Reducer::Sum);  // Sum(Grad[Y])
    const ValueId grad_scale = mul(g, sum_dy_centred, rstd);
    const ValueId i2 = feature_broadcast(g, grad_beta, x, f);
    const ValueId i3 = feature_broadcast(g, sum_dy_centred, x, f);
    const ValueId i4 = mul(g, i3, centred);
    const ValueId i5 = div(g, i4, add(g, var_b, eps_x));
    const ValueId scale_rstd = div(g, mul(g, scale_b, rstd_b), n);  // scale rsqrt / N
    const ValueId i1 = mul(g, dy, n);
    const ValueId i6 = sub(g, sub(g, i1, i2), i5);
    return {mul(g, scale_rstd, i6), grad_scale, grad_beta};
}

// torch_xla/csrc/softmax_builder.cpp, LogSoftmaxPartials.
struct SoftmaxPartials {
    ValueId shifted, exp_shifted, sum;
};
SoftmaxPartials softmax_partials(Graph& g, ValueId x, int64_t dim) {
    const ValueId max = reduce(g, x, {dim}, Reducer::Max);
    const ValueId shifted = sub(g, x, reduced_broadcast(g, max, x, dim));
    const ValueId e = exp(g, shifted);
    return {shifted, e, reduce(g, e, {dim}, Reducer::Sum)};
}

void lower(Rewriter& rw, const Op& op) {
    Graph& g = rw.out();
    const OpScope scope(g, op.name);
    const auto in = rw.operands(op);
    const Attrs& a = op.attrs;
    const auto set = [&](size_t i, ValueId v) { rw.set(op.results[i], v); };
    switch (op.kind) {
        case OpKind::Relu:
            // torch_xla/csrc/elementwise.cpp, BuildRelu: Max(input, 0).
            set(0, max(g, in[0], scalar_like(g, 0.0, in[0])));
            return;
        case OpKind::Gelu: {
            const ValueId x = in[0];
            const ValueId half = scalar_like(g, 0.5, x), one = scalar_like(g, 1.0, x);
            if (!a.approximate) {
                // elementwise.cpp, BuildGelu: input * half * (erf(input * M_SQRT1_2) + one).
                const ValueId e = erf(g, mul(g, x, scalar_like(g, M_SQRT1_2, x)));
                set(0, mul(g, mul(g, x, half), add(g, e, one)));
                return;
            }
            // torch_xla/csrc/ops/ops.cpp, TanhGelu:
            // half * input * (one + tanh(beta * (input + kappa * input^3))).
            const ValueId beta = scalar_like(g, M_SQRT2 * M_2_SQRTPI * 0.5, x);
            const ValueId kappa = scalar_like(g, 0.044715, x);
            const ValueId cube = pow(g, x, scalar_like(g, 3.0, x));
            const ValueId inner = mul(g, beta, add(g, x, mul(g, kappa, cube)));
            set(0, mul(g, mul(g, half, x), add(g, one, tanh(g, inner))));
            return;
        }
        case OpKind::GeluGrad: {
            const ValueId dy = in[0], x = in[1];
            const ValueId half = scalar_like(g, 0.5, x), one = scalar_like(g, 1.0, x);
            if (!a.approximate) {
                // elementwise.cpp, BuildGeluBackward.
                const ValueId m_2_sqrtpi = scalar_like(g, M_2_SQRTPI, x);
                const ValueId m_sqrt1_2 = scalar_like(g, M_SQRT1_2, x);
                const ValueId alpha = mul(g, mul(g, m_2_sqrtpi, m_sqrt1_2), half);
                const ValueId scratch = erf(g, mul(g, x, m_sqrt1_2));
                const ValueId dinput = exp(g, mul(g, mul(g, x, x), neg(g, half)));
                const ValueId left = mul(g, half, add(g, one, scratch));
                const ValueId right = mul(g, mul(g, x, dinput), alpha);
                set(0, mul(g, dy, add(g, left, right)));
                return;
            }
            // ops.cpp, TanhGeluBackward.
            const ValueId beta = scalar_like(g, M_SQRT2 * M_2_SQRTPI * 0.5, x);
            const ValueId kappa = scalar_like(g, 0.044715, x);
            const ValueId two = scalar_like(g, 2.0, x), three = scalar_like(g, 3.0, x);
            const ValueId inner = mul(g, beta, add(g, x, mul(g, kappa, pow(g, x, three))));
            const ValueId tanh_inner = tanh(g, inner);
            const ValueId left = mul(g, half, x);
            const ValueId right = add(g, one, tanh_inner);
            const ValueId left_derivative = mul(g, half, right);
            const ValueId tanh_derivative = sub(g, one, mul(g, tanh_inner, tanh_inner));
            const ValueId inner_derivative =
                mul(g, beta, add(g, one, mul(g, mul(g, three, kappa), pow(g, x, two))));
            const ValueId right_derivative =
                mul(g, mul(g, left, tanh_derivative), inner_derivative);
            set(0, mul(g, dy, add(g, left_derivative, right_derivative)));
            return;
        }
        case OpKind::Softmax: {
            // softmax_builder.cpp, BuildSoftmax: exp_shifted / sum.
            const auto p = softmax_partials(g, in[0], a.axis);
            set(0, div(g, p.exp_shifted, reduced_broadcast(g, p.sum, in[0], a.axis)));
            return;
        }
        case OpKind::LogSoftmax: {
            // softmax_builder.cpp, BuildLogSoftmax: shifted - log(sum).
            const auto p = softmax_partials(g, in[0], a.axis);
            set(0, sub(g, p.shifted, reduced_broadcast(g, log(g, p.sum), in[0], a.axis)));
            return;
        }
        case OpKind::SoftmaxGrad: {
            // softmax_builder.cpp, BuildSoftmaxGrad: y * (dy - sum(dy * y)).
            const ValueId dy = in[0], y = in[1];
            const ValueId sum = reduce(g, mul(g, dy, y), {a.axis}, Reducer::Sum);
            set(0, mul(g, y, sub(g, dy, reduced_broadcast(g, sum, dy, a.axis))));
            return;
        }
        case OpKind::LogSoftmaxGrad: {
            // softmax_builder.cpp, BuildLogSoftmaxGrad: dy - exp(y) * sum(dy).
            const ValueId dy = in[0], y = in[1];
            const ValueId sum = reduce(g, dy, {a.axis}, Reducer::Sum);
            set(0, sub(g, dy, mul(g, exp(g, y), reduced_broadcast(g, sum, dy, a.axis))));
            return;
        }
        case OpKind::LayerNorm: {
            // pytorch aten/src/ATen/native/layer_norm.cpp, math_native_layer_norm ("ported from
            // pytorch/xla", used by torch_xla's native_layer_norm): the input viewed as
            // {1, M, N}, batch norm in training mode with default weight 1 and bias 0 (torch_xla
            // tensor_methods.cpp native_batch_norm), then bias.addcmul(out, weight, 1).
            const ValueId x = in[0], gamma = in[1], beta = in[2];
            const Shape xs = g.shape(x);
            const int64_t n = xs.dims.back(), m = xs.elements() / std::max<int64_t>(n, 1);
            const ValueId x3 = reshape(g, x, {1, m, n});
            const Shape feat{xs.dtype, {m}};
            const auto bn =
                expand_batch_norm_training(g, x3, full(g, 1.0, feat), full(g, 0.0, feat), a.eps, 1);
            const ValueId out = reshape(g, bn.y, xs.dims);
            const ValueId prod = mul(g, out, broadcast(g, gamma, xs.dims, {xs.rank() - 1}));
            const ValueId y = add(g, broadcast(g, beta, xs.dims, {xs.rank() - 1}),
                                  mul(g, prod, scalar_like(g, 1.0, prod)));
            // torch_xla batch_norm.cpp, BatchNormVarianceInvert: rsqrt(var + eps).
            const ValueId rstd = rsqrt(g, add(g, bn.var, scalar_like(g, a.eps, bn.var)));
            std::vector<int64_t> stat = xs.dims;
            stat.back() = 1;
            set(0, y);
            set(1, reshape(g, bn.mean, stat));
            set(2, reshape(g, rstd, stat));
            return;
        }
        case OpKind::BatchNormTraining: {
            const auto r = expand_batch_norm_training(g, in[0], in[1], in[2], a.eps, a.axis);
            set(0, r.y);
            set(1, r.mean);
            set(2, r.var);
            return;
        }
        case OpKind::BatchNormInference:
            set(0,
                expand_batch_norm_inference(g, in[0], in[1], in[2], in[3], in[4], a.eps, a.axis));
            return;
        case OpKind::BatchNormGrad: {
            const auto r =
                expand_batch_norm_grad(g, in[0], in[1], in[2], in[3], in[4], a.eps, a.axis);
            set(0, r.dx);
            set(1, r.dscale);
            set(2, r.doffset);
            return;
        }
        case OpKind::CrossEntropy: {
            // pytorch aten/src/ATen/native/LossNLL.cpp, cross_entropy_loss_prob_target (float
            // targets), reduction mean: -(log_softmax(input, 1) * target).sum() / (numel / C).
            const ValueId logits = in[0], target = in[1];
            const auto p = softmax_partials(g, logits, 1);
            const ValueId lsm = sub(g, p.shifted, reduced_broadcast(g, log(g, p.sum), logits, 1));
            const ValueId total = reduce(g, mul(g, lsm, target), {0, 1}, Reducer::Sum);
            const Shape& ls = g.shape(logits);
            set(0, div(g, neg(g, total), literal(g, double(ls.dims[0]), ls.dtype)));
            return;
        }
        case OpKind::SgdMomentum: {
            // torch.optim.SGD (momentum, no dampening): buf = buf * momentum + grad;
            // p = p - lr * buf (driver::sgd_momentum_reference, the trainer's numerics).
            const ValueId w = in[0], grad = in[1], v = in[2], lr = in[3];
            const ValueId v2 = add(g, mul(g, v, scalar_like(g, float(a.momentum), v)), grad);
            const ValueId lr_b = broadcast(g, lr, g.shape(w).dims, {});
            set(0, sub(g, w, mul(g, v2, lr_b)));
            set(1, v2);
            return;
        }
        case OpKind::Adam: {
            // torch.optim.Adam in VPU operations (driver::adam_reference, the trainer's
            // numerics: the VPU has rsqrt but no divide or sqrt).
            const ValueId w = in[0], grad = in[1], m = in[2], v = in[3];
            const float b1 = float(a.beta1), b2 = float(a.beta2);
            const ValueId m2 = add(g, mul(g, m, scalar_like(g, b1, m)),
                                   mul(g, grad, scalar_like(g, 1.0f - b1, grad)));
            const ValueId v2 = add(g, mul(g, v, scalar_like(g, b2, v)),
                                   mul(g, mul(g, grad, grad), scalar_like(g, 1.0f - b2, grad)));
            const auto bcast = [&](ValueId s) { return broadcast(g, s, g.shape(w).dims, {}); };
            const ValueId vh = mul(g, v2, bcast(in[5]));
            const ValueId zero = scalar_like(g, 0.0, vh);
            const ValueId sq =
                select(g, compare(g, vh, zero, Comparison::Ne), mul(g, vh, rsqrt(g, vh)), vh);
            const ValueId r1 = rsqrt(g, add(g, sq, scalar_like(g, float(a.eps), sq)));
            const ValueId step = mul(g, mul(g, m2, mul(g, r1, r1)), bcast(in[4]));
            set(0, sub(g, w, step));
            set(1, m2);
            set(2, v2);
            return;
        }
        default:
            throw CompileError(fmt::format("decompose: {} has no lowering", op_name(op.kind)));
    }
}

}  // namespace

Graph decompose(const Graph& graph) {
    Rewriter rw(graph);
    for (const Op& op : graph.ops()) {
        if (op_class(op.kind) == OpClass::Composite)
            lower(rw, op);
        else
            rw.copy(op);
    }
    return rw.finish();
}

}  // namespace tpu::compiler
