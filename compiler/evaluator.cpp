// SPDX-License-Identifier: Apache-2.0
#include "compiler/evaluator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "compiler/stages.h"
#include "driver/kernels/allreduce.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/gemm.h"
#include "driver/kernels/pool.h"
#include "hw/core/numerics.h"

namespace tpu::compiler {
namespace {

/// `x` as a value of type `t`: f32 rounding, bf16 rounding, s32 wrap-around, pred 0/1.
double store(DType t, double x) {
    switch (t) {
        case DType::F32:
            return double(float(x));
        case DType::BF16:
            return double(hw::bf16_round(float(x)));
        case DType::S32: {
            if (std::isnan(x)) return 0;
            const double c = std::clamp(std::trunc(x), -2147483648.0, 2147483647.0);
            return c;
        }
        case DType::Pred:
            return x != 0 ? 1 : 0;
    }
    return x;
}

/// max/min with NaN winning (the VPU's v.max and v.maxs).
float max_nan(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
    return a > b ? a : b;
}
float min_nan(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
    return a < b ? a : b;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
    std::vector<int64_t> s(dims.size(), 1);
    for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
    return s;
}

int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& strides) {
    int64_t i = 0;
    for (size_t d = 0; d < idx.size(); ++d) i += idx[d] * strides[d];
    return i;
}

[[noreturn]] void eval_fail(const Op& op, const std::string& what) {
    throw EvalError(fmt::format("{}{}: {}", op_name(op.kind),
                                op.name.empty() ? "" : " (" + op.name + ")", what));
}

HostArray eval_dot(const Op& op, const HostArray& l, const HostArray& r, uint32_t R,
                   const Shape& out) {
    const DotDims& d = op.attrs.dot;
    const auto free = [](int64_t rank, const std::vector<int64_t>& b,
                         const std::vector<int64_t>& c) {
        std::vector<int64_t> f;
        for (int64_t i = 0; i < rank; ++i)
            if (std::find(b.begin(), b.end(), i) == b.end() &&
                std::find(c.begin(), c.end(), i) == c.end())
                f.push_back(i);
        return f;
    };
    const auto lf = free(l.shape.rank(), d.lhs_batch, d.lhs_contracting);
    const auto rf = free(r.shape.rank(), d.rhs_batch, d.rhs_contracting);
    const auto prod = [](const Shape& s, const std::vector<int64_t>& dims) {
        int64_t n = 1;
        for (int64_t x : dims) n *= s.dims[size_t(x)];
        return n;
    };
    const int64_t B = prod(l.shape, d.lhs_batch), M = prod(l.shape, lf),
                  K = prod(l.shape, d.lhs_contracting), N = prod(r.shape, rf);
    // Linear position of a multi-index within a list of dims (row-major over that list).
    const auto pos = [](const std::vector<int64_t>& idx, const Shape& s,
                        const std::vector<int64_t>& dims) {
        int64_t p = 0;
        for (int64_t x : dims) p = p * s.dims[size_t(x)] + idx[size_t(x)];
        return p;
    };
    std::vector<std::vector<float>> A(size_t(B), std::vector<float>(size_t(M * K))),
        W(size_t(B), std::vector<float>(size_t(K * N)));
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < l.shape.elements(); ++i) {
        unravel(i, l.shape.dims, idx);
        A[size_t(pos(idx, l.shape, d.lhs_batch))]
         [size_t(pos(idx, l.shape, lf) * K + pos(idx, l.shape, d.lhs_contracting))] =
             float(l.data[size_t(i)]);
    }
    for (int64_t i = 0; i < r.shape.elements(); ++i) {
        unravel(i, r.shape.dims, idx);
        W[size_t(pos(idx, r.shape, d.rhs_batch))]
         [size_t(pos(idx, r.shape, d.rhs_contracting) * N + pos(idx, r.shape, rf))] =
             float(r.data[size_t(i)]);
    }
    HostArray y = HostArray::zeros(out);
    const auto prec = detail::mxu_precision(op.attrs.precision, l.shape.dtype);
    for (int64_t b = 0; b < B; ++b) {
        if (M == 0 || N == 0) break;
        const auto c = K == 0 ? std::vector<float>(size_t(M * N), 0.0f)
                              : driver::gemm_reference(A[size_t(b)], W[size_t(b)], uint32_t(M),
                                                       uint32_t(K), uint32_t(N), prec, R);
        for (int64_t i = 0; i < M * N; ++i)
            y.data[size_t(b * M * N + i)] = store(out.dtype, c[size_t(i)]);
    }
    return y;
}

driver::Conv2dShape conv_shape(const std::vector<int64_t>& x, int64_t cout, const Window& w) {
    driver::Conv2dShape s;
    s.batch = uint32_t(x[0]);
    s.height = uint32_t(x[1]);
    s.width = uint32_t(x[2]);
    s.cin = uint32_t(x[3]);
    s.cout = uint32_t(cout);
    s.kernel = uint32_t(w.kernel);
    s.stride = uint32_t(w.stride);
    s.pad = uint32_t(w.pad);
    return s;
}

