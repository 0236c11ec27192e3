// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

using isa::imm;
using isa::Opcode;
using streaming::Body;
using streaming::Operand;
using streaming::Param;
using streaming::Spec;
using streaming::Stream;

/// The largest divisor of `n` that is at most `limit` (>= 1).
uint32_t divisor_at_most(uint32_t n, uint64_t limit) {
    for (uint32_t d = static_cast<uint32_t>(std::min<uint64_t>(n, limit)); d > 1; --d)
        if (n % d == 0) return d;
    return 1;
}

/// Softmax over rows of C values, operands as softmax_params.
Spec softmax_spec(uint32_t rows, uint32_t C, bool scaled, bool causal, std::span<const Operand> o) {
    enum { X, Z, E, Y, M, S, Ls, B };
    Spec sp;
    sp.fp = {"softmax", rows, {C, C, C, C, 1, 1, 1}, {}};
    sp.ins = {{o[0], X}};
    sp.outs = {{o[1], Y}};
    const isa::Arg scale = scaled ? o[2].value : imm(0);
    if (causal) {
        sp.fp.areas.push_back(C);
        // Bias rows follow the row index within its C x C block; tiles never straddle two blocks
        // (the tile size divides C, plan_softmax), so one contiguous DMA covers a tile's bias
        // rows.
        const Operand bias = o[scaled ? 3 : 2];
        sp.ins.emplace_back(bias, B,
                            [=](Body& b, const isa::Reg& first, const isa::Reg& units,
                                const isa::Reg& slot, const isa::Flag& flag) {
                                const int64_t row = int64_t(C) * 4;
                                b.emit(Opcode::Remu, {b.tmp(0), first, imm(C)});
                                b.emit(Opcode::Mul, {b.tmp(0), b.tmp(0), imm(row)});
                                b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), bias.value});
                                b.emit(Opcode::Mul, {b.tmp(1), units, imm(row)});
                                b.emit(Opcode::DmaHv, {b.at(slot, B), b.tmp(0), imm(1), b.tmp(1),
                                                       b.tmp(1), b.tmp(1), flag});
                            });
    }
    sp.body = [=](Body& b) {
        const isa::Reg &r = b.units(), &n = b.scratch();
        b.emit(Opcode::Mul, {n, r, imm(C)});
        if (scaled) b.vpu(Opcode::VMulS, {b.a(X), b.a(X), scale, n});
        if (causal) b.vpu(Opcode::VAdd, {b.a(X), b.a(X), b.a(B), n});
        b.vpu(Opcode::VRMax, {b.a(M), b.a(X), r, imm(C)});
        b.vpu(Opcode::VSubCol, {b.a(Z), b.a(X), b.a(M), r, imm(C)});
        b.vpu(Opcode::VExp, {b.a(E), b.a(Z), n});
        b.vpu(Opcode::VRSum, {b.a(S), b.a(E), r, imm(C)});
        b.vpu(Opcode::VLog, {b.a(Ls), b.a(S), r});
        b.vpu(Opcode::VSubCol, {b.a(Z), b.a(Z), b.a(Ls), r, imm(C)});
        b.vpu(Opcode::VExp, {b.a(Y), b.a(Z), n});
    };
    return sp;
}

/// dx = y (dy - sum dy y) [* scale], operands as softmax_grad_params.
Spec softmax_grad_spec(uint32_t rows, uint32_t C, bool scaled, std::span<const Operand> o) {
    enum { Y, Dy, T, U, Dx, S };
    Spec sp;
    sp.fp = {"softmax_grad", rows, {C, C, C, C, C, 1}, {}};
    sp.ins = {{o[0], Y}, {o[1], Dy}};
    sp.outs = {{o[2], Dx}};
    const isa::Arg scale = scaled ? o[3].value : imm(0);
    sp.body = [=](Body& b) {
        const isa::Reg &r = b.units(), &n = b.scratch();
        b.emit(Opcode::Mul, {n, r, imm(C)});
        b.vpu(Opcode::VMul, {b.a(T), b.a(Dy), b.a(Y), n});
        b.vpu(Opcode::VRSum, {b.a(S), b.a(T), r, imm(C)});
        b.vpu(Opcode::VSubCol, {b.a(U), b.a(Dy), b.a(S), r, imm(C)});
        b.vpu(Opcode::VMul, {b.a(Dx), b.a(Y), b.a(U), n});
        if (scaled) b.vpu(Opcode::VMulS, {b.a(Dx), b.a(Dx), scale, n});
    };
    return sp;
}

}  // namespace

