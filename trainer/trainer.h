// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "driver/device.h"
#include "driver/program_cache.h"
#include "trainer/data_loader.h"
#include "trainer/graph.h"
#include "trainer/host_timeline.h"
#include "trainer/metrics.h"
#include "trainer/module.h"

namespace tpu::sim {
class Tracer;
}

/// Data-parallel training as PyTorch Lightning does it on a TPU: one replica per selected core,
/// a distributed sampler inserted automatically, gradients averaged over ICI at every optimizer
/// step, replicas kept (and verified) bit-identical.
namespace tpu::trainer {

/// The progress bar's loss field: "loss=2.3026", or "loss=…" before the first loss read-back.
std::string progress_loss_text(std::optional<float> loss);

/// A Trainer argument Lightning would reject; the message is Lightning's.
class ConfigError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

/// Trainer `devices`: "auto", a number of cores, or a list of core indices.
using Devices = std::variant<std::string, int, std::vector<int>>;
/// Parses a command-line value the way Lightning parses strings: "auto", "8", "[5]", "5,".
Devices parse_devices(std::string_view text);
/// Python repr of a Devices value ("'auto'", "9", "[1, 2]"), as Lightning's errors print it.
std::string devices_repr(const Devices& d);
/// Lightning's rule for TPUs: 'auto' and `num_cores` select every core, 1 selects core 0,
/// [i] selects core i; anything else is a ConfigError with Lightning's message. With
/// `num_nodes` > 1 (a pod slice of `hosts` TPU hosts), `devices` counts the cores of one host
/// and every core of every host trains: 'auto' or devices x num_nodes == num_cores, with one
/// node per host; anything else is a ConfigError naming the numbers. On a megacore board
/// (`cores_per_device` > 1, hw::BoardConfig::megacore) the rule counts devices, num_cores /
/// cores_per_device of them, and each selected device brings its cores.
std::vector<uint32_t> resolve_devices(const Devices& d, uint32_t num_cores, uint32_t num_nodes = 1,
                                      uint32_t hosts = 1, uint32_t cores_per_device = 1);
/// "32-true", "bf16-mixed" or "bf16-true"; anything else is a ConfigError.
PrecisionMode parse_precision(std::string_view precision);
/// A precision as a Lightning user types it: the mode it runs in and, for a word Lightning
/// accepts on a TPU with a warning, that warning in Lightning's words (empty otherwise).
struct PrecisionChoice {
    PrecisionMode mode = PrecisionMode::True32;  ///< what runs
    std::string warning;                         ///< Lightning's warning, or empty
};
/// parse_precision's names, and Lightning's older words (trainer/README.md says whose): "32"
/// (Lightning 2's alias of "32-true", silent); "16" (Lightning 1.x: AMP is not supported with
/// TPUs), "16-mixed" (Lightning 2.0: AMP with fp16 is not supported on TPUs) and "bf16"
/// (Lightning 2's alias of "bf16-mixed") run as bf16-mixed with that warning. "16-true" is a
/// ConfigError: fp16 is not modelled. Anything else: parse_precision's error.
PrecisionChoice resolve_precision(std::string_view precision);
/// The precision string of a mode.
std::string_view precision_name(PrecisionMode mode);

/// Trainer arguments (the subset of lightning.Trainer that applies here).
struct TrainerOptions {
    Devices devices = std::string("auto");  ///< "auto", 1, 8 or {i}
    /// TPU hosts (Lightning's num_nodes); above 1, `devices` counts the cores of one host.
    uint32_t num_nodes = 1;
    /// When not empty, these cores instead of `devices`: any set of distinct cores of the board,
    /// for tools that are not bound by Lightning's devices rule (tpusim model).
    std::vector<uint32_t> cores;
    /// Lightning 1.x's `tpu_cores`: when set, the devices to use instead of `devices`, with
    /// Lightning's deprecation warning.
    std::optional<Devices> tpu_cores;
    std::string precision =
        "32-true";            ///< "32-true", "bf16-mixed", "bf16-true" (resolve_precision)
    uint32_t max_epochs = 1;  ///< total epochs, counting a resumed checkpoint's
    int64_t max_steps = -1;   ///< total optimizer steps, counting a resumed checkpoint's (-1: none)
    int64_t limit_train_batches = -1;  ///< steps per epoch at most (-1: all)
    int64_t limit_val_batches = -1;    ///< validation batches at most (-1: all)
    uint32_t log_every_n_steps = 50;   ///< loss read back (a host sync) every n steps
    bool enable_progress_bar = true;   ///< draw a progress bar when stderr is a terminal
    std::string ckpt_path;             ///< resume from this checkpoint in fit()
    uint64_t trace_first_step = 0;     ///< with trace_steps: first global step traced
    uint64_t trace_steps = 0;          ///< trace only this many steps (0: everything)
};

/// A logged training loss: mean over the global batch, read back at a log step.
struct StepLog {
    uint64_t step = 0;       ///< global step (0-based) the loss belongs to
    uint32_t epoch = 0;      ///< epoch of that step
    float loss = 0;          ///< mean cross-entropy over the global batch
    double sim_seconds = 0;  ///< simulated device time at the end of the step
};

/// What one training step cost.
struct StepTime {
    uint64_t cycles = 0;       ///< board cycles from batch upload to the end of the update
    double host_seconds = 0;   ///< host seconds of the same span
    uint64_t begin_cycle = 0;  ///< board cycle the step's batch upload began
    uint64_t wall_cycles = 0;  ///< estimated wall-clock cycles of the step (host timeline)
    uint64_t ops = 0;          ///< ops recorded into the step's graph (kernel calls)
    bool compiled = false;     ///< the step compiled new programs
};

/// The result of validate(). Every figure counts each example of the dataset once: the
/// distributed sampler's padding (repeats that even out the shards) is evaluated, costing its
/// cycles as on a TPU, but weighs nothing in the loss, the accuracy or the count.
struct EvalResult {
    double loss = 0;  ///< mean loss over the real rows (each token of a window)
    /// argmax(logits) == label, over every row of the real examples (each token of a window)
    double accuracy = 0;
    uint32_t examples = 0;  ///< examples counted (padding excluded)
};

/// The result of predict().
struct PredictResult {
    std::vector<float> outputs;   ///< forward(x) of every example in dataset order, row-major
    uint32_t cols = 0;            ///< values per output row
    uint64_t forward_cycles = 0;  ///< board cycles of the forward passes (no transfers)
    uint64_t begin_cycle = 0;     ///< board cycle the first forward pass began
};

/// Fits a Module on the cores selected by `devices` of an open Device.
class Trainer {
public:
    /// Validates devices and precision against the board (ConfigError with Lightning's
    /// wording).
    Trainer(driver::Device& dev, TrainerOptions opts);
    ~Trainer();
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    /// Trains for max_epochs; validates on `val` after each epoch when given.
    void fit(Module& module, const DataLoader& train, const DataLoader* val = nullptr);
    /// Loss and accuracy of `module` on `loader` (evaluation mode, every core its shard).
    EvalResult validate(Module& module, const DataLoader& loader);
    /// forward(x) of every example of `loader` (evaluation mode, every core its shard, no
    /// loss), as lightning.Trainer.predict; labels are not used.
    PredictResult predict(Module& module, const DataLoader& loader);
    /// Writes parameters and optimizer state with sim::OutputFile (atomic for a regular file);
    /// throws ConfigError naming the file.
    void save_checkpoint(const std::string& path);
    /// Places `module` (if needed) and loads parameters and optimizer state from `path`.
    void load_checkpoint(Module& module, const std::string& path);

