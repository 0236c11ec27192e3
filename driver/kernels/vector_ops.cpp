// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/vector_ops.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "driver/kernels/kernel.h"

namespace tpu::driver {

uint32_t detail::f32_bits(float x) {
    return std::bit_cast<uint32_t>(x);
}

namespace {

using isa::fimm;
using isa::imm;
using isa::Opcode;
using streaming::Body;
using streaming::Operand;
using streaming::Param;
using streaming::Spec;

/// Name and operands of each VectorOp, in enum order.
struct OpInfo {
    const char* name;
    std::vector<Param> params;
};
const std::array<OpInfo, 12>& op_info() {
    static const std::array<OpInfo, 12> kInfo = {{
        {"add", {{"a"}, {"b"}, {"out"}}},
        {"mul", {{"a"}, {"b"}, {"out"}}},
        {"scale", {{"a"}, {"out"}, {"s", true}}},
        {"relu", {{"x"}, {"out"}}},
        {"add_relu", {{"a"}, {"b"}, {"out"}}},
        {"relu_grad", {{"x"}, {"dy"}, {"dx"}}},
        {"bias_add", {{"x"}, {"bias"}, {"out"}}},
        {"row_sum", {{"x"}, {"out"}}},
        {"col_sum", {{"x"}, {"out"}}},
        {"softmax_cross_entropy",
         {{"logits"}, {"labels"}, {"loss"}, {"dlogits"}, {"inv_rows", true}}},
        {"sgd_momentum", {{"w"}, {"g"}, {"v"}, {"lr", true}, {"momentum", true}}},
        {"adam",
         {{"w"},
          {"g"},
          {"m"},
          {"v"},
          {"beta1", true},
          {"one_minus_b1", true},
          {"beta2", true},
          {"one_minus_b2", true},
          {"c2", true},
          {"eps", true},
          {"lr_c1", true}}},
    }};
    return kInfo;
}
const OpInfo& info_of(VectorOp op) {
    return op_info().at(static_cast<size_t>(op));
}

/// Elementwise kernels over n values: `areas` slot areas of one value per unit.
Spec elementwise(VectorOp op, uint64_t n, int areas) {
    Spec sp;
    sp.fp.name = info_of(op).name;
    sp.fp.units = n;
    sp.fp.areas.assign(areas, 1);
    return sp;
}

/// The kernel: its footprint, streams and body, with operands `o` (vector_params order).
Spec vector_spec(VectorOp op, uint64_t units, uint32_t cols, std::span<const Operand> o) {
    const uint32_t C = cols;
    switch (op) {
        case VectorOp::Add:
        case VectorOp::Mul: {
            Spec sp = elementwise(op, units, 3);
            sp.ins = {{o[0], 0}, {o[1], 1}};
            sp.outs = {{o[2], 2}};
            const Opcode vop = op == VectorOp::Add ? Opcode::VAdd : Opcode::VMul;
            sp.body = [vop](Body& b) { b.vpu(vop, {b.a(2), b.a(0), b.a(1), b.units()}); };
            return sp;
        }
        case VectorOp::Scale: {
            Spec sp = elementwise(op, units, 2);
            sp.ins = {{o[0], 0}};
            sp.outs = {{o[1], 1}};
            const isa::Arg s = o[2].value;
            sp.body = [s](Body& b) { b.vpu(Opcode::VMulS, {b.a(1), b.a(0), s, b.units()}); };
            return sp;
        }
        case VectorOp::Relu: {
            Spec sp = elementwise(op, units, 2);
            sp.ins = {{o[0], 0}};
            sp.outs = {{o[1], 1}};
            sp.body = [](Body& b) {
                b.vpu(Opcode::VMaxS, {b.a(1), b.a(0), fimm(0.0f), b.units()});
            };
            return sp;
        }
        case VectorOp::AddRelu: {
            Spec sp = elementwise(op, units, 3);
            sp.ins = {{o[0], 0}, {o[1], 1}};
            sp.outs = {{o[2], 2}};
            sp.body = [](Body& b) {
                b.vpu(Opcode::VAdd, {b.a(2), b.a(0), b.a(1), b.units()});
                b.vpu(Opcode::VMaxS, {b.a(2), b.a(2), fimm(0.0f), b.units()});
            };
            return sp;
        }
        case VectorOp::ReluGrad: {
            enum { X, Dy, Zero, Mask, Dx };
            Spec sp = elementwise(op, units, 5);
            sp.ins = {{o[0], X}, {o[1], Dy}};
            sp.outs = {{o[2], Dx}};
            sp.body = [](Body& b) {
                // x > x is false for every x, NaN included, so this makes +0.0 without a
                // constant in memory; the mask is 1.0 or +0.0 and doubles as the +0.0 operand of
                // the select.
                b.vpu(Opcode::VCmpGt, {b.a(Zero), b.a(X), b.a(X), b.units()});
                b.vpu(Opcode::VCmpGt, {b.a(Mask), b.a(X), b.a(Zero), b.units()});
                b.vpu(Opcode::VSel, {b.a(Dx), b.a(Mask), b.a(Dy), b.a(Mask), b.units()});
            };
            return sp;
        }
        case VectorOp::BiasAdd: {
            Spec sp;
            sp.fp = {info_of(op).name, units, {C, C}, {C}};
            sp.ins = {{o[0], 0}};
            sp.outs = {{o[2], 1}};
            sp.fixed_ins = {{o[1], 0}};
            sp.body = [C](Body& b) {
                b.vpu(Opcode::VAddRow, {b.a(1), b.a(0), b.f(0), b.units(), imm(C)});
            };
            return sp;
        }
        case VectorOp::RowSum: {
            Spec sp;
            sp.fp = {info_of(op).name, units, {C, 1}, {}};
            sp.ins = {{o[0], 0}};
            sp.outs = {{o[1], 1}};
            sp.body = [C](Body& b) { b.vpu(Opcode::VRSum, {b.a(1), b.a(0), b.units(), imm(C)}); };
            return sp;
        }
        case VectorOp::ColSum: {
            Spec sp;
            sp.fp = {info_of(op).name, units, {C}, {C, C}};  // fixed: running sum, tile sum
            sp.ins = {{o[0], 0}};
            sp.fixed_outs = {{o[1], 0}};
            sp.body = [C](Body& b) {
                // The first tile's sum is stored; later tile sums are added to it.
                b.builder().if_(
                    isa::Cond::Eq, b.tile(), imm(0),
                    [&] {
                        b.vpu(Opcode::VCSum, {b.f(0), b.a(0), b.units(), imm(C)});
                    },
                    [&] {
                        b.vpu(Opcode::VCSum, {b.f(1), b.a(0), b.units(), imm(C)});
                        b.vpu(Opcode::VAdd, {b.f(0), b.f(0), b.f(1), imm(C)});
                    });
            };
            return sp;
        }
        case VectorOp::SoftmaxCrossEntropy: {
            enum { Lg, Y, Z, E, P, D, M, S, Ls, Lr, Loss };
            Spec sp;
            sp.fp = {info_of(op).name, units, {C, C, C, C, C, C, 1, 1, 1, 1, 1}, {}};
            sp.ins = {{o[0], Lg}, {o[1], Y}};
            sp.outs = {{o[2], Loss}, {o[3], D}};
            const isa::Arg inv_rows = o[4].value;
            sp.body = [C, inv_rows](Body& b) {
                const isa::Reg& n = b.scratch();  // values in the tile
                b.emit(Opcode::Mul, {n, b.units(), imm(C)});
                b.vpu(Opcode::VRMax, {b.a(M), b.a(Lg), b.units(), imm(C)});
                b.vpu(Opcode::VSubCol, {b.a(Z), b.a(Lg), b.a(M), b.units(), imm(C)});
                b.vpu(Opcode::VExp, {b.a(E), b.a(Z), n});
                b.vpu(Opcode::VRSum, {b.a(S), b.a(E), b.units(), imm(C)});
                b.vpu(Opcode::VLog, {b.a(Ls), b.a(S), b.units()});
                b.vpu(Opcode::VSubCol, {b.a(P), b.a(Z), b.a(Ls), b.units(), imm(C)});
                b.vpu(Opcode::VMul, {b.a(E), b.a(Y), b.a(P), n});
                b.vpu(Opcode::VRSum, {b.a(Lr), b.a(E), b.units(), imm(C)});
                b.vpu(Opcode::VMulS, {b.a(Loss), b.a(Lr), fimm(-1.0f), b.units()});
                b.vpu(Opcode::VExp, {b.a(E), b.a(P), n});
                b.vpu(Opcode::VSub, {b.a(D), b.a(E), b.a(Y), n});
                b.vpu(Opcode::VMulS, {b.a(D), b.a(D), inv_rows, n});
            };
            return sp;
        }
        case VectorOp::SgdMomentum: {
            enum { W, G, V, T };
            Spec sp = elementwise(op, units, 4);
            sp.ins = {{o[0], W}, {o[1], G}, {o[2], V}};
            sp.outs = {{o[0], W}, {o[2], V}};
            const isa::Arg lr = o[3].value, momentum = o[4].value;
            sp.body = [lr, momentum](Body& b) {
                b.vpu(Opcode::VMulS, {b.a(V), b.a(V), momentum, b.units()});
                b.vpu(Opcode::VAdd, {b.a(V), b.a(V), b.a(G), b.units()});
                b.vpu(Opcode::VMulS, {b.a(T), b.a(V), lr, b.units()});
                b.vpu(Opcode::VSub, {b.a(W), b.a(W), b.a(T), b.units()});
            };
            return sp;
        }
        case VectorOp::Adam: {
            enum { W, G, M, V, T1, T2 };
            Spec sp = elementwise(op, units, 6);
            sp.ins = {{o[0], W}, {o[1], G}, {o[2], M}, {o[3], V}};
            sp.outs = {{o[0], W}, {o[2], M}, {o[3], V}};
            const isa::Arg beta1 = o[4].value, one_minus_b1 = o[5].value, beta2 = o[6].value,
                           one_minus_b2 = o[7].value, c2 = o[8].value, eps = o[9].value,
                           lr_c1 = o[10].value;
            // PyTorch divides by sqrt(v_hat) + eps; the VPU has rsqrt but no sqrt or divide, so
            // sqrt(x) = x * rsqrt(x) (selected back to 0 where x = 0, where rsqrt is inf) and
            // 1 / d = rsqrt(d)^2.
            sp.body = [=](Body& b) {
                const isa::Reg& n = b.units();
                b.vpu(Opcode::VMulS, {b.a(T1), b.a(G), one_minus_b1, n});
                b.vpu(Opcode::VMulS, {b.a(M), b.a(M), beta1, n});
                b.vpu(Opcode::VAdd, {b.a(M), b.a(M), b.a(T1), n});
                b.vpu(Opcode::VMul, {b.a(T2), b.a(G), b.a(G), n});
                b.vpu(Opcode::VMulS, {b.a(T2), b.a(T2), one_minus_b2, n});
                b.vpu(Opcode::VMulS, {b.a(V), b.a(V), beta2, n});
                b.vpu(Opcode::VAdd, {b.a(V), b.a(V), b.a(T2), n});
                b.vpu(Opcode::VMulS, {b.a(T2), b.a(V), c2, n});
                b.vpu(Opcode::VRsqrt, {b.a(T1), b.a(T2), n});
                b.vpu(Opcode::VMul, {b.a(T1), b.a(T2), b.a(T1), n});
                b.vpu(Opcode::VSel, {b.a(T1), b.a(T2), b.a(T1), b.a(T2), n});
                b.vpu(Opcode::VAddS, {b.a(T1), b.a(T1), eps, n});
                b.vpu(Opcode::VRsqrt, {b.a(T1), b.a(T1), n});
                b.vpu(Opcode::VMul, {b.a(T1), b.a(T1), b.a(T1), n});
                b.vpu(Opcode::VMul, {b.a(T1), b.a(M), b.a(T1), n});
                b.vpu(Opcode::VMulS, {b.a(T1), b.a(T1), lr_c1, n});
                b.vpu(Opcode::VSub, {b.a(W), b.a(W), b.a(T1), n});
            };
            return sp;
        }
    }
    throw std::logic_error("vector_spec: unknown VectorOp");
}

/// A buffer argument and the fp32 values the shape needs in it.
struct BufArg {
    const Buffer* buf;
    const char* label;
    uint64_t values;
};

/// Checks the arguments (one core, large enough, addressable) and returns their core.
uint32_t check_args(const std::string& name, const std::vector<BufArg>& args) {
    const uint32_t core = args.front().buf->core;
    for (const BufArg& a : args) {
        if (a.buf->core != core)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: {} is on core {} but {} is on core {}; all buffers "
                                          "must be on one core",
                                          name, a.label, a.buf->core, args.front().label, core));
        const uint64_t need = a.values * 4;
        if (a.buf->bytes < need)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: {} holds {} bytes; {} fp32 values need {}", name,
                                          a.label, a.buf->bytes, a.values, need));
        // As lengths: an address near 2^64 plus the need wraps to a small end.
        if (a.buf->addr > kHbmWindowBytes || need > kHbmWindowBytes - a.buf->addr)
            throw DeviceError(
                ErrorKind::Usage,
                fmt::format("{}: {} ends past the 4 GiB of HBM a kernel addresses", name, a.label));
    }
    return core;
}

