// SPDX-License-Identifier: Apache-2.0
// tpusim op KIND: one library op from HBM to HBM on random inputs, with cycles, MXU
// utilisation, HBM bytes, host seconds and an optional check against the host references.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "driver/kernels/attention.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor.h"
#include "driver/kernels/tensor_ops.h"
#include "hw/board.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/random_fill.h"
#include "tools/tpusim/run_output.h"

namespace tpu::cli {
namespace {

/// What one run of an op reports; a kind fills it.
struct OpRun {
    nlohmann::ordered_json params;  ///< the kind's sizes, as given
    driver::Event event;            ///< the op's launches, merged
    uint64_t macs = 0;              ///< useful multiply-accumulates
    double mxu_utilization = 0;     ///< macs over the cores' MXU peak for the op's cycles
    uint64_t hbm_bytes = 0;         ///< bytes the op's DMAs moved between HBM and VMEM
    std::string plan;               ///< the tiling, one line
    // --check: the device against the bit-exact host reference, and the reference against fp64.
    bool bitexact = false;     ///< device result == host reference, bit for bit
    double max_abs_error = 0;  ///< max |device - fp64|
    double max_rel_error = 0;  ///< max_abs_error / max |fp64|
};

/// Runs the op on `cores` of a fresh device; `check` computes the references too.
using OpRunner =
    std::function<OpRun(driver::Device& dev, driver::ProgramCache& cache,
                        const std::vector<uint32_t>& cores, bool check, uint32_t seed)>;

/// One op kind: its name, help line, and a function that adds its size options to its
/// subcommand and returns the runner that reads them. Adding a kind is one entry in kinds().
struct OpKind {
    const char* name;
    const char* help;
    std::function<OpRunner(CLI::App& cmd)> add_options;
};

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

OpRunner conv2d_options(CLI::App& cmd) {
    // Defaults: the calibration row of validation/tpuv3.csv.
    auto s =
        std::make_shared<driver::Conv2dShape>(driver::Conv2dShape{64, 28, 28, 128, 128, 3, 1, 1});
    cmd.add_option("--batch", s->batch, "images (N)")->check(positive_number());
    cmd.add_option("--height", s->height, "input rows (H)")->check(positive_number());
    cmd.add_option("--width", s->width, "input columns (W)")->check(positive_number());
    cmd.add_option("--cin", s->cin, "input channels")->check(positive_number());
    cmd.add_option("--cout", s->cout, "output channels")->check(positive_number());
    cmd.add_option("--kernel", s->kernel, "kernel rows = columns")->check(positive_number());
    cmd.add_option("--stride", s->stride, "stride")->check(positive_number());
    cmd.add_option("--pad", s->pad, "zero padding on every side");
    return [s](driver::Device& dev, driver::ProgramCache& cache, const std::vector<uint32_t>& cores,
               bool check, uint32_t seed) {
        if (s->kernel > s->height + 2 * s->pad || s->kernel > s->width + 2 * s->pad)
            throw InputError(fmt::format(
                "--kernel {} is larger than the padded input: --height {} and --width {} plus "
                "2 x --pad {} give {}x{}",
                s->kernel, s->height, s->width, s->pad, s->height + 2 * s->pad,
                s->width + 2 * s->pad));
        std::vector<float> x(size_t(s->batch) * s->height * s->width * s->cin),
            w(size_t(s->kernel) * s->kernel * s->cin * s->cout), b(s->cout);
        fill_uniform(x, seed);
        fill_uniform(w, seed ^ 0x80000000u);
        fill_uniform(b, seed ^ 0x40000000u);
        const driver::Conv2dResult res = driver::conv2d(dev, cache, x, w, b, *s, cores);
        OpRun r;
        r.params = {{"batch", s->batch},   {"height", s->height}, {"width", s->width},
                    {"cin", s->cin},       {"cout", s->cout},     {"kernel", s->kernel},
                    {"stride", s->stride}, {"pad", s->pad}};
        r.event = res.event;
        r.macs = res.macs;
        r.mxu_utilization = res.mxu_utilization;
        r.hbm_bytes = res.hbm_bytes;
        const driver::Conv2dTiling& t = res.tiling;
        r.plan = fmt::format(
            "implicit GEMM, {} tap x {} Cin tile weight tiles per Cout tile ({}), blocks of {} "
            "image{} x {} output rows, {} stride phase{}, {} MXU{}",
            s->kernel * s->kernel, t.CT, t.NT, t.block_images, t.block_images == 1 ? "" : "s",
            t.band_rows, t.phases * t.phases, t.phases == 1 ? "" : "s", t.mxus,
            t.mxus == 1 ? "" : "s");
        if (check)
            compare(r, res.y, driver::conv2d_reference(x, w, b, *s, dev.config().core.mxu_rows),
                    driver::conv2d_reference_fp64(x, w, b, *s));
        return r;
    };
}

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

/// --rows and --cols of a row-wise op (layernorm, softmax).
struct RowsShape {
    uint32_t rows = 2048, cols = 768;
};

std::shared_ptr<RowsShape> rows_options(CLI::App& cmd, uint32_t cols) {
    auto s = std::make_shared<RowsShape>(RowsShape{2048, cols});
    cmd.add_option("--rows", s->rows, "rows, split over the cores")->check(positive_number());
    cmd.add_option("--cols", s->cols, "values per row")->check(positive_number());
    return s;
}

OpRunner layernorm_options(CLI::App& cmd) {
    auto s = rows_options(cmd, 768);
    return [s](driver::Device& dev, driver::ProgramCache& cache, const std::vector<uint32_t>& cores,
               bool check, uint32_t seed) {
        const uint32_t rows = share(s->rows, cores.size()), cols = s->cols;
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
        OpRun r;
        r.params = {{"rows", s->rows}, {"cols", s->cols}};
        r.plan = fmt::format("{} rows per core, streamed through VMEM in row tiles (VPU)", rows);
        finish_run(r, dev, ev, before, 0, cores.size());
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
    };
}

OpRunner softmax_options(CLI::App& cmd) {
    auto s = rows_options(cmd, 2048);
    return [s](driver::Device& dev, driver::ProgramCache& cache, const std::vector<uint32_t>& cores,
               bool check, uint32_t seed) {
        const uint32_t rows = share(s->rows, cores.size()), cols = s->cols;
        const driver::KernelStats before = dev.kernel_totals();
        HostTensor x = random_tensor(dev, cores, rows, cols, seed);
        const driver::Tensor y = driver::alloc_tensor(dev, cores, rows, cols);
        const driver::Event ev = driver::softmax(dev, cache, x.t, y);
        OpRun r;
        r.params = {{"rows", s->rows}, {"cols", s->cols}};
        r.plan = fmt::format("{} rows per core, streamed through VMEM in row tiles (VPU)", rows);
        finish_run(r, dev, ev, before, 0, cores.size());
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
    };
}

OpRunner attention_options(CLI::App& cmd) {
    auto s =
        std::make_shared<driver::AttentionShape>(driver::AttentionShape{1, 12, 512, 64, false});
    cmd.add_option("--batch", s->batch, "sequences, split over the cores")
        ->check(positive_number());
    cmd.add_option("--heads", s->heads, "attention heads")->check(positive_number());
    cmd.add_option("--seq", s->seq, "tokens per sequence")->check(positive_number());
    cmd.add_option("--dhead", s->dhead, "features per head")->check(positive_number());
    cmd.add_flag("--causal", s->causal, "mask keys after the query (decoder self-attention)");
    return [s](driver::Device& dev, driver::ProgramCache& cache, const std::vector<uint32_t>& cores,
               bool check, uint32_t seed) {
        driver::AttentionShape core = *s;
        core.batch = share(s->batch, cores.size());
        const uint32_t rows = core.groups() * core.seq;
        const driver::KernelStats before = dev.kernel_totals();
        HostTensor q = random_tensor(dev, cores, rows, core.dhead, seed),
                   k = random_tensor(dev, cores, rows, core.dhead, seed ^ 0x5555u),
                   v = random_tensor(dev, cores, rows, core.dhead, seed ^ 0xAAAAu);
        const driver::Tensor o = driver::alloc_tensor(dev, cores, rows, core.dhead),
                             p = driver::alloc_tensor(dev, cores, rows, core.seq);
        const driver::Event ev = driver::attention(dev, cache, core, q.t, k.t, v.t, o, p);
        OpRun r;
        r.params = {{"batch", s->batch},
                    {"heads", s->heads},
                    {"seq", s->seq},
                    {"dhead", s->dhead},
                    {"causal", s->causal}};
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
    };
}

/// The kinds `tpusim op` runs (besides `gemm`, the alias of `tpusim gemm`).
const std::vector<OpKind>& kinds() {
    static const std::vector<OpKind> k = {
        {"conv2d", "2-D convolution, NHWC, bf16 operands, fp32 accumulation, with bias",
         conv2d_options},
        {"layernorm", "layer normalisation over each row (random gain and bias), fp32",
         layernorm_options},
        {"softmax", "softmax over each row, fp32, numerically stable", softmax_options},
        {"attention",
         "multi-head scaled dot-product attention, bf16 MXU contractions, fp32 softmax",
         attention_options},
    };
    return k;
}

void add_kind(CLI::App& op, const OpKind& kind) {
    struct Opts {
        CommonOptions common;
        std::string cores = "0";
        bool check = false;
        uint32_t seed = 1;
    };
    auto o = std::make_shared<Opts>();
    CLI::App* cmd = op.add_subcommand(kind.name, kind.help);
    const OpRunner run = kind.add_options(*cmd);
    cmd->add_option("--cores", o->cores, "cores, data-parallel over the batch: 3, 0-3, 2,5 or all");
    cmd->add_flag("--check", o->check,
                  "compare with the host reference of the same numerics (bit-exact) "
                  "and report the max error against fp64");
    cmd->add_option("--seed", o->seed, "seed of the random inputs");
    add_common_options(*cmd, o->common);
    const std::string name = kind.name;
    cmd->callback([o, run, name] {
        const hw::BoardConfig cfg = o->common.board_config();
        const std::vector<uint32_t> cores = parse_cores_option(o->cores, cfg.cores());
        check_needs_values(o->check, cfg);
        auto dev = driver::Device::open(cfg);
        RunTrace trace(o->common, cfg);
        dev->set_tracer(trace.get());
        driver::ProgramCache cache;
        OpRun r;
        try {
            r = run(*dev, cache, cores, o->check, o->seed);
        } catch (const driver::DeviceError& e) {
            throw_as_cli_error(e);
        }
        const uint64_t cycles = r.event.end_cycle - r.event.start_cycle;
        const double seconds = double(cycles) / (cfg.clock_mhz * 1e6);
        nlohmann::ordered_json j;
        j["op"] = name;
        for (const auto& [key, value] : r.params.items()) j[key] = value;
        j["cores"] = cores.size();
        j["cycles"] = cycles;
        j["simulated_seconds"] = seconds;
        j["mxu_utilization"] = r.mxu_utilization;
        j["tflops"] = seconds > 0 ? 2.0 * double(r.macs) / seconds / 1e12 : 0.0;
        j["macs"] = r.macs;
        j["hbm_bytes"] = r.hbm_bytes;
        j["host_seconds"] = r.event.host_seconds;
        j["plan"] = r.plan;
        if (o->check) {
            j["bitexact"] = r.bitexact;
            j["max_abs_error"] = r.max_abs_error;
            j["max_rel_error"] = r.max_rel_error;
        }
        if (o->common.json) {
            fmt::print("{}\n", j.dump());
        } else {
            std::string params;
            for (const auto& [key, value] : r.params.items())
                if (!value.is_boolean())
                    params += fmt::format(" --{} {}", key, value.dump());
                else if (value.get<bool>())
                    params += fmt::format(" --{}", key);  // a flag
            fmt::print("{}{} on {} core{}: {} cycles = {:.3f} us at {} MHz\n", name, params,
                       cores.size(), cores.size() == 1 ? "" : "s", cycles, seconds * 1e6,
                       cfg.clock_mhz);
            fmt::print(
                "MXU utilisation {:.1f}%, {:.2f} TFLOP/s (peak {:.1f}), HBM {} bytes, host "
                "{:.3f} s\n",
                100.0 * r.mxu_utilization, j["tflops"].get<double>(),
                cfg.peak_flops_per_core() * double(cores.size()) / 1e12, r.hbm_bytes,
                r.event.host_seconds);
            fmt::print("plan: {}\n", r.plan);
            if (o->check)
                fmt::print(
                    "check: bit-exact vs reference: {}; max error vs fp64: {:.3e} ({:.3e} of "
                    "the largest value)\n",
                    r.bitexact ? "yes" : "NO", r.max_abs_error, r.max_rel_error);
        }
        write_stats_file(o->common, dev->board(), dev->kernel_stats());
        dev->set_tracer(nullptr);
        trace.finish();
        if (o->check && !r.bitexact)
            throw RunError(
                fmt::format("{}: the device result differs from the bit-exact reference", name));
    });
}

}  // namespace

void register_op_command(CLI::App& app) {
    auto* op = app.add_subcommand("op", "run one library op from HBM to HBM on random inputs");
    auto kind = std::make_shared<std::string>();
    // An unmatched word lands here, so a typo gets a message that lists the kinds.
    op->add_option("kind", *kind, "the op: conv2d, layernorm, softmax, attention or gemm");
    op->require_subcommand(0, 1);
    for (const OpKind& k : kinds()) add_kind(*op, k);
    add_gemm_command(*op, "gemm", "the library GEMM (an alias of tpusim gemm)");
    op->callback([op, kind] {
        if (!op->get_subcommands().empty()) return;
        std::string names;
        for (const OpKind& k : kinds()) names += fmt::format("{}, ", k.name);
        names += "gemm";
        if (kind->empty()) throw InputError(fmt::format("op: name a KIND ({})", names));
        throw InputError(fmt::format("op: unknown KIND '{}' (kinds: {})", *kind, names));
    });
}

}  // namespace tpu::cli
