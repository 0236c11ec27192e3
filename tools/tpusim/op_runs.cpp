// SPDX-License-Identifier: Apache-2.0
#include "tools/tpusim/op_runs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor.h"
#include "driver/kernels/tensor_ops.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/random_fill.h"
#include "trainer/trainer.h"

namespace tpu::cli {
namespace {

/// Each core's share of `total` rows: even shares, the last ones padded (as XLA pads a
/// sharded dimension), so every replica has one shape.
uint32_t share(uint32_t total, size_t cores) {
    return uint32_t((total + cores - 1) / cores);
}

/// A tensor on `cores` whose replica i holds host[i]: random values in [-1, 1) from `seed`.
struct HostTensor {
    driver::Tensor t;
    std::vector<std::vector<float>> host;
};

HostTensor random_tensor(driver::Device& dev, const std::vector<uint32_t>& cores, uint32_t rows,
                         uint32_t cols, uint32_t seed) {
    HostTensor h{driver::alloc_tensor(dev, cores, rows, cols), {}};
    for (size_t i = 0; i < cores.size(); ++i) {
        h.host.emplace_back(size_t(rows) * cols);
        fill_uniform(h.host.back(), seed + uint32_t(i) * 0x9E3779B9u);
        driver::write_tensor(dev, h.t, i, h.host.back());
    }
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

OpRun run_layernorm(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                    bool check, uint32_t seed) {
    const uint32_t rows = share(rows_total, cores.size());
    const driver::KernelStats before = dev.kernel_totals();
    HostTensor x = random_tensor(dev, cores, rows, cols, seed);
    // PyTorch's initial gain and bias (ones and zeros) would hide a mix-up of the two.
    HostTensor g = random_tensor(dev, cores, 1, cols, seed ^ 0x5555u),
               b = random_tensor(dev, cores, 1, cols, seed ^ 0xAAAAu);
    const driver::Tensor y = driver::alloc_tensor(dev, cores, rows, cols),
                         mean = driver::alloc_tensor(dev, cores, rows, 1),
                         rstd = driver::alloc_tensor(dev, cores, rows, 1);
    const float eps = 1e-5f;
    const driver::Event ev = driver::layer_norm(dev, cache, x.t, g.t, b.t, eps, y, mean, rstd);
    OpRun r = rows_op_run(dev, ev, before, cores.size(), rows_total, cols, rows);
    if (check) {
        std::vector<float> want;
        std::vector<double> exact;
        for (size_t c = 0; c < cores.size(); ++c) {
            const auto& xv = x.host[c];
            const auto ref =
                driver::layer_norm_reference(xv, g.host[c], b.host[c], eps, rows, cols);
            want.insert(want.end(), ref.out.begin(), ref.out.end());
            for (uint32_t i = 0; i < rows; ++i) {
                double m = 0, v = 0;
                for (uint32_t j = 0; j < cols; ++j) m += xv[size_t(i) * cols + j];
                m /= cols;
                for (uint32_t j = 0; j < cols; ++j) {
                    const double d = xv[size_t(i) * cols + j] - m;
                    v += d * d;
                }
                const double inv = 1.0 / std::sqrt(v / cols + double(eps));
                for (uint32_t j = 0; j < cols; ++j)
                    exact.push_back((xv[size_t(i) * cols + j] - m) * inv * g.host[c][j] +
                                    b.host[c][j]);
            }
        }
        compare(r, read_all(dev, y), want, exact);
    }
    return r;
}

OpRun run_softmax(driver::Device& dev, driver::ProgramCache& cache,
                  const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                  bool check, uint32_t seed) {
    const uint32_t rows = share(rows_total, cores.size());
    const driver::KernelStats before = dev.kernel_totals();
    HostTensor x = random_tensor(dev, cores, rows, cols, seed);
    const driver::Tensor y = driver::alloc_tensor(dev, cores, rows, cols);
    const driver::Event ev = driver::softmax(dev, cache, x.t, y);
    OpRun r = rows_op_run(dev, ev, before, cores.size(), rows_total, cols, rows);
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
        compare(r, read_all(dev, y), want, exact);
    }
    return r;
}

OpRun run_attention(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const driver::AttentionShape& shape,
                    bool check, uint32_t seed) {
    driver::AttentionShape core = shape;
    core.batch = share(shape.batch, cores.size());
    const uint32_t rows = core.groups() * core.seq;
    const driver::KernelStats before = dev.kernel_totals();
    HostTensor q = random_tensor(dev, cores, rows, core.dhead, seed),
               k = random_tensor(dev, cores, rows, core.dhead, seed ^ 0x5555u),
               v = random_tensor(dev, cores, rows, core.dhead, seed ^ 0xAAAAu);
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
        compare(r, read_all(dev, o), want, exact);
    }
    return r;
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
            r.host_seconds = tr.step_times().at(0).host_seconds;
        } else {
            const auto h0 = std::chrono::steady_clock::now();
            r.cycles = tr.predict(*model.module, loader).forward_cycles;
            r.host_seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
        }
        r.layers = tr.layer_profiles();
    } catch (const trainer::ConfigError& e) {
        throw InputError(e.what());
    }
    return r;
}

}  // namespace tpu::cli