void check_shape(const std::string& name, uint64_t rows, uint64_t cols) {
    if (rows == 0 || cols == 0)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: empty shape ({} x {})", name, rows, cols));
}

std::string cores_text(const std::vector<uint32_t>& cores) {
    return fmt::format("[{}]", fmt::join(cores, ", "));
}

/// Plans `op` on this device and launches its program on `cores`.
Event run(Device& dev, ProgramCache& cache, VectorOp op, uint64_t units, uint32_t cols,
          const std::vector<uint32_t>& cores, const BindFn& bind) {
    return launch(dev, cache, plan_vector(op, units, cols, dev.config().core.vmem_bytes), cores,
                  bind);
}

/// run() on one core with the buffers bound to `op`'s tensor parameters in order and
/// `scalars` (fp32) to the scalar ones.
Event run_buffers(Device& dev, ProgramCache& cache, VectorOp op, uint64_t units, uint32_t cols,
                  const std::vector<const Buffer*>& bufs, const std::vector<float>& scalars = {}) {
    const auto& params = info_of(op).params;
    return run(dev, cache, op, units, cols, {bufs.front()->core}, [&](size_t, LaunchArgs& a) {
        for (size_t k = 0; k < params.size(); ++k)
            if (params[k].scalar)
                a.set_f32(params[k].name, scalars.at(k - bufs.size()));
            else
                a.set(params[k].name, *bufs.at(k));
    });
}

