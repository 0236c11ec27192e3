// SPDX-License-Identifier: Apache-2.0
// tpusim model NAME: one inference or one training step of a zoo model, with a per-layer table.
#include <algorithm>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "hw/board.h"
#include "sim/stat_names.h"
#include "sim/tracer.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/op_runs.h"
#include "tools/tpusim/run_output.h"
#include "trainer/trainer.h"
#include "trainer/zoo.h"

namespace tpu::cli {

void register_model_command(CLI::App& app) {
    struct Opts {
        CommonOptions common;
        std::string name;
        uint32_t batch = 1;
        std::string cores = "0";
        bool train_step = false;
        std::string precision = "bf16-mixed";
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
                  "one training step instead: forward, backward, gradient all-reduce, Adam");
    cmd->add_option("--precision", o->precision, "32-true | bf16-mixed | bf16-true");
    cmd->add_option("--image", o->zoo.image, "resnet18, resnet50: image height = width (224)");
    cmd->add_option("--hidden", o->zoo.hidden, "bert-block, gpt: model width");
    cmd->add_option("--heads", o->zoo.heads, "bert-block, gpt: attention heads");
    cmd->add_option("--seq", o->zoo.seq, "bert-block, gpt: tokens per sequence");
    cmd->add_option("--ffn", o->zoo.ffn, "bert-block, gpt: feed-forward width");
    cmd->add_option("--layers", o->zoo.layers, "gpt: transformer blocks");
    cmd->add_option("--vocab", o->zoo.vocab, "gpt: tokens");
    cmd->add_option("--seed", o->zoo.seed, "seed of the weights and inputs");
    add_common_options(*cmd, o->common);
    cmd->callback([o] {
        const hw::BoardConfig cfg = o->common.board_config();
        const std::vector<uint32_t> cores = parse_cores_option(o->cores, cfg.cores());
        auto dev = driver::Device::open(cfg);
        RunTrace trace(o->common, cfg);
        dev->set_tracer(trace.get());
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
        if (sim::Tracer* t = trace.get()) {
            const int track = t->track("host", "layers");
            for (const auto& l : layers)
                for (const auto& [begin, end] : l.spans)
                    t->complete(track, l.name, begin, end, {{"kind", std::string_view(l.kind)}});
            // The span the command reports (the report's headline), beside the whole run.
            t->complete(t->track("host", "model"), what, run.begin_cycle, run.begin_cycle + cycles,
                        {{"model", std::string_view(o->name)}, {"batch", uint64_t(o->batch)}});
        }
        const double seconds = double(cycles) / (cfg.clock_mhz * 1e6);
        nlohmann::ordered_json j;
        j["model"] = o->name;
        j["description"] = run.description;
        j["mode"] = o->train_step ? "train-step" : "inference";
        j["batch"] = o->batch;
        j["cores"] = cores.size();
        j["precision"] = o->precision;
        j["cycles"] = cycles;
        j["simulated_seconds"] = seconds;
        j["run_cycles"] = dev->now_cycle();
        j["run_simulated_seconds"] = cfg.clock().seconds(double(dev->now_cycle()));
        j["host_seconds"] = host;
        uint64_t flops = 0;
        auto& jl = j["layers"] = nlohmann::ordered_json::array();
        for (const auto& l : layers) {
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
        const RunEnergy energy = estimate_energy(dev->board(), dev->kernel_stats());
        j["energy"] = energy_json(energy);
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