driver::PoolShape pool_shape(const std::vector<int64_t>& x, const Window& w) {
    driver::PoolShape s;
    s.batch = uint32_t(x[0]);
    s.height = uint32_t(x[1]);
    s.width = uint32_t(x[2]);
    s.channels = uint32_t(x[3]);
    s.kernel = uint32_t(w.kernel);
    s.stride = uint32_t(w.stride);
    s.pad = uint32_t(w.pad);
    return s;
}

/// conv2d at three or six MXU passes: per output, tap by tap, each Cin tile of R channels and
/// each pass a sum from +0.0 in channel order, added to the fp32 accumulator (the first stored),
/// the implicit GEMM's order at every precision.
std::vector<float> conv2d_passes(const std::vector<float>& x, const std::vector<float>& w,
                                 const driver::Conv2dShape& s, driver::Precision p, uint32_t R) {
    const auto passes = driver::mxu_passes(p);
    const uint32_t Ho = s.out_height(), Wo = s.out_width();
    std::vector<float> y(size_t(s.batch) * Ho * Wo * s.cout);
    for (uint32_t n = 0; n < s.batch; ++n)
        for (uint32_t oy = 0; oy < Ho; ++oy)
            for (uint32_t ox = 0; ox < Wo; ++ox)
                for (uint32_t co = 0; co < s.cout; ++co) {
                    float acc = 0;
                    bool first = true;
                    for (uint32_t kh = 0; kh < s.kernel; ++kh)
                        for (uint32_t kw = 0; kw < s.kernel; ++kw) {
                            const int64_t iy = int64_t(oy) * s.stride + kh - s.pad,
                                          ix = int64_t(ox) * s.stride + kw - s.pad;
                            const bool inside = iy >= 0 && iy < s.height && ix >= 0 && ix < s.width;
                            for (uint32_t c0 = 0; c0 < s.cin; c0 += R)
                                for (const auto& [pa, pw] : passes) {
                                    float sum = 0;
                                    for (uint32_t c = c0; c < std::min(s.cin, c0 + R); ++c) {
                                        const float xv =
                                            inside
                                                ? x[((size_t(n) * s.height + size_t(iy)) * s.width +
                                                     size_t(ix)) *
                                                        s.cin +
                                                    c]
                                                : 0.0f;
                                        const float wv =
                                            w[((size_t(kh) * s.kernel + kw) * s.cin + c) * s.cout +
                                              co];
                                        sum += hw::bf16_to_f32(hw::split3(xv)[size_t(pa)]) *
                                               hw::bf16_to_f32(hw::split3(wv)[size_t(pw)]);
                                    }
                                    acc = first ? sum : acc + sum;
                                    first = false;
                                }
                        }
                    y[((size_t(n) * Ho + oy) * Wo + ox) * s.cout + co] = acc;
                }
    return y;
}