SoftmaxKey plan_softmax(uint32_t rows, uint32_t cols, bool scaled, bool causal,
                        uint64_t vmem_bytes) {
    SoftmaxKey k{rows, cols, scaled, causal, 0};
    streaming::Footprint fp =
        softmax_spec(rows, cols, scaled, causal, streaming::placeholders(softmax_params(k))).fp;
    if (causal) fp.max_tile_units = divisor_at_most(cols, streaming::plan(fp, vmem_bytes));
    k.tile = streaming::plan(fp, vmem_bytes);
    return k;
}

std::vector<Param> softmax_params(const SoftmaxKey& k) {
    std::vector<Param> p = {{"x"}, {"y"}};
    if (k.scaled) p.push_back({"scale", true});
    if (k.causal) p.push_back({"bias"});
    return p;
}

void emit(isa::Builder& b, const SoftmaxKey& k, std::span<const Operand> ops) {
    streaming::check_operands(k.name(), softmax_params(k), ops);
    streaming::emit(b, softmax_spec(k.rows, k.cols, k.scaled, k.causal, ops), k.tile);
}

isa::Program generate(const SoftmaxKey& k) {
    return streaming::standalone(k.name(), softmax_params(k), k.tile,
                                 [&](std::span<const Operand> o) {
                                     return softmax_spec(k.rows, k.cols, k.scaled, k.causal, o);
                                 });
}

SoftmaxGradKey plan_softmax_grad(uint32_t rows, uint32_t cols, bool scaled, uint64_t vmem_bytes) {
    SoftmaxGradKey k{rows, cols, scaled, 0};
    k.tile = streaming::plan(
        softmax_grad_spec(rows, cols, scaled, streaming::placeholders(softmax_grad_params(k))).fp,
        vmem_bytes);
    return k;
}

std::vector<Param> softmax_grad_params(const SoftmaxGradKey& k) {
    std::vector<Param> p = {{"y"}, {"dy"}, {"dx"}};
    if (k.scaled) p.push_back({"scale", true});
    return p;
}

void emit(isa::Builder& b, const SoftmaxGradKey& k, std::span<const Operand> ops) {
    streaming::check_operands(k.name(), softmax_grad_params(k), ops);
    streaming::emit(b, softmax_grad_spec(k.rows, k.cols, k.scaled, ops), k.tile);
}

isa::Program generate(const SoftmaxGradKey& k) {
    return streaming::standalone(
        k.name(), softmax_grad_params(k), k.tile,
        [&](std::span<const Operand> o) { return softmax_grad_spec(k.rows, k.cols, k.scaled, o); });
}

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
    const SoftmaxKey k = plan_softmax(x.rows, x.cols, scaled, causal, dev.config().core.vmem_bytes);
    Tensor bias;
    auto bind = [&](size_t i, LaunchArgs& a) {
        a.set("x", x.bufs[i]).set("y", y.bufs[i]);
        if (scaled) a.set_f32("scale", scale);
        if (causal) a.set("bias", bias.bufs[i]);
    };
    if (!causal) return launch(dev, cache, k, x.cores, bind);
    // The bias is written once per call from the host (outside the launch's Event), one copy
    // per core, because the VPU has no index generator to build it in VMEM.
    bias = alloc_tensor(dev, x.cores, x.cols, x.cols);
    try {
        write_tensor_all(dev, bias, causal_bias(x.cols));
        const Event ev = launch(dev, cache, k, x.cores, bind);
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
    const SoftmaxGradKey k =
        plan_softmax_grad(y.rows, y.cols, scaled, dev.config().core.vmem_bytes);
    return launch(dev, cache, k, y.cores, [&](size_t i, LaunchArgs& a) {
        a.set("y", y.bufs[i]).set("dy", dy.bufs[i]).set("dx", dx.bufs[i]);
        if (scaled) a.set_f32("scale", scale);
    });
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