/// run() on the tensors' core set: replica i of each tensor bound to `op`'s tensor parameters in
/// order, `scalars` (fp32) to the scalar ones.
Event run_tensors(Device& dev, ProgramCache& cache, VectorOp op, uint64_t units, uint32_t cols,
                  const std::vector<const Tensor*>& tensors,
                  const std::vector<float>& scalars = {}) {
    const Tensor& first = *tensors.front();
    for (const Tensor* t : tensors)
        if (t->bufs.size() != first.cores.size() || t->cores != first.cores)
            throw DeviceError(
                ErrorKind::Usage,
                fmt::format("{}: tensors on different core sets ({} and {})", info_of(op).name,
                            cores_text(first.cores), cores_text(t->cores)));
    const auto& params = info_of(op).params;
    return run(dev, cache, op, units, cols, first.cores, [&](size_t i, LaunchArgs& a) {
        for (size_t k = 0; k < params.size(); ++k)
            if (params[k].scalar)
                a.set_f32(params[k].name, scalars.at(k - tensors.size()));
            else
                a.set(params[k].name, tensors.at(k)->bufs[i]);
    });
}

std::vector<float> adam_args(const AdamScalars& k) {
    return {k.beta1, k.one_minus_b1, k.beta2, k.one_minus_b2, k.c2, k.eps, k.lr_c1};
}