/// Evaluates one op (not a leaf or a collective) on one replica.
std::vector<HostArray> eval_op(const Graph& g, const Op& op,
                               const std::vector<const HostArray*>& in, const EvalOptions& o) {
    const Shape& out = g.shape(op.results[0]);
    const Attrs& a = op.attrs;
    HostArray y = HostArray::zeros(out);
    const int64_t n = out.elements();
    std::vector<int64_t> idx, src;
    switch (op_class(op.kind)) {
        case OpClass::Literal:
            y.data[0] = store(out.dtype, a.scalar);
            return {y};
        case OpClass::Elementwise:
            for (int64_t i = 0; i < n; ++i) {
                const size_t k = size_t(i);
                const double x0 = in[0]->data[k];
                const float f0 = float(x0);
                double r = 0;
                switch (op.kind) {
                    case OpKind::Neg:
                        r = out.dtype == DType::S32 ? -x0 : double(-f0);
                        break;
                    case OpKind::Abs:
                        r = out.dtype == DType::S32 ? std::fabs(x0) : double(vpu_abs(f0));
                        break;
                    case OpKind::Exp:
                        r = std::exp(f0);
                        break;
                    case OpKind::Log:
                        r = std::log(f0);
                        break;
                    case OpKind::Rsqrt:
                        r = 1.0f / std::sqrt(f0);
                        break;
                    case OpKind::Sqrt:
                        r = vpu_sqrt(f0);
                        break;
                    case OpKind::Tanh:
                        r = std::tanh(f0);
                        break;
                    case OpKind::Erf:
                        r = vpu_erf(f0);
                        break;
                    case OpKind::Convert:
                        r = in[0]->shape.dtype == DType::S32 || in[0]->shape.dtype == DType::Pred
                                ? x0
                                : double(f0);
                        break;
                    case OpKind::Select:
                        r = x0 != 0 ? in[1]->data[k] : in[2]->data[k];
                        break;
                    default: {
                        const double x1 = in[1]->data[k];
                        const float f1 = float(x1);
                        const bool integer =
                            in[0]->shape.dtype == DType::S32 || in[0]->shape.dtype == DType::Pred;
                        switch (op.kind) {
                            case OpKind::Add:
                                r = integer ? x0 + x1 : double(f0 + f1);
                                break;
                            case OpKind::Sub:
                                r = integer ? x0 - x1 : double(f0 - f1);
                                break;
                            case OpKind::Mul:
                                r = integer ? x0 * x1 : double(f0 * f1);
                                break;
                            case OpKind::Div:
                                r = vpu_divide(f0, f1);
                                break;
                            case OpKind::Max:
                                r = integer ? std::max(x0, x1) : double(max_nan(f0, f1));
                                break;
                            case OpKind::Min:
                                r = integer ? std::min(x0, x1) : double(min_nan(f0, f1));
                                break;
                            case OpKind::Pow:
                                r = vpu_pow(f0, f1);
                                break;
                            case OpKind::Compare: {
                                const double p = integer ? x0 : double(f0),
                                             q = integer ? x1 : double(f1);
                                switch (a.comparison) {
                                    // The VPU compares with > only (compiler/README.md,
                                    // "Numerics"): the others are built from p > q and q > p,
                                    // so with a NaN ==, <= and >= hold and != does not.
                                    case Comparison::Eq:
                                        r = !(p > q) && !(q > p);
                                        break;
                                    case Comparison::Ne:
                                        r = p > q || q > p;
                                        break;
                                    case Comparison::Lt:
                                        r = p < q;
                                        break;
                                    case Comparison::Le:
                                        r = !(p > q);
                                        break;
                                    case Comparison::Gt:
                                        r = p > q;
                                        break;
                                    case Comparison::Ge:
                                        r = !(q > p);
                                        break;
                                }
                                break;
                            }
                            default:
                                eval_fail(op, "not an elementwise op");
                        }
                    }
                }
                y.data[k] = store(out.dtype, r);
            }
            return {y};
        case OpClass::Movement:
            switch (op.kind) {
                case OpKind::Broadcast: {
                    const auto st = strides_of(in[0]->shape.dims);
                    for (int64_t i = 0; i < n; ++i) {
                        unravel(i, out.dims, idx);
                        int64_t j = 0;
                        for (size_t d = 0; d < a.dims.size(); ++d)
                            j += idx[size_t(a.dims[d])] * st[d];
                        y.data[size_t(i)] = in[0]->data[size_t(j)];
                    }
                    return {y};
                }
                case OpKind::Reshape:
                    y.data = in[0]->data;
                    return {y};
                case OpKind::Transpose: {
                    const auto st = strides_of(in[0]->shape.dims);
                    src.resize(a.dims.size());
                    for (int64_t i = 0; i < n; ++i) {
                        unravel(i, out.dims, idx);
                        for (size_t d = 0; d < a.dims.size(); ++d) src[size_t(a.dims[d])] = idx[d];
                        y.data[size_t(i)] = in[0]->data[size_t(ravel(src, st))];
                    }
                    return {y};
                }
                case OpKind::Slice: {
                    const auto st = strides_of(in[0]->shape.dims);
                    for (int64_t i = 0; i < n; ++i) {
                        unravel(i, out.dims, idx);
                        for (size_t d = 0; d < idx.size(); ++d) idx[d] += a.dims[d];
                        y.data[size_t(i)] = in[0]->data[size_t(ravel(idx, st))];
                    }
                    return {y};
                }
                case OpKind::Concatenate: {
                    for (int64_t i = 0; i < n; ++i) {
                        unravel(i, out.dims, idx);
                        int64_t at = idx[size_t(a.axis)];
                        for (const HostArray* part : in) {
                            const int64_t len = part->shape.dims[size_t(a.axis)];
                            if (at < len) {
                                idx[size_t(a.axis)] = at;
                                y.data[size_t(i)] =
                                    part->data[size_t(ravel(idx, strides_of(part->shape.dims)))];
                                break;
                            }
                            at -= len;
                        }
                    }
                    return {y};
                }
                case OpKind::Iota:
                    for (int64_t i = 0; i < n; ++i) {
                        unravel(i, out.dims, idx);
                        y.data[size_t(i)] = store(out.dtype, double(idx[size_t(a.axis)]));
                    }
                    return {y};
                default:
                    break;
            }
            break;
        case OpClass::Reduce: {
            const HostArray& x = *in[0];
            const bool sum = a.reducer == Reducer::Sum;
            std::vector<float> acc(size_t(n), sum ? 0.0f : -std::numeric_limits<float>::infinity());
            std::vector<char> keep(size_t(x.shape.rank()), 1);
            for (int64_t d : a.dims) keep[size_t(d)] = 0;
            const auto ost = strides_of(out.dims);
            // The VPU's order (compiler/README.md, "Code generation"): each output's reduced
            // elements, in index order, are cut into chunks of one vector register row
            // (vpu_lanes); a chunk is reduced from the identity (v.rsum / v.rmax), and with more
            // than one chunk the chunk results are reduced again from the identity.
            const float ident = sum ? 0.0f : -std::numeric_limits<float>::infinity();
            const auto combine = [&](float a, float v) { return sum ? a + v : max_nan(a, v); };
            // Over major dims (the operand's most-minor non-unit dim is kept), the device streams
            // bands of vpu_sublanes rows and accumulates each band into one register of partials
            // (v.add / v.max): reduced element i goes to partial i mod vpu_sublanes, each from the
            // identity in index order; the partials are then reduced from the identity in order.
            int64_t minor = -1;
            for (int64_t d = 0; d < x.shape.rank(); ++d)
                if (x.shape.dims[size_t(d)] != 1) minor = d;
            // Over every dim of an array of rank 2 or more: over the rows as above for each
            // column of the most-minor dim, then the row of column results in chunks as below.
            int64_t nonunit = 0;
            for (int64_t d : x.shape.dims) nonunit += d != 1;
            if (nonunit >= 2 && n == 1 && !keep[size_t(minor)]) {
                const int64_t C = x.shape.dims[size_t(minor)];
                const int64_t parts = std::max<int64_t>(1, o.vpu_sublanes);
                const int64_t lanes = std::max<int64_t>(1, o.vpu_lanes);
                std::vector<float> part(size_t(C * parts), ident);
                std::vector<int64_t> seen(size_t(C), 0);
                for (int64_t i = 0; i < x.shape.elements(); ++i) {
                    float& p = part[size_t((i % C) * parts + seen[size_t(i % C)]++ % parts)];
                    p = combine(p, float(x.data[size_t(i)]));
                }
                float total = ident, chunk = ident;
                for (int64_t c = 0; c < C; ++c) {
                    float col = ident;
                    for (int64_t s = 0; s < parts; ++s)
                        col = combine(col, part[size_t(c * parts + s)]);
                    chunk = combine(chunk, col);
                    if ((c + 1) % lanes == 0 || c + 1 == C) {
                        total = C <= lanes ? chunk : combine(total, chunk);
                        chunk = ident;
                    }
                }
                y.data[0] = store(out.dtype, total);
                return {y};
            }
            if (minor >= 0 && keep[size_t(minor)] && int64_t(a.dims.size()) > 0) {
                const int64_t parts = std::max<int64_t>(1, o.vpu_sublanes);
                std::vector<float> part(size_t(n * parts), ident);
                std::vector<int64_t> seen(size_t(n), 0);
                for (int64_t i = 0; i < x.shape.elements(); ++i) {
                    unravel(i, x.shape.dims, idx);
                    int64_t j = 0, k = 0;
                    for (size_t d = 0; d < idx.size(); ++d)
                        if (keep[d]) j += idx[d] * ost[size_t(k++)];
                    float& p = part[size_t(j * parts + seen[size_t(j)]++ % parts)];
                    p = combine(p, float(x.data[size_t(i)]));
                }
                for (int64_t j = 0; j < n; ++j) {
                    float r = ident;
                    for (int64_t s = 0; s < parts; ++s) r = combine(r, part[size_t(j * parts + s)]);
                    y.data[size_t(j)] = store(out.dtype, r);
                }
                return {y};
            }
            std::vector<float> outer(size_t(n), ident);
            std::vector<int64_t> count(size_t(n), 0);
            const int64_t lanes = std::max<int64_t>(1, o.vpu_lanes);
            // Row-major over the input visits each output's reduced indices in index order.
            for (int64_t i = 0; i < x.shape.elements(); ++i) {
                unravel(i, x.shape.dims, idx);
                int64_t j = 0, k = 0;
                for (size_t d = 0; d < idx.size(); ++d)
                    if (keep[d]) j += idx[d] * ost[size_t(k++)];
                const float v = float(x.data[size_t(i)]);
                // A chunk moves into the outer reduction when the next one starts, so a single
                // chunk (exactly vpu_lanes elements included) stays its own result.
                if (count[size_t(j)] > 0 && count[size_t(j)] % lanes == 0) {
                    outer[size_t(j)] = combine(outer[size_t(j)], acc[size_t(j)]);
                    acc[size_t(j)] = ident;
                }
                acc[size_t(j)] = combine(acc[size_t(j)], v);
                ++count[size_t(j)];
            }
            for (int64_t i = 0; i < n; ++i) {
                // One chunk (or none): the chunk's own result; more: the outer reduction of the
                // full chunks and the last one.
                float r = acc[size_t(i)];
                if (count[size_t(i)] > lanes) r = combine(outer[size_t(i)], acc[size_t(i)]);
                y.data[size_t(i)] = store(out.dtype, r);
            }
            return {y};
        }
        case OpClass::Contraction: {
            if (op.kind == OpKind::Dot) return {eval_dot(op, *in[0], *in[1], o.mxu_rows, out)};
            std::vector<float> r;
            if (op.kind == OpKind::Conv2d) {
                const auto s = conv_shape(in[0]->shape.dims, in[1]->shape.dims[3], a.window);
                const auto prec = detail::mxu_precision(a.precision, in[0]->shape.dtype);
                if (prec == driver::Precision::Bf16)
                    r = driver::conv2d_reference(in[0]->floats(), in[1]->floats(),
                                                 std::vector<float>(s.cout, 0.0f), s, o.mxu_rows,
                                                 detail::conv_folds_taps(s, o.mxu_rows));
                else
                    r = conv2d_passes(in[0]->floats(), in[1]->floats(), s, prec, o.mxu_rows);
            } else {
                if (detail::mxu_precision(a.precision, in[0]->shape.dtype) !=
                    driver::Precision::Bf16)
                    eval_fail(op,
                              "convolution gradients above default precision are not in the "
                              "host evaluator yet");
                const auto& xd = a.window.input_dims;
                if (op.kind == OpKind::Conv2dInputGrad) {
                    const auto s = conv_shape(xd, in[1]->shape.dims[3], a.window);
                    const std::vector<float> zeros_x(size_t(Shape{DType::F32, xd}.elements()),
                                                     0.0f);
                    r = driver::conv2d_grad_reference(zeros_x, in[1]->floats(), in[0]->floats(), s,
                                                      o.mxu_rows, 8)
                            .dx;
                } else {
                    const auto s = conv_shape(xd, in[1]->shape.dims[3], a.window);
                    const std::vector<float> zeros_w(size_t(out.elements()), 0.0f);
                    r = driver::conv2d_grad_reference(in[0]->floats(), zeros_w, in[1]->floats(), s,
                                                      o.mxu_rows, 8)
                            .dw;
                }
            }
            return {HostArray::from_floats(out, r)};
        }
        case OpClass::Window: {
            std::vector<float> r;
            switch (op.kind) {
                case OpKind::Pool: {
                    const auto s = pool_shape(in[0]->shape.dims, a.window);
                    r = a.pool == PoolKind::Max ? driver::max_pool2d_reference(s, in[0]->floats())
                                                : driver::avg_pool2d_reference(s, in[0]->floats());
                    break;
                }
                case OpKind::MaxPoolGrad:
                    r = driver::max_pool2d_grad_reference(pool_shape(in[0]->shape.dims, a.window),
                                                          in[0]->floats(), in[1]->floats());
                    break;
                case OpKind::AvgPoolGrad:
                    r = driver::avg_pool2d_grad_reference(pool_shape(a.window.input_dims, a.window),
                                                          in[0]->floats());
                    break;
                case OpKind::ScatterAdd: {
                    const HostArray &ix = *in[0], &up = *in[1];
                    const int64_t rows = out.dims[0],
                                  row = out.elements() / std::max<int64_t>(rows, 1);
                    std::vector<float> acc(size_t(out.elements()), 0.0f);
                    for (int64_t i = 0; i < ix.shape.elements(); ++i) {
                        const int64_t t = int64_t(ix.data[size_t(i)]);
                        if (t < 0 || t >= rows)
                            eval_fail(op,
                                      fmt::format("index {} outside the table's {} rows", t, rows));
                        for (int64_t j = 0; j < row; ++j)
                            acc[size_t(t * row + j)] += float(up.data[size_t(i * row + j)]);
                    }
                    r = acc;
                    break;
                }
                default:
                    break;
            }
            return {HostArray::from_floats(out, r)};
        }
        case OpClass::Gather: {
            const HostArray &table = *in[0], &ix = *in[1];
            const int64_t rows = table.shape.dims[0],
                          row = table.shape.elements() / std::max<int64_t>(rows, 1);
            // XLA's gather clamps an index outside the operand to the nearest row (its start
            // index is clamped so the slice lies inside: openxla.org/xla/operation_semantics,
            // Gather; jax.lax.gather's mode "clip"), as the device's gather does
            // (codegen_gather.cpp). PyTorch on the CPU raises instead.
            for (int64_t i = 0; i < ix.shape.elements(); ++i) {
                const int64_t t = std::clamp<int64_t>(int64_t(ix.data[size_t(i)]), 0,
                                                      std::max<int64_t>(rows - 1, 0));
                std::copy_n(table.data.begin() + t * row, row, y.data.begin() + i * row);
            }
            return {y};
        }
        case OpClass::Rng: {
            const uint32_t seed = uint32_t(int64_t(in[0]->data[0]));
            for (int64_t i = 0; i < n; ++i) y.data[size_t(i)] = hw::vpu_uniform(seed, uint64_t(i));
            return {y};
        }
        case OpClass::Custom: {
            auto it = o.custom_calls.find(a.target);
            if (it == o.custom_calls.end())
                eval_fail(op, fmt::format("no host function is registered for \"{}\"", a.target));
            std::vector<HostArray> args;
            for (const HostArray* x : in) args.push_back(*x);
            HostArray r = it->second(args, out);
            if (!(r.shape == out) || int64_t(r.data.size()) != n)
                eval_fail(op, fmt::format("\"{}\" returned {}, expected {}", a.target,
                                          r.shape.to_string(), out.to_string()));
            return {r};
        }
        case OpClass::Composite:
            eval_fail(op, "is a composite: decompose() the graph first");
        case OpClass::Leaf:
        case OpClass::Collective:
            break;
    }
    eval_fail(op, "cannot be evaluated here");
}

