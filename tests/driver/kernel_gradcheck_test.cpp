// SPDX-License-Identifier: Apache-2.0
// Host-only: the backward references against central finite differences of fp64 forward
// passes on tiny shapes, so each reference is known to be the gradient of its op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "driver/kernels/attention.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/softmax.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::random_values;
using Vec = std::vector<double>;

/// d/dx_j of sum_i w_i f(x)_i by central differences in fp64 (step h).
Vec numeric_grad(const std::function<Vec(const Vec&)>& f, const std::vector<float>& x,
                 const std::vector<float>& w, double h = 1e-6) {
    Vec xd(x.begin(), x.end()), g(x.size());
    auto loss = [&](const Vec& v) {
        const Vec y = f(v);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += w[i] * y[i];
        return l;
    };
    for (size_t j = 0; j < x.size(); ++j) {
        const double keep = xd[j];
        xd[j] = keep + h;
        const double up = loss(xd);
        xd[j] = keep - h;
        const double down = loss(xd);
        xd[j] = keep;
        g[j] = (up - down) / (2 * h);
    }
    return g;
}

/// |got - want| <= tol * max(1, max |want|) for every value.
void expect_close(const std::vector<float>& got, const Vec& want, double tol) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 1;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], tol * scale) << "value " << i;
}

Vec softmax64(const Vec& x, uint32_t rows, uint32_t cols, double scale, bool causal) {
    Vec y(x.size());
    for (uint32_t r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (uint32_t j = 0; j < cols; ++j)
            if (!(causal && j > r % cols)) m = std::max(m, x[r * cols + j] * scale);
        for (uint32_t j = 0; j < cols; ++j) {
            const double e = causal && j > r % cols ? 0.0 : std::exp(x[r * cols + j] * scale - m);
            y[r * cols + j] = e;
            s += e;
        }
        for (uint32_t j = 0; j < cols; ++j) y[r * cols + j] /= s;
    }
    return y;
}

TEST(KernelGradCheck, SoftmaxGradIsTheDerivativeOfSoftmax) {
    const uint32_t rows = 3, cols = 5;
    const auto x = random_values(rows * cols, 1), w = random_values(rows * cols, 2);
    const auto y = softmax_reference(x, rows, cols);
    const Vec fd =
        numeric_grad([&](const Vec& v) { return softmax64(v, rows, cols, 1, false); }, x, w);
    expect_close(softmax_grad_reference(y, w, rows, cols), fd, 1e-5);
}

TEST(KernelGradCheck, AttentionGradIsTheDerivativeOfAttention) {
    for (bool causal : {false, true}) {
        SCOPED_TRACE(causal ? "causal" : "full");
        const AttentionShape s{.batch = 1, .heads = 2, .seq = 3, .dhead = 4, .causal = causal};
        const size_t n = size_t(s.groups()) * s.seq * s.dhead;
        const auto q = random_values(n, 3), k = random_values(n, 4), v = random_values(n, 5);
        const auto w = random_values(n, 6);
        // fp64 attention with one of q, k, v replaced.
        auto f = [&](int which) {
            return [&, which](const Vec& x) {
                Vec qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
                (which == 0 ? qd : which == 1 ? kd : vd) = x;
                Vec o(n, 0.0);
                const uint32_t S = s.seq, D = s.dhead;
                for (uint32_t g = 0; g < s.groups(); ++g) {
                    const size_t b = size_t(g) * S * D;
                    Vec sc(S * S);
                    for (uint32_t i = 0; i < S; ++i)
                        for (uint32_t j = 0; j < S; ++j)
                            for (uint32_t c = 0; c < D; ++c)
                                sc[i * S + j] += qd[b + i * D + c] * kd[b + j * D + c];
                    const Vec p = softmax64(sc, S, S, 1 / std::sqrt(double(D)), s.causal);
                    for (uint32_t i = 0; i < S; ++i)
                        for (uint32_t j = 0; j < S; ++j)
                            for (uint32_t c = 0; c < D; ++c)
                                o[b + i * D + c] += p[i * S + j] * vd[b + j * D + c];
                }
                return o;
            };
        };
        const auto fwd = attention_reference(s, q, k, v, 128);
        const auto g = attention_grad_reference(s, q, k, v, fwd.p, w, 128);
        // The reference rounds every MXU operand to bf16 (8 bits of mantissa).
        expect_close(g.dq, numeric_grad(f(0), q, w), 3e-2);
        expect_close(g.dk, numeric_grad(f(1), k, w), 3e-2);
        expect_close(g.dv, numeric_grad(f(2), v, w), 3e-2);
    }
}

/// fp64 pooling of NHWC x (max or average with count_include_pad).
Vec pool64(const PoolShape& s, const Vec& x, bool is_max) {
    const uint32_t OH = s.out_height(), OW = s.out_width();
    Vec y(size_t(s.batch) * OH * OW * s.channels);
    size_t i = 0;
    for (uint32_t n = 0; n < s.batch; ++n)
        for (uint32_t oh = 0; oh < OH; ++oh)
            for (uint32_t ow = 0; ow < OW; ++ow)
                for (uint32_t c = 0; c < s.channels; ++c) {
                    double acc = is_max ? -INFINITY : 0.0;
                    for (uint32_t kh = 0; kh < s.kernel; ++kh)
                        for (uint32_t kw = 0; kw < s.kernel; ++kw) {
                            const int64_t ih = int64_t(oh) * s.stride - s.pad + kh;
                            const int64_t iw = int64_t(ow) * s.stride - s.pad + kw;
                            if (ih < 0 || iw < 0 || ih >= s.height || iw >= s.width) continue;
                            const double v =
                                x[((size_t(n) * s.height + ih) * s.width + iw) * s.channels + c];
                            acc = is_max ? std::max(acc, v) : acc + v;
                        }
                    y[i++] = is_max ? acc : acc / (s.kernel * s.kernel);
                }
    return y;
}

TEST(KernelGradCheck, PoolGradsAreTheDerivativesOfPooling) {
    const PoolShape s{
        .batch = 1, .height = 5, .width = 4, .channels = 2, .kernel = 3, .stride = 2, .pad = 1};
    const size_t in = 5 * 4 * 2, out = size_t(s.out_height()) * s.out_width() * 2;
    const auto x = random_values(in, 7), w = random_values(out, 8);
    expect_close(max_pool2d_grad_reference(s, x, w),
                 numeric_grad([&](const Vec& v) { return pool64(s, v, true); }, x, w), 1e-6);
    expect_close(avg_pool2d_grad_reference(s, w),
                 numeric_grad([&](const Vec& v) { return pool64(s, v, false); }, x, w), 1e-6);
    const PoolShape gs{.batch = 2, .height = 3, .width = 2, .channels = 3};
    const auto gx = random_values(2 * 6 * 3, 9), gw = random_values(2 * 3, 10);
    auto gap64 = [&](const Vec& v) {
        Vec y(6, 0.0);
        for (size_t n = 0; n < 2; ++n)
            for (size_t i = 0; i < 6; ++i)
                for (size_t c = 0; c < 3; ++c) y[n * 3 + c] += v[(n * 6 + i) * 3 + c] / 6;
        return y;
    };
    expect_close(global_avg_pool_grad_reference(gs, gw), numeric_grad(gap64, gx, gw), 1e-6);
}

}  // namespace
}  // namespace tpu::driver