float max0(float x) {
    if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
    return x > 0.0f ? x : 0.0f;
}

}  // namespace

// ---- keys and generators ---------------------------------------------------------------------

std::string VectorKey::name() const {
    return info_of(op).name;
}

VectorKey plan_vector(VectorOp op, uint64_t units, uint32_t cols, uint64_t vmem_bytes) {
    const auto ops = streaming::placeholders(vector_params(op));
    return {op, units, cols, streaming::plan(vector_spec(op, units, cols, ops).fp, vmem_bytes)};
}

std::span<const Param> vector_params(VectorOp op) {
    return info_of(op).params;
}

void emit(isa::Builder& b, const VectorKey& k, std::span<const Operand> ops) {
    streaming::check_operands(k.name(), vector_params(k.op), ops);
    streaming::emit(b, vector_spec(k.op, k.units, k.cols, ops), k.tile);
}

isa::Program generate(const VectorKey& k) {
    return streaming::standalone(
        k.name(), vector_params(k.op), k.tile,
        [&](std::span<const Operand> o) { return vector_spec(k.op, k.units, k.cols, o); });
}

// ---- detail ----------------------------------------------------------------------------------

Event detail::merge(const std::vector<Event>& evs) {
    Event e = evs.back();
    e.start_cycle = evs.front().start_cycle;
    e.host_seconds = 0;
    std::fill(e.core_cycles.begin(), e.core_cycles.end(), 0);
    for (const Event& x : evs) {
        e.host_seconds += x.host_seconds;
        for (size_t i = 0; i < e.core_cycles.size() && i < x.core_cycles.size(); ++i)
            e.core_cycles[i] += x.core_cycles[i];
    }
    return e;
}