/// All-reduce across replicas: the device's order and rounding (EvalOptions::all_reduce; by
/// default the driver's ring). An fp32 array in a layout that reorders or pads its values is
/// summed as that layout lays them out (padding included), as the device's kernel sums its
/// buffer: which chunk a value lies in sets its order of additions.
std::vector<HostArray> eval_all_reduce(const Op& op, const Shape& out, const Layout& l,
                                       const std::vector<const HostArray*>& per_replica,
                                       const EvalOptions& o) {
    const float scale = float(op.attrs.scalar);
    const auto reduce = [&](const std::vector<std::vector<float>>& rs) {
        return rs.size() == 1 && op.attrs.scalar == 1.0 ? rs[0]
               : o.all_reduce                           ? o.all_reduce(rs, scale)
                                                        : driver::allreduce_reference(rs, scale);
    };
    const bool physical =
        l.assigned() && out.dtype == DType::F32 && !(l == row_major(int64_t(out.dims.size())));
    std::vector<std::vector<float>> rs;
    for (const HostArray* x : per_replica) {
        if (!physical) {
            rs.push_back(x->floats());
            continue;
        }
        const std::vector<uint8_t> mem = layout_bytes_of(*x, l);
        std::vector<float>& v = rs.emplace_back(mem.size() / 4);
        std::memcpy(v.data(), mem.data(), v.size() * 4);
    }
    const std::vector<float> sum = reduce(rs);
    if (physical) {
        std::vector<uint8_t> mem(sum.size() * 4);
        std::memcpy(mem.data(), sum.data(), mem.size());
        return std::vector<HostArray>(per_replica.size(), array_from_layout_bytes(mem, out, l));
    }
    return std::vector<HostArray>(per_replica.size(), HostArray::from_floats(out, sum));
}

