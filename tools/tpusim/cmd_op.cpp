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

#include "driver/kernels/allreduce.h"
#include "driver/kernels/attention.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor.h"
#include "driver/kernels/tensor_ops.h"
#include "hw/board.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/op_runs.h"
#include "tools/tpusim/random_fill.h"
#include "tools/tpusim/run_output.h"

namespace tpu::cli {
namespace {

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
    const char* default_cores = "0";  ///< --cores when not given
};

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
    cmd.add_option("--pad", s->pad, "zero padding on every side")->check(whole_number());
    return [s](driver::Device& dev, driver::ProgramCache& cache, const std::vector<uint32_t>& cores,
               bool check, uint32_t seed) {
        // In 64 bits: 2 x --pad wraps in 32.
        const uint64_t ph = s->height + 2 * uint64_t(s->pad), pw = s->width + 2 * uint64_t(s->pad);
        if (s->kernel > ph || s->kernel > pw)
            throw InputError(fmt::format(
                "--kernel {} is larger than the padded input: --height {} and --width {} plus "
                "2 x --pad {} give {}x{}",
                s->kernel, s->height, s->width, s->pad, ph, pw));
        check_conv2d(dev.config(), cores.size(), *s, option_names());
        std::vector<float> x(size_t(s->batch) * s->height * s->width * s->cin),
            w(size_t(s->kernel) * s->kernel * s->cin * s->cout), b(s->cout);
        fill_uniform(x, seed);
        fill_uniform(w, seed ^ 0x80000000u);
        fill_uniform(b, seed ^ 0x40000000u);
        return run_conv2d(dev, cache, cores, *s, x, w, b, check);
    };
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
        check_rows_op(dev.config(), cores.size(), s->rows, s->cols, option_names());
        return run_layernorm(dev, cache, cores, s->rows, s->cols, check, seed);
    };
}

OpRunner softmax_options(CLI::App& cmd) {
    auto s = rows_options(cmd, 2048);
    return [s](driver::Device& dev, driver::ProgramCache& cache, const std::vector<uint32_t>& cores,
               bool check, uint32_t seed) {
        check_rows_op(dev.config(), cores.size(), s->rows, s->cols, option_names());
        return run_softmax(dev, cache, cores, s->rows, s->cols, check, seed);
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
    auto engine = std::make_shared<std::string>("auto");
    cmd.add_option("--engine", *engine,
                   "compiled = PyTorchSim's attention graph (k q^T / sqrt(d), softmax over the "
                   "keys, v^T p: out [heads, dhead, seq]) compiled into one program, as "
                   "PyTorch/XLA runs it; library = the hand-written fused kernel (p v: out "
                   "[heads, seq, dhead]; causal masks); auto = compiled where the code generator "
                   "covers the shape, else the library kernel (the plan says why)")
        ->check(CLI::IsMember({"auto", "compiled", "library"}))
        ->capture_default_str();
    return [s, engine](driver::Device& dev, driver::ProgramCache& cache,
                       const std::vector<uint32_t>& cores, bool check, uint32_t seed) {
        check_attention(dev.config(), cores.size(), *s, option_names());
        return run_attention(dev, cache, cores, *s, check, seed, *engine);
    };
}

OpRunner allreduce_options(CLI::App& cmd) {
    auto elements = std::make_shared<uint32_t>(4u << 20);  // 16 MiB of fp32 per core
    cmd.add_option("--elements", *elements, "fp32 values per core")->check(positive_number());
    return [elements](driver::Device& dev, driver::ProgramCache& cache,
                      const std::vector<uint32_t>& cores, bool check, uint32_t seed) {
        const uint32_t n = *elements;
        check_allreduce(dev.config(), n, option_names());
        return run_allreduce(
            dev, cache, cores, n,
            [seed](size_t i, std::vector<float>& xi) { fill_uniform(xi, seed + uint32_t(i)); },
            check, false);
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
        {"allreduce",
         "all-reduce (sum) of an fp32 tensor per core in HBM, over --cores (default all): a "
         "ring, or along each torus dimension on a torus board",
         allreduce_options, "all"},
    };
    return k;
}

void add_kind(CLI::App& op, const OpKind& kind) {
    struct Opts {
        CommonOptions common;
        std::string cores;
        bool check = false;
        uint32_t seed = 1;
    };
    auto o = std::make_shared<Opts>();
    o->cores = kind.default_cores;
    CLI::App* cmd = op.add_subcommand(kind.name, kind.help);
    const OpRunner run = kind.add_options(*cmd);
    cmd->add_option("--cores", o->cores, "cores, data-parallel over the batch: 3, 0-3, 2,5 or all");
    cmd->add_flag("--check", o->check,
                  "compare with the host reference of the same numerics (bit-exact) "
                  "and report the max error against fp64");
    cmd->add_option("--seed", o->seed, "seed of the random inputs")->check(whole_number());
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
        const nlohmann::ordered_json j = op_json(name, r, cores.size(), cfg, o->check);
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
            if (!r.digest.empty()) fmt::print("result FNV-1a: {}\n", r.digest);
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
    op->add_option("kind", *kind,
                   "the op: conv2d, layernorm, softmax, attention, allreduce or gemm");
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