void check_tensor(const Tensor& t, uint32_t rows, uint32_t cols, const Tensor& like,
                  const char* kernel, const char* label) {
    if (t.rows != rows || t.cols != cols || t.cores != like.cores)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: {} is {} x {} on cores {}; expected {} x {} on cores {}",
                                      kernel, label, t.rows, t.cols, cores_text(t.cores), rows,
                                      cols, cores_text(like.cores)));
}

// ---- Buffer kernels --------------------------------------------------------------------------

namespace {

Event binary(Device& dev, ProgramCache& cache, VectorOp op, const Buffer& a, const Buffer& b,
             const Buffer& out, uint64_t n) {
    const char* name = info_of(op).name;
    check_shape(name, n, 1);
    check_args(name, {{&a, "a", n}, {&b, "b", n}, {&out, "out", n}});
    return run_buffers(dev, cache, op, n, 1, {&a, &b, &out});
}

}  // namespace

Event add(Device& dev, ProgramCache& cache, const Buffer& a, const Buffer& b, const Buffer& out,
          uint64_t n) {
    return binary(dev, cache, VectorOp::Add, a, b, out, n);
}

Event mul(Device& dev, ProgramCache& cache, const Buffer& a, const Buffer& b, const Buffer& out,
          uint64_t n) {
    return binary(dev, cache, VectorOp::Mul, a, b, out, n);
}

Event scale(Device& dev, ProgramCache& cache, const Buffer& a, float s, const Buffer& out,
            uint64_t n) {
    check_shape("scale", n, 1);
    check_args("scale", {{&a, "a", n}, {&out, "out", n}});
    return run_buffers(dev, cache, VectorOp::Scale, n, 1, {&a, &out}, {s});
}

Event relu(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint64_t n) {
    check_shape("relu", n, 1);
    check_args("relu", {{&x, "x", n}, {&out, "out", n}});
    return run_buffers(dev, cache, VectorOp::Relu, n, 1, {&x, &out});
}

Event relu_grad(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& dy,
                const Buffer& dx, uint64_t n) {
    check_shape("relu_grad", n, 1);
    check_args("relu_grad", {{&x, "x", n}, {&dy, "dy", n}, {&dx, "dx", n}});
    return run_buffers(dev, cache, VectorOp::ReluGrad, n, 1, {&x, &dy, &dx});
}

