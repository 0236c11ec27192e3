// SPDX-License-Identifier: Apache-2.0
#include "trainer/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "driver/kernels/allreduce.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"
#include "sim/cluster.h"
#include "sim/file_io.h"
#include "sim/tracer.h"

namespace tpu::trainer {

using driver::Tensor;

// ---- devices and precision ------------------------------------------------------------------

Devices parse_devices(std::string_view text) {
    std::string s(text);
    auto trim = [](std::string v) {
        const auto b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
        return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
    };
    s = trim(s);
    if (s == "auto") return s;
    auto as_int = [](const std::string& v, int& out) {
        if (v.empty()) return false;
        size_t used = 0;
        try {
            out = std::stoi(v, &used);
        } catch (...) {
            return false;
        }
        return used == v.size();
    };
    int n = 0;
    if (as_int(s, n)) return n;
    // "[5]" and "5," are lists, as in Lightning's string parsing.
    std::string body = s;
    if (body.size() >= 2 && body.front() == '[' && body.back() == ']')
        body = body.substr(1, body.size() - 2);
    std::vector<int> list;
    size_t at = 0;
    while (at <= body.size()) {
        const size_t comma = body.find(',', at);
        const std::string item =
            trim(body.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (!item.empty()) {
            if (!as_int(item, n))
                throw ConfigError(fmt::format("Could not parse the selected TPU devices: '{}'", s));
            list.push_back(n);
        }
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    if (list.empty())
        throw ConfigError(fmt::format("Could not parse the selected TPU devices: '{}'", s));
    return list;
}

std::string devices_repr(const Devices& d) {
    if (const auto* s = std::get_if<std::string>(&d)) return fmt::format("'{}'", *s);
    if (const auto* n = std::get_if<int>(&d)) return std::to_string(*n);
    std::string out = "[";
    for (int i : std::get<std::vector<int>>(d))
        out += (out.size() > 1 ? ", " : "") + std::to_string(i);
    return out + "]";
}

std::vector<uint32_t> resolve_devices(const Devices& d, uint32_t num_cores, uint32_t num_nodes,
                                      uint32_t hosts, uint32_t cores_per_device) {
    if (cores_per_device > 1) {
        // A megacore: the rule below over devices, then each device's cores.
        std::vector<uint32_t> cores;
        for (uint32_t dev : resolve_devices(d, num_cores / cores_per_device, num_nodes, hosts))
            for (uint32_t c = 0; c < cores_per_device; ++c)
                cores.push_back(dev * cores_per_device + c);
        return cores;
    }
    std::vector<uint32_t> all(num_cores);
    for (uint32_t i = 0; i < num_cores; ++i) all[i] = i;
    if (num_nodes == 0) throw ConfigError("`num_nodes` must be at least 1. Got 0");
    if (num_nodes > 1) {
        // A pod slice: xla_dist runs one process per host, each driving all of its cores.
        const auto* n = std::get_if<int>(&d);
        const auto* s = std::get_if<std::string>(&d);
        if (n && int64_t(*n) * num_nodes != int64_t(num_cores))
            throw ConfigError(fmt::format(
                "`devices={}` x `num_nodes={}` = {} cores, but the board has {} cores: a TPU "
                "pod slice trains on every core of every host",
                *n, num_nodes, int64_t(*n) * num_nodes, num_cores));
        if (!n && !(s && *s == "auto"))
            throw ConfigError(fmt::format(
                "`devices={}` with `num_nodes={}`: on a TPU pod slice `devices` is 'auto' or the "
                "cores of one host ({})",
                devices_repr(d), num_nodes, num_cores / num_nodes));
        if (num_nodes != hosts)
            throw ConfigError(fmt::format(
                "`num_nodes={}`: the board has {} TPU hosts (chips / chips_per_host), and a pod "
                "slice runs one node per host",
                num_nodes, hosts));
        return all;
    }
    if (const auto* s = std::get_if<std::string>(&d)) {
        if (*s == "auto") return all;
    } else if (const auto* n = std::get_if<int>(&d)) {
        if (*n == 1) return {0};
        if (*n == int(num_cores)) return all;
    } else {
        const auto& list = std::get<std::vector<int>>(d);
        if (list.size() == 1 && list[0] >= 0 && list[0] < int(num_cores))
            return {uint32_t(list[0])};
    }
    throw ConfigError(
        fmt::format("`devices` can only be 'auto', 1, {} or [<0-{}>] for TPUs. Got {}", num_cores,
                    num_cores - 1, devices_repr(d)));
}

PrecisionMode parse_precision(std::string_view precision) {
    if (precision == "32-true") return PrecisionMode::True32;
    if (precision == "bf16-mixed") return PrecisionMode::Bf16Mixed;
    if (precision == "bf16-true") return PrecisionMode::Bf16True;
    throw ConfigError(
        fmt::format("`precision='{}'` is not supported in XLA. `precision` must be "
                    "one of: ('32-true', 'bf16-mixed', 'bf16-true').",
                    precision));
}

PrecisionChoice resolve_precision(std::string_view precision) {
    // Lightning 2's aliases of its 1.x words: "32" silently, the others with its warning.
    if (precision == "32") return {PrecisionMode::True32, {}};
    if (precision == "16")
        return {PrecisionMode::Bf16Mixed,
                "You passed `Trainer(accelerator='tpu', precision=16)` but AMP is not supported "
                "with TPUs. Using `precision='bf16'` instead."};
    if (precision == "16-mixed")
        return {PrecisionMode::Bf16Mixed,
                "You passed `Trainer(accelerator='tpu', precision='16-mixed')` but AMP with fp16 "
                "is not supported on TPUs. Using `precision='bf16-mixed'` instead."};
    if (precision == "bf16")
        return {PrecisionMode::Bf16Mixed,
                "`precision=bf16` is supported for historical reasons but its usage is "
                "discouraged. Please set your precision to bf16-mixed instead!"};
    if (precision == "16-true")
        throw ConfigError(
            "`precision='16-true'`: fp16 is not modelled (the MXU multiplies bf16); use "
            "'bf16-true' or 'bf16-mixed'");
    return {parse_precision(precision), {}};
}

std::string_view precision_name(PrecisionMode mode) {
    switch (mode) {
        case PrecisionMode::True32:
            return "32-true";
        case PrecisionMode::Bf16Mixed:
            return "bf16-mixed";
        case PrecisionMode::Bf16True:
            return "bf16-true";
    }
    return "?";
}

// ---- trainer --------------------------------------------------------------------------------

namespace {

/// Flat buffers keep each parameter 256-byte aligned, as DMA rows like.
constexpr uint64_t kAlignValues = 64;

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string clock_text(double seconds) {
    const auto s = static_cast<uint64_t>(std::max(0.0, seconds));
    return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

}  // namespace

std::string progress_loss_text(std::optional<float> loss) {
    // The loss is read back only every log_every_n_steps steps (a host sync): until the first
    // read-back there is no value to show, which is not the same as a NaN loss.
    return loss ? fmt::format("loss={:.4f}", *loss) : std::string("loss=\u2026");
}

namespace {

/// Lightning-like bar on stderr, redrawn in place; only when stderr is a terminal, and over MPI
/// only on rank 0 (every rank runs the same loop).
class ProgressBar {
public:
    explicit ProgressBar(bool enabled)
        : m_on(enabled && isatty(STDERR_FILENO) && sim::Cluster::rank() == 0) {}
    void start(uint32_t epoch, uint64_t total) {
        m_epoch = epoch;
        m_total = total;
        m_t0 = std::chrono::steady_clock::now();
    }
    void update(uint64_t done, std::optional<float> loss, double sim_seconds) {
        if (!m_on) return;
        const double el = since(m_t0), eta = done ? el / double(done) * double(m_total - done) : 0;
        const int width = 20, filled = int(double(width) * double(done) / double(m_total));
        std::fprintf(stderr, "\rEpoch %u: %3d%%|%s%s| %llu/%llu [%s<%s, sim %.3f ms] %s ", m_epoch,
                     int(100.0 * double(done) / double(m_total)),
                     std::string(size_t(filled), '#').c_str(),
                     std::string(size_t(width - filled), ' ').c_str(), (unsigned long long)done,
                     (unsigned long long)m_total, clock_text(el).c_str(), clock_text(eta).c_str(),
                     sim_seconds * 1e3, progress_loss_text(loss).c_str());
        std::fflush(stderr);
    }
    void finish() {
        if (m_on) std::fprintf(stderr, "\n");
    }

private:
    bool m_on;
    uint32_t m_epoch = 0;
    uint64_t m_total = 1;
    std::chrono::steady_clock::time_point m_t0;
};

}  // namespace

Trainer::Trainer(driver::Device& dev, TrainerOptions opts)
    : m_dev(dev),
      m_opts(std::move(opts)),
      m_cores(m_opts.cores.empty()
                  ? resolve_devices(m_opts.tpu_cores ? *m_opts.tpu_cores : m_opts.devices,
                                    dev.num_cores(), m_opts.num_nodes, dev.config().hosts(),
                                    dev.config().cores_per_device())
                  : m_opts.cores),
      m_cores_per_device(m_opts.cores.empty() ? dev.config().cores_per_device() : 1),
      m_mode(resolve_precision(m_opts.precision).mode),
      // Every rank records the warning; rank 0 prints it (Lightning's rank_zero_warn).
      m_warn([](const std::string& w) {
          if (sim::Cluster::rank() == 0) std::fprintf(stderr, "%s\n", w.c_str());
      }),
      m_timeline(dev.config().runtime, dev.config().clock()) {
    for (size_t i = 0; i < m_cores.size(); ++i)
        if (m_cores[i] >= dev.num_cores() ||
            std::find(m_cores.begin(), m_cores.begin() + int64_t(i), m_cores[i]) !=
                m_cores.begin() + int64_t(i))
            throw ConfigError(
                fmt::format("cores: core {} is {} (the board has {} cores)", m_cores[i],
                            m_cores[i] >= dev.num_cores() ? "not on the board" : "listed twice",
                            dev.num_cores()));
    if (m_opts.max_epochs == 0) throw ConfigError("`max_epochs` must be at least 1. Got 0");
    if (m_opts.log_every_n_steps == 0)
        throw ConfigError("`log_every_n_steps` must be at least 1. Got 0");
    // -1 is "all"; 0 would train or validate nothing, which no caller means.
    for (const auto& [name, limit] : {std::pair{"limit_train_batches", m_opts.limit_train_batches},
                                      std::pair{"limit_val_batches", m_opts.limit_val_batches}})
        if (limit == 0 || limit < -1)
            throw ConfigError(fmt::format(
                "`{}` must be a number of batches >= 1 or -1 (all). Got {}", name, limit));
    m_rt = std::make_unique<Runtime>(m_dev, m_cache, m_cores, m_mode, m_metrics);
    // Lightning's words for its older arguments (trainer/README.md names the versions).
    if (m_opts.tpu_cores) {
        const std::string n = devices_repr(*m_opts.tpu_cores);
        warn(
            fmt::format("warning: Setting `Trainer(tpu_cores={})` is deprecated in v1.7 and will "
                        "be removed in v2.0. Please use `Trainer(accelerator='tpu', devices={})` "
                        "instead.",
                        n, n));
        const auto* d = std::get_if<std::string>(&m_opts.devices);
        if (!d || *d != "auto")
            warn(
                fmt::format("warning: The flag `devices={}` will be ignored, instead the device "
                            "specific number {} will be used",
                            devices_repr(m_opts.devices), n));
    }
    if (const std::string w = resolve_precision(m_opts.precision).warning; !w.empty())
        warn("warning: " + w);
}

Trainer::~Trainer() {
    try {
        release();
    } catch (...) {
    }
}

void Trainer::set_tracer(sim::Tracer* tracer) {
    m_tracer = tracer && tracer->enabled() ? tracer : nullptr;
    m_track = m_tracer ? m_tracer->track("host", "trainer") : -1;
    // The estimate runs on its own clock, so its tracks ignore the cycle window.
    m_wall_host =
        m_tracer ? m_tracer->track(sim::kWallClockProcess, "host", sim::TrackWindow::Own) : -1;
    m_wall_device =
        m_tracer ? m_tracer->track(sim::kWallClockProcess, "device", sim::TrackWindow::Own) : -1;
    m_wall_aligned = false;
}

Trainer::GraphMark Trainer::mark_graph() const {
    return {m_dev.now_cycle(), m_rt->kernel_calls(), m_cache.misses(), m_cache.compile_seconds(),
            std::chrono::steady_clock::now()};
}

HostStep Trainer::finish_graph(const GraphMark& m) {
    HostStep s;
    s.ops = m_rt->kernel_calls() - m.calls;
    s.compiled = m_cache.misses() > m.misses;
    s.device_cycles = m_dev.now_cycle() - m.cycle;
    s.cpu_fallbacks = m_rt->take_cpu_fallbacks();
    const sim::ClockDomain clock = m_dev.config().clock();
    // One sample per graph, as PyTorch/XLA counts executions and compilations: the device time
    // of the graph (host seconds spent simulating it beside), and on a compile-cache miss the
    // compile time of the host timeline (host seconds spent generating programs beside).
    m_metrics.add_time("ExecuteTime", clock.seconds(double(s.device_cycles)), since(m.host));
    if (s.compiled) {
        m_metrics.add_time("CompileTime", clock.seconds(double(m_timeline.compile_cycles(s.ops))),
                           m_cache.compile_seconds() - m.compile_host);
        m_metrics.count("UncachedCompile");
    } else if (s.ops > 0) {
        m_metrics.count("CachedCompile");
    }
    return s;
}

void Trainer::trace_wall(const StepWall& w, const HostStep& step, uint64_t sim_begin) {
    if (!m_tracer || (m_wall_host < 0 && m_wall_device < 0)) return;
    if (!m_wall_aligned) {
        // The first step drawn starts on the host at the cycle its device work starts in the
        // simulation; from there the estimate runs on its own (longer) clock.
        m_wall_offset = int64_t(sim_begin) - int64_t(w.trace_begin);
        m_wall_aligned = true;
    }
    auto span = [&](int track, std::string_view name, uint64_t a, uint64_t b,
                    std::initializer_list<sim::TraceArg> args = {}) {
        if (b <= a) return;
        const int64_t ta = int64_t(a) + m_wall_offset, tb = int64_t(b) + m_wall_offset;
        if (ta < 0) return;
        m_tracer->complete(track, name, uint64_t(ta), uint64_t(tb), args);
    };
    const uint64_t step_no = m_global_step;
    span(m_wall_host, "trace", w.trace_begin, w.trace_end, {{"step", step_no}, {"ops", step.ops}});
    if (!step.cpu_fallbacks.empty())
        span(m_wall_host, "cpu fallbacks", w.trace_end, w.fallback_end,
             {{"ops", uint64_t(step.cpu_fallbacks.size())},
              {"first", std::string_view(step.cpu_fallbacks.front())}});
    span(m_wall_host, "wait for device (mark_step)", w.fallback_end, w.lock_end);
    span(m_wall_host, "compile", w.lock_end, w.compile_end, {{"step", step_no}});
    span(m_wall_host, "dispatch", w.compile_end, w.dispatch_end, {{"step", step_no}});
    if (step.reads) {
        span(m_wall_host, "wait for device (.item())", w.dispatch_end, w.device_end);
        span(m_wall_host, "read", w.device_end, w.host_end);
    }
    span(m_wall_device, "train_step", w.device_begin, w.device_end,
         {{"step", step_no}, {"device_cycles", step.device_cycles}});
}

uint64_t Trainer::step_cycles() const {
    uint64_t sum = 0;
    for (const StepTime& t : m_step_times) sum += t.cycles;
    return sum;
}

uint64_t Trainer::compiled_steps() const {
    uint64_t n = 0;
    for (const StepTime& t : m_step_times) n += t.compiled;
    return n;
}

void Trainer::warn(const std::string& text) {
    m_warnings.push_back(text);
    if (m_warn) m_warn(text);
}

void Trainer::release() {
    m_rt->end_step();
    for (Tensor* t : {&m_flat_params, &m_flat_grads, &m_state1, &m_state2})
        if (!t->bufs.empty()) driver::free_tensor(m_dev, *t);
    m_placed = nullptr;
}

void Trainer::place(Module& module) {
    if (m_placed == &module) return;
    release();
    const auto params = module.named_parameters();
    if (params.empty()) throw ConfigError("The module has no parameters to optimize");
    uint64_t total = 0;
    for (const auto& [name, p] : params) {
        if (!p->init) throw ConfigError(fmt::format("parameter {} has no initialiser", name));
        p->offset = total;
        total += (uint64_t(p->rows) * p->cols + kAlignValues - 1) / kAlignValues * kAlignValues;
    }
    if (total > UINT32_MAX / 4)
        throw ConfigError(
            fmt::format("{} parameter values do not fit a core's 4 GiB window", total));
    const auto n = static_cast<uint32_t>(total);
    m_opt = module.configure_optimizers();
    m_flat_params = driver::alloc_tensor(m_dev, m_cores, 1, n);
    m_flat_grads = driver::alloc_tensor(m_dev, m_cores, 1, n);
    m_state1 = driver::alloc_tensor(m_dev, m_cores, 1, n);
    if (m_opt.kind == OptimizerConfig::Kind::Adam)
        m_state2 = driver::alloc_tensor(m_dev, m_cores, 1, n);
    // Initial values go to every replica once (the broadcast Lightning does at setup). A
    // timing-only board holds no values: the transfers are timed, no value is made.
    if (m_dev.config().sim.functional) {
        std::vector<float> host(n, 0.0f);
        for (const auto& [name, p] : params)
            p->init({host.data() + p->offset, uint64_t(p->rows) * p->cols});
        const std::vector<float> zeros(n, 0.0f);
        for (size_t r = 0; r < m_cores.size(); ++r) {
            m_rt->upload(m_flat_params, r, host);
            m_rt->upload(m_flat_grads, r, zeros);
            m_rt->upload(m_state1, r, zeros);
            if (!m_state2.bufs.empty()) m_rt->upload(m_state2, r, zeros);
        }
    } else {
        for (size_t r = 0; r < m_cores.size(); ++r)
            for (const Tensor* t : {&m_flat_params, &m_flat_grads, &m_state1, &m_state2})
                if (!t->bufs.empty()) m_rt->upload_timing(*t, r);
    }
    if (m_mode == PrecisionMode::Bf16True)
        m_rt->exec("round_bf16", [&] {
            return driver::round_bf16(m_dev, m_cache, m_flat_params, m_flat_params);
        });
    // Setup ends when the state is on the device, as torch_xla's model.to(device) returns once
    // the copies are done: the first step starts with its weights resident instead of waiting
    // for the posted writes (tens of MB on a ResNet), so every step times the step alone.
    m_dev.synchronize();
    for (const auto& [name, p] : params) {
        p->value = driver::view(m_flat_params, p->offset, p->rows, p->cols);
        p->grad = driver::view(m_flat_grads, p->offset, p->rows, p->cols);
    }
    m_placed = &module;
    m_adam_step = 0;
}

Batch Trainer::load_batch(const Dataset& data, const std::vector<std::vector<uint32_t>>& idx,
                          uint32_t first, uint32_t examples, bool mask_padding) {
    const uint32_t per = data.rows_per_example();
    const uint32_t rows = examples * per;
    Batch b;
    b.rows = rows;
    b.x = m_rt->leaf(rows, data.features);
    b.onehot = m_rt->leaf(rows, data.classes);
    if (!m_dev.config().sim.functional) {
        // A timing-only board holds no values: time the uploads, stage nothing.
        for (size_t r = 0; r < m_cores.size(); ++r) {
            m_rt->upload_timing(b.x->value, r);
            m_rt->upload_timing(b.onehot->value, r);
        }
        return b;
    }
    std::vector<float> x(size_t(rows) * data.features), y(size_t(rows) * data.classes);
    for (size_t r = 0; r < m_cores.size(); ++r) {
        std::fill(y.begin(), y.end(), 0.0f);
        if (data.context) std::fill(x.begin(), x.end(), 0.0f);
        for (uint32_t i = 0; i < examples; ++i) {
            const uint32_t e = idx[r][first + i];
            if (data.context) {
                // A window's rows are one-hot tokens; the embedding is a one-hot matmul.
                const uint64_t start = uint64_t(e) * data.stride;
                for (uint32_t t = 0; t < per; ++t)
                    x[(size_t(i) * per + t) * data.features + data.tokens[start + t]] = 1.0f;
            } else {
                const uint64_t n = uint64_t(per) * data.features;
                std::copy_n(data.x.begin() + int64_t(e * n), n, x.begin() + int64_t(i * n));
            }
            // eval_shards puts example r + i N of the dataset at position i of replica r.
            if (mask_padding && r + uint64_t(first + i) * m_cores.size() >= data.count) continue;
            for (uint32_t t = 0; t < per; ++t)
                y[(size_t(i) * per + t) * data.classes + data.label(e, t)] = 1.0f;
        }
        m_rt->upload(b.x->value, r, x);
        m_rt->upload(b.onehot->value, r, y);
    }
    return b;
}

void Trainer::optimizer_step(const OptimizerConfig& opt) {
    // A parameter the step did not use keeps no stale gradient: it gets zeros.
    for (Parameter* p : m_rt->params_without_grad()) {
        if (!m_dev.config().sim.functional) {
            for (size_t r = 0; r < m_cores.size(); ++r) m_rt->upload_timing(p->grad, r);
            continue;
        }
        const std::vector<float> zeros(uint64_t(p->rows) * p->cols, 0.0f);
        for (size_t r = 0; r < m_cores.size(); ++r) m_rt->upload(p->grad, r, zeros);
    }
    if (m_cores.size() > 1)
        m_rt->exec("allreduce_mean", [&] {
            return driver::allreduce(m_dev, m_cache, m_flat_grads, 1.0f / float(m_cores.size()));
        });
    if (opt.kind == OptimizerConfig::Kind::Sgd) {
        m_rt->exec("sgd_momentum", [&] {
            return driver::sgd_momentum(m_dev, m_cache, m_flat_params, m_flat_grads, m_state1,
                                        opt.lr, opt.momentum);
        });
    } else {
        ++m_adam_step;
        m_rt->exec("adam", [&] {
            return driver::adam(m_dev, m_cache, m_flat_params, m_flat_grads, m_state1, m_state2,
                                opt.lr, opt.beta1, opt.beta2, opt.eps, m_adam_step);
        });
    }
    if (m_mode == PrecisionMode::Bf16True)
        m_rt->exec("round_bf16", [&] {
            return driver::round_bf16(m_dev, m_cache, m_flat_params, m_flat_params);
        });
}

const std::vector<LayerProfile>& Trainer::layer_profiles() const {
    return m_rt->layer_profiles();
}

void Trainer::clear_layer_profiles() {
    m_rt->clear_layer_profiles();
}

float Trainer::read_loss(const Var& loss) {
    if (m_cores.size() > 1)
        m_rt->exec("allreduce_mean", [&] {
            return driver::allreduce(m_dev, m_cache, loss->value, 1.0f / float(m_cores.size()));
        });
    return m_rt->download(loss->value, 0)[0];
}

DataLoader Trainer::per_core(const DataLoader& loader) const {
    DataLoader l = loader;
    if (m_cores_per_device > 1 && loader.batch_size % m_cores_per_device != 0)
        throw ConfigError(fmt::format(
            "batch_size={}: a megacore device splits its batch over its {} cores; use a "
            "multiple of {}",
            loader.batch_size, m_cores_per_device, m_cores_per_device));
    l.batch_size = loader.batch_size / m_cores_per_device;
    return l;
}

void Trainer::fit(Module& module, const DataLoader& device_loader, const DataLoader* val) {
    // Below, every replica is a core: a megacore device's batch is split over its cores.
    const DataLoader train = per_core(device_loader);
    if (!train.dataset || train.dataset->count == 0)
        throw ConfigError("fit: the training DataLoader has no dataset");
    if (train.batch_size == 0)
        throw ConfigError("batch_size should be a positive integer value, but got batch_size=0");
    check_batch(*train.dataset, train.batch_size);
    const auto t0 = std::chrono::steady_clock::now();
    const double sim0 = m_dev.now_seconds();
    // Tracing a few steps: nothing is kept until the first traced step starts, not even the
    // set-up's uploads (a trace that opens on an empty timeline hides the steps it recorded).
    const bool windowed = m_tracer && m_opts.trace_steps > 0;
    if (windowed && m_global_step <= m_opts.trace_first_step) m_tracer->set_window(UINT64_MAX, 0);
    place(module);
    if (!m_opts.ckpt_path.empty()) load_checkpoint(module, m_opts.ckpt_path);
    const uint64_t step0 = m_global_step;
    const Dataset& data = *train.dataset;
    const auto N = static_cast<uint32_t>(m_cores.size());
    // The sampler Lightning inserts: even shards, padded by wrapping around.
    std::vector<DistributedSampler> samplers;
    for (uint32_t r = 0; r < N; ++r)
        samplers.emplace_back(data.count, N, r, train.shuffle, train.seed, false);
    const uint32_t per = samplers[0].per_replica();
    uint64_t steps =
        train.drop_last ? per / train.batch_size : (per + train.batch_size - 1) / train.batch_size;
    if (m_opts.limit_train_batches >= 0)
        steps = std::min<uint64_t>(steps, uint64_t(m_opts.limit_train_batches));
    if (m_opts.max_steps < -1)
        throw ConfigError(fmt::format("max_steps must be -1 or a non-negative integer, got {}",
                                      m_opts.max_steps));
    if (steps == 0)
        throw ConfigError(
            fmt::format("fit: {} examples per device do not make one batch of {} "
                        "(drop_last=True)",
                        per, train.batch_size));
    ProgressBar bar(m_opts.enable_progress_bar);
    const OptimizerConfig opt = module.configure_optimizers();
    try {
        opt.validate();
    } catch (const OptimizerError& e) {
        throw ConfigError(e.what());
    }
    // max_epochs is the total, as in Lightning: a run resumed after epoch 1 of max_epochs=1
    // trains nothing more.
    // The bar keeps the last loss read back (from an earlier epoch too) until a new one.
    std::optional<float> last_loss;
    // Lightning stops at max_steps wherever it falls, mid-epoch too, and still validates.
    const auto steps_left = [&] {
        return m_opts.max_steps < 0 ? UINT64_MAX
                                    : uint64_t(m_opts.max_steps) -
                                          std::min(m_global_step, uint64_t(m_opts.max_steps));
    };
    for (; m_epoch < m_opts.max_epochs && steps_left() > 0; ++m_epoch) {
        const uint64_t epoch_steps = std::min(steps, steps_left());
        std::vector<std::vector<uint32_t>> idx;
        for (auto& s : samplers) {
            s.set_epoch(m_epoch);
            idx.push_back(s.indices());
        }
        bar.start(m_epoch, epoch_steps);
        for (uint64_t s = 0; s < epoch_steps; ++s) {
            const uint64_t c0 = m_dev.now_cycle();
            const auto h0 = std::chrono::steady_clock::now();
            const GraphMark graph = mark_graph();
            if (windowed && m_global_step == m_opts.trace_first_step) {
                m_trace_begin = c0;
                m_tracer->set_window(c0, 0);
            }
            if (windowed && m_global_step == m_opts.trace_first_step + m_opts.trace_steps)
                m_tracer->set_window(m_trace_begin, c0);
            const auto first = static_cast<uint32_t>(s * train.batch_size);
            const uint32_t rows = std::min(train.batch_size, per - first);
            if (m_batch_rows == 0) m_batch_rows = rows;
            const uint64_t misses = m_cache.misses();
            m_rt->set_training(true);
            const uint64_t syncs = m_metrics.counter("HostSync");
            Batch batch = load_batch(data, idx, first, rows);
            Var loss = module.training_step(*m_rt, batch);
            m_rt->backward(loss);
            optimizer_step(opt);
            const bool log =
                (m_global_step + 1) % m_opts.log_every_n_steps == 0 || s + 1 == epoch_steps;
            if (log) {
                last_loss = read_loss(loss);
                m_history.push_back({m_global_step, m_epoch, *last_loss, m_dev.now_seconds()});
            }
            m_rt->end_step();
            m_metrics.count("MarkStep");
            // A new batch shape recompiles every kernel it touches; other first-time programs
            // (the loss read-back at the first log step) are expected.
            if (m_global_step > 0 && m_cache.misses() > misses && rows != m_batch_rows) {
                ++m_recompiles;
                warn(fmt::format(
                    "warning: step {} compiled {} new programs: its batch has {} rows "
                    "per device instead of {}. Every new shape recompiles (as on a "
                    "TPU); use drop_last=True (tpusim train --drop-last) or a dataset size "
                    "that divides evenly.",
                    m_global_step, m_cache.misses() - misses, rows, m_batch_rows));
            }
            HostStep host = finish_graph(graph);
            host.reads = log ? 1 : 0;
            const StepWall& wall = m_timeline.add(host);
            if (m_tracer) {
                m_tracer->complete(m_track, "train_step", c0, m_dev.now_cycle(),
                                   {{"step", m_global_step}, {"rows", uint64_t(rows)}});
                const bool traced =
                    !windowed || (m_global_step >= m_opts.trace_first_step &&
                                  m_global_step < m_opts.trace_first_step + m_opts.trace_steps);
                if (traced) trace_wall(wall, host, c0);
            }
            m_step_times.push_back(
                {m_dev.now_cycle() - c0, since(h0), c0, wall.wall_cycles, host.ops, host.compiled});
            m_train_syncs += m_metrics.counter("HostSync") - syncs;
            ++m_global_step;
            bar.update(s + 1, last_loss, m_dev.now_seconds() - sim0);
        }
        bar.finish();
        if (val) {
            const uint64_t c0 = m_dev.now_cycle();
            const EvalResult r = validate(module, *val);
            if (m_tracer)
                m_tracer->complete(m_track, "validation", c0, m_dev.now_cycle(),
                                   {{"examples", uint64_t(r.examples)}});
        }
    }
    m_fit_steps = m_global_step - step0;
    // Lightning's fit loop says which limit ended it (a resumed run may have met it already).
    m_stop_reason =
        steps_left() == 0
            ? fmt::format("`Trainer.fit` stopped: `max_steps={}` reached.", m_opts.max_steps)
            : fmt::format("`Trainer.fit` stopped: `max_epochs={}` reached.", m_opts.max_epochs);
    verify_replicas(module);
    m_sim_seconds += m_dev.now_seconds() - sim0;
    m_host_seconds += since(t0);
}

void Trainer::check_batch(const Dataset& data, uint32_t batch_size) const {
    // Inputs and one-hot labels of one batch on one core, in 64 bits.
    const uint64_t rows = uint64_t(batch_size) * data.rows_per_example();
    const uint64_t width = uint64_t(data.features) + data.classes;
    if (width != 0 && rows > driver::kHbmWindowBytes / 4 / width)
        throw ConfigError(fmt::format(
            "batch_size={}: a batch of {} rows of {} input and {} label values per device is "
            "larger than the 4 GiB a core's kernels address",
            batch_size, rows, data.features, data.classes));
}

std::vector<std::vector<uint32_t>> Trainer::eval_shards(Module& module, const DataLoader& loader,
                                                        const char* what) {
    if (!loader.dataset || loader.dataset->count == 0)
        throw ConfigError(fmt::format("{}: the DataLoader has no dataset", what));
    if (loader.batch_size == 0)
        throw ConfigError("batch_size should be a positive integer value, but got batch_size=0");
    place(module);
    const uint32_t count = loader.dataset->count;
    const auto N = static_cast<uint32_t>(m_cores.size());
    // Shard r holds examples r, r + N, ...; positions past the dataset are padding (repeats)
    // and are not counted.
    const uint32_t per = (count + N - 1) / N;
    std::vector<std::vector<uint32_t>> idx(N);
    for (uint32_t r = 0; r < N; ++r)
        for (uint32_t i = 0; i < per; ++i) idx[r].push_back((r + i * N) % count);
    return idx;
}

PredictResult Trainer::predict(Module& module, const DataLoader& device_loader) {
    const DataLoader loader = per_core(device_loader);
    if (loader.dataset) check_batch(*loader.dataset, loader.batch_size);
    const std::vector<std::vector<uint32_t>> idx = eval_shards(module, loader, "predict");
    const Dataset& data = *loader.dataset;
    const auto N = static_cast<uint32_t>(m_cores.size());
    const auto per = uint32_t(idx[0].size());
    PredictResult res;
    m_rt->set_training(false);
    for (uint32_t first = 0; first < per; first += loader.batch_size) {
        const uint32_t rows = std::min(loader.batch_size, per - first);
        const GraphMark graph = mark_graph();
        Batch batch = load_batch(data, idx, first, rows);
        // Host writes are posted: wait for them, so the forward's cycles hold no transfer.
        m_dev.synchronize();
        const uint64_t c0 = m_dev.now_cycle();
        if (first == 0) res.begin_cycle = c0;
        const Var out = module.forward(*m_rt, batch.x);
        m_dev.synchronize();
        res.forward_cycles += m_dev.now_cycle() - c0;
        const uint32_t out_rows = out->value.rows / rows;  // output rows per example
        res.cols = out->value.cols;
        const size_t example = size_t(out_rows) * res.cols;
        if (res.outputs.empty()) res.outputs.resize(size_t(data.count) * example);
        for (uint32_t r = 0; r < N; ++r) {
            const std::vector<float> v = m_rt->download(out->value, r);
            for (uint32_t i = 0; i < rows; ++i) {
                const uint64_t e = r + uint64_t(first + i) * N;
                if (e >= data.count) continue;  // padding
                std::copy_n(v.begin() + int64_t(i * example), example,
                            res.outputs.begin() + int64_t(e * example));
            }
        }
        m_rt->end_step();
        finish_graph(graph);
    }
    m_rt->set_training(true);
    return res;
}

EvalResult Trainer::validate(Module& module, const DataLoader& device_loader) {
    const DataLoader loader = per_core(device_loader);
    if (loader.dataset) check_batch(*loader.dataset, loader.batch_size);
    const std::vector<std::vector<uint32_t>> idx = eval_shards(module, loader, "validate");
    const Dataset& data = *loader.dataset;
    const auto N = static_cast<uint32_t>(m_cores.size());
    const auto per = uint32_t(idx[0].size());
    uint64_t batches = (per + loader.batch_size - 1) / loader.batch_size;
    if (m_opts.limit_val_batches >= 0)
        batches = std::min<uint64_t>(batches, uint64_t(m_opts.limit_val_batches));
    EvalResult res;
    double loss_sum = 0;  // sum over batches of the loss of their real rows
    uint64_t loss_rows = 0;
    uint64_t correct = 0, predictions = 0;
    const uint32_t per_example = data.rows_per_example();
    m_rt->set_training(false);
    for (uint64_t b = 0; b < batches; ++b) {
        const auto first = static_cast<uint32_t>(b * loader.batch_size);
        const uint32_t rows = std::min(loader.batch_size, per - first);
        // Padding rows get all-zero labels: their loss terms are -(0 . log p) = 0, so the
        // device's mean over the global batch (every core's rows x N) times that row count is
        // the sum over the real rows alone (trainer/README.md, "one rule for padding").
        const GraphMark graph = mark_graph();
        Batch batch = load_batch(data, idx, first, rows, true);
        StepOutput out = module.validation_step(*m_rt, batch);
        uint64_t real = 0;
        for (uint32_t r = 0; r < N; ++r)
            for (uint32_t i = 0; i < rows; ++i) real += r + uint64_t(first + i) * N < data.count;
        loss_sum += double(read_loss(out.loss)) * double(rows) * per_example * N;
        loss_rows += real * per_example;
        const uint32_t classes = out.logits->value.cols;
        for (uint32_t r = 0; r < N; ++r) {
            const std::vector<float> logits = m_rt->download(out.logits->value, r);
            for (uint32_t i = 0; i < rows; ++i) {
                if (r + uint64_t(first + i) * N >= data.count) continue;  // padding
                for (uint32_t t = 0; t < data.rows_per_example(); ++t) {
                    const float* row =
                        logits.data() + (size_t(i) * data.rows_per_example() + t) * classes;
                    const auto best = uint32_t(std::max_element(row, row + classes) - row);
                    correct += best == data.label(idx[r][first + i], t);
                    ++predictions;
                }
                ++res.examples;
            }
        }
        m_rt->end_step();
        finish_graph(graph);
    }
    m_rt->set_training(true);
    res.loss = loss_rows ? loss_sum / double(loss_rows) : 0;
    res.accuracy = predictions ? double(correct) / double(predictions) : 0;
    return res;
}

void Trainer::verify_replicas(Module& module) {
    if (m_cores.size() < 2) return;
    const std::vector<float> first = m_rt->download(m_flat_params, 0);
    for (size_t r = 1; r < m_cores.size(); ++r) {
        const std::vector<float> other = m_rt->download(m_flat_params, r);
        if (std::memcmp(first.data(), other.data(), first.size() * 4) == 0) continue;
        size_t i = 0;
        while (std::memcmp(&first[i], &other[i], 4) == 0) ++i;
        std::string where = fmt::format("value {}", i);
        for (const auto& [name, p] : module.named_parameters())
            if (i >= p->offset && i < p->offset + uint64_t(p->rows) * p->cols)
                where = fmt::format("{}[{}]", name, i - p->offset);
        throw std::runtime_error(
            fmt::format("replicas diverged: core {} holds {} = {} but core {} holds {}", m_cores[r],
                        where, other[i], m_cores[0], first[i]));
    }
}

// ---- checkpoints ----------------------------------------------------------------------------

namespace {
constexpr char kCkptMagic[] = "TPUCKPT1\n";
/// The longest header line read: names, shapes and offsets of every parameter, a few hundred
/// bytes each (ResNet-50's 161 parameters take about 12 KB).
constexpr uint64_t kCkptMaxHeader = uint64_t(16) << 20;
}  // namespace

void Trainer::save_checkpoint(const std::string& path) {
    if (!m_placed) throw ConfigError("save_checkpoint: fit() has not placed a module yet");
    nlohmann::json meta;
    meta["epoch"] = m_epoch;
    meta["global_step"] = m_global_step;
    meta["adam_step"] = m_adam_step;
    meta["precision"] = precision_name(m_mode);
    meta["optimizer"] = m_opt.kind == OptimizerConfig::Kind::Adam ? "adam" : "sgd";
    meta["values"] = m_flat_params.cols;
    for (const auto& [name, p] : m_placed->named_parameters())
        meta["parameters"].push_back(
            {{"name", name}, {"rows", p->rows}, {"cols", p->cols}, {"offset", p->offset}});
    std::vector<const Tensor*> bufs{&m_flat_params, &m_state1};
    if (!m_state2.bufs.empty()) bufs.push_back(&m_state2);
    meta["buffers"] = bufs.size();
    try {
        sim::OutputFile f(path);
        const std::string header = meta.dump();
        f.stream() << kCkptMagic << header << '\n';
        for (const Tensor* t : bufs) {
            const std::vector<float> v = m_rt->download(*t, 0);
            f.stream().write(reinterpret_cast<const char*>(v.data()),
                             std::streamsize(v.size() * 4));
        }
        // Atomic for a regular file: a reader sees the old checkpoint or the new one.
        f.commit();
    } catch (const sim::OutputError& e) {
        throw ConfigError(fmt::format("checkpoint: {}", e.what()));
    }
}

void Trainer::load_checkpoint(Module& module, const std::string& path) {
    place(module);
    std::string bytes;
    // The layout of the placed module says how long its checkpoint is: the magic, a header
    // line of at most kCkptMaxHeader bytes and the buffers' values. Nothing longer is read.
    const uint64_t layout_bytes =
        (m_state2.bufs.empty() ? 2 : 3) * uint64_t(m_flat_params.cols) * 4;
    try {
        bytes = sim::read_input_file(path, sizeof(kCkptMagic) + kCkptMaxHeader + layout_bytes);
    } catch (const sim::InputFileError& e) {
        throw ConfigError(fmt::format("checkpoint: {}", e.what()));
    }
    const std::string_view magic(kCkptMagic, sizeof(kCkptMagic) - 1);
    const size_t eol = bytes.find('\n', magic.size());
    if (bytes.compare(0, magic.size(), magic) != 0 || eol == std::string::npos)
        throw ConfigError(fmt::format("checkpoint '{}': not a tpusim checkpoint", path));
    const std::string_view header(bytes.data() + magic.size(), eol - magic.size());
    nlohmann::json meta;
    // As config files: a key given twice is ambiguous, so the second is refused, naming it.
    std::vector<std::pair<std::set<std::string>, std::string>> open;  // keys, last key
    const auto refuse_duplicates = [&](int, nlohmann::json::parse_event_t event,
                                       nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start) {
            open.emplace_back();
        } else if (event == Event::object_end) {
            open.pop_back();
        } else if (event == Event::key) {
            auto& [keys, last] = open.back();
            last = parsed.get<std::string>();
            if (!keys.insert(last).second) {
                std::string where;
                for (size_t i = 0; i + 1 < open.size(); ++i) where += open[i].second + ".";
                throw ConfigError(fmt::format("checkpoint '{}': the header gives '{}{}' twice",
                                              path, where, last));
            }
        }
        return true;
    };
    try {
        meta = nlohmann::json::parse(header, refuse_duplicates);
    } catch (const nlohmann::json::exception& e) {
        // nlohmann's text starts with its exception id and the position; keep the reason.
        std::string what = e.what();
        for (const char* from : {"syntax error", "] "})
            if (const size_t at = what.find(from); at != std::string::npos) {
                what = what.substr(at + (from[0] == ']' ? 2 : 0));
                break;
            }
        const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e);
        throw ConfigError(
            fmt::format("checkpoint '{}': the header (line 2) is not valid JSON{}: {}", path,
                        pe ? fmt::format(" at column {}", pe->byte) : std::string(), what));
    }
    if (!meta.is_object())
        throw ConfigError(fmt::format("checkpoint '{}': the header is not a JSON object", path));
    // Every header field is checked before use: a checkpoint is a file from anywhere, and a
    // wrong step or epoch would silently change the learning-rate schedule or skip training.
    auto whole = [&](const nlohmann::json& obj, const std::string& where, const char* key,
                     uint64_t max) -> uint64_t {
        const auto it = obj.find(key);
        if (it == obj.end())
            throw ConfigError(fmt::format("checkpoint '{}': {}'{}' is missing", path, where, key));
        if (!it->is_number_unsigned() || it->get<uint64_t>() > max)
            throw ConfigError(
                fmt::format("checkpoint '{}': {}'{}' is {}, expected a whole number from 0 to {}",
                            path, where, key, it->dump(), max));
        return it->get<uint64_t>();
    };
    constexpr uint64_t kMax32 = std::numeric_limits<uint32_t>::max();
    const auto params = module.named_parameters();
    const auto saved = meta.find("parameters");
    if (saved == meta.end() || !saved->is_array())
        throw ConfigError(fmt::format("checkpoint '{}': 'parameters' is not a list", path));
    if (saved->size() != params.size())
        throw ConfigError(fmt::format("checkpoint '{}' has {} parameters, the module has {}", path,
                                      saved->size(), params.size()));
    for (size_t i = 0; i < params.size(); ++i) {
        const auto& [name, p] = params[i];
        const nlohmann::json& sp = (*saved)[i];
        const std::string where = fmt::format("parameter {}: ", i);
        if (!sp.is_object() || !sp.contains("name") || !sp["name"].is_string())
            throw ConfigError(
                fmt::format("checkpoint '{}': {}'name' is missing or not a string", path, where));
        const std::string sname = sp["name"].get<std::string>();
        const uint64_t rows = whole(sp, where, "rows", kMax32);
        const uint64_t cols = whole(sp, where, "cols", kMax32);
        const uint64_t offset = whole(sp, where, "offset", kMax32);
        if (sname != name || rows != p->rows || cols != p->cols)
            throw ConfigError(
                fmt::format("checkpoint '{}': parameter {} is {} {} x {}, the module "
                            "has {} {} x {}",
                            path, i, sname, rows, cols, name, p->rows, p->cols));
        if (offset != p->offset)
            throw ConfigError(fmt::format(
                "checkpoint '{}': parameter {} ({}) is at offset {}, the module's layout puts it "
                "at {}",
                path, i, name, offset, p->offset));
    }
    std::vector<Tensor*> bufs{&m_flat_params, &m_state1};
    if (!m_state2.bufs.empty()) bufs.push_back(&m_state2);
    if (whole(meta, "", "values", kMax32) != m_flat_params.cols ||
        whole(meta, "", "buffers", kMax32) != bufs.size())
        throw ConfigError(
            fmt::format("checkpoint '{}' was written for another optimizer or "
                        "layout",
                        path));
    const uint64_t global_step = whole(meta, "", "global_step", uint64_t(1) << 53);
    const uint64_t epoch = whole(meta, "", "epoch", std::min(global_step, kMax32));
    // Adam counts its own steps (bias correction); it cannot have taken more than the trainer.
    const uint64_t adam_step = whole(meta, "", "adam_step", std::min(global_step, kMax32));
    const size_t data_bytes = bufs.size() * size_t(m_flat_params.cols) * 4;
    if (bytes.size() - eol - 1 != data_bytes)
        throw ConfigError(fmt::format(
            "checkpoint '{}' has {} bytes of values after its header, the layout needs {}{}", path,
            bytes.size() - eol - 1, data_bytes,
            bytes.size() - eol - 1 < data_bytes ? " (truncated)" : ""));
    const char* data = bytes.data() + eol + 1;
    for (Tensor* t : bufs) {
        std::vector<float> v(t->cols);
        std::memcpy(v.data(), data, v.size() * 4);
        data += v.size() * 4;
        for (size_t r = 0; r < m_cores.size(); ++r) m_rt->upload(*t, r, v);
    }
    m_epoch = static_cast<uint32_t>(epoch);
    m_global_step = global_step;
    m_adam_step = static_cast<uint32_t>(adam_step);
}

// ---- report ---------------------------------------------------------------------------------

std::string Trainer::metrics_report() const {
    std::string out = m_metrics.report();
    const uint64_t steps = m_step_times.size();
    const uint64_t syncs = m_metrics.counter("HostSync");
    const sim::ClockDomain clock = m_dev.config().clock();
    const auto ms = [&](uint64_t cycles) { return clock.seconds(double(cycles)) * 1e3; };
    const auto per = [&](double v) { return steps ? v / double(steps) : 0.0; };
    uint64_t ops = 0;
    for (const StepTime& t : m_step_times) ops += t.ops;
    out += "\nAnalysis:\n";
    out += fmt::format("  {} steps on {} core(s), precision {}, {} examples per device.\n", steps,
                       m_cores.size(), precision_name(m_mode), m_batch_rows);
    const uint64_t device = step_cycles(), wall = m_timeline.wall_cycles();
    out += fmt::format(
        "  Device time of the training steps: {:.3f} ms ({:.3f} ms per step); set-up and "
        "evaluation are not in it.\n",
        ms(device), per(ms(device)));
    out += fmt::format(
        "  Wall clock of the steps (estimate, host timeline): {:.3f} ms ({:.3f} ms per step); the "
        "device is busy {:.1f}% of it.\n",
        ms(wall), per(ms(wall)), wall ? 100.0 * double(device) / double(wall) : 0.0);
    if (steps && wall > 2 * device)
        out += fmt::format(
            "  Host-bound: per step the host records {:.0f} ops ({:.3f} ms) and dispatches the "
            "program ({:.3f} ms) while the device needs {:.3f} ms; larger batches per device "
            "amortise the host's work.\n",
            per(double(ops)), ms(m_timeline.trace_cycles(ops / steps)),
            m_timeline.config().dispatch_us / 1e3, per(ms(device)));
    uint64_t compile = 0;
    for (const StepWall& w : m_timeline.steps()) compile += w.compile_end - w.lock_end;
    out += fmt::format(
        "  Compilations: {} graphs compiled, {} cache hits; {} training step(s) compiled new "
        "programs ({:.1f} ms of the wall clock, estimate){}.\n",
        m_metrics.counter("UncachedCompile"), m_metrics.counter("CachedCompile"), compiled_steps(),
        ms(compile), m_recompiles == 0 ? "" : "; shapes changed (see warnings)");
    out += fmt::format(
        "  Host syncs: {} in training steps ({:.3f} per step: the loss is read every {} steps), "
        "{} outside them (set-up, evaluation, the final replica check).\n",
        m_train_syncs, per(double(m_train_syncs)), m_opts.log_every_n_steps, syncs - m_train_syncs);
    uint64_t fallbacks = 0;
    std::string names;
    for (const auto& [name, n] : m_metrics.counters()) {
        if (name.rfind("aten::", 0) != 0) continue;
        fallbacks += n;
        names += fmt::format("{}{} x {}", names.empty() ? "" : ", ", name, n);
    }
    if (fallbacks)
        out +=
            fmt::format("  CPU fallbacks: {} ({}): each waits for the device.\n", fallbacks, names);
    out += fmt::format("  Kernel calls: {} ({:.1f} per step).\n", m_rt->kernel_calls(),
                       per(double(ops)));
    return out;
}

}  // namespace tpu::trainer
