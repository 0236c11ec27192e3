// SPDX-License-Identifier: Apache-2.0
// tpusim model NAME: one inference or one training step of a zoo model, with a per-layer table.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "hw/board.h"
#include "sim/stat_names.h"
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
                  "one training step instead: forward, backward, gradient all-reduce, Adam (the "
                  "loss: softmax cross-entropy of the outputs against random labels; bert-block "
                  "adds a token-classification head, 9 labels per token)");
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
    add_common_options(*cmd, o->common);
    cmd->callback([o, size_options] {
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