Event bias_add(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& bias,
               const Buffer& out, uint32_t rows, uint32_t cols) {
    check_shape("bias_add", rows, cols);
    const uint64_t n = uint64_t(rows) * cols;
    check_args("bias_add", {{&x, "x", n}, {&bias, "bias", cols}, {&out, "out", n}});
    return run_buffers(dev, cache, VectorOp::BiasAdd, rows, cols, {&x, &bias, &out});
}

Event row_sum(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint32_t rows,
              uint32_t cols) {
    check_shape("row_sum", rows, cols);
    check_args("row_sum", {{&x, "x", uint64_t(rows) * cols}, {&out, "out", rows}});
    return run_buffers(dev, cache, VectorOp::RowSum, rows, cols, {&x, &out});
}

Event col_sum(Device& dev, ProgramCache& cache, const Buffer& x, const Buffer& out, uint32_t rows,
              uint32_t cols) {
    check_shape("col_sum", rows, cols);
    check_args("col_sum", {{&x, "x", uint64_t(rows) * cols}, {&out, "out", cols}});
    return run_buffers(dev, cache, VectorOp::ColSum, rows, cols, {&x, &out});
}

uint32_t col_sum_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols) {
    check_shape("col_sum", rows, cols);
    return plan_vector(VectorOp::ColSum, rows, cols, cfg.core.vmem_bytes).tile;
}

Event softmax_cross_entropy(Device& dev, ProgramCache& cache, const Buffer& logits,
                            const Buffer& labels_onehot, const Buffer& loss_per_row,
                            const Buffer& dlogits, uint32_t rows, uint32_t classes) {
    const char* name = "softmax_cross_entropy";
    check_shape(name, rows, classes);
    const uint64_t n = uint64_t(rows) * classes;
    check_args(name, {{&logits, "logits", n},
                      {&labels_onehot, "labels_onehot", n},
                      {&loss_per_row, "loss_per_row", rows},
                      {&dlogits, "dlogits", n}});
    const float inv_rows = 1.0f / static_cast<float>(rows);
    return run_buffers(dev, cache, VectorOp::SoftmaxCrossEntropy, rows, classes,
                       {&logits, &labels_onehot, &loss_per_row, &dlogits}, {inv_rows});
}

Event sgd_momentum(Device& dev, ProgramCache& cache, const Buffer& w, const Buffer& g,
                   const Buffer& v, uint64_t n, float lr, float momentum) {
    check_shape("sgd_momentum", n, 1);
    check_args("sgd_momentum", {{&w, "w", n}, {&g, "g", n}, {&v, "v", n}});
    return run_buffers(dev, cache, VectorOp::SgdMomentum, n, 1, {&w, &g, &v}, {lr, momentum});
}

AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, uint32_t step) {
    if (step == 0) throw DeviceError(ErrorKind::Usage, "adam: step must be >= 1");
    AdamScalars s;
    s.beta1 = beta1;
    s.one_minus_b1 = 1.0f - beta1;
    s.beta2 = beta2;
    s.one_minus_b2 = 1.0f - beta2;
    s.c2 = static_cast<float>(1.0 / (1.0 - std::pow(double(beta2), double(step))));
    s.eps = eps;
    s.lr_c1 = static_cast<float>(double(lr) / (1.0 - std::pow(double(beta1), double(step))));
    return s;
}

Event adam(Device& dev, ProgramCache& cache, const Buffer& w, const Buffer& g, const Buffer& m,
           const Buffer& v, uint64_t n, float lr, float beta1, float beta2, float eps,
           uint32_t step) {
    check_shape("adam", n, 1);
    check_args("adam", {{&w, "w", n}, {&g, "g", n}, {&m, "m", n}, {&v, "v", n}});
    return run_buffers(dev, cache, VectorOp::Adam, n, 1, {&w, &g, &m, &v},
                       adam_args(adam_scalars(lr, beta1, beta2, eps, step)));
}

// ---- Tensor kernels --------------------------------------------------------------------------