/// `b` with an empty list filled with one empty binding per replica; throws EvalError when the
/// lists disagree or a leaf is missing or has the wrong shape.
Bindings checked_bindings(const Graph& g, Bindings b) {
    if (b.replicas() == 0) throw EvalError("evaluate: no replicas bound");
    if (b.parameters.empty()) b.parameters.resize(b.replicas());
    if (b.inputs.empty()) b.inputs.resize(b.replicas());
    if (b.inputs.size() != b.parameters.size())
        throw EvalError(fmt::format("evaluate: {} replicas of parameters but {} of inputs",
                                    b.parameters.size(), b.inputs.size()));
    const auto check = [&](OpKind k, const std::vector<std::vector<HostArray>>& data) {
        const auto leaves = g.leaves(k);
        for (size_t r = 0; r < data.size(); ++r) {
            if (data[r].size() != leaves.size())
                throw EvalError(fmt::format("evaluate: replica {} binds {} {}s, the graph has {}",
                                            r, data[r].size(), op_name(k), leaves.size()));
            for (size_t i = 0; i < leaves.size(); ++i) {
                const Shape& s = g.shape(leaves[i]);
                if (!(data[r][i].shape == s) || int64_t(data[r][i].data.size()) != s.elements())
                    throw EvalError(fmt::format("evaluate: {} {} \"{}\" is {}, bound {}",
                                                op_name(k), i, g.producer(leaves[i]).name,
                                                s.to_string(), data[r][i].shape.to_string()));
            }
        }
    };
    check(OpKind::Parameter, b.parameters);
    check(OpKind::Input, b.inputs);
    return b;
}

