// SPDX-License-Identifier: Apache-2.0
// tpusim model NAME: one inference or one training step of a zoo model, with a per-layer table.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "hw/board.h"
#include "hw/mem/hbm_timing.h"
#include "sim/stat_names.h"
#include "sim/tracer.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/op_runs.h"
#include "tools/tpusim/run_output.h"
#include "trainer/record.h"
#include "trainer/trainer.h"
#include "trainer/zoo.h"

namespace tpu::cli {

/// One inference (or training step) of zoo model `name` recorded into the compiler and run as
/// one compiled step (LazyContext on a DeviceBackend over `cores`, host fallback on).
CompiledRun run_model_compiled(driver::Device& dev, const std::string& name,
                               const trainer::ZooOptions& options, uint32_t batch,
                               const std::vector<uint32_t>& cores, const std::string& precision,
                               bool train_step, uint32_t steps) {
    try {
        trainer::check_zoo_options(name, options, batch);
    } catch (const std::invalid_argument& e) {
        throw InputError(e.what());
    }
    check_model(dev.config(), name, options, batch, cores.size(), train_step, option_names());
    trainer::PrecisionMode mode;
    try {
        mode = trainer::resolve_precision(precision).mode;
    } catch (const trainer::ConfigError& e) {
        throw InputError(e.what());
    }
    trainer::ZooModel model;
    trainer::ZooOptions zoo = options;
    // The recorded step uploads its inputs as data; a timing-only board holds none (issue #27
    // item 3: host memory grows with the program, not the data), so none are made.
    const bool values = dev.config().sim.functional;
    zoo.values = values;
    try {
        model = trainer::make_zoo_model(name, zoo, batch, train_step);
    } catch (const std::invalid_argument& e) {
        throw InputError(e.what());
    }
    const uint32_t share = uint32_t((batch + cores.size() - 1) / cores.size());
    const trainer::Dataset& d = model.input;
    const uint32_t rows = share * d.rows_per_example();
    const size_t per_row = model.module->token_input() ? 1 : d.features;
    // Each core's share of the examples; the last shares padded with zeros (token 0), as the
    // eager engine pads them.
    // A training step's labels: one-hot rows (padding rows all zero: no loss, but counted in
    // the mean, as a padded shard's rows are).
    std::vector<std::vector<float>> inputs, onehot;
    if (!values) {
        inputs.emplace_back();
        if (train_step) onehot.emplace_back();
    }
    for (size_t r = 0; r < cores.size() && values; ++r) {
        const uint32_t first = std::min<uint32_t>(batch, uint32_t(r) * share);
        const uint32_t count = std::min<uint32_t>(batch - first, share);
        inputs.push_back(trainer::recorded_input_values(d, first, count));
        inputs.back().resize(size_t(rows) * per_row, 0.0f);
        if (!train_step) continue;
        std::vector<float>& y = onehot.emplace_back(size_t(rows) * d.classes, 0.0f);
        for (uint32_t e = 0; e < count; ++e)
            for (uint32_t k = 0; k < d.rows_per_example(); ++k)
                y[(size_t(e) * d.rows_per_example() + k) * d.classes + d.label(first + e, k)] =
                    1.0f;
    }
    compiler::CodegenOptions cg;
    cg.board = dev.config();
    cg.replicas = uint32_t(cores.size());
    cg.host_fallback = true;
    compiler::DeviceBackend backend(dev, cores, cg);
    backend.time_fusions(true);
    compiler::CompileOptions co;
    co.board = dev.config();
    compiler::LazyContext ctx(backend, co);

    CompiledRun run;
    run.description = model.description;
    const auto h0 = std::chrono::steady_clock::now();
    try {
        trainer::Recorder rec(ctx, mode, trainer::parameter_names(*model.module));
        // Steps after the first find the compiled step in the cache and the converted
        // parameters on the device; the last one is reported.
        uint64_t launches_before = 0;
        for (uint32_t s = 0; s < steps; ++s) {
            if (s > 0) rec.new_step();
            launches_before = backend.stats().launches;
            const compiler::LazyTensor y =
                train_step ? trainer::record_train_step(ctx, rec, *model.module, rows, d.features,
                                                        d.classes, inputs, onehot, 1, cores.size())
                           : trainer::record_forward_step(ctx, rec, *model.module, rows, d.features,
                                                          inputs);
            ctx.mark_step();
            (void)y;
        }
        run.host_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
        const compiler::CompiledStep& step = *ctx.last_step();
        const compiler::DeviceBackendStats& st = backend.stats();
        const compiler::StepProgram& prog = backend.program(step);
        run.fusions = step.fusions.size();
        run.memory = step.memory;
        run.launches = st.launches - launches_before;
        run.steps = steps;
        run.step_cycles = st.last_step_cycles;
        run.compile_seconds = ctx.stats().compile_seconds;
        run.codegen_seconds = st.codegen_seconds;
        std::vector<uint64_t> device = st.last_fusion_cycles;
        std::vector<bool> on_host(step.fusions.size(), false);
        // "fusion.3 output dot+reshape": its name, kind and the kinds of its ops.
        const auto title = [&](const compiler::Fusion& f) {
            std::string ops;
            for (compiler::OpId id : f.ops) {
                const auto n = compiler::op_name(step.graph.op(id).kind);
                if (ops.find(n) == std::string::npos)
                    ops += fmt::format("{}{}", ops.empty() ? "" : "+", n);
            }
            return fmt::format("{} {} {}", f.name, compiler::fusion_kind_name(f.kind), ops);
        };
        for (const compiler::ProgramSegment& seg : prog.segments) {
            if (seg.host_fusion < 0) continue;
            const size_t i = size_t(seg.host_fusion);
            const compiler::Fusion& f = step.fusions[i];
            run.host.push_back({title(f), fmt::format("{}", fmt::join(f.layers, ", ")),
                                seg.fallback.empty() ? "custom call" : seg.fallback,
                                st.last_fusion_cycles.at(i)});
            device[i] = 0;
            on_host[i] = true;
        }
        for (size_t i = 0; i < step.fusions.size(); ++i) {
            const compiler::Fusion& f = step.fusions[i];
            uint64_t bytes = 0;
            for (const compiler::FusionValue& v : f.operands) bytes += v.buffer.bytes;
            for (const compiler::FusionValue& v : f.results) bytes += v.buffer.bytes;
            run.fusion_rows.push_back({title(f), fmt::format("{}", fmt::join(f.layers, ", ")),
                                       on_host[i],
                                       st.last_fusion_cycles.at(i),
                                       st.last_fusion_spans.at(i).first, bytes});
        }
        for (uint64_t c : st.last_fusion_cycles) run.cycles += c;
        for (uint64_t c : device) run.device_cycles += c;
        run.layers = trainer::attribute_fusion_cycles(step, st.last_fusion_cycles, rec.layers());
        run.device_layers = trainer::attribute_fusion_cycles(step, device, rec.layers());
    } catch (const compiler::CompileError& e) {
        throw InputError(fmt::format("{} (compiled engine): {}", name, e.what()));
    } catch (const std::invalid_argument& e) {
        throw InputError(fmt::format("{} (compiled engine): {}", name, e.what()));
    }
    return run;
}

namespace {

/// The least HBM traffic of a fusion per cycle, as a share of the core's HBM peak: near 1, the
/// fusion is HBM bound; far below, something else (the MXUs, the VPU, the sequencer) sets it.
double hbm_share(const FusionRow& r, double peak) {
    return r.cycles && peak > 0 ? double(r.hbm_bytes) / double(r.cycles) / peak : 0.0;
}

nlohmann::ordered_json compiled_json(const CompiledRun& run, const std::string& name,
                                     uint32_t batch, size_t cores, const std::string& precision,
                                     bool train_step, driver::Device& dev) {
    const hw::BoardConfig& cfg = dev.config();
    nlohmann::ordered_json j;
    j["model"] = name;
    j["description"] = run.description;
    j["mode"] = train_step ? "train-step" : "inference";
    j["engine"] = "compiled";
    j["steps"] = run.steps;
    j["batch"] = batch;
    j["cores"] = cores;
    j["precision"] = precision;
    j["cycles"] = run.cycles;
    j["device_cycles"] = run.device_cycles;
    j["simulated_seconds"] = cfg.clock().seconds(double(run.cycles));
    j["run_cycles"] = dev.now_cycle();
    j["run_simulated_seconds"] = cfg.clock().seconds(double(dev.now_cycle()));
    j["host_seconds"] = run.host_seconds;
    j["compile_seconds"] = run.compile_seconds;
    j["codegen_seconds"] = run.codegen_seconds;
    j["launches"] = run.launches;
    auto& jf = j["fusions"];
    jf["total"] = run.fusions;
    jf["device"] = run.fusions - run.host.size();
    jf["host"] = run.host.size();
    auto& jh = jf["host_fusions"] = nlohmann::ordered_json::array();
    for (const HostFusion& h : run.host)
        jh.push_back({{"fusion", h.fusion},
                      {"layers", h.layers},
                      {"reason", h.reason},
                      {"cycles", h.cycles}});
    const double peak = hw::hbm_peak_bytes_per_cycle(cfg);
    auto& jl_f = jf["list"] = nlohmann::ordered_json::array();
    for (const FusionRow& r : run.fusion_rows)
        jl_f.push_back({{"fusion", r.fusion},
                        {"layers", r.layers},
                        {"where", r.on_host ? "host" : "device"},
                        {"cycles", r.cycles},
                        {"begin_cycle", r.begin_cycle},
                        {"hbm_bytes", r.hbm_bytes},
                        {"hbm_share_of_peak", hbm_share(r, peak)}});
    auto& jm = j["memory"];
    jm["parameter_bytes"] = run.memory.parameter_bytes;
    jm["input_bytes"] = run.memory.input_bytes;
    jm["output_bytes"] = run.memory.output_bytes;
    jm["temp_bytes"] = run.memory.temp_bytes;
    jm["temp_unshared_bytes"] = run.memory.temp_unshared_bytes;
    jm["peak_bytes"] = run.memory.peak_bytes();
    auto& jl = j["layers"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < run.layers.size(); ++i) {
        const trainer::CompiledLayer& l = run.layers[i];
        jl.push_back({{"name", l.name},
                      {"kind", l.kind},
                      {"cycles", l.cycles},
                      {"device_cycles", run.device_layers.at(i).cycles},
                      {"fusions", l.fusions},
                      {"flops", l.flops}});
    }
    j["energy"] = energy_json(estimate_energy(dev.board(), dev.kernel_stats()));
    return j;
}

void print_compiled(const CompiledRun& run, const std::string& name, uint32_t batch, size_t cores,
                    const std::string& precision, bool train_step, bool fusions,
                    driver::Device& dev) {
    const hw::BoardConfig& cfg = dev.config();
    const uint64_t cycles = run.cycles;
    fmt::print("{} {} of {} (batch {}) on {} core{}, {}, compiled{}: {} cycles = {:.3f} ms\n", name,
               train_step ? "training step" : "inference", run.description, batch, cores,
               cores == 1 ? "" : "s", precision,
               run.steps > 1 ? fmt::format(", step {} of {}", run.steps, run.steps) : "", cycles,
               cfg.clock().seconds(double(cycles)) * 1e3);
    fmt::print(
        "one compiled step: {} fusions, {} generated for the device ({} cycles in {} "
        "launch{}), {} on the host (host fallback: {} cycles of host-link traffic, not "
        "device work)\n",
        run.fusions, run.fusions - run.host.size(), run.device_cycles, run.launches,
        run.launches == 1 ? "" : "es", run.host.size(), cycles - run.device_cycles);
    std::map<std::string, size_t> reasons;
    for (const HostFusion& h : run.host) {
        // The message names its fusion first ("fusion.3: ..."): count the rest.
        const size_t colon = h.reason.find(": ");
        ++reasons[colon == std::string::npos ? h.reason : h.reason.substr(colon + 2)];
    }
    for (const auto& [reason, n] : reasons) fmt::print("  {:>3} x {}\n", n, reason);
    const compiler::MemoryPlan& m = run.memory;
    fmt::print(
        "HBM per core: {} parameters + {} inputs + {} outputs + {} temp (live peak; {} "
        "without reuse) = {} bytes\n",
        m.parameter_bytes, m.input_bytes, m.output_bytes, m.temp_bytes, m.temp_unshared_bytes,
        m.peak_bytes());
    fmt::print("{:<28} {:<20} {:>10} {:>6} {:>10} {:>8} {:>10}\n", "layer", "kind", "cycles", "%",
               "device", "fusions", "GFLOP");
    for (size_t i = 0; i < run.layers.size(); ++i) {
        const trainer::CompiledLayer& l = run.layers[i];
        fmt::print("{:<28} {:<20} {:>10} {:>5.1f}% {:>10} {:>8} {:>10.3f}\n", l.name, l.kind,
                   l.cycles, cycles ? 100.0 * double(l.cycles) / double(cycles) : 0.0,
                   run.device_layers.at(i).cycles, l.fusions, l.flops / 1e9);
    }
    fmt::print(
        "(a fusion of several layers is split by the flops of each layer's ops; "
        "\"device\" leaves out the host fallbacks)\n");
    if (fusions) {
        const double peak = hw::hbm_peak_bytes_per_cycle(cfg);
        fmt::print("{:>10} {:>6} {:>9} {:>8} {:<6} {}\n", "cycles", "%", "HBM MB", "of peak",
                   "where", "fusion [layers]");
        for (const FusionRow& r : run.fusion_rows)
            fmt::print("{:>10} {:>5.1f}% {:>9.2f} {:>7.1f}% {:<6} {} [{}]\n", r.cycles,
                       cycles ? 100.0 * double(r.cycles) / double(cycles) : 0.0,
                       double(r.hbm_bytes) / 1e6, 100.0 * hbm_share(r, peak),
                       r.on_host ? "host" : "device", r.fusion, r.layers);
        fmt::print(
            "(HBM MB: the arrays a fusion reads and writes, each once, the least traffic it can "
            "have; of peak: that per cycle against the core's HBM peak of {:.1f} B/cycle)\n",
            peak);
    }
    fmt::print("host {:.2f} s (compile {:.3f} s, code generation {:.3f} s)\n", run.host_seconds,
               run.compile_seconds, run.codegen_seconds);
}

/// The last step's fusions on a "fusions" track of the trace, and the step on "model".
void trace_compiled(sim::Tracer* tracer, const CompiledRun& run, const std::string& name,
                    uint32_t batch, bool train_step) {
    if (!tracer || run.fusion_rows.empty()) return;
    const int track = tracer->track("host", "fusions");
    uint64_t begin = run.fusion_rows.front().begin_cycle, end = begin;
    for (const FusionRow& r : run.fusion_rows) {
        tracer->complete(track, r.fusion, r.begin_cycle, r.begin_cycle + r.cycles,
                         {{"layers", std::string_view(r.layers)},
                          {"where", std::string_view(r.on_host ? "host" : "device")},
                          {"hbm_bytes", r.hbm_bytes}});
        begin = std::min(begin, r.begin_cycle);
        end = std::max(end, r.begin_cycle + r.cycles);
    }
    tracer->complete(tracer->track("host", "model"), train_step ? "training step" : "inference",
                     begin, end, {{"model", std::string_view(name)}, {"batch", uint64_t(batch)}});
}

}  // namespace

void register_model_command(CLI::App& app) {
    struct Opts {
        CommonOptions common;
        std::string name;
        uint32_t batch = 1;
        std::string cores = "0";
        bool train_step = false;
        std::string precision = "bf16-mixed";
        std::string engine = "eager";
        uint32_t steps = 1;
        bool fusions = false;
        trainer::ZooOptions zoo;
    };
    auto o = std::make_shared<Opts>();
    std::string models;
    for (const auto& m : trainer::zoo_models())
        models += fmt::format("\n  {:<12} {}", m.name, m.help);
    auto* cmd = app.add_subcommand(
        "model", "one inference (or training step) of a zoo model, with a per-layer table");
    cmd->footer("Models:" + models);
    cmd->add_option("name", o->name, "the model")->required();
    cmd->add_option("--batch", o->batch, "examples, data-parallel over the cores (padded shares)")
        ->check(positive_number());
    cmd->add_option("--cores", o->cores, "cores: 3, 0-3, 2,5 or all");
    cmd->add_flag("--train-step", o->train_step,
                  "one training step instead: forward, backward, gradient all-reduce, Adam (the "
                  "loss: softmax cross-entropy of the outputs against random labels; bert-block "
                  "adds a token-classification head, 9 labels per token)");
    cmd->add_option("--engine", o->engine,
                    "eager (default): the trainer's kernels, one launch per op | compiled: the "
                    "forward (or training step: mlp, cnn, resnets) recorded into the compiler and "
                    "run as one compiled step (fusions not generated for the device yet run on the "
                    "host, counted "
                    "with their reasons, so eager stays the default until whole models generate)")
        ->check(CLI::IsMember({"eager", "compiled"}));
    cmd->add_option("--steps", o->steps,
                    "compiled engine: run this many steps and report the last (1: the first, "
                    "which compiles and converts the parameters to the layouts their kernels "
                    "read; the second compiles again, the parameters now carrying layouts; from "
                    "the third on the step is the steady state a measured TPU step is)")
        ->check(positive_number());
    CLI::Option* fusions = cmd->add_flag(
        "--fusions", o->fusions,
        "compiled engine: list the step's fusions after the layer table (cycles, the least HBM "
        "traffic and its share of the HBM peak, host or device, layers)");
    cmd->add_option("--precision", o->precision,
                    "32-true | bf16-mixed | bf16-true (and Lightning's 32, 16, 16-mixed, bf16)");
    // The size options; each one's help lists the models that read it (zoo_models()).
    struct Size {
        const char* key;
        uint32_t* field;
        const char* help;
    };
    const Size sizes[] = {{"image", &o->zoo.image, "image height = width (224)"},
                          {"hidden", &o->zoo.hidden, "model width"},
                          {"heads", &o->zoo.heads, "attention heads"},
                          {"seq", &o->zoo.seq, "tokens per sequence"},
                          {"ffn", &o->zoo.ffn, "feed-forward width"},
                          {"layers", &o->zoo.layers, "transformer blocks"},
                          {"vocab", &o->zoo.vocab, "tokens"}};
    auto size_options = std::make_shared<std::vector<std::pair<std::string, CLI::Option*>>>();
    for (const Size& sz : sizes) {
        std::string users;
        for (const auto& m : trainer::zoo_models())
            if (std::find(m.sizes.begin(), m.sizes.end(), sz.key) != m.sizes.end())
                users += fmt::format("{}{}", users.empty() ? "" : ", ", m.name);
        size_options->emplace_back(sz.key, cmd->add_option(fmt::format("--{}", sz.key), *sz.field,
                                                           fmt::format("{}: {}", users, sz.help))
                                               ->check(positive_number()));
    }
    cmd->add_option("--seed", o->zoo.seed, "seed of the weights and inputs")->check(whole_number());
    CLI::Option* activation =
        cmd->add_option("--activation", o->zoo.activation,
                        "bert-block: the feed-forward activation, gelu (BERT's, the default) or "
                        "relu (PyTorchSim's EncoderBlock, which tpusim validate's bert-block rows "
                        "run)")
            ->transform(CLI::CheckedTransformer(
                std::map<std::string, trainer::FfnActivation>{
                    {"gelu", trainer::FfnActivation::Gelu}, {"relu", trainer::FfnActivation::Relu}},
                CLI::ignore_case));
    add_common_options(*cmd, o->common);
    cmd->callback([o, size_options, activation, fusions] {
        if (fusions->count() > 0 && o->engine != "compiled")
            throw InputError("--fusions applies to --engine compiled (the eager engine runs "
                             "kernels, not fusions)");
        if (activation->count() > 0 && o->name != "bert-block")
            throw InputError(fmt::format("--activation applies to bert-block, not to model {}",
                                         o->name));
        // An option the model does not read would be silently ignored: refuse it.
        const auto entry = std::find_if(trainer::zoo_models().begin(), trainer::zoo_models().end(),
                                        [&](const auto& m) { return m.name == o->name; });
        if (entry != trainer::zoo_models().end())
            for (const auto& [key, opt] : *size_options)
                if (opt->count() > 0 &&
                    std::find(entry->sizes.begin(), entry->sizes.end(), key) == entry->sizes.end())
                    throw InputError(fmt::format(
                        "--{} does not apply to model {} ({})", key, o->name,
                        entry->sizes.empty()
                            ? std::string("it has no size options")
                            : fmt::format("it takes --{}", fmt::join(entry->sizes, ", --"))));
        const hw::BoardConfig cfg = o->common.board_config();
        const std::vector<uint32_t> cores = parse_cores_option(o->cores, cfg.cores());
        auto dev = driver::Device::open(cfg);
        RunTrace trace(o->common, cfg);
        dev->set_tracer(trace.get());
        if (o->steps != 1 && o->engine != "compiled")
            throw InputError(
                "--steps applies to --engine compiled (the eager engine runs one step)");
        if (o->engine == "compiled") {
            CompiledRun run;
            try {
                run = run_model_compiled(*dev, o->name, o->zoo, o->batch, cores, o->precision,
                                         o->train_step, o->steps);
            } catch (const driver::DeviceError& e) {
                throw_as_cli_error(e);
            }
            if (o->common.json)
                fmt::print("{}\n", compiled_json(run, o->name, o->batch, cores.size(), o->precision,
                                                 o->train_step, *dev)
                                       .dump());
            else
                print_compiled(run, o->name, o->batch, cores.size(), o->precision, o->train_step,
                               o->fusions, *dev);
            trace_compiled(trace.get(), run, o->name, o->batch, o->train_step);
            const std::vector<ResultStat> result{
                {"cycles",
                 fmt::format("device cycles of one compiled {} of {} (batch {}) on {} "
                             "core{}, host fallbacks included",
                             o->train_step ? "training step" : "inference", o->name, o->batch,
                             cores.size(), cores.size() == 1 ? "" : "s"),
                 sim::StatUnit::Cycles, double(run.cycles)},
                {std::string(sim::stat_names::kSteps),
                 o->train_step ? "training steps measured" : "inferences measured",
                 sim::StatUnit::Count, 1.0},
                {"devices", "cores running the model", sim::StatUnit::Count, double(cores.size())}};
            write_stats_file(o->common, dev->board(), dev->kernel_stats(), result);
            dev->set_tracer(nullptr);
            trace.finish();
            return;
        }
        ModelRun run;
        try {
            run = run_model(*dev, o->name, o->zoo, o->batch, cores, o->train_step, o->precision);
        } catch (const driver::DeviceError& e) {
            throw_as_cli_error(e);
        }
        const uint64_t cycles = run.cycles;
        const double host = run.host_seconds;
        const auto& layers = run.layers;
        const std::string what = o->train_step ? "training step" : "inference";
        trace_model(trace.get(), run, o->name, o->batch, o->train_step);
        const double seconds = cfg.clock().seconds(double(cycles));
        const nlohmann::ordered_json j =
            model_json(run, o->name, o->batch, cores.size(), o->train_step, o->precision, *dev);
        const RunEnergy energy = estimate_energy(dev->board(), dev->kernel_stats());
        if (o->common.json) {
            fmt::print("{}\n", j.dump());
        } else {
            fmt::print("{} {} of {} (batch {}) on {} core{}, {}: {} cycles = {:.3f} ms\n", o->name,
                       o->train_step ? "training step" : "inference", run.description, o->batch,
                       cores.size(), cores.size() == 1 ? "" : "s", o->precision, cycles,
                       seconds * 1e3);
            fmt::print("{:<28} {:<20} {:>10} {:>6} {:>10} {:>6} {:>12}\n", "layer", "kind",
                       "cycles", "%", "GFLOP", "MXU", "HBM bytes");
            for (const auto& l : layers)
                fmt::print("{:<28} {:<20} {:>10} {:>5.1f}% {:>10.3f} {:>5.1f}% {:>12}\n", l.name,
                           l.kind, l.work.cycles,
                           cycles ? 100.0 * double(l.work.cycles) / double(cycles) : 0.0,
                           double(l.work.flops()) / 1e9, 100.0 * l.work.mxu_utilization(),
                           l.work.hbm_bytes());
            fmt::print(
                "whole run {} cycles = {:.3f} ms (weights and inputs uploaded first); estimated "
                "energy {:.3f} J, {:.0f} W on average\n",
                dev->now_cycle(), cfg.clock().seconds(double(dev->now_cycle())) * 1e3,
                energy.total_j(), energy.average_power_w());
            fmt::print("host {:.2f} s\n", host);
        }
        const std::vector<ResultStat> result{
            {"cycles",
             fmt::format("device cycles of one {} of {} (batch {}) on {} core{}, weights already "
                         "on the device; board.cycles is the whole run (uploads included)",
                         what, o->name, o->batch, cores.size(), cores.size() == 1 ? "" : "s"),
             sim::StatUnit::Cycles, double(cycles)},
            {std::string(sim::stat_names::kSteps), fmt::format("{}s measured", what),
             sim::StatUnit::Count, 1.0},
            {"batch_rows", "examples per core (the batch's share)", sim::StatUnit::Count,
             double((o->batch + cores.size() - 1) / cores.size())},
            {"devices", "cores running the model", sim::StatUnit::Count, double(cores.size())}};
        write_stats_file(o->common, dev->board(), dev->kernel_stats(), result);
        dev->set_tracer(nullptr);
        trace.finish();
    });
}

}  // namespace tpu::cli
