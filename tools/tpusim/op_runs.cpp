// SPDX-License-Identifier: Apache-2.0
#include "tools/tpusim/op_runs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "driver/kernels/allreduce.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor.h"
#include "driver/kernels/tensor_ops.h"
#include "hw/ici/ici_costs.h"
#include "sim/tracer.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/random_fill.h"
#include "tools/tpusim/run_output.h"
#include "trainer/trainer.h"

namespace tpu::cli {
namespace {

/// Appends layer norm of `rows` x `cols` row-major `x` in double precision: the exact value the
/// device's fp32 result is compared with.
void exact_layer_norm(const std::vector<float>& x, const std::vector<float>& gamma,
                      const std::vector<float>& beta, float eps, uint32_t rows, uint32_t cols,
                      std::vector<double>& out) {
    for (uint32_t i = 0; i < rows; ++i) {
        const float* row = x.data() + size_t(i) * cols;
        double m = 0, v = 0;
        for (uint32_t j = 0; j < cols; ++j) m += row[j];
        m /= cols;
        for (uint32_t j = 0; j < cols; ++j) v += (row[j] - m) * (row[j] - m);
        const double inv = 1.0 / std::sqrt(v / cols + double(eps));
        for (uint32_t j = 0; j < cols; ++j) out.push_back((row[j] - m) * inv * gamma[j] + beta[j]);
    }
}

/// Random values in [-1, 1) for each core: block i from `seed` + i x golden ratio.
PerCore random_blocks(size_t cores, uint32_t rows, uint32_t cols, uint32_t seed) {
    PerCore host;
    for (size_t i = 0; i < cores; ++i) {
        host.emplace_back(size_t(rows) * cols);
        fill_uniform(host.back(), seed + uint32_t(i) * 0x9E3779B9u);
    }
    return host;
}

/// A tensor on `cores` whose replica i holds host[i] (each rows x cols values).
struct HostTensor {
    driver::Tensor t;
    const PerCore& host;
};

HostTensor upload(driver::Device& dev, const std::vector<uint32_t>& cores, uint32_t rows,
                  uint32_t cols, const PerCore& host, const char* what) {
    if (host.size() != cores.size())
        throw InputError(
            fmt::format("{}: {} blocks for {} cores", what, host.size(), cores.size()));
    for (const auto& h : host)
        if (h.size() != size_t(rows) * cols)
            throw InputError(fmt::format("{}: a block of {} values, expected {} x {}", what,
                                         h.size(), rows, cols));
    HostTensor h{driver::alloc_tensor(dev, cores, rows, cols), host};
    for (size_t i = 0; i < cores.size(); ++i) driver::write_tensor(dev, h.t, i, host[i]);
    return h;
}

/// The results of every replica of `t`, concatenated.
std::vector<float> read_all(driver::Device& dev, const driver::Tensor& t) {
    std::vector<float> out;
    for (size_t i = 0; i < t.cores.size(); ++i) {
        const std::vector<float> v = driver::read_tensor(dev, t, i);
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

/// Fills the op-independent fields of a run over `cores` whose launches are `ev`: the MXU
/// utilisation of `macs` useful MACs, HBM bytes from the kernel totals since `before`.
void finish_run(OpRun& r, const driver::Device& dev, const driver::Event& ev,
                const driver::KernelStats& before, uint64_t macs, size_t cores) {
    r.event = ev;
    r.macs = macs;
    const double seconds = double(ev.end_cycle - ev.start_cycle) / (dev.config().clock_mhz * 1e6);
    r.mxu_utilization =
        seconds > 0
            ? 2.0 * double(macs) / (dev.config().peak_flops_per_core() * double(cores) * seconds)
            : 0.0;
    r.hbm_bytes = dev.kernel_totals().since(before).hbm_bytes();
}

/// The report of a row-wise VPU op on `rows_total` x `cols` values, `rows` per core.
OpRun rows_op_run(const driver::Device& dev, const driver::Event& ev,
                  const driver::KernelStats& before, size_t cores, uint32_t rows_total,
                  uint32_t cols, uint32_t rows) {
    OpRun r;
    r.params = {{"rows", rows_total}, {"cols", cols}};
    r.plan = fmt::format("{} rows per core, streamed through VMEM in row tiles (VPU)", rows);
    finish_run(r, dev, ev, before, 0, cores);
    return r;
}

/// Each core's share of `total` in 64 bits (the same even shares as share()).
uint64_t share64(uint64_t total, size_t cores) {
    return (total + cores - 1) / cores;
}

/// A rows x cols op as PyTorch/XLA runs it: recorded lazily, compiled into one program
/// (compiler/), run on the device backend over `cores` (one launch), and the same recording
/// run on the host evaluator for --check. `record` builds the op on x and returns its result.
struct CompiledRowsOp {
    OpRun run;
    std::vector<float> device, host;  ///< every core's result in core order (when asked)
};

using RecordRows = std::function<compiler::ValueId(compiler::Graph&, compiler::ValueId,
                                                   const std::vector<compiler::ValueId>&)>;

/// The compiled op, or nothing (with `why` set) when the code generator does not yet cover its
/// shape (compiler::NotYetGenerated, e.g. rows that do not fill T(8,128) tiles): then nothing
/// has touched the device and the caller runs its hand-written kernel instead.
std::optional<CompiledRowsOp> run_compiled_rows(
    driver::Device& dev, const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
    const PerCore& xs, const std::vector<std::pair<std::string, PerCore>>& params, bool check,
    bool keep_result, const RecordRows& record, std::string& why) {
    using namespace compiler;
    const uint32_t rows = core_share(rows_total, cores.size());
    for (const auto& h : xs)
        if (h.size() != size_t(rows) * cols)
            throw InputError(
                fmt::format("a block of {} values, expected {} x {}", h.size(), rows, cols));
    if (xs.size() != cores.size())
        throw InputError(fmt::format("{} blocks for {} cores", xs.size(), cores.size()));
    CompileOptions co;
    co.board = dev.config();
    CodegenOptions cg;
    cg.board = dev.config();
    CompiledRowsOp c;
    // Records the op in a fresh context on `backend` and runs it as one step; returns every
    // core's result (when `read`) and the compiled step.
    const auto run_on = [&](Backend& backend, bool read, std::vector<float>& out,
                            const std::function<void(const CompiledStep&)>& after_step) {
        LazyContext ctx(backend, co);
        const LazyTensor x = ctx.input("x", Shape{DType::F32, {rows, cols}}, xs);
        std::vector<LazyTensor> ps;
        for (const auto& [name, v] : params)
            ps.push_back(ctx.parameter(name, Shape{DType::F32, {cols}}, v));
        std::vector<ValueId> pv;
        for (const LazyTensor& p : ps) pv.push_back(ctx.value(p));
        const LazyTensor y = ctx.wrap(record(ctx.graph(), ctx.value(x), pv), "y");
        ctx.mark_step();
        if (after_step) after_step(*ctx.last_step());
        if (read)
            for (size_t r = 0; r < cores.size(); ++r) {
                const auto v = ctx.to_host(y, r);
                out.insert(out.end(), v.begin(), v.end());
            }
    };
    const driver::KernelStats before = dev.kernel_totals();
    DeviceBackend device(dev, cores, cg);
    try {
        // The device run: uploads, one launch, and the reads only when a result is wanted.
        run_on(device, check || keep_result, c.device, [&](const CompiledStep& step) {
            finish_run(c.run, dev, device.stats().last_launch, before, 0, cores.size());
            std::string kinds;
            for (const Fusion& f : step.fusions)
                kinds += (kinds.empty() ? "" : " ") + std::string(fusion_kind_name(f.kind));
            c.run.plan = fmt::format(
                "{} rows per core; one program of {} fusions ({}), {} launch, compiled in {:.3f} "
                "s + code generation {:.3f} s",
                rows, step.fusions.size(), kinds, device.stats().launches, step.compile_seconds,
                device.stats().codegen_seconds);
        });
    } catch (const NotYetGenerated& e) {
        why = e.what();
        return std::nullopt;
    }
    c.run.params = {{"rows", rows_total}, {"cols", cols}};
    if (check) {
        HostBackend host(cores.size(), EvalOptions{.mxu_rows = dev.config().core.mxu_rows,
                                                   .vpu_lanes = dev.config().core.vpu_lanes});
        run_on(host, true, c.host, nullptr);
    }
    return c;
}

/// The hand-written layer-norm kernel (driver/kernels), for shapes the code generator does not
/// cover yet (`why` names what).
OpRun run_layernorm_kernel(const std::string& why, driver::Device& dev, driver::ProgramCache& cache,
                           const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                           const PerCore& xs, const PerCore& gammas, const PerCore& betas,
                           bool check, bool keep_result) {
    const uint32_t rows = core_share(rows_total, cores.size());
    const driver::KernelStats before = dev.kernel_totals();
    HostTensor x = upload(dev, cores, rows, cols, xs, "layernorm x");
    HostTensor g = upload(dev, cores, 1, cols, gammas, "layernorm gamma"),
               b = upload(dev, cores, 1, cols, betas, "layernorm beta");
    const driver::Tensor y = driver::alloc_tensor(dev, cores, rows, cols),
                         mean = driver::alloc_tensor(dev, cores, rows, 1),
                         rstd = driver::alloc_tensor(dev, cores, rows, 1);
    const float eps = 1e-5f;
    const driver::Event ev = driver::layer_norm(dev, cache, x.t, g.t, b.t, eps, y, mean, rstd);
    OpRun r = rows_op_run(dev, ev, before, cores.size(), rows_total, cols, rows);
    r.plan += fmt::format(" (hand-written kernel: {})", why);
    if (check) {
        std::vector<float> want;
        std::vector<double> exact;
        for (size_t c = 0; c < cores.size(); ++c) {
            const auto& xv = x.host[c];
            const auto ref =
                driver::layer_norm_reference(xv, g.host[c], b.host[c], eps, rows, cols);
            want.insert(want.end(), ref.out.begin(), ref.out.end());
            exact_layer_norm(xv, g.host[c], b.host[c], eps, rows, cols, exact);
        }
        r.result = read_all(dev, y);
        compare(r, r.result, want, exact);
    } else if (keep_result) {
        r.result = read_all(dev, y);
    }
    return r;
}

/// The hand-written softmax kernel (driver/kernels), for shapes the code generator does not
/// cover yet (`why` names what).
OpRun run_softmax_kernel(const std::string& why, driver::Device& dev, driver::ProgramCache& cache,
                         const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                         const PerCore& xs, bool check, bool keep_result) {
    const uint32_t rows = core_share(rows_total, cores.size());
    const driver::KernelStats before = dev.kernel_totals();
    HostTensor x = upload(dev, cores, rows, cols, xs, "softmax x");
    const driver::Tensor y = driver::alloc_tensor(dev, cores, rows, cols);
    const driver::Event ev = driver::softmax(dev, cache, x.t, y);
    OpRun r = rows_op_run(dev, ev, before, cores.size(), rows_total, cols, rows);
    r.plan += fmt::format(" (hand-written kernel: {})", why);
    if (check) {
        std::vector<float> want;
        std::vector<double> exact;
        for (size_t c = 0; c < cores.size(); ++c) {
            const auto ref = driver::softmax_reference(x.host[c], rows, cols);
            want.insert(want.end(), ref.begin(), ref.end());
            for (uint32_t i = 0; i < rows; ++i) {
                const float* row = x.host[c].data() + size_t(i) * cols;
                const double m = *std::max_element(row, row + cols);
                double sum = 0;
                for (uint32_t j = 0; j < cols; ++j) sum += std::exp(row[j] - m);
                for (uint32_t j = 0; j < cols; ++j) exact.push_back(std::exp(row[j] - m) / sum);
            }
        }
        r.result = read_all(dev, y);
        compare(r, r.result, want, exact);
    } else if (keep_result) {
        r.result = read_all(dev, y);
    }
    return r;
}

}  // namespace

void check_rows_op(const hw::BoardConfig& cfg, size_t cores, uint64_t rows_total, uint64_t cols,
                   const SizeName& name) {
    const uint64_t rows = share64(rows_total, cores);
    check_core_bytes(
        cfg, fmt::format("{} x {}", name("rows", rows_total), name("cols", cols)),
        fmt::format("each core's input and output ({} rows of {} fp32 values each)", rows, cols),
        product({2, rows, cols, 4}));
}

void check_attention(const hw::BoardConfig& cfg, size_t cores, const driver::AttentionShape& s,
                     const SizeName& name) {
    const uint64_t rows = product({share64(s.batch, cores), s.heads, s.seq});
    // Q, K, V and O are rows x dhead, the probabilities P rows x seq.
    check_core_bytes(
        cfg,
        fmt::format("{} x {} x {} x {}", name("batch", s.batch), name("heads", s.heads),
                    name("seq", s.seq), name("dhead", s.dhead)),
        fmt::format("each core's Q, K, V, O ({} rows x {} fp32 values) and P ({} rows x {})", rows,
                    s.dhead, rows, s.seq),
        product({rows, 4}) > UINT64_MAX / 2 ? UINT64_MAX
                                            : product({rows, 4 * uint64_t(s.dhead) + s.seq, 4}));
}

void check_conv2d(const hw::BoardConfig& cfg, size_t cores, const driver::Conv2dShape& s,
                  const SizeName& name) {
    const std::string inputs = fmt::format(
        "{} x {} x {} x {} x {} with {}, {} and {}", name("batch", s.batch),
        name("height", s.height), name("width", s.width), name("cin", s.cin), name("cout", s.cout),
        name("kernel", s.kernel), name("stride", s.stride), name("pad", s.pad));
    driver::Conv2dShape core = s;
    core.batch = static_cast<uint32_t>(share64(s.batch, cores));
    try {
        core.validate();
    } catch (const driver::DeviceError& e) {
        throw InputError(fmt::format("{}: {}", inputs, e.what()));
    }
    // validate() bounds every size below 2^32, so the output dims are exact here.
    const uint64_t x = product({core.batch, s.height, s.width, s.cin, 4}),
                   y = product({core.batch, core.out_height(), core.out_width(), s.cout, 4}),
                   w = product({s.kernel, s.kernel, s.cin, s.cout, 4});
    check_core_bytes(cfg, inputs,
                     fmt::format("each core's input ({} images), weights and output", core.batch),
                     x > UINT64_MAX - w - y ? UINT64_MAX : x + w + y);
}

void check_gemm(const hw::BoardConfig& cfg, size_t cores, uint64_t M, uint64_t K, uint64_t N,
                driver::Precision precision, const SizeName& name) {
    // bf16 parts of A and W (one per MXU pass), fp32 C; every element lives on some core.
    uint64_t parts = 0;
    for (const auto& [ap, wp] : driver::mxu_passes(precision))
        parts = std::max<uint64_t>(parts, std::max(ap, wp) + 1);
    const uint64_t a = product({parts, M, K, 2}), w = product({parts, K, N, 2}),
                   c = product({M, N, 4});
    const uint64_t all = a > UINT64_MAX - w - c ? UINT64_MAX : a + w + c;
    check_core_bytes(
        cfg, fmt::format("{} x {} x {}", name("m", M), name("k", K), name("n", N)),
        fmt::format("the largest core's share of A, W and C ({}, split over {} core{})",
                    driver::precision_name(precision), cores, cores == 1 ? "" : "s"),
        all == UINT64_MAX ? all : share64(all, cores));
}

void check_model(const hw::BoardConfig& cfg, const std::string& model,
                 const trainer::ZooOptions& options, uint64_t batch, size_t cores, bool train_step,
                 const SizeName& name) {
    // Each core's share of the examples goes to the device in one step: check it (and so the
    // host copy of the whole batch) before anything is allocated.
    const uint64_t per_example = trainer::zoo_example_values(model, options, train_step);
    const uint64_t share = share64(batch, cores);
    if (per_example != 0)
        check_core_bytes(cfg, name("batch", batch),
                         fmt::format("each core's {} example{} ({} fp32 input and label values "
                                     "each)",
                                     share, share == 1 ? "" : "s", per_example),
                         product({share, per_example, 4}));
}

void check_allreduce(const hw::BoardConfig& cfg, uint64_t elements, const SizeName& name) {
    check_core_bytes(cfg, name("elements", elements), "each core's tensor", product({elements, 4}));
}

/// Fills the --check fields from the device result, the bit-exact reference and fp64.
void compare(OpRun& r, const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<double>& exact) {
    r.bitexact = got.size() == want.size() &&
                 std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
    double scale = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
        r.max_abs_error = std::max(r.max_abs_error, std::abs(double(got[i]) - exact[i]));
        scale = std::max(scale, std::abs(exact[i]));
    }
    r.max_rel_error = scale > 0 ? r.max_abs_error / scale : 0;
}

uint32_t core_share(uint32_t total, size_t cores) {
    return uint32_t((total + cores - 1) / cores);
}

OpRun run_layernorm(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                    bool check, uint32_t seed) {
    const uint32_t rows = core_share(rows_total, cores.size());
    // PyTorch's initial gain and bias (ones and zeros) would hide a mix-up of the two.
    return run_layernorm(dev, cache, cores, rows_total, cols,
                         random_blocks(cores.size(), rows, cols, seed),
                         random_blocks(cores.size(), 1, cols, seed ^ 0x5555u),
                         random_blocks(cores.size(), 1, cols, seed ^ 0xAAAAu), check, false);
}

OpRun run_layernorm(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                    const PerCore& xs, const PerCore& gammas, const PerCore& betas, bool check,
                    bool keep_result) {
    const uint32_t rows = core_share(rows_total, cores.size());
    const float eps = 1e-5f;
    std::string why;
    std::optional<CompiledRowsOp> compiled = run_compiled_rows(
        dev, cores, rows_total, cols, xs, {{"weight", gammas}, {"bias", betas}}, check, keep_result,
        [&](compiler::Graph& g, compiler::ValueId x, const std::vector<compiler::ValueId>& p) {
            return compiler::layer_norm(g, x, p[0], p[1], eps).y;
        },
        why);
    if (!compiled)
        return run_layernorm_kernel(why, dev, cache, cores, rows_total, cols, xs, gammas, betas,
                                    check, keep_result);
    CompiledRowsOp& c = *compiled;
    OpRun r = std::move(c.run);
    if (check) {
        std::vector<double> exact;
        for (size_t k = 0; k < cores.size(); ++k) {
            const auto& xv = xs[k];
            exact_layer_norm(xv, gammas[k], betas[k], eps, rows, cols, exact);
        }
        compare(r, c.device, c.host, exact);
    }
    if (check || keep_result) r.result = std::move(c.device);
    return r;
}

OpRun run_softmax(driver::Device& dev, driver::ProgramCache& cache,
                  const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                  bool check, uint32_t seed) {
    const uint32_t rows = core_share(rows_total, cores.size());
    return run_softmax(dev, cache, cores, rows_total, cols,
                       random_blocks(cores.size(), rows, cols, seed), check, false);
}

OpRun run_softmax(driver::Device& dev, driver::ProgramCache& cache,
                  const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                  const PerCore& xs, bool check, bool keep_result) {
    const uint32_t rows = core_share(rows_total, cores.size());
    std::string why;
    std::optional<CompiledRowsOp> compiled = run_compiled_rows(
        dev, cores, rows_total, cols, xs, {}, check, keep_result,
        [&](compiler::Graph& g, compiler::ValueId x, const std::vector<compiler::ValueId>&) {
            return compiler::softmax(g, x, 1);
        },
        why);
    if (!compiled)
        return run_softmax_kernel(why, dev, cache, cores, rows_total, cols, xs, check, keep_result);
    CompiledRowsOp& c = *compiled;
    OpRun r = std::move(c.run);
    if (check) {
        std::vector<double> exact;
        for (size_t k = 0; k < cores.size(); ++k)
            for (uint32_t i = 0; i < rows; ++i) {
                const float* row = xs[k].data() + size_t(i) * cols;
                const double m = *std::max_element(row, row + cols);
                double sum = 0;
                for (uint32_t j = 0; j < cols; ++j) sum += std::exp(row[j] - m);
                for (uint32_t j = 0; j < cols; ++j) exact.push_back(std::exp(row[j] - m) / sum);
            }
        compare(r, c.device, c.host, exact);
    }
    if (check || keep_result) r.result = std::move(c.device);
    return r;
}

namespace {

/// PyTorchSim's attention graph (../shared/validation/README.md, "attention") as PyTorch/XLA
/// compiles it: q, k, v [G, S, d] (G = sequences x heads per core), `scores = k q^T / sqrt(d)`
/// ([G, keys, queries]), softmax over the keys (dim -2), `v^T p` ([G, d, queries]). One
/// program (compiler/), one launch; nothing when the code generator does not cover the shape
/// (`why` says what: then nothing has touched the device).
std::optional<OpRun> run_attention_compiled(driver::Device& dev, const std::vector<uint32_t>& cores,
                                            const driver::AttentionShape& shape, const PerCore& qs,
                                            const PerCore& ks, const PerCore& vs, bool check,
                                            std::string& why) {
    using namespace compiler;
    if (shape.causal) {
        why = "a causal mask is not part of the compiled attention graph";
        return std::nullopt;
    }
    driver::AttentionShape core = shape;
    core.batch = core_share(shape.batch, cores.size());
    const int64_t G = core.groups(), S = core.seq, D = core.dhead;
    CompileOptions co;
    co.board = dev.config();
    CodegenOptions cg;
    cg.board = dev.config();
    const auto record = [&](Graph& g, ValueId q, ValueId k, ValueId v) {
        DotDims sd;
        sd.lhs_batch = sd.rhs_batch = {0};
        sd.lhs_contracting = sd.rhs_contracting = {2};
        const ValueId sc = dot(g, k, q, sd);
        const ValueId p = softmax(g, div(g, sc, full(g, std::sqrt(double(D)), g.shape(sc))), 1);
        DotDims od;
        od.lhs_batch = od.rhs_batch = {0};
        od.lhs_contracting = od.rhs_contracting = {1};
        return dot(g, v, p, od);
    };
    OpRun r;
    std::vector<float> got, want;
    const auto run_on = [&](Backend& backend, std::vector<float>* out,
                            const std::function<void(const CompiledStep&)>& after) {
        LazyContext ctx(backend, co);
        const Shape in{DType::F32, {G, S, D}};
        const LazyTensor q = ctx.input("query", in, qs), k = ctx.input("key", in, ks),
                         v = ctx.input("value", in, vs);
        const LazyTensor o =
            ctx.wrap(record(ctx.graph(), ctx.value(q), ctx.value(k), ctx.value(v)), "out");
        ctx.mark_step();
        if (after) after(*ctx.last_step());
        if (out)
            for (size_t c = 0; c < cores.size(); ++c) {
                const auto x = ctx.to_host(o, c);
                out->insert(out->end(), x.begin(), x.end());
            }
    };
    const driver::KernelStats before = dev.kernel_totals();
    DeviceBackend device(dev, cores, cg);
    try {
        run_on(device, check ? &got : nullptr, [&](const CompiledStep& step) {
            finish_run(r, dev, device.stats().last_launch, before,
                       2ull * uint64_t(G * S * S * D) * cores.size(), cores.size());
            std::string kinds;
            for (const Fusion& f : step.fusions)
                kinds += (kinds.empty() ? "" : " ") + std::string(fusion_kind_name(f.kind));
            r.plan = fmt::format(
                "{} sequence{} x {} heads per core, [heads, seq, dhead] operands; PyTorchSim's "
                "graph (k q^T / sqrt(d), softmax over the keys, v^T p: out [heads, dhead, seq]) "
                "compiled into one program of {} fusions ({}), {} launch",
                core.batch, core.batch == 1 ? "" : "s", core.heads, step.fusions.size(), kinds,
                device.stats().launches);
        });
    } catch (const NotYetGenerated& e) {
        why = e.what();
        return std::nullopt;
    }
    r.params = {{"batch", shape.batch},
                {"heads", shape.heads},
                {"seq", shape.seq},
                {"dhead", shape.dhead},
                {"causal", shape.causal}};
    if (check) {
        HostBackend host(cores.size(), EvalOptions{.mxu_rows = dev.config().core.mxu_rows,
                                                   .vpu_lanes = dev.config().core.vpu_lanes});
        run_on(host, &want, nullptr);
        std::vector<double> exact;
        for (size_t c = 0; c < cores.size(); ++c)
            for (int64_t g = 0; g < G; ++g) {
                // p[j][i]: softmax over the keys j of k_j . q_i / sqrt(d); out[d][i] = sum_j
                // p[j][i] v[j][d].
                std::vector<double> o(static_cast<size_t>(D * S), 0.0);
                for (int64_t i = 0; i < S; ++i) {
                    std::vector<double> e(static_cast<size_t>(S));
                    double m = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < S; ++j) {
                        double dotv = 0;
                        for (int64_t d = 0; d < D; ++d)
                            dotv += double(ks[c][size_t((g * S + j) * D + d)]) *
                                    qs[c][size_t((g * S + i) * D + d)];
                        e[size_t(j)] = dotv / std::sqrt(double(D));
                        m = std::max(m, e[size_t(j)]);
                    }
                    for (double& x : e) sum += (x = std::exp(x - m));
                    for (int64_t j = 0; j < S; ++j)
                        for (int64_t d = 0; d < D; ++d)
                            o[size_t(d * S + i)] +=
                                e[size_t(j)] / sum * vs[c][size_t((g * S + j) * D + d)];
                }
                exact.insert(exact.end(), o.begin(), o.end());
            }
        compare(r, got, want, exact);
        r.result = std::move(got);
    }
    return r;
}

}  // namespace

OpRun run_attention(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const driver::AttentionShape& shape,
                    bool check, uint32_t seed, const std::string& engine) {
    driver::AttentionShape core = shape;
    core.batch = core_share(shape.batch, cores.size());
    const uint32_t rows = core.groups() * core.seq;
    if (engine != "library") {
        std::string why;
        const PerCore q = random_blocks(cores.size(), rows, core.dhead, seed),
                      k = random_blocks(cores.size(), rows, core.dhead, seed ^ 0x5555u),
                      v = random_blocks(cores.size(), rows, core.dhead, seed ^ 0xAAAAu);
        if (auto r = run_attention_compiled(dev, cores, shape, q, k, v, check, why)) return *r;
        if (engine == "compiled")
            throw InputError("attention: the compiled engine does not cover this shape: " + why);
        OpRun r = run_attention(dev, cache, cores, shape, q, k, v, check, false);
        r.plan += fmt::format(" (the library's fused kernel: {})", why);
        return r;
    }
    return run_attention(
        dev, cache, cores, shape, random_blocks(cores.size(), rows, core.dhead, seed),
        random_blocks(cores.size(), rows, core.dhead, seed ^ 0x5555u),
        random_blocks(cores.size(), rows, core.dhead, seed ^ 0xAAAAu), check, false);
}

OpRun run_attention(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const driver::AttentionShape& shape,
                    const PerCore& qs, const PerCore& ks, const PerCore& vs, bool check,
                    bool keep_result) {
    driver::AttentionShape core = shape;
    core.batch = core_share(shape.batch, cores.size());
    const uint32_t rows = core.groups() * core.seq;
    const driver::KernelStats before = dev.kernel_totals();
    HostTensor q = upload(dev, cores, rows, core.dhead, qs, "attention q"),
               k = upload(dev, cores, rows, core.dhead, ks, "attention k"),
               v = upload(dev, cores, rows, core.dhead, vs, "attention v");
    const driver::Tensor o = driver::alloc_tensor(dev, cores, rows, core.dhead),
                         p = driver::alloc_tensor(dev, cores, rows, core.seq);
    const driver::Event ev = driver::attention(dev, cache, core, q.t, k.t, v.t, o, p);
    OpRun r;
    r.params = {{"batch", shape.batch},
                {"heads", shape.heads},
                {"seq", shape.seq},
                {"dhead", shape.dhead},
                {"causal", shape.causal}};
    r.plan = fmt::format(
        "{} sequence{} x {} heads per core, layout [batch, heads, seq, dhead]; Q Kᵀ and P V "
        "on the MXU, scale, mask and softmax on the VPU",
        core.batch, core.batch == 1 ? "" : "s", core.heads);
    // Q Kᵀ and P V: seq x seq x dhead each per (sequence, head).
    finish_run(r, dev, ev, before,
               2ull * core.groups() * core.seq * core.seq * core.dhead * cores.size(),
               cores.size());
    if (check) {
        std::vector<float> want;
        std::vector<double> exact;
        const uint32_t S = core.seq, D = core.dhead;
        for (size_t c = 0; c < cores.size(); ++c) {
            const auto ref = driver::attention_reference(core, q.host[c], k.host[c], v.host[c],
                                                         dev.config().core.mxu_rows);
            want.insert(want.end(), ref.o.begin(), ref.o.end());
            for (uint32_t g = 0; g < core.groups(); ++g)
                for (uint32_t i = 0; i < S; ++i) {
                    std::vector<double> sc(S);
                    double m = -INFINITY, sum = 0;
                    for (uint32_t j = 0; j < S; ++j) {
                        double dot = 0;
                        for (uint32_t d = 0; d < D; ++d)
                            dot += double(q.host[c][(size_t(g) * S + i) * D + d]) *
                                   k.host[c][(size_t(g) * S + j) * D + d];
                        sc[j] = core.causal && j > i ? -INFINITY : dot / std::sqrt(double(D));
                        m = std::max(m, sc[j]);
                    }
                    for (double& e : sc) sum += (e = std::exp(e - m));
                    for (uint32_t d = 0; d < D; ++d) {
                        double acc = 0;
                        for (uint32_t j = 0; j < S; ++j)
                            acc += sc[j] / sum * v.host[c][(size_t(g) * S + j) * D + d];
                        exact.push_back(acc);
                    }
                }
        }
        r.result = read_all(dev, o);
        compare(r, r.result, want, exact);
    } else if (keep_result) {
        r.result = read_all(dev, o);
    }
    return r;
}

OpRun run_conv2d(driver::Device& dev, driver::ProgramCache& cache,
                 const std::vector<uint32_t>& cores, const driver::Conv2dShape& shape,
                 const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& b, bool check) {
    const driver::Conv2dShape* s = &shape;
    driver::Conv2dResult res = driver::conv2d(dev, cache, x, w, b, *s, cores);
    OpRun r;
    r.params = {{"batch", s->batch}, {"height", s->height}, {"width", s->width},   {"cin", s->cin},
                {"cout", s->cout},   {"kernel", s->kernel}, {"stride", s->stride}, {"pad", s->pad}};
    r.event = res.event;
    r.macs = res.macs;
    r.mxu_utilization = res.mxu_utilization;
    r.hbm_bytes = res.hbm_bytes;
    const driver::Conv2dTiling& t = res.tiling;
    const uint32_t kc = s->kernel * s->kernel * s->cin, R = dev.config().core.mxu_rows;
    if (res.folded)
        r.plan = fmt::format(
            "im2col + GEMM (taps folded into K: {} rows in {} MXU passes instead of {} per "
            "tap), then the bias; im2col(x) written on the device first in {} cycles (not "
            "counted)",
            kc, (kc + R - 1) / R, s->kernel * s->kernel * ((s->cin + R - 1) / R),
            res.pack.end_cycle - res.pack.start_cycle);
    else
        r.plan = fmt::format(
            "implicit GEMM, {} tap x {} Cin tile weight tiles per Cout tile ({}), blocks of {} "
            "image{} x {} output rows, {} stride phase{}, {} MXU{}{}; NHWC/HWIO fp32 packed "
            "into that layout on the device first in {} cycles (not counted)",
            s->kernel * s->kernel, t.CT, t.NT, t.block_images, t.block_images == 1 ? "" : "s",
            t.band_rows, t.phases * t.phases, t.phases == 1 ? "" : "s", t.mxus,
            t.mxus == 1 ? "" : "s", t.cout_split > 1 ? " (a Cout tile each)" : "",
            res.pack.end_cycle - res.pack.start_cycle);
    if (check)
        compare(r, res.y, driver::conv2d_reference(x, w, b, *s, dev.config().core.mxu_rows),
                driver::conv2d_reference_fp64(x, w, b, *s));
    r.result = std::move(res.y);
    return r;
}

OpRun run_allreduce(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const PerCore& x, bool check,
                    bool keep_result) {
    if (x.size() != cores.size())
        throw InputError(fmt::format("allreduce: {} vectors for {} cores", x.size(), cores.size()));
    const auto n = uint32_t(x.empty() ? 0 : x[0].size());
    for (size_t i = 0; i < cores.size(); ++i)
        if (x[i].size() != n)
            throw InputError(fmt::format("allreduce: vector {} has {} values, vector 0 has {}", i,
                                         x[i].size(), n));
    return run_allreduce(
        dev, cache, cores, n, [&](size_t i, std::vector<float>& out) { out = x[i]; }, check,
        keep_result);
}

OpRun run_allreduce(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t n, const AllreduceInput& input,
                    bool check, bool keep_result) {
    // One core has nobody to reduce with (and the formula's bound would be 0 / 0).
    if (cores.size() < 2)
        throw InputError(fmt::format(
            "--cores: an all-reduce needs at least two cores; core {} alone has nothing to "
            "reduce with",
            cores.at(0)));
    // Values leave the device only for --check or a kept result; otherwise digests do.
    const bool read_values = check || keep_result;
    driver::Tensor t = driver::alloc_tensor(dev, cores, 1, n);
    std::vector<std::vector<float>> x(check ? cores.size() : 0);
    std::vector<float> one;
    for (size_t i = 0; i < cores.size(); ++i) {
        if (!read_values && !(dev.config().sim.functional && dev.board().owns(cores[i]))) {
            dev.write_timing(t.bufs[i], t.bytes());
            continue;
        }
        std::vector<float>& xi = check ? x[i] : one;
        xi.resize(n);
        input(i, xi);
        driver::write_tensor(dev, t, i, xi);
    }
    const driver::KernelStats before = dev.kernel_totals();
    OpRun r;
    r.params = {{"elements", n}};
    r.event = driver::allreduce(dev, cache, t);
    r.hbm_bytes = dev.kernel_totals().since(before).hbm_bytes();
    // The collective's own bound (hw/README.md, "All-reduce bounds"), of the algorithm the
    // planner chose: the torus's on a torus board where it is lower, else the ring's.
    const hw::BoardConfig& cfg = dev.config();
    const uint64_t S = uint64_t(n) * 4;
    const hw::IciCosts costs = hw::ici_costs(cfg);
    const bool torus = driver::plan_allreduce_torus(cfg, cores, n).has_value();
    const hw::TorusShape shape = hw::torus_shape(cfg.ici, cfg.cores());
    const double formula =
        torus ? hw::allreduce_torus_bound(costs, {shape.x, shape.y, shape.z}, S)
              : hw::allreduce_ring_bound(costs, static_cast<uint32_t>(cores.size()), S);
    const uint64_t cycles = r.event.end_cycle - r.event.start_cycle;
    r.plan = torus ? fmt::format(
                         "torus all-reduce (sum) over {} cores ({} x {} x {}), reduce-scatter "
                         "and all-gather along each dimension; formula sum over dimensions of "
                         "2(n-1)/n x S_i / (2 x link) + 2(n-1) x hop = {:.0f} cycles, "
                         "simulated / formula = {:.3f}",
                         cores.size(), shape.x, shape.y, shape.z, formula, double(cycles) / formula)
                   : fmt::format(
                         "ring all-reduce (sum) over {} cores in both directions; formula "
                         "2(N-1)/N x S / (2 x link) + 2(N-1) x hop = {:.0f} cycles, "
                         "simulated / formula = {:.3f}",
                         cores.size(), formula, double(cycles) / formula);
    // Every replica should equal the one reference: compare each against it, rather than
    // against N copies of it (at 128 cores x 16 MiB those would be gigabytes).
    std::vector<float> want;
    std::vector<double> exact;
    if (check) {
        want = driver::allreduce_reference(cfg, cores, x, 1.0f);
        exact.assign(n, 0.0);
        for (const auto& xi : x)
            for (uint32_t j = 0; j < n; ++j) exact[j] += xi[j];
        r.bitexact = true;
    }
    // A digest of every replica's bytes, so runs (and process splits) compare for identity;
    // without values to read only the digests leave the ranks that simulate the cores.
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < cores.size(); ++i) {
        if (!read_values) {
            h = dev.read_digest(t.bufs[i], h);
            continue;
        }
        const std::vector<float> y = driver::read_tensor(dev, t, i);
        for (float v : y) {
            uint32_t b;
            std::memcpy(&b, &v, 4);
            for (int k = 0; k < 4; ++k) h = (h ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
        }
        if (keep_result) r.result.insert(r.result.end(), y.begin(), y.end());
        if (!check) continue;
        OpRun one;
        compare(one, y, want, exact);
        r.bitexact = r.bitexact && one.bitexact;
        r.max_abs_error = std::max(r.max_abs_error, one.max_abs_error);
        r.max_rel_error = std::max(r.max_rel_error, one.max_rel_error);
    }
    r.digest = fmt::format("{:016x}", h);
    return r;
}

nlohmann::ordered_json op_json(const std::string& kind, const OpRun& r, size_t cores,
                               const hw::BoardConfig& cfg, bool check) {
    const uint64_t cycles = r.event.end_cycle - r.event.start_cycle;
    const double seconds = double(cycles) / (cfg.clock_mhz * 1e6);
    nlohmann::ordered_json j;
    j["op"] = kind;
    for (const auto& [key, value] : r.params.items()) j[key] = value;
    j["cores"] = cores;
    j["cycles"] = cycles;
    j["simulated_seconds"] = seconds;
    j["mxu_utilization"] = r.mxu_utilization;
    j["tflops"] = seconds > 0 ? 2.0 * double(r.macs) / seconds / 1e12 : 0.0;
    j["macs"] = r.macs;
    j["hbm_bytes"] = r.hbm_bytes;
    j["host_seconds"] = r.event.host_seconds;
    j["plan"] = r.plan;
    if (check) {
        j["bitexact"] = r.bitexact;
        j["max_abs_error"] = r.max_abs_error;
        j["max_rel_error"] = r.max_rel_error;
    }
    if (!r.digest.empty()) j["result_fnv1a"] = r.digest;
    return j;
}

nlohmann::ordered_json gemm_json(const driver::GemmResult& r, uint32_t M, uint32_t K, uint32_t N,
                                 size_t cores, driver::Precision precision,
                                 const hw::BoardConfig& cfg) {
    const uint64_t cycles = r.event.end_cycle - r.event.start_cycle;
    const double seconds = cfg.clock().seconds(double(cycles));
    nlohmann::ordered_json j;
    j["m"] = M;
    j["k"] = K;
    j["n"] = N;
    j["cores"] = cores;
    j["precision"] = driver::precision_name(precision);
    j["cycles"] = cycles;
    j["simulated_seconds"] = seconds;
    j["mxu_utilization"] = r.mxu_utilization;
    j["tflops"] = 2.0 * M * K * N / seconds / 1e12;
    j["host_seconds"] = r.event.host_seconds;
    j["split"] = fmt::format("{}x{}", r.split.gm, r.split.gn);
    j["block_rows"] = r.tiling.block_rows;
    j["a_stream"] = r.tiling.a_stream;
    j["hbm_bytes"] = r.hbm_bytes;
    j["min_hbm_bytes"] = r.min_hbm_bytes;
    j["roofline_cycles"] = r.roofline_cycles;
    return j;
}

ModelRun run_model(driver::Device& dev, const std::string& name, const trainer::ZooOptions& options,
                   uint32_t batch, const std::vector<uint32_t>& cores, bool train_step,
                   const std::string& precision) {
    // The model's own sizes first (they name the option at fault), then its inputs per core.
    try {
        trainer::check_zoo_options(name, options, batch);
    } catch (const std::invalid_argument& e) {
        throw InputError(e.what());
    }
    check_model(dev.config(), name, options, batch, cores.size(), train_step, option_names());
    const uint64_t share = share64(batch, cores.size());
    trainer::ZooModel model;
    trainer::ZooOptions zoo = options;
    zoo.values = dev.config().sim.functional;  // a timing-only board uploads no input values
    try {
        model = trainer::make_zoo_model(name, zoo, batch, train_step);
    } catch (const std::invalid_argument& e) {
        throw InputError(e.what());
    }
    trainer::TrainerOptions topts;
    topts.cores = cores;
    topts.precision = precision;
    topts.enable_progress_bar = false;
    topts.limit_train_batches = 1;
    ModelRun r;
    r.description = model.description;
    try {
        trainer::Trainer tr(dev, topts);
        const trainer::DataLoader loader{&model.input, static_cast<uint32_t>(share), false, false,
                                         0};
        if (train_step) {
            tr.fit(*model.module, loader);
            r.cycles = tr.step_times().at(0).cycles;
            r.begin_cycle = tr.step_times().at(0).begin_cycle;
            r.host_seconds = tr.step_times().at(0).host_seconds;
        } else {
            const auto h0 = std::chrono::steady_clock::now();
            const trainer::PredictResult p = tr.predict(*model.module, loader);
            r.cycles = p.forward_cycles;
            r.begin_cycle = p.begin_cycle;
            r.host_seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
        }
        r.layers = tr.layer_profiles();
    } catch (const trainer::ConfigError& e) {
        throw InputError(e.what());
    }
    return r;
}

nlohmann::ordered_json model_json(const ModelRun& run, const std::string& name, uint32_t batch,
                                  size_t cores, bool train_step, const std::string& precision,
                                  driver::Device& dev) {
    const hw::BoardConfig& cfg = dev.config();
    nlohmann::ordered_json j;
    j["model"] = name;
    j["description"] = run.description;
    j["mode"] = train_step ? "train-step" : "inference";
    j["batch"] = batch;
    j["cores"] = cores;
    j["precision"] = precision;
    j["cycles"] = run.cycles;
    j["simulated_seconds"] = cfg.clock().seconds(double(run.cycles));
    j["run_cycles"] = dev.now_cycle();
    j["run_simulated_seconds"] = cfg.clock().seconds(double(dev.now_cycle()));
    j["host_seconds"] = run.host_seconds;
    uint64_t flops = 0;
    auto& jl = j["layers"] = nlohmann::ordered_json::array();
    for (const auto& l : run.layers) {
        flops += l.work.flops();
        jl.push_back({{"name", l.name},
                      {"kind", l.kind},
                      {"cycles", l.work.cycles},
                      {"launches", l.work.launches},
                      {"flops", l.work.flops()},
                      {"mxu_utilization", l.work.mxu_utilization()},
                      {"hbm_bytes", l.work.hbm_bytes()}});
    }
    j["flops"] = flops;
    j["energy"] = energy_json(estimate_energy(dev.board(), dev.kernel_stats()));
    return j;
}

void trace_model(sim::Tracer* tracer, const ModelRun& run, const std::string& name, uint32_t batch,
                 bool train_step) {
    if (!tracer) return;
    const int track = tracer->track("host", "layers");
    for (const auto& l : run.layers)
        for (const auto& [begin, end] : l.spans)
            tracer->complete(track, l.name, begin, end, {{"kind", std::string_view(l.kind)}});
    // The span the command reports (the report's headline), beside the whole run.
    tracer->complete(tracer->track("host", "model"), train_step ? "training step" : "inference",
                     run.begin_cycle, run.begin_cycle + run.cycles,
                     {{"model", std::string_view(name)}, {"batch", uint64_t(batch)}});
}

}  // namespace tpu::cli