Event add(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b, const Tensor& out) {
    check_same(a, b, "add");
    check_same(a, out, "add");
    return run_tensors(dev, cache, VectorOp::Add, a.elements(), 1, {&a, &b, &out});
}

Event mul(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b, const Tensor& out) {
    check_same(a, b, "mul");
    check_same(a, out, "mul");
    return run_tensors(dev, cache, VectorOp::Mul, a.elements(), 1, {&a, &b, &out});
}

Event scale(Device& dev, ProgramCache& cache, const Tensor& a, float s, const Tensor& out) {
    check_same(a, out, "scale");
    return run_tensors(dev, cache, VectorOp::Scale, a.elements(), 1, {&a, &out}, {s});
}

Event relu(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_same(x, out, "relu");
    return run_tensors(dev, cache, VectorOp::Relu, x.elements(), 1, {&x, &out});
}

Event add_relu(Device& dev, ProgramCache& cache, const Tensor& a, const Tensor& b,
               const Tensor& out) {
    check_same(a, b, "add_relu");
    check_same(a, out, "add_relu");
    return run_tensors(dev, cache, VectorOp::AddRelu, a.elements(), 1, {&a, &b, &out});
}

Event relu_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                const Tensor& dx) {
    check_same(x, dy, "relu_grad");
    check_same(x, dx, "relu_grad");
    return run_tensors(dev, cache, VectorOp::ReluGrad, x.elements(), 1, {&x, &dy, &dx});
}

Event bias_add(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& bias,
               const Tensor& out) {
    check_tensor(bias, 1, x.cols, x, "bias_add", "bias");
    check_same(x, out, "bias_add");
    return run_tensors(dev, cache, VectorOp::BiasAdd, x.rows, x.cols, {&x, &bias, &out});
}

Event row_sum(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_tensor(out, x.rows, 1, x, "row_sum", "out");
    return run_tensors(dev, cache, VectorOp::RowSum, x.rows, x.cols, {&x, &out});
}

Event col_sum(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_tensor(out, 1, x.cols, x, "col_sum", "out");
    return run_tensors(dev, cache, VectorOp::ColSum, x.rows, x.cols, {&x, &out});
}

Event softmax_cross_entropy(Device& dev, ProgramCache& cache, const Tensor& logits,
                            const Tensor& labels_onehot, const Tensor& loss_per_row,
                            const Tensor& dlogits) {
    const char* name = "softmax_cross_entropy";
    check_same(logits, labels_onehot, name);
    check_same(logits, dlogits, name);
    check_tensor(loss_per_row, logits.rows, 1, logits, name, "loss_per_row");
    const float inv_rows = 1.0f / static_cast<float>(logits.rows);
    return run_tensors(dev, cache, VectorOp::SoftmaxCrossEntropy, logits.rows, logits.cols,
                       {&logits, &labels_onehot, &loss_per_row, &dlogits}, {inv_rows});
}

Event sgd_momentum(Device& dev, ProgramCache& cache, const Tensor& w, const Tensor& g,
                   const Tensor& v, float lr, float momentum) {
    check_same(w, g, "sgd_momentum");
    check_same(w, v, "sgd_momentum");
    return run_tensors(dev, cache, VectorOp::SgdMomentum, w.elements(), 1, {&w, &g, &v},
                       {lr, momentum});
}

Event adam(Device& dev, ProgramCache& cache, const Tensor& w, const Tensor& g, const Tensor& m,
           const Tensor& v, float lr, float beta1, float beta2, float eps, uint32_t step) {
    check_same(w, g, "adam");
    check_same(w, m, "adam");
    check_same(w, v, "adam");
    return run_tensors(dev, cache, VectorOp::Adam, w.elements(), 1, {&w, &g, &m, &v},
                       adam_args(adam_scalars(lr, beta1, beta2, eps, step)));
}

// ---- References ------------------------------------------------------------------------------

std::vector<float> add_reference(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
    return out;
}

std::vector<float> mul_reference(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] * b[i];
    return out;
}

std::vector<float> scale_reference(const std::vector<float>& a, float s) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] * s;
    return out;
}