    /// PyTorch/XLA-style metrics report followed by a short analysis.
    std::string metrics_report() const;
    const Metrics& metrics() const { return m_metrics; }
    const std::vector<StepLog>& history() const { return m_history; }
    /// Cycles and host seconds of every training step so far.
    const std::vector<StepTime>& step_times() const { return m_step_times; }
    const std::vector<uint32_t>& cores() const { return m_cores; }
    PrecisionMode precision() const { return m_mode; }
    uint64_t global_step() const { return m_global_step; }
    /// Simulated device seconds spent in fit() so far: set-up, steps and validation.
    double simulated_seconds() const { return m_sim_seconds; }
    /// Host seconds spent simulating in fit() so far.
    double host_seconds() const { return m_host_seconds; }
    /// The device time of training: board cycles of every training step so far (batch upload
    /// to the end of the update), summed. Set-up, validation and the replica check are not in it.
    uint64_t step_cycles() const;
    /// Where each training step sat on the estimated wall clock (host timeline).
    const HostTimeline& host_timeline() const { return m_timeline; }
    /// Host syncs inside training steps (loss read-backs).
    uint64_t train_host_syncs() const { return m_train_syncs; }
    /// Training steps that compiled new programs (the first one, and every new shape).
    uint64_t compiled_steps() const;
    /// Examples per device of the first training batch.
    uint32_t batch_rows() const { return m_batch_rows; }
    /// Warnings issued (Lightning's deprecations, recompilation, ...), also printed to stderr.
    const std::vector<std::string>& warnings() const { return m_warnings; }
    /// How many of them were recompilations (a new batch shape).
    uint64_t recompile_warnings() const { return m_recompiles; }
    /// Why the last fit() stopped, in Lightning's words ("`Trainer.fit` stopped: `max_steps=0`
    /// reached."); empty before the first fit.
    const std::string& stop_reason() const { return m_stop_reason; }
    /// Optimizer steps the last fit() took (0 when a limit was already reached).
    uint64_t fit_steps() const { return m_fit_steps; }
    /// Steps and validation as spans on a host track (nullptr: off).
    void set_tracer(sim::Tracer* tracer);
    /// Replaces the stderr warning printer (tests).
    void on_warning(std::function<void(const std::string&)> f) { m_warn = std::move(f); }

