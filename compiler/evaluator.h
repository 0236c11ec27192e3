// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "compiler/compiled_step.h"
#include "compiler/ir.h"

/// The host evaluator (compiler/README.md, "Evaluator"): the IR's reference semantics on the
/// host, used to check that passes preserve values and as the CPU fallback. fp32 arithmetic in
/// the order each op defines; a bf16 result is rounded to nearest even; contractions, pooling
/// and all-reduce use the driver's host references, so their numerics are the device's.
namespace tpu::compiler {

/// Data that cannot be evaluated (an index outside a table, an unknown custom call).
class EvalError : public std::runtime_error {
public:
    explicit EvalError(const std::string& what) : std::runtime_error(what) {}
};

/// An array on the host: its shape and its elements in row-major order. Elements are doubles
/// that hold the exact f32, bf16, s32 or pred (0/1) value.
struct HostArray {
    Shape shape{};
    std::vector<double> data{};

    /// Zeros of `s`.
    static HostArray zeros(const Shape& s);
    /// From floats (rounded to bf16 when s is bf16).
    static HostArray from_floats(const Shape& s, const std::vector<float>& v);
    /// The elements as floats.
    std::vector<float> floats() const;
};

/// A custom call's host implementation: operands in, the result (of `result`'s shape) out.
using CustomCallFn = std::function<HostArray(const std::vector<HostArray>&, const Shape& result)>;
/// An all-reduce of one vector per replica: their sum times `scale` (EvalOptions::all_reduce).
using AllReduceFn =
    std::function<std::vector<float>(const std::vector<std::vector<float>>& replicas, float scale)>;

/// How to evaluate.
struct EvalOptions {
    /// K per MXU pass (the order of a contraction's sums): the board's core.mxu_rows.
    uint32_t mxu_rows = 128;
    /// Elements per chunk of a reduction (the order of its sums): the board's core.vpu_lanes.
    uint32_t vpu_lanes = 128;
    /// Partial results of a reduction over major dims (rows accumulated per sublane): the
    /// board's core.vpu_sublanes.
    uint32_t vpu_sublanes = 8;
    std::map<std::string, CustomCallFn> custom_calls{};  ///< by target name
    /// An all-reduce's sum over replicas times the scale, in the device's order of fp32
    /// additions; empty: the ring in replica order (driver::allreduce_reference).
    /// device_eval_options() gives a DeviceBackend's (the torus where its code takes the torus).
    AllReduceFn all_reduce{};
};

/// Per replica, the step's leaf data by number (constants come from the graph). A graph without
/// parameters (or inputs) may leave that list empty.
struct Bindings {
    std::vector<std::vector<HostArray>> parameters;  ///< [replica][parameter number]
    std::vector<std::vector<HostArray>> inputs;      ///< [replica][input number]
    /// Replicas (all-reduce sums over them): the longer of the two lists.
    size_t replicas() const { return std::max(parameters.size(), inputs.size()); }
};

/// `a` as bytes in layout `l` (layout_bytes(a.shape, l) of them; padding zero): what the runtime
/// writes to HBM.
std::vector<uint8_t> layout_bytes_of(const HostArray& a, const Layout& l);
/// The array of shape `s` that `mem` holds in layout `l`.
HostArray array_from_layout_bytes(const std::vector<uint8_t>& mem, const Shape& s, const Layout& l);

/// 1 / |y| as the VPU computes it (it has no divide): t = rsqrt(max(y, -y)), then t * t; two
/// roundings, so up to about 1.5 ulp from the correctly rounded reciprocal.
float vpu_reciprocal(float y);
/// x / y as the device computes it (compiler/README.md, "Code generation"): q = x *
/// vpu_reciprocal(y), negated when 0 > y. The evaluator's divide is this, so host and device
/// agree bit for bit; it differs from IEEE x / y by up to about 2 ulp.
float vpu_divide(float x, float y);
/// |x| as the device computes it: max(x, -x) (NaN stays NaN).
float vpu_abs(float x);
/// sqrt(x) as the device computes it (the VPU has rsqrt only): x * rsqrt(x) for x > 0, x itself
/// for +-0, rsqrt(x) (NaN) for x < 0. Within about 1 ulp of sqrt; sqrt(+inf) gives NaN.
float vpu_sqrt(float x);
/// erf(x) as the device computes it: Abramowitz and Stegun 7.1.26 (absolute error <= 1.5e-7),
/// 1 - (a1 t + ... + a5 t^5) exp(-x^2) with t = 1 / (1 + p |x|) (vpu_reciprocal), the sign of x.
float vpu_erf(float x);
/// x^n for an integer 0 <= n <= kVpuPowMax as the device computes it: 1, then n - 1 products
/// left to right (x * x * x); std::pow otherwise (the device does not generate it).
float vpu_pow(float x, float n);
/// The largest integer exponent vpu_pow multiplies out.
inline constexpr int kVpuPowMax = 16;
/// The coefficients of vpu_erf (A&S 7.1.26): p, then a1 .. a5.
inline constexpr float kErfP = 0.3275911f;
inline constexpr float kErfA[5] = {0.254829592f, -0.284496736f, 1.421413741f, -1.453152027f,
                                   1.061405429f};

/// Evaluates a graph without composites (decompose() first) on every replica; returns
/// [replica][output number]. Throws EvalError or CompileError naming the op.
std::vector<std::vector<HostArray>> evaluate(const Graph& g, const Bindings& b,
                                             const EvalOptions& o = {});
/// Runs a compiled step fusion by fusion, each reading its operands from and writing its
/// results to byte buffers at the assigned offsets in the assigned layouts (one temp arena per
/// replica), so overlapping live buffers or inconsistent layouts change the results. Returns
/// [replica][output number]; `parameters_after` (optional) receives each replica's parameters
/// as the step leaves them (in-place updates applied).
std::vector<std::vector<HostArray>> evaluate_compiled(
    const CompiledStep& step, const Bindings& b, const EvalOptions& o = {},
    std::vector<std::vector<HostArray>>* parameters_after = nullptr);

}  // namespace tpu::compiler