std::vector<float> relu_reference(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = max0(x[i]);
    return out;
}

std::vector<float> add_relu_reference(const std::vector<float>& a, const std::vector<float>& b) {
    return relu_reference(add_reference(a, b));
}

std::vector<float> relu_grad_reference(const std::vector<float>& x, const std::vector<float>& dy) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return out;
}

std::vector<float> bias_add_reference(const std::vector<float>& x, const std::vector<float>& bias,
                                      uint32_t rows, uint32_t cols) {
    std::vector<float> out(size_t(rows) * cols);
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j) out[r * cols + j] = x[r * cols + j] + bias[j];
    return out;
}

std::vector<float> row_sum_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols) {
    std::vector<float> out(rows);
    for (size_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (size_t j = 0; j < cols; ++j) acc = acc + x[r * cols + j];
        out[r] = acc;
    }
    return out;
}

std::vector<float> col_sum_reference(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                                     uint32_t tile_rows) {
    std::vector<float> out(cols), part(cols);
    for (uint32_t r0 = 0; r0 < rows; r0 += tile_rows) {
        std::fill(part.begin(), part.end(), 0.0f);
        for (size_t r = r0; r < std::min(rows, r0 + tile_rows); ++r)
            for (size_t j = 0; j < cols; ++j) part[j] = part[j] + x[r * cols + j];
        for (size_t j = 0; j < cols; ++j) out[j] = r0 == 0 ? part[j] : out[j] + part[j];
    }
    return out;
}

SoftmaxCeResult softmax_cross_entropy_reference(const std::vector<float>& logits,
                                                const std::vector<float>& labels_onehot,
                                                uint32_t rows, uint32_t classes) {
    SoftmaxCeResult res{std::vector<float>(rows), std::vector<float>(size_t(rows) * classes)};
    const float inv_rows = 1.0f / static_cast<float>(rows);
    std::vector<float> z(classes), lp(classes);
    for (size_t r = 0; r < rows; ++r) {
        const float* l = &logits[r * classes];
        const float* y = &labels_onehot[r * classes];
        float m = -INFINITY;
        for (size_t j = 0; j < classes; ++j)
            m = std::isnan(m) || std::isnan(l[j]) ? std::numeric_limits<float>::quiet_NaN()
                                                  : (m > l[j] ? m : l[j]);
        float s = 0.0f;
        for (size_t j = 0; j < classes; ++j) {
            z[j] = l[j] - m;
            s = s + std::exp(z[j]);
        }
        const float ls = std::log(s);
        float acc = 0.0f;
        for (size_t j = 0; j < classes; ++j) {
            lp[j] = z[j] - ls;
            acc = acc + y[j] * lp[j];
        }
        res.loss[r] = acc * -1.0f;
        for (size_t j = 0; j < classes; ++j)
            res.dlogits[r * classes + j] = (std::exp(lp[j]) - y[j]) * inv_rows;
    }
    return res;
}

void sgd_momentum_reference(std::vector<float>& w, const std::vector<float>& g,
                            std::vector<float>& v, float lr, float momentum) {
    for (size_t i = 0; i < w.size(); ++i) {
        v[i] = v[i] * momentum + g[i];
        w[i] = w[i] - v[i] * lr;
    }
}

void adam_reference(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                    std::vector<float>& v, float lr, float beta1, float beta2, float eps,
                    uint32_t step) {
    const AdamScalars k = adam_scalars(lr, beta1, beta2, eps, step);
    for (size_t i = 0; i < w.size(); ++i) {
        m[i] = m[i] * k.beta1 + g[i] * k.one_minus_b1;
        v[i] = v[i] * k.beta2 + (g[i] * g[i]) * k.one_minus_b2;
        const float vh = v[i] * k.c2;
        const float sq = vh != 0.0f ? vh * (1.0f / std::sqrt(vh)) : vh;
        const float r1 = 1.0f / std::sqrt(sq + k.eps);
        w[i] = w[i] - (m[i] * (r1 * r1)) * k.lr_c1;
    }
}

}  // namespace tpu::driver
