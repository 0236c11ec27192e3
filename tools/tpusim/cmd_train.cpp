// SPDX-License-Identifier: Apache-2.0
// tpusim train: data-parallel training of an MLP on Fashion-MNIST or a synthetic dataset.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "hw/board.h"
#include "sim/file_io.h"
#include "sim/stat_names.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/run_output.h"
#include "trainer/dataset.h"
#include "trainer/text_corpus.h"
#include "trainer/trainer.h"

namespace tpu::cli {
namespace {

/// How close the class centres of `--data synthetic` are: overlapping classes, so the run
/// shows learning over an epoch (loss falling, accuracy climbing) instead of 100% in a few
/// steps.
constexpr float kSyntheticSpread = 0.05f;

/// "784,512,256,10" -> sizes.
std::vector<uint32_t> parse_sizes(const std::string& text) {
    std::vector<uint32_t> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            const unsigned long v = std::stoul(item, &used);
            if (used != item.size() || v == 0 || v > 65536) throw std::invalid_argument(item);
            out.push_back(uint32_t(v));
        } catch (const std::exception&) {
            throw InputError(fmt::format("--hidden: '{}' is not a layer width (1-65536)", item));
        }
    }
    return out;
}

}  // namespace

void register_train_command(CLI::App& app) {
    struct Opts {
        CommonOptions common;
        std::string model = "mlp";
        std::string hidden;  // per model: "512,256" (mlp) or "128" (gpt)
        std::vector<std::string> text_files;
        int64_t max_steps = -2;  // -2: the model's default (-1 for mlp, 300 for gpt)
        uint32_t layers = 2, heads = 4, context = 64;
        std::string data = "auto";
        std::string data_dir = std::string(trainer::kFashionMnistDir);
        std::string devices = "auto";
        std::string tpu_cores;
        uint32_t num_nodes = 1;
        std::string precision = "bf16-mixed";
        std::string optimizer = "adam";
        uint32_t epochs = 1;
        uint32_t batch_size = 16;
        float lr = 1e-3f;
        float momentum = 0.9f;
        uint32_t seed = 0;
        int64_t limit_train_batches = -1;
        int64_t limit_test_batches = -1;
        uint32_t log_every = 50;
        uint32_t synthetic_count = 8192;
        std::string metrics_report;
        std::string checkpoint;
        std::string resume;
        std::string trace_steps;
        bool no_progress = false;
        bool drop_last = false;
    };
    auto o = std::make_shared<Opts>();
    auto* cmd = app.add_subcommand("train", "data-parallel training (PyTorch Lightning on TPU)");
    cmd->add_option("--model", o->model, "model: mlp | cnn | gpt");
    cmd->add_option("--hidden", o->hidden,
                    "mlp: hidden layer widths, e.g. 512,256 (the default); gpt: the model width "
                    "(default 128)");
    cmd->add_option("--data", o->data,
                    "fashion-mnist | synthetic | text | auto (gpt: text; otherwise "
                    "Fashion-MNIST when the Debian package dataset-fashion-mnist is installed)");
    cmd->add_option("--text-file", o->text_files,
                    "gpt: a text file of the corpus, repeatable, read in order (default: the "
                    "regular files of /usr/share/common-licenses in name order)");
    cmd->add_option("--max-steps", o->max_steps,
                    "stop after this many optimizer steps in all, as Lightning's max_steps "
                    "(-1: no limit; default -1, gpt 300)");
    cmd->add_option("--layers", o->layers, "gpt: transformer blocks")->check(positive_number());
    cmd->add_option("--heads", o->heads, "gpt: attention heads")->check(positive_number());
    cmd->add_option("--context", o->context, "gpt: tokens per sequence")->check(positive_number());
    cmd->add_option("--data-dir", o->data_dir, "directory of the Fashion-MNIST IDX files");
    cmd->add_option("--devices", o->devices, "auto | 1 | 8 | [i]  (Lightning's TPU devices)");
    cmd->add_option("--tpu-cores", o->tpu_cores,
                    "Lightning 1.x's tpu_cores: as --devices, with Lightning's deprecation "
                    "warning")
        ->default_str("");
    cmd->add_option("--num-nodes", o->num_nodes,
                    "TPU hosts (Lightning's num_nodes): above 1, --devices counts the cores of "
                    "one host and every core trains; run under mpirun to share the hosts among "
                    "processes")
        ->check(positive_number());
    cmd->add_option("--precision", o->precision,
                    "32-true | bf16-mixed | bf16-true (Lightning's older 32, 16, 16-mixed and "
                    "bf16 are accepted with its warnings; 16-true is not modelled)");
    cmd->add_option("--optimizer", o->optimizer, "adam | sgd (SGD with momentum)");
    auto* epochs = cmd->add_option("--epochs", o->epochs,
                                   "total epochs (Lightning's max_epochs: a resumed run counts the "
                                   "checkpoint's epochs)")
                       ->check(whole_number());
    cmd->add_option("--batch-size", o->batch_size, "examples per batch and device")
        ->check(whole_number());
    cmd->add_option("--lr", o->lr, "learning rate");
    cmd->add_option("--momentum", o->momentum, "SGD momentum");
    cmd->add_option("--seed", o->seed, "seed of initialisation, shuffling and synthetic data")
        ->check(whole_number());
    cmd->add_option("--limit-train-batches", o->limit_train_batches,
                    "at most this many steps per epoch (-1: all)");
    cmd->add_option("--limit-test-batches", o->limit_test_batches,
                    "at most this many test batches (-1: all)");
    cmd->add_option("--log-every-n-steps", o->log_every,
                    "read the loss back (a host sync) every n steps")
        ->check(whole_number());
    cmd->add_option("--synthetic-count", o->synthetic_count,
                    "training examples of the synthetic dataset")
        ->check(positive_number());
    cmd->add_option("--metrics-report", o->metrics_report,
                    "write the PyTorch/XLA-style metrics report to FILE ('-': stdout)");
    cmd->add_option("--checkpoint", o->checkpoint, "save parameters and optimizer state to FILE")
        ->check(output_path());
    cmd->add_option("--resume", o->resume, "resume from a checkpoint FILE");
    cmd->add_option("--trace-steps", o->trace_steps,
                    "FIRST:COUNT: trace only COUNT training steps from global step FIRST "
                    "(a whole epoch traced per instruction is gigabytes)");
    cmd->add_flag("--drop-last", o->drop_last,
                  "drop each device's short last batch, so shapes never change (no recompile)");
    cmd->add_flag("--no-progress", o->no_progress, "no progress bar");
    add_common_options(*cmd, o->common);
    cmd->callback([o, epochs] {
        const hw::BoardConfig cfg = o->common.board_config();
        const bool gpt = o->model == "gpt", cnn = o->model == "cnn";
        if (o->model != "mlp" && !gpt && !cnn)
            throw InputError(fmt::format("--model '{}': the models are: mlp, cnn, gpt", o->model));
        // Both write stdout, and the JSON must stay one parseable document.
        if (o->metrics_report == "-" && o->common.json)
            throw InputError(
                "--metrics-report - and --json both write to stdout; name a file for the report");
        trainer::TrainerOptions topts;
        try {
            topts.devices = trainer::parse_devices(o->devices);
        } catch (const trainer::ConfigError& e) {
            throw InputError(fmt::format("--devices: {}", e.what()));
        }
        if (!o->tpu_cores.empty()) {
            try {
                topts.tpu_cores = trainer::parse_devices(o->tpu_cores);
            } catch (const trainer::ConfigError& e) {
                throw InputError(fmt::format("--tpu-cores: {}", e.what()));
            }
        }
        topts.num_nodes = o->num_nodes;
        topts.precision = o->precision;
        topts.max_epochs = o->epochs;
        topts.max_steps = o->max_steps == -2 ? (gpt ? 300 : -1) : o->max_steps;
        if (topts.max_steps < -1)
            throw InputError(
                fmt::format("--max-steps {}: expected a number of steps >= 0, or -1 for no limit",
                            o->max_steps));
        // As in Lightning, a step limit without an epoch limit runs as many epochs as it takes.
        if (topts.max_steps >= 0 && epochs->count() == 0) topts.max_epochs = UINT32_MAX;
        topts.limit_train_batches = o->limit_train_batches;
        topts.limit_val_batches = o->limit_test_batches;
        topts.log_every_n_steps = o->log_every;
        topts.enable_progress_bar = !o->no_progress && !o->common.json;
        topts.ckpt_path = o->resume;
        if (!o->trace_steps.empty()) {
            const auto colon = o->trace_steps.find(':');
            try {
                if (colon == std::string::npos) throw std::invalid_argument("no colon");
                size_t u1 = 0, u2 = 0;
                const std::string a = o->trace_steps.substr(0, colon),
                                  b = o->trace_steps.substr(colon + 1);
                // Digits only: stoull reads "-1" as 2^64 - 1.
                for (const std::string* part : {&a, &b})
                    if (part->empty() || part->find_first_not_of("0123456789") != std::string::npos)
                        throw std::invalid_argument("not a whole number");
                topts.trace_first_step = std::stoull(a, &u1);
                topts.trace_steps = std::stoull(b, &u2);
                if (u1 != a.size() || u2 != b.size() || topts.trace_steps == 0)
                    throw std::invalid_argument("bad number");
            } catch (const std::exception&) {
                throw InputError(fmt::format(
                    "--trace-steps '{}': expected FIRST:COUNT with COUNT >= 1, e.g. 100:2",
                    o->trace_steps));
            }
        }
        trainer::OptimizerConfig opt;
        if (o->optimizer == "sgd") {
            opt.kind = trainer::OptimizerConfig::Kind::Sgd;
        } else if (o->optimizer != "adam") {
            throw InputError(fmt::format("--optimizer '{}': expected adam or sgd", o->optimizer));
        }
        opt.lr = o->lr;
        opt.momentum = o->momentum;
        try {
            opt.validate();
        } catch (const trainer::OptimizerError& e) {
            throw InputError(fmt::format("--{}: {}", e.field(), e.what()));
        }
        for (const auto& [flag, limit] :
             {std::pair{"--limit-train-batches", o->limit_train_batches},
              std::pair{"--limit-test-batches", o->limit_test_batches}})
            if (limit == 0 || limit < -1)
                throw InputError(fmt::format(
                    "{} {}: expected a number of batches >= 1, or -1 for all", flag, limit));

        // Data: check before the board is built, so a missing file fails fast.
        std::string data = o->data;
        if (data == "auto")
            data = gpt ? "text"
                   : std::filesystem::exists(std::filesystem::path(o->data_dir) /
                                             "train-images-idx3-ubyte.gz")
                       ? "fashion-mnist"
                       : "synthetic";
        if (gpt != (data == "text"))
            throw InputError(
                fmt::format("--data '{}' does not suit --model {}: {}", data, o->model,
                            gpt ? "a GPT trains on --data text" : "text data is for --model gpt"));
        if (!o->text_files.empty() && !gpt)
            throw InputError("--text-file is the corpus of --model gpt");
        trainer::Dataset train, test;
        trainer::TextCorpus corpus;
        try {
            if (data == "text") {
                const std::vector<std::string> files =
                    o->text_files.empty()
                        ? trainer::text_files_in(std::string(trainer::kLicenseDir))
                        : o->text_files;
                corpus = trainer::load_text_corpus(files, o->context + 1);
                const auto vocab = uint32_t(corpus.vocab.size());
                // Training windows start at every character; validation windows tile the
                // validation text, so each of its characters is predicted once.
                train = trainer::token_windows(corpus.train, vocab, o->context, 1);
                test = trainer::token_windows(corpus.val, vocab, o->context, o->context);
            } else if (data == "fashion-mnist") {
                train = trainer::load_fashion_mnist(o->data_dir, true);
                test = trainer::load_fashion_mnist(o->data_dir, false);
            } else if (data == "synthetic") {
                // One dataset split 4:1, so test examples come from the same class centres.
                const uint32_t n_test = std::max<uint32_t>(1, o->synthetic_count / 4);
                const trainer::Dataset all = trainer::synthetic(o->synthetic_count + n_test, 784,
                                                                10, o->seed, kSyntheticSpread);
                train = trainer::subset(all, 0, o->synthetic_count);
                test = trainer::subset(all, o->synthetic_count, n_test);
            } else {
                throw InputError(fmt::format(
                    "--data '{}': expected fashion-mnist, synthetic, text or auto", o->data));
            }
        } catch (const trainer::DataError& e) {
            throw InputError(e.what());
        }
        // Standardise with the training split's statistics (torchvision's Normalize): inputs
        // centred on 0 train faster than raw [0, 1] pixels.
        std::unique_ptr<trainer::Module> model;
        std::string description;
        try {
            if (gpt) {
                trainer::GptConfig g;
                g.vocab = train.classes;
                g.layers = o->layers;
                g.hidden = parse_sizes(o->hidden.empty() ? "128" : o->hidden).at(0);
                if (o->hidden.find(',') != std::string::npos)
                    throw InputError(fmt::format("--hidden '{}': a GPT has one width", o->hidden));
                g.heads = o->heads;
                g.seq = o->context;
                model = std::make_unique<trainer::Gpt>(g, opt, o->seed);
                description = fmt::format(
                    "a GPT ({} layers, hidden {}, {} heads, context {}, {} symbols, tied "
                    "embeddings)",
                    g.layers, g.hidden, g.heads, g.seq, g.vocab);
            } else {
                const auto [mean, stddev] = trainer::value_stats(train);
                trainer::normalize(train, mean, stddev);
                trainer::normalize(test, mean, stddev);
                if (cnn) {
                    if (train.features != 784)
                        throw InputError(fmt::format(
                            "--model cnn takes 28x28x1 images; --data {} has {} values per "
                            "example",
                            data, train.features));
                    if (!o->hidden.empty())
                        throw InputError("--hidden is the MLP's and the GPT's; the CNN is fixed");
                    model = std::make_unique<trainer::Cnn>(trainer::ImageShape{28, 28, 1},
                                                           train.classes, opt, o->seed);
                    description = "a CNN conv32-pool-conv64-pool-fc128-fc10";
                } else {
                    const std::string hidden = o->hidden.empty() ? "512,256" : o->hidden;
                    std::vector<uint32_t> sizes{train.features};
                    for (uint32_t h : parse_sizes(hidden)) sizes.push_back(h);
                    sizes.push_back(train.classes);
                    model = std::make_unique<trainer::Mlp>(sizes, opt, o->seed);
                    description = fmt::format("an MLP {}", hidden);
                }
            }
        } catch (const std::invalid_argument& e) {
            throw InputError(e.what());
        }

        auto dev = driver::Device::open(cfg);
        RunTrace trace(o->common, cfg);
        dev->set_tracer(trace.get());
        std::unique_ptr<trainer::Trainer> tr;
        try {
            tr = std::make_unique<trainer::Trainer>(*dev, topts);
        } catch (const trainer::ConfigError& e) {
            throw InputError(e.what());
        }
        tr->set_tracer(trace.get());
        trainer::DataLoader train_loader{&train, o->batch_size, true, o->drop_last, o->seed};
        trainer::DataLoader test_loader{&test, o->batch_size, false, false, 0};
        trainer::EvalResult eval;
        try {
            tr->fit(*model, train_loader);
            eval = tr->validate(*model, test_loader);
            if (!o->checkpoint.empty()) tr->save_checkpoint(o->checkpoint);
        } catch (const trainer::ConfigError& e) {
            throw InputError(e.what());
        } catch (const driver::DeviceError& e) {
            if (e.kind() == driver::ErrorKind::Usage || e.kind() == driver::ErrorKind::OutOfMemory)
                throw InputError(e.what());
            throw RunError(e.what());
        }
        const auto& hist = tr->history();
        // A fit that took no step (max_steps 0, a resumed run already at its limit) has no
        // loss to report: Lightning says which limit it met and trains nothing.
        const bool trained = !hist.empty();
        const uint64_t steps = tr->global_step();
        if (!o->metrics_report.empty()) {
            if (o->metrics_report == "-") {
                if (!o->common.json) fmt::print("{}", tr->metrics_report());
            } else {
                try {
                    sim::write_output_file(o->metrics_report, tr->metrics_report());
                } catch (const sim::OutputError& e) {
                    throw InputError(fmt::format("--metrics-report: {}", e.what()));
                }
            }
        }
        // Totals, each saying what it counts: the device time of training is the training
        // steps' (result); the whole run adds set-up, uploads and evaluation; the wall clock
        // is the host timeline's estimate of the steps.
        const sim::ClockDomain clock = cfg.clock();
        const uint64_t run_steps = tr->step_times().size();  // steps of this run (not resumed)
        const uint64_t step_cycles = tr->step_cycles();
        const uint64_t run_cycles = dev->now_cycle();
        const trainer::HostTimeline& timeline = tr->host_timeline();
        const uint64_t wall_cycles = timeline.wall_cycles();
        const auto per_step = [&](double v) { return run_steps ? v / double(run_steps) : 0.0; };
        const RunEnergy energy = estimate_energy(dev->board(), dev->kernel_stats());
        nlohmann::ordered_json j;
        // A language model is judged on held-out text: its validation split.
        const std::string split = gpt ? "val" : "test";
        j["model"] = o->model;
        j[split + "_accuracy"] = eval.accuracy;
        j["final_loss"] =
            trained ? nlohmann::ordered_json(hist.back().loss) : nlohmann::ordered_json(nullptr);
        if (!trained) j["stopped"] = tr->stop_reason();
        j["steps"] = steps;
        j["simulated_seconds"] = clock.seconds(double(step_cycles));
        j["simulated_seconds_per_step"] = per_step(clock.seconds(double(step_cycles)));
        j["run_simulated_seconds"] = clock.seconds(double(run_cycles));
        j["wall_seconds_estimate"] = clock.seconds(double(wall_cycles));
        j["wall_seconds_per_step_estimate"] = per_step(clock.seconds(double(wall_cycles)));
        j["device_busy_fraction_estimate"] =
            wall_cycles ? double(step_cycles) / double(wall_cycles) : 0.0;
        // A typical step, without the first steps' compilation: the medians.
        const auto median = [](std::vector<uint64_t> v) {
            if (v.empty()) return uint64_t(0);
            std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
            return v[v.size() / 2];
        };
        std::vector<uint64_t> device_steps, wall_steps;
        for (const trainer::StepTime& t : tr->step_times()) {
            device_steps.push_back(t.cycles);
            wall_steps.push_back(t.wall_cycles);
        }
        j["simulated_seconds_median_step"] = clock.seconds(double(median(device_steps)));
        j["wall_seconds_median_step_estimate"] = clock.seconds(double(median(wall_steps)));
        j["host_seconds"] = tr->host_seconds();
        j["host_seconds_per_step"] = steps ? tr->host_seconds() / double(steps) : 0.0;
        j["devices"] = tr->cores().size();
        j["num_nodes"] = o->num_nodes;
        j["precision"] = trainer::precision_name(tr->precision());
        j["data"] = data;
        j[split + "_loss"] = eval.loss;
        j[split + "_examples"] = eval.examples;
        if (gpt) {
            j["val_characters"] = uint64_t(eval.examples) * o->context;
            j["vocab"] = corpus.vocab.size();
            j["unigram_entropy"] = corpus.unigram_entropy();
        }
        auto& curve = j["loss_curve"] = nlohmann::ordered_json::array();
        for (const auto& h : hist) curve.push_back({h.step + 1, h.loss});
        j["recompile_warnings"] = tr->recompile_warnings();
        j["energy"] = energy_json(energy);
        if (o->common.json) {
            fmt::print("{}\n", j.dump());
        } else {
            fmt::print("trained {} on {} ({} {}) with {} core{}, {}, {} steps of {} per device\n",
                       description, data, gpt ? corpus.chars : train.count,
                       gpt ? "characters" : "examples", tr->cores().size(),
                       tr->cores().size() == 1 ? "" : "s", j["precision"].get<std::string>(), steps,
                       o->batch_size);
            const std::string loss_text =
                !trained ? fmt::format("{} No training loss", tr->stop_reason())
                : gpt    ? fmt::format("final training loss {:.4f} nats/char", hist.back().loss)
                         : fmt::format("final training loss {:.4f}", hist.back().loss);
            if (gpt)
                fmt::print(
                    "{}; validation loss {:.4f} nats/char, next-character accuracy {:.2f}% on {} "
                    "characters (unigram entropy {:.2f})\n",
                    loss_text, eval.loss, 100.0 * eval.accuracy,
                    uint64_t(eval.examples) * o->context, corpus.unigram_entropy());
            else
                fmt::print("{}; test accuracy {:.2f}% on {} examples (test loss {:.4f})\n",
                           loss_text, 100.0 * eval.accuracy, eval.examples, eval.loss);
            fmt::print(
                "device time of the {} training steps: {:.3f} ms ({:.3f} ms per step); whole run "
                "{:.3f} ms (set-up, uploads and evaluation included)\n",
                run_steps, clock.seconds(double(step_cycles)) * 1e3,
                per_step(clock.seconds(double(step_cycles))) * 1e3,
                clock.seconds(double(run_cycles)) * 1e3);
            fmt::print(
                "estimated wall clock of the steps: {:.3f} ms ({:.3f} ms per step); the device "
                "is busy {:.1f}% of it{}\n",
                clock.seconds(double(wall_cycles)) * 1e3,
                per_step(clock.seconds(double(wall_cycles))) * 1e3,
                100.0 * j["device_busy_fraction_estimate"].get<double>(),
                wall_cycles > 2 * step_cycles ? " (host-bound: see --metrics-report)" : "");
            fmt::print(
                "estimated energy of the whole run: {:.3f} J, {:.0f} W on average (idle board "
                "{:.0f} W)\n",
                energy.total_j(), energy.average_power_w(), energy.idle_power_w);
            fmt::print("host {:.1f} s simulating ({:.3f} s per step)\n", tr->host_seconds(),
                       j["host_seconds_per_step"].get<double>());
        }
        uint64_t fallbacks = 0, ops = 0, compile_cycles = 0;
        for (const trainer::StepWall& w : timeline.steps())
            compile_cycles += w.compile_end - w.lock_end;
        for (const auto& [name, n] : tr->metrics().counters())
            if (name.rfind("aten::", 0) == 0) fallbacks += n;
        for (const trainer::StepTime& t : tr->step_times()) ops += t.ops;
        const std::vector<ResultStat> result{
            {"cycles",
             fmt::format("device cycles of the {} training steps (batch upload to the end of the "
                         "update), summed: the device time of training; board.cycles is the "
                         "whole run",
                         run_steps),
             sim::StatUnit::Cycles, double(step_cycles)},
            {std::string(sim::stat_names::kSteps), "training steps", sim::StatUnit::Count,
             double(run_steps)},
            {std::string(sim::stat_names::kWallCycles),
             "estimated wall-clock cycles of the training steps: the host timeline (tracing, "
             "compiling, dispatching, host reads) overlapped with the device "
             "(trainer/README.md)",
             sim::StatUnit::Cycles, double(wall_cycles)},
            {"batch_rows", "examples per device of a training batch", sim::StatUnit::Count,
             double(tr->batch_rows())},
            {"devices", "cores training", sim::StatUnit::Count, double(tr->cores().size())},
            {"host_syncs", "host reads (loss.item()) inside training steps", sim::StatUnit::Count,
             double(tr->train_host_syncs())},
            {"compiled_steps", "training steps that compiled new programs", sim::StatUnit::Count,
             double(tr->compiled_steps())},
            {"shape_changes", "training steps whose batch shape differed from the first's",
             sim::StatUnit::Count, double(tr->recompile_warnings())},
            {"compile_cycles_estimate",
             "estimated compile time of the training steps on the host timeline",
             sim::StatUnit::Cycles, double(compile_cycles)},
            {"cpu_fallbacks", "ops run on the CPU (aten:: fallbacks)", sim::StatUnit::Count,
             double(fallbacks)},
            {"ops", "ops recorded into the training steps' graphs (kernel calls)",
             sim::StatUnit::Count, double(ops)},
            {"log_every_n_steps", "the loss is read back every this many steps",
             sim::StatUnit::Count, double(o->log_every)}};
        write_stats_file(o->common, dev->board(), dev->kernel_stats(), result);
        dev->set_tracer(nullptr);
        trace.finish();
    });
}

}  // namespace tpu::cli