HostArray leaf_value(const Graph& g, const Op& op, const Bindings& b, size_t r) {
    switch (op.kind) {
        case OpKind::Parameter:
            return b.parameters[r][size_t(op.attrs.axis)];
        case OpKind::Input:
            return b.inputs[r][size_t(op.attrs.axis)];
        default:
            return HostArray::from_floats(g.shape(op.results[0]), g.constant_data(op.attrs.axis));
    }
}

// ---- Byte buffers for evaluate_compiled -------------------------------------------------------

void write_bytes(std::vector<uint8_t>& mem, uint64_t base, const HostArray& a, const Layout& l) {
    const uint32_t eb = dtype_bytes(a.shape.dtype);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < a.shape.elements(); ++i) {
        unravel(i, a.shape.dims, idx);
        const uint64_t at = base + physical_index(a.shape, l, idx) * eb;
        const double v = a.data[size_t(i)];
        switch (a.shape.dtype) {
            case DType::F32: {
                const uint32_t bits = std::bit_cast<uint32_t>(float(v));
                std::memcpy(&mem.at(at + 3) - 3, &bits, 4);
                break;
            }
            case DType::BF16: {
                const uint16_t h = hw::f32_to_bf16(float(v));
                std::memcpy(&mem.at(at + 1) - 1, &h, 2);
                break;
            }
            case DType::S32: {
                const int32_t s = int32_t(v);
                std::memcpy(&mem.at(at + 3) - 3, &s, 4);
                break;
            }
            case DType::Pred:
                mem.at(at) = v != 0;
                break;
        }
    }
}

