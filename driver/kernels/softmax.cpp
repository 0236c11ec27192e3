// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/softmax.h"

#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

using detail::Body;
using detail::f32_bits;
using detail::Spec;
using detail::Stream;

/// The largest divisor of `n` that is at most `limit` (>= 1).
uint32_t divisor_at_most(uint32_t n, uint64_t limit) {
    for (uint32_t d = static_cast<uint32_t>(std::min<uint64_t>(n, limit)); d > 1; --d)
        if (n % d == 0) return d;
    return 1;
}

/// Softmax over rows of C values. Launch args: s1 x, s2 y, then s3 the fp32 scale when
/// `scaled`, then the causal bias (C x C, row r of a tile uses bias row r mod C) when `causal`.
Spec softmax_spec(uint32_t rows, uint32_t C, bool scaled, bool causal, const hw::BoardConfig& cfg) {
    enum { X, Z, E, Y, M, S, Ls, B };
    Spec sp;
    sp.name = fmt::format("softmax{}{}", scaled ? " scaled" : "", causal ? " causal" : "");
    sp.units = rows;
    sp.areas = {C, C, C, C, 1, 1, 1};
    sp.ins = {{1, X}};
    sp.outs = {{2, Y}};
    const int bias_arg = scaled ? 4 : 3;
    if (causal) {
        sp.areas.push_back(C);
        // Bias rows follow the row index within its C x C block; tiles never straddle two blocks
        // (the tile size divides C, below), so one contiguous DMA covers a tile's bias rows.
        sp.ins.emplace_back(bias_arg, B,
                            [=](Body& b, const std::string& first, const std::string& units,
                                const std::string& slot, const std::string& flag) {
                                const uint64_t row = uint64_t(C) * 4;
                                b.line(fmt::format("        remu s13, {}, {}", first, C));
                                b.line(fmt::format("        mul s13, s13, {}", row));
                                b.line(fmt::format("        add s13, s13, s{}", bias_arg));
                                b.line(fmt::format("        mul s14, {}, {}", units, row));
                                b.line(fmt::format("        dma.hv {}, [s13], 1, s14, s14, s14, {}",
                                                   b.at(slot, B), flag));
                            });
    }
    sp.body = [=](Body& b) {
        b.line(fmt::format("        mul s15, s18, {}", C));
        if (scaled) b.vpu(fmt::format("        v.muls {}, {}, s3, s15", b.a(X), b.a(X)));
        if (causal) b.vpu(fmt::format("        v.add {}, {}, {}, s15", b.a(X), b.a(X), b.a(B)));
        b.vpu(fmt::format("        v.rmax {}, {}, s18, {}", b.a(M), b.a(X), C));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(Z), b.a(X), b.a(M), C));
        b.vpu(fmt::format("        v.exp {}, {}, s15", b.a(E), b.a(Z)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(S), b.a(E), C));
        b.vpu(fmt::format("        v.log {}, {}, s18", b.a(Ls), b.a(S)));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(Z), b.a(Z), b.a(Ls), C));
        b.vpu(fmt::format("        v.exp {}, {}, s15", b.a(Y), b.a(Z)));
    };
    if (causal) sp.max_tile_units = divisor_at_most(C, detail::tile_units(sp, cfg));
    return sp;
}

/// dx = y (dy - sum dy y) [* scale]. Launch args: s1 y, s2 dy, s3 dx, s4 the fp32 scale.
Spec softmax_grad_spec(uint32_t rows, uint32_t C, bool scaled) {
    enum { Y, Dy, T, U, Dx, S };
    Spec sp;
    sp.name = scaled ? "softmax_grad scaled" : "softmax_grad";
    sp.units = rows;
    sp.areas = {C, C, C, C, C, 1};
    sp.ins = {{1, Y}, {2, Dy}};
    sp.outs = {{3, Dx}};
    sp.body = [=](Body& b) {
        b.line(fmt::format("        mul s15, s18, {}", C));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(T), b.a(Dy), b.a(Y)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(S), b.a(T), C));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(U), b.a(Dy), b.a(S), C));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(Dx), b.a(Y), b.a(U)));
        if (scaled) b.vpu(fmt::format("        v.muls {}, {}, s4, s15", b.a(Dx), b.a(Dx)));
    };
    return sp;
}

}  // namespace