    /// The kernels of each named layer (forward and backward) since the last clear, for
    /// per-layer tables (see Runtime::layer).
    const std::vector<LayerProfile>& layer_profiles() const;
    void clear_layer_profiles();

    /// The per-core flat buffer of parameters (1 x total values; parameters are views of it).
    const driver::Tensor& flat_parameters() const { return m_flat_params; }

private:
    struct Shard;
    /// Where a graph execution (a step, an evaluation batch) started.
    struct GraphMark {
        uint64_t cycle = 0, calls = 0, misses = 0;
        double compile_host = 0;
        std::chrono::steady_clock::time_point host;
    };
    GraphMark mark_graph() const;
    /// Records the graph started at `m` in the metrics as PyTorch/XLA counts graphs
    /// (ExecuteTime, CompileTime, Cached/UncachedCompile) and returns what the host did for it.
    HostStep finish_graph(const GraphMark& m);
    /// Draws a training step's estimated wall-clock phases on the trace's "wall clock" process.
    void trace_wall(const StepWall& w, const HostStep& step, uint64_t sim_begin);
    void place(Module& module);
    void release();
    /// Uploads examples idx[r][first ..] of every replica r. Positions at or past `real` (the
    /// dataset's examples, counted over the replicas as eval_shards lays them out) are
    /// padding: with `mask_padding` their labels are all zero, so they add nothing to a loss.
    Batch load_batch(const Dataset& data, const std::vector<std::vector<uint32_t>>& idx,
                     uint32_t first, uint32_t examples, bool mask_padding = false);
    /// Refuses a batch whose per-core upload would not fit the HBM a kernel addresses, before
    /// any host buffer of it exists.
    void check_batch(const Dataset& data, uint32_t batch_size) const;
    void optimizer_step(const OptimizerConfig& opt);
    /// Checks an evaluation loader, places `module`, and returns each replica's example
    /// indices (validate() and predict() shard alike).
    std::vector<std::vector<uint32_t>> eval_shards(Module& module, const DataLoader& loader,
                                                   const char* what);
    float read_loss(const Var& loss);
    void verify_replicas(Module& module);
    void warn(const std::string& text);
    /// `loader` with each core's share of its per-device batch (a megacore's cores split it).
    DataLoader per_core(const DataLoader& loader) const;

    driver::Device& m_dev;
    TrainerOptions m_opts;
    std::vector<uint32_t> m_cores;
    /// Cores of one device: a megacore's (hw::BoardConfig::cores_per_device), else 1.
    uint32_t m_cores_per_device = 1;
    PrecisionMode m_mode;
    driver::ProgramCache m_cache;
    Metrics m_metrics;
    std::unique_ptr<Runtime> m_rt;
    Module* m_placed = nullptr;
    OptimizerConfig m_opt;
    driver::Tensor m_flat_params, m_flat_grads, m_state1, m_state2;
    uint64_t m_global_step = 0;
    uint32_t m_adam_step = 0;
    uint32_t m_epoch = 0;
    std::vector<StepLog> m_history;
    std::vector<StepTime> m_step_times;
    uint64_t m_train_syncs = 0;  ///< host syncs inside training steps
    double m_sim_seconds = 0, m_host_seconds = 0;
    std::vector<std::string> m_warnings;
    uint64_t m_recompiles = 0;
    std::string m_stop_reason;
    uint64_t m_fit_steps = 0;
    std::function<void(const std::string&)> m_warn;
    HostTimeline m_timeline;
    sim::Tracer* m_tracer = nullptr;
    int m_track = -1;
    int m_wall_host = -1, m_wall_device = -1;  ///< the wall-clock estimate's tracks
    int64_t m_wall_offset = 0;                 ///< trace cycle of wall-clock cycle 0
    bool m_wall_aligned = false;
    uint64_t m_trace_begin = 0;  ///< cycle the traced steps began
    uint32_t m_batch_rows = 0;   ///< rows of the first training batch (shape changes warn)
};

}  // namespace tpu::trainer