HostArray read_bytes(const std::vector<uint8_t>& mem, uint64_t base, const Shape& s,
                     const Layout& l) {
    HostArray a = HostArray::zeros(s);
    const uint32_t eb = dtype_bytes(s.dtype);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < s.elements(); ++i) {
        unravel(i, s.dims, idx);
        const uint64_t at = base + physical_index(s, l, idx) * eb;
        double& v = a.data[size_t(i)];
        switch (s.dtype) {
            case DType::F32: {
                uint32_t bits;
                std::memcpy(&bits, &mem.at(at + 3) - 3, 4);
                v = std::bit_cast<float>(bits);
                break;
            }
            case DType::BF16: {
                uint16_t h;
                std::memcpy(&h, &mem.at(at + 1) - 1, 2);
                v = hw::bf16_to_f32(h);
                break;
            }
            case DType::S32: {
                int32_t x;
                std::memcpy(&x, &mem.at(at + 3) - 3, 4);
                v = x;
                break;
            }
            case DType::Pred:
                v = mem.at(at);
                break;
        }
    }
    return a;
}

/// One replica's HBM as the compiled step lays it out: one byte vector per allocation.
struct Memory {
    std::vector<std::vector<uint8_t>> parameters, inputs, constants, outputs;
    std::vector<uint8_t> temp;

    std::vector<uint8_t>& at(const BufferRef& b) {
        switch (b.space) {
            case BufferRef::Space::Parameter:
                return parameters.at(b.index);
            case BufferRef::Space::Input:
                return inputs.at(b.index);
            case BufferRef::Space::Constant:
                return constants.at(b.index);
            case BufferRef::Space::Output:
                return outputs.at(b.index);
            case BufferRef::Space::Temp:
                return temp;
        }
        return temp;
    }
};

}  // namespace

std::vector<uint8_t> layout_bytes_of(const HostArray& a, const Layout& l) {
    std::vector<uint8_t> mem(layout_bytes(a.shape, l), 0);
    write_bytes(mem, 0, a, l);
    return mem;
}

HostArray array_from_layout_bytes(const std::vector<uint8_t>& mem, const Shape& s,
                                  const Layout& l) {
    return read_bytes(mem, 0, s, l);
}

float vpu_reciprocal(float y) {
    const float t = 1.0f / std::sqrt(max_nan(y, y * -1.0f));
    return t * t;
}

float vpu_divide(float x, float y) {
    const float q = x * vpu_reciprocal(y);
    return 0.0f > y ? q * -1.0f : q;
}

float vpu_abs(float x) {
    return max_nan(x, x * -1.0f);
}

float vpu_sqrt(float x) {
    const float t = 1.0f / std::sqrt(x);
    const float r = x > 0.0f ? x * t : x;
    return 0.0f > x ? t : r;
}

float vpu_erf(float x) {
    const float ax = vpu_abs(x);
    const float t = vpu_reciprocal(ax * kErfP + 1.0f);
    float poly = kErfA[4];  // Horner: ((((a5 t + a4) t + a3) t + a2) t + a1) t
    for (int i = 3; i >= 0; --i) poly = poly * t + kErfA[i];
    poly = poly * t;
    const float e = std::exp(ax * ax * -1.0f);
    const float y = poly * e * -1.0f + 1.0f;
    return 0.0f > x ? y * -1.0f : y;
}

float vpu_pow(float x, float n) {
    if (!(n >= 0.0f && n <= float(kVpuPowMax) && n == std::floor(n))) return std::pow(x, n);
    float r = 1.0f;
    for (int i = 0; i < int(n); ++i) r = i == 0 ? x : r * x;
    return r;
}

HostArray HostArray::zeros(const Shape& s) {
    return HostArray{s, std::vector<double>(size_t(s.elements()), 0.0)};
}

HostArray HostArray::from_floats(const Shape& s, const std::vector<float>& v) {
    if (int64_t(v.size()) != s.elements())
        throw EvalError(
            fmt::format("{} needs {} values, got {}", s.to_string(), s.elements(), v.size()));
    HostArray a{s, std::vector<double>(v.size())};
    for (size_t i = 0; i < v.size(); ++i) a.data[i] = store(s.dtype, v[i]);
    return a;
}

std::vector<float> HostArray::floats() const {
    return std::vector<float>(data.begin(), data.end());
}

std::vector<std::vector<HostArray>> evaluate(const Graph& g, const Bindings& bindings,
                                             const EvalOptions& o) {
    const Bindings b = checked_bindings(g, bindings);
    const size_t R = b.replicas();
    std::vector<std::vector<HostArray>> vals(R, std::vector<HostArray>(g.values().size()));
    for (const Op& op : g.ops()) {
        if (op_class(op.kind) == OpClass::Leaf) {
            for (size_t r = 0; r < R; ++r) vals[r][op.results[0]] = leaf_value(g, op, b, r);
            continue;
        }
        if (op_class(op.kind) == OpClass::Collective) {
            std::vector<const HostArray*> xs;
            for (size_t r = 0; r < R; ++r) xs.push_back(&vals[r][op.operands[0]]);
            const auto ys =
                eval_all_reduce(op, g.shape(op.results[0]), g.value(op.operands[0]).layout, xs, o);
            for (size_t r = 0; r < R; ++r) vals[r][op.results[0]] = ys[r];
            continue;
        }
        for (size_t r = 0; r < R; ++r) {
            std::vector<const HostArray*> in;
            for (ValueId v : op.operands) in.push_back(&vals[r][v]);
            auto res = eval_op(g, op, in, o);
            for (size_t i = 0; i < res.size(); ++i) vals[r][op.results[i]] = std::move(res[i]);
        }
    }
    std::vector<std::vector<HostArray>> out(R);
    for (size_t r = 0; r < R; ++r)
        for (const Output& x : g.outputs()) out[r].push_back(vals[r][x.value]);
    return out;
}