std::vector<float> causal_bias(uint32_t C) {
    std::vector<float> bias(size_t(C) * C, 0.0f);
    for (size_t r = 0; r < C; ++r)
        for (size_t j = r + 1; j < C; ++j)
            bias[r * C + j] = -std::numeric_limits<float>::infinity();
    return bias;
}

Event softmax(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& y) {
    return scaled_softmax(dev, cache, x, 1.0f, false, y);
}

Event softmax_grad(Device& dev, ProgramCache& cache, const Tensor& y, const Tensor& dy,
                   const Tensor& dx) {
    return scaled_softmax_grad(dev, cache, y, dy, 1.0f, dx);
}

Event scaled_softmax(Device& dev, ProgramCache& cache, const Tensor& x, float scale, bool causal,
                     const Tensor& y) {
    check_same(x, y, "softmax");
    const bool scaled = scale != 1.0f;
    const Spec sp = softmax_spec(x.rows, x.cols, scaled, causal, dev.config());
    std::vector<uint32_t> scalars;
    if (scaled) scalars.push_back(f32_bits(scale));
    if (!causal) return detail::run(dev, cache, sp, {&x, &y}, scalars);
    // The bias is written once per call from the host (outside the launch's Event), one copy
    // per core, because the VPU has no index generator to build it in VMEM.
    Tensor bias = alloc_tensor(dev, x.cores, x.cols, x.cols);
    try {
        write_tensor_all(dev, bias, causal_bias(x.cols));
        const Event ev = detail::run(dev, cache, sp, x.cores, [&](size_t i) {
            std::vector<uint32_t> a = {static_cast<uint32_t>(x.bufs[i].addr),
                                       static_cast<uint32_t>(y.bufs[i].addr)};
            a.insert(a.end(), scalars.begin(), scalars.end());
            a.push_back(static_cast<uint32_t>(bias.bufs[i].addr));
            return a;
        });
        free_tensor(dev, bias);
        return ev;
    } catch (...) {
        free_tensor(dev, bias);
        throw;
    }
}

Event scaled_softmax_grad(Device& dev, ProgramCache& cache, const Tensor& y, const Tensor& dy,
                          float scale, const Tensor& dx) {
    check_same(y, dy, "softmax_grad");
    check_same(y, dx, "softmax_grad");
    const bool scaled = scale != 1.0f;
    return detail::run(dev, cache, softmax_grad_spec(y.rows, y.cols, scaled), {&y, &dy, &dx},
                       {f32_bits(scale)});
}

std::vector<float> softmax_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                                     float scale, bool causal) {
    std::vector<float> y(x.size()), s(cols), z(cols);
    for (size_t r = 0; r < rows; ++r) {
        for (size_t j = 0; j < cols; ++j) {
            s[j] = scale != 1.0f ? x[r * cols + j] * scale : x[r * cols + j];
            if (causal) s[j] = s[j] + (j > r % cols ? -INFINITY : 0.0f);
        }
        float m = -INFINITY;
        for (size_t j = 0; j < cols; ++j)
            m = std::isnan(m) || std::isnan(s[j]) ? std::numeric_limits<float>::quiet_NaN()
                                                  : (m > s[j] ? m : s[j]);
        float sum = 0.0f;
        for (size_t j = 0; j < cols; ++j) {
            z[j] = s[j] - m;
            sum = sum + std::exp(z[j]);
        }
        const float ls = std::log(sum);
        for (size_t j = 0; j < cols; ++j) y[r * cols + j] = std::exp(z[j] - ls);
    }
    return y;
}

std::vector<float> softmax_grad_reference(const std::vector<float>& y, const std::vector<float>& dy,
                                          uint32_t rows, uint32_t cols, float scale) {
    std::vector<float> dx(y.size());
    for (size_t r = 0; r < rows; ++r) {
        const float* yr = &y[r * cols];
        const float* d = &dy[r * cols];
        float s = 0.0f;
        for (size_t j = 0; j < cols; ++j) s = s + d[j] * yr[j];
        for (size_t j = 0; j < cols; ++j) {
            const float v = yr[j] * (d[j] - s);
            dx[r * cols + j] = scale != 1.0f ? v * scale : v;
        }
    }
    return dx;
}

}  // namespace tpu::driver