std::vector<std::vector<HostArray>> evaluate_compiled(
    const CompiledStep& step, const Bindings& bindings, const EvalOptions& o,
    std::vector<std::vector<HostArray>>* parameters_after) {
    const Graph& g = step.graph;
    const Bindings b = checked_bindings(g, bindings);
    const size_t R = b.replicas();
    std::vector<Memory> mem(R);
    for (size_t r = 0; r < R; ++r) {
        Memory& m = mem[r];
        const auto fill = [&](const std::vector<LeafBuffer>& leaves,
                              std::vector<std::vector<uint8_t>>& bufs) {
            for (const LeafBuffer& lb : leaves) {
                bufs.emplace_back(lb.bytes, 0);
                write_bytes(bufs.back(), 0, leaf_value(g, g.producer(lb.value), b, r), lb.layout);
            }
        };
        fill(step.parameters, m.parameters);
        fill(step.inputs, m.inputs);
        fill(step.constants, m.constants);
        for (const OutputBuffer& ob : step.outputs)
            m.outputs.emplace_back(
                ob.buffer.space == BufferRef::Space::Output ? ob.buffer.bytes : 0, 0);
        m.temp.assign(step.memory.temp_bytes, 0);
    }
    for (const Fusion& f : step.fusions) {
        std::vector<std::map<ValueId, HostArray>> env(R);
        for (size_t r = 0; r < R; ++r)
            for (const FusionValue& fv : f.operands)
                env[r][fv.value] =
                    read_bytes(mem[r].at(fv.buffer), fv.buffer.offset, fv.shape, fv.layout);
        for (OpId id : f.ops) {
            const Op& op = g.op(id);
            if (op_class(op.kind) == OpClass::Collective) {
                std::vector<const HostArray*> xs;
                for (size_t r = 0; r < R; ++r) xs.push_back(&env[r].at(op.operands[0]));
                const auto ys = eval_all_reduce(op, g.shape(op.results[0]),
                                                g.value(op.operands[0]).layout, xs, o);
                for (size_t r = 0; r < R; ++r) env[r][op.results[0]] = ys[r];
                continue;
            }
            for (size_t r = 0; r < R; ++r) {
                std::vector<const HostArray*> in;
                for (ValueId v : op.operands) {
                    auto it = env[r].find(v);
                    if (it == env[r].end())
                        throw EvalError(
                            fmt::format("{}: %{} is neither an operand nor computed "
                                        "inside it (a compiler bug)",
                                        f.name, v));
                    in.push_back(&it->second);
                }
                auto res = eval_op(g, op, in, o);
                for (size_t i = 0; i < res.size(); ++i) env[r][op.results[i]] = std::move(res[i]);
            }
        }
        for (size_t r = 0; r < R; ++r)
            for (const FusionValue& fv : f.results)
                write_bytes(mem[r].at(fv.buffer), fv.buffer.offset, env[r].at(fv.value), fv.layout);
    }
    std::vector<std::vector<HostArray>> out(R);
    for (size_t r = 0; r < R; ++r)
        for (const OutputBuffer& ob : step.outputs)
            out[r].push_back(
                read_bytes(mem[r].at(ob.buffer), ob.buffer.offset, ob.shape, ob.layout));
    if (parameters_after) {
        parameters_after->assign(R, {});
        for (size_t r = 0; r < R; ++r) {
            for (const LeafBuffer& lb : step.parameters)
                (*parameters_after)[r].push_back(read_bytes(
                    mem[r].parameters[(&lb - step.parameters.data())], 0, lb.shape, lb.layout));
            for (size_t i = 0; i < step.outputs.size(); ++i)
                if (step.outputs[i].updates_parameter >= 0)
                    (*parameters_after)[r][size_t(step.outputs[i].updates_parameter)] = out[r][i];
        }
    }
    return out;
}

driver::Precision detail::mxu_precision(Precision precision, DType dtype) {
    if (dtype == DType::BF16) return driver::Precision::Bf16;
    switch (precision) {
        case Precision::Default:
            return driver::Precision::Bf16;
        case Precision::High:
            return driver::Precision::Fp32Pass3;
        case Precision::Highest:
            return driver::Precision::Fp32Pass6;
    }
    return driver::Precision::Bf16;
}

}  // namespace tpu::compiler
