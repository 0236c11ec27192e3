// SPDX-License-Identifier: Apache-2.0
#include "traces/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hw/power/power_model.h"
#include "sim/clock_domain.h"
#include "sim/config_io.h"
#include "sim/metrics.h"
#include "sim/stat_names.h"
#include "sim/tracer.h"

namespace tpu::traces {

ReportError::ReportError(Input input, const std::string& problem)
    : std::invalid_argument(fmt::format("{}: {}", input_name(input), problem)),
      m_input(input),
      m_problem(problem) {}

const char* ReportError::input_name(Input input) {
    switch (input) {
        case Input::Trace:
            return "trace";
        case Input::Stats:
            return "stats";
        case Input::Config:
            return "config";
    }
    return "input";
}

namespace {

using nlohmann::json;
using Input = ReportError::Input;

/// The hardware the roof is drawn for. The defaults are the v3-8-like board's per-core numbers,
/// used when the run's config is not at hand.
struct Machine {
    double clock_mhz = 940.0;          ///< core clock
    bool clock_known = false;          ///< clock from the config or the trace, not the default
    uint32_t mxus = 2;                 ///< MXUs per core
    uint32_t rows = 128;               ///< PE rows per MXU
    uint32_t cols = 128;               ///< PE columns per MXU
    double peak_flops = 61.6e12;       ///< MXU FLOP/s per core
    double hbm_bytes_per_s = 450.7e9;  ///< HBM bandwidth per core
    bool from_config = false;          ///< roof taken from the config, not the defaults
    /// The whole board config (the power estimate's coefficients); defaults unless the run's
    /// config could be read into it.
    hw::BoardConfig board;

    double pe_count() const { return double(mxus) * rows * cols; }
    sim::ClockDomain clock() const { return sim::ClockDomain{clock_mhz}; }
};

/// A counter track: (timestamp in us, value) in file order.
using Samples = std::vector<std::pair<double, double>>;

/// Everything the page shows about one core.
struct Core {
    std::string name;
    std::map<std::string, uint64_t> unit_busy;  ///< unit thread -> cycles with an event open
    std::map<std::string, uint64_t> unit_sum;   ///< unit thread -> sum of X durations (cycles)
    uint64_t first = UINT64_MAX;                ///< first X event's begin cycle
    uint64_t last = 0;                          ///< last X event's end cycle
    uint64_t events = 0;                        ///< X events
    uint64_t dma_hbm_bytes = 0;                 ///< bytes of HBM<->VMEM DMA events
    Samples util, gbps;                         ///< mxu_utilization, hbm_gbps
    /// (begin, end, amount) of HBM DMA events (bytes) and VPU events (elements), for power.
    std::vector<std::tuple<uint64_t, uint64_t, double>> hbm_events, vpu_events;
    std::optional<double> instructions, hbm_bytes, mxu_flops;  ///< from stats
    /// The core's HBM group from stats (row hits, misses, activates, ...), in file order.
    std::vector<std::pair<std::string, double>> hbm_stats;

    // Derived.
    uint64_t span = 0;
    double flops = 0, bytes = 0, insts = 0;
    bool flops_estimated = false, bytes_from_trace = false, insts_from_trace = false;
};

/// Host runtime transfers (the "host" process).
struct Host {
    uint64_t writes = 0, reads = 0, write_bytes = 0, read_bytes = 0;
};

/// One kernel's totals from the stats' `kernels` group (Device::kernel_stats()).
struct Kernel {
    std::string name;
    double launches = 0, cycles = 0, core_cycles = 0, flops = 0, mxu_flops = 0, vpu_flops = 0;
    double hbm_bytes = 0, ici_bytes = 0;
    std::optional<double> mxu_util;
    std::optional<double> energy_j;  ///< the estimate's energy of the launches

    /// FLOP/byte of HBM traffic (0 without HBM bytes).
    double ai() const { return hbm_bytes > 0 ? flops / hbm_bytes : 0.0; }
    /// Achieved TFLOP/s per core: FLOPs over the launched cores' summed busy time, so kernels
    /// on any number of cores sit under the same per-core roof.
    double tflops(double clock_mhz) const {
        return core_cycles > 0 ? flops / sim::ClockDomain{clock_mhz}.seconds(core_cycles) / 1e12
                               : 0.0;
    }
};

/// One ICI link's figures from the stats' `ici` group.
struct Link {
    std::string name;
    double bytes = 0, utilization = 0;
};

/// One layer of the trace's host "layers" track (tpusim model).
struct Layer {
    std::string name, kind;
    uint64_t cycles = 0;  ///< sum of its spans
    uint64_t spans = 0;   ///< runs of consecutive kernels (forward, backward)
};

/// The stats' `result` group: what the command reported, labelled.
struct Result {
    std::string label;  ///< the description of `cycles`
    double cycles = 0;
    std::map<std::string, double> values;  ///< every other statistic of the group
    std::optional<double> get(const std::string& key) const {
        const auto it = values.find(key);
        return it == values.end() ? std::nullopt : std::optional<double>(it->second);
    }
};

/// The stats' `energy` group.
struct EnergyStats {
    double total_j = 0, average_w = 0, idle_w = 0;
    std::optional<double> outside_kernels_j;
    std::vector<std::pair<std::string, double>> blocks;  ///< kind -> joules, in file order
};

struct Model {
    Machine machine;
    std::vector<Layer> layers;          ///< host "layers" track, first-appearance order
    std::optional<Result> result;       ///< from stats
    std::optional<EnergyStats> energy;  ///< from stats
    uint64_t trace_steps = 0, trace_step_cycles = 0;  ///< host "trainer" train_step spans
    std::optional<std::pair<std::string, uint64_t>> trace_model;  ///< host "model" span
    uint64_t hidden_cores = 0;  ///< cores that did nothing, left out
    /// (begin, end, bytes) of ICI link transfers and host-link transfers, for power.
    std::vector<std::tuple<uint64_t, uint64_t, double>> ici_events, host_events;
    std::vector<Link> links;      ///< from stats, in file order
    std::map<int, Core> cores;    ///< by core index
    std::vector<Kernel> kernels;  ///< from stats, in file order
    Host host;
    uint64_t trace_end = 0;  ///< last end cycle of any X event
    /// Cycles [begin, end) the trace covers (otherData.window; absent in foreign traces).
    std::optional<std::pair<uint64_t, uint64_t>> window;
    std::optional<double> board_cycles;  ///< from stats
    bool have_stats = false;

    /// True when the stats and the trace count the same cycles: the trace covers the whole
    /// run the stats count. Otherwise per-core figures come from the trace alone, so that no
    /// counter of one scope is divided by cycles of another.
    bool same_scope() const {
        return have_stats && board_cycles && window && window->first == 0 &&
               double(window->second) >= *board_cycles;
    }
};

/// A rate or utilisation never shown above its peak: estimates from counter windows, which
/// straddle a span's edges, can exceed it slightly, and no achieved figure really does.
double at_most(double v, double peak) {
    return std::min(v, peak);
}

json parse(const std::string& text, Input input) {
    try {
        return json::parse(text);
    } catch (const json::parse_error& e) {
        // Traces are written as the run goes, so a crashed run leaves a cut-off file: say so
        // rather than point one byte past the end.
        if (text.find_first_not_of(" \t\r\n") == std::string::npos)
            throw ReportError(input, "empty, not JSON");
        if (e.byte > text.size())
            throw ReportError(input,
                              fmt::format("truncated JSON (ends after {} bytes)", text.size()));
        throw ReportError(input, fmt::format("malformed JSON at byte {}", e.byte));
    }
}

std::optional<double> number(const json& obj, std::string_view key) {
    if (!obj.is_object()) return std::nullopt;
    const auto it = obj.find(key);
    if (it == obj.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
}

std::string string_of(const json& obj, std::string_view key) {
    if (!obj.is_object()) return {};
    const auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

/// "core12" -> 12; anything else -> -1.
int core_index(const std::string& name) {
    if (name.size() < 5 || name.compare(0, 4, "core") != 0) return -1;
    int v = 0;
    for (size_t i = 4; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9' || v > 100000) return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

/// The unit a thread belongs to: "dma#3" (a lane of overlapping events) -> "dma".
std::string unit_of(const std::string& thread) {
    const size_t hash = thread.rfind('#');
    if (hash == std::string::npos || hash + 1 == thread.size()) return thread;
    for (size_t i = hash + 1; i < thread.size(); ++i)
        if (thread[i] < '0' || thread[i] > '9') return thread;
    return thread.substr(0, hash);
}

uint64_t to_cycles(double v) {
    return v <= 0 ? 0 : static_cast<uint64_t>(std::llround(v));
}

void read_config(const std::string& text, Machine& m) {
    const json cfg = parse(text, Input::Config);
    if (!cfg.is_object()) throw ReportError(Input::Config, "not a board config (not an object)");
    const json core = cfg.value("core", json::object());
    const json hbm = cfg.value("hbm", json::object());
    if (auto v = number(cfg, "clock_mhz"); v && *v > 0) {
        m.clock_mhz = *v;
        m.clock_known = true;
    }
    if (auto v = number(core, "mxus"); v && *v > 0) m.mxus = static_cast<uint32_t>(*v);
    if (auto v = number(core, "mxu_rows"); v && *v > 0) m.rows = static_cast<uint32_t>(*v);
    if (auto v = number(core, "mxu_cols"); v && *v > 0) m.cols = static_cast<uint32_t>(*v);
    m.peak_flops = 2.0 * m.pe_count() * m.clock().hz();
    const auto channels = number(hbm, "channels");
    const auto bus_bits = number(hbm, "bus_bits");
    const auto tck_ps = number(hbm, "tck_ps");
    // Double data rate: two bus transfers per HBM clock.
    if (channels && bus_bits && tck_ps && *tck_ps > 0)
        m.hbm_bytes_per_s = *channels * (*bus_bits / 8.0) * 2.0 / (*tck_ps * 1e-12);
    m.from_config = true;
    // The power estimate needs every coefficient: read the config as the run did. A config of
    // another version (unknown or bad keys) leaves the defaults, as a foreign trace does.
    hw::BoardConfig board;
    try {
        sim::apply_json(sim::root_of(board), text, "config");
        m.board = board;
    } catch (const sim::ConfigError&) {
        m.board = hw::BoardConfig{};
    }
}

void read_trace(const std::string& text, Model& model) {
    const json doc = parse(text, Input::Trace);
    const json* events = nullptr;
    if (doc.is_array()) {
        events = &doc;  // the bare-array form of the trace-event format
    } else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) {
        events = &doc["traceEvents"];
    } else {
        throw ReportError(Input::Trace, "not a Chrome trace (no \"traceEvents\" array)");
    }
    if (doc.is_object()) {
        const json other = doc.value("otherData", json::object());
        // The run's own config (tpusim writes it): the clock and the roof without guessing. A
        // config file given explicitly takes precedence.
        if (const json cfg = other.is_object() ? other.value("config", json{}) : json{};
            cfg.is_object() && !model.machine.from_config)
            read_config(cfg.dump(), model.machine);
        const json window = other.is_object() ? other.value("window", json{}) : json{};
        const auto b = number(window, "begin_cycle"), e = number(window, "end_cycle");
        if (b && e && *b >= 0 && *e >= *b) model.window = {to_cycles(*b), to_cycles(*e)};
    }

    struct Span {
        int pid;
        int tid;
        std::string name;
        double a, b;  ///< begin and end cycle, or ts and dur in us when !cycles
        bool cycles;
        uint64_t bytes;
        uint64_t elements;
        std::string kind;
    };
    struct Sample {
        int pid;
        std::string name;
        double ts, value;
    };
    std::map<int, std::string> processes;
    std::map<std::pair<int, int>, std::string> threads;
    std::vector<Span> spans;
    std::vector<Sample> samples;
    std::optional<double> clock_from_trace;

    // (1) Collect: metadata may come after the events that use it.
    for (size_t i = 0; i < events->size(); ++i) {
        const json& e = (*events)[i];
        if (!e.is_object())
            throw ReportError(Input::Trace, fmt::format("event {} is not an object", i));
        const std::string ph = string_of(e, "ph");
        const auto pid = number(e, "pid");
        const auto tid = number(e, "tid");
        if (!pid) continue;
        const json args = e.value("args", json::object());
        if (ph == "M") {
            const std::string kind = string_of(e, "name");
            if (kind == "process_name") processes[int(*pid)] = string_of(args, "name");
            if (kind == "thread_name" && tid)
                threads[{int(*pid), int(*tid)}] = string_of(args, "name");
        } else if (ph == "X") {
            const auto b = number(args, "begin_cycle");
            const auto en = number(args, "end_cycle");
            const auto ts = number(e, "ts");
            const auto dur = number(e, "dur");
            const uint64_t bytes = to_cycles(number(args, "bytes").value_or(0));
            const uint64_t elements = to_cycles(number(args, "elements").value_or(0));
            if (b && en) {
                if (!clock_from_trace && ts && *ts >= 1.0) clock_from_trace = *b / *ts;
                spans.push_back({int(*pid), tid ? int(*tid) : 0, string_of(e, "name"), *b, *en,
                                 true, bytes, elements, string_of(args, "kind")});
            } else if (ts && dur) {
                // Not written by tpusim: placed in cycles from ts/dur once the clock is known.
                spans.push_back({int(*pid), tid ? int(*tid) : 0, string_of(e, "name"), *ts, *dur,
                                 false, bytes, elements, string_of(args, "kind")});
            }
        } else if (ph == "C") {
            const auto ts = number(e, "ts");
            const auto v = number(args, "value");
            if (ts && v) samples.push_back({int(*pid), string_of(e, "name"), *ts, *v});
        }
    }
    Machine& m = model.machine;
    if (!m.clock_known && clock_from_trace && *clock_from_trace > 0) {
        m.clock_mhz = *clock_from_trace;
        m.clock_known = true;
    }

    // (2) Attribute spans and samples to cores and units.
    std::map<std::pair<int, std::string>, std::vector<std::pair<uint64_t, uint64_t>>> intervals;
    for (const auto& s : spans) {
        const uint64_t begin = to_cycles(s.cycles ? s.a : s.a * m.clock_mhz);
        const uint64_t end =
            std::max(begin, s.cycles ? to_cycles(s.b) : begin + to_cycles(s.b * m.clock_mhz));
        const auto pit = processes.find(s.pid);
        const std::string pname = pit == processes.end() ? std::string{} : pit->second;
        // The trainer's wall-clock estimate runs on a clock of its own: not part of the run.
        if (pname == sim::kWallClockProcess) continue;
        model.trace_end = std::max(model.trace_end, end);
        const auto tit = threads.find({s.pid, s.tid});
        const std::string unit =
            tit == threads.end() ? fmt::format("tid{}", s.tid) : unit_of(tit->second);
        if (pname == "host") {
            Host& h = model.host;
            if (s.name == "write") {
                ++h.writes;
                h.write_bytes += s.bytes;
                model.host_events.emplace_back(begin, end, double(s.bytes));
            } else if (s.name == "read") {
                ++h.reads;
                h.read_bytes += s.bytes;
                model.host_events.emplace_back(begin, end, double(s.bytes));
            } else if (unit == "layers") {
                auto it = std::find_if(model.layers.begin(), model.layers.end(),
                                       [&](const Layer& l) { return l.name == s.name; });
                if (it == model.layers.end())
                    it = model.layers.insert(model.layers.end(), Layer{s.name, s.kind});
                it->cycles += end - begin;
                ++it->spans;
            } else if (unit == "trainer" && s.name == "train_step") {
                ++model.trace_steps;
                model.trace_step_cycles += end - begin;
            } else if (unit == "model") {
                model.trace_model = {s.name, end - begin};
            }
            continue;
        }
        if (pname == "ici") {
            model.ici_events.emplace_back(begin, end, double(s.bytes));
            continue;
        }
        const int idx = core_index(pname);
        if (idx < 0) continue;
        Core& c = model.cores[idx];
        c.name = pname;
        c.unit_sum[unit] += end - begin;
        intervals[{idx, unit}].emplace_back(begin, end);
        c.first = std::min(c.first, begin);
        c.last = std::max(c.last, end);
        ++c.events;
        // dma.vv stays inside VMEM; only the HBM<->VMEM directions count as HBM traffic.
        if (s.name == "dma.hv" || s.name == "dma.vh") {
            c.dma_hbm_bytes += s.bytes;
            c.hbm_events.emplace_back(begin, end, double(s.bytes));
        }
        if (unit == "vpu" && s.elements) c.vpu_events.emplace_back(begin, end, double(s.elements));
    }
    // A unit's queue lets its events overlap (a weight load runs under the previous matmul),
    // so busy time is the union of its events, not their sum.
    for (auto& [key, iv] : intervals) {
        std::sort(iv.begin(), iv.end());
        uint64_t busy = 0, open_begin = iv.front().first, open_end = iv.front().second;
        for (const auto& [b, e] : iv) {
            if (b > open_end) {
                busy += open_end - open_begin;
                open_begin = b;
            }
            open_end = std::max(open_end, e);
        }
        model.cores[key.first].unit_busy[key.second] = busy + (open_end - open_begin);
    }
    for (const auto& s : samples) {
        const auto pit = processes.find(s.pid);
        if (pit == processes.end()) continue;
        const int idx = core_index(pit->second);
        if (idx < 0) continue;
        Core& c = model.cores[idx];
        c.name = pit->second;
        if (s.name == "mxu_utilization") c.util.emplace_back(s.ts, s.value);
        if (s.name == "hbm_gbps") c.gbps.emplace_back(s.ts, s.value);
    }
    if (model.cores.empty())
        throw ReportError(Input::Trace,
                          "no core processes (\"core0\", \"core1\", ...) in the trace");
    for (auto& [idx, c] : model.cores) {
        // Counter samples are written per window as the run goes; plot them in time order.
        std::stable_sort(c.util.begin(), c.util.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        std::stable_sort(c.gbps.begin(), c.gbps.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    }
}

/// board.kernels.<name>.counters: per-kernel totals (absent in older stats files).
void read_kernels(const json& group, Model& model) {
    if (!group.is_object()) return;
    const json kernels = group.value("children", json::object());
    if (!kernels.is_object()) return;
    for (const auto& [name, k] : kernels.items()) {
        if (!k.is_object()) continue;
        const json counters = k.value("counters", json::object());
        if (!counters.is_object()) continue;
        auto value = [&](std::string_view key) -> std::optional<double> {
            const auto it = counters.find(key);
            return it == counters.end() ? std::nullopt : number(*it, "value");
        };
        Kernel out;
        out.name = name;
        out.launches = value(sim::stat_names::kLaunches).value_or(0);
        out.cycles = value(sim::stat_names::kCycles).value_or(0);
        out.core_cycles = value(sim::stat_names::kCoreCycles).value_or(0);
        out.flops = value(sim::stat_names::kFlops).value_or(0);
        out.mxu_flops = value(sim::stat_names::kMxuFlops).value_or(0);
        out.vpu_flops = value(sim::stat_names::kVpuFlops).value_or(0);
        out.hbm_bytes = value(sim::stat_names::kHbmReadBytes).value_or(0) +
                        value(sim::stat_names::kHbmWriteBytes).value_or(0);
        out.ici_bytes = value(sim::stat_names::kIciBytes).value_or(0);
        out.mxu_util = value(sim::stat_names::kMxuUtilization);
        out.energy_j = value(sim::stat_names::kEnergyJ);
        model.kernels.push_back(std::move(out));
    }
}

void read_stats(const std::string& text, Model& model) {
    const json doc = parse(text, Input::Stats);
    if (!doc.is_object() || !doc.contains("board") || !doc["board"].is_object())
        throw ReportError(Input::Stats, "not a tpusim stats file (no \"board\" object)");
    const json& board = doc["board"];
    model.have_stats = true;
    model.board_cycles = number(board.value("counters", json::object())
                                    .value(std::string(sim::stat_names::kCycles), json{}),
                                "value");
    const json children = board.value("children", json::object());
    if (!children.is_object()) return;
    read_kernels(children.value(std::string(sim::stat_names::kKernels), json::object()), model);
    namespace n = sim::stat_names;
    if (const json r = children.value(std::string(n::kResult), json::object());
        r.is_object() && r.value("counters", json::object()).is_object()) {
        const json counters = r.value("counters", json::object());
        if (const auto it = counters.find(std::string(n::kCycles));
            it != counters.end() && number(*it, "value")) {
            Result out;
            out.cycles = *number(*it, "value");
            out.label = string_of(*it, "desc");
            for (const auto& [key, c] : counters.items())
                if (auto v = number(c, "value"); v && key != n::kCycles) out.values[key] = *v;
            model.result = std::move(out);
        }
    }
    if (const json en = children.value(std::string(n::kEnergy), json::object()); en.is_object()) {
        const json counters = en.value("counters", json::object());
        auto v = [&](std::string_view key) -> std::optional<double> {
            const auto it = counters.is_object() ? counters.find(key) : counters.end();
            return counters.is_object() && it != counters.end() ? number(*it, "value")
                                                                : std::nullopt;
        };
        if (const auto total = v(n::kTotalJ)) {
            EnergyStats e;
            e.total_j = *total;
            e.average_w = v(n::kAveragePowerW).value_or(0);
            e.idle_w = v(n::kIdlePowerW).value_or(0);
            e.outside_kernels_j = v(n::kOutsideKernelsJ);
            const json kinds = en.value("children", json::object());
            if (kinds.is_object())
                for (const auto& [kind, g] : kinds.items()) {
                    const json kc = g.is_object() ? g.value("counters", json::object()) : json{};
                    const auto it = kc.is_object() ? kc.find(n::kEnergyJ) : kc.end();
                    if (kc.is_object() && it != kc.end())
                        if (auto j = number(*it, "value")) e.blocks.emplace_back(kind, *j);
                }
            model.energy = std::move(e);
        }
    }
    auto counters_of = [](const json& group) {
        const json c = group.is_object() ? group.value("counters", json::object()) : json{};
        return c.is_object() ? c : json::object();
    };
    auto value_in = [](const json& counters, std::string_view key) -> std::optional<double> {
        const auto it = counters.find(key);
        return it == counters.end() ? std::nullopt : number(*it, "value");
    };
    const json links =
        children.value(std::string(n::kIci), json::object()).value("children", json::object());
    for (const auto& [name, link] : links.items()) {
        const json c = counters_of(link);
        model.links.push_back(
            {name, value_in(c, n::kBytes).value_or(0), value_in(c, n::kUtilization).value_or(0)});
    }
    for (const auto& [name, group] : children.items()) {
        const int idx = core_index(name);
        if (idx < 0 || !group.is_object()) continue;
        const json units = group.value("children", json::object());
        const json dma = counters_of(units.value(std::string(n::kDma), json{}));
        // A core the trace was filtered away from (--trace-units) still gets its row.
        Core& c = model.cores[idx];
        c.name = name;
        c.instructions = value_in(counters_of(group), n::kInstructions);
        const auto rd = value_in(dma, n::kHbmReadBytes);
        const auto wr = value_in(dma, n::kHbmWriteBytes);
        if (rd || wr) c.hbm_bytes = rd.value_or(0) + wr.value_or(0);
        double flops = 0;
        bool any = false;
        for (const auto& [unit, ug] : units.items()) {
            // mxu0, mxu1, ...: one group per MXU.
            if (unit.compare(0, n::kMxuPrefix.size(), n::kMxuPrefix) != 0) continue;
            if (auto v = value_in(counters_of(ug), n::kFlops)) {
                flops += *v;
                any = true;
            }
        }
        if (any) c.mxu_flops = flops;
        const json hbm = counters_of(units.value(std::string(n::kHbm), json{}));
        for (const auto& [key, counter] : hbm.items())
            if (auto v = number(counter, "value")) c.hbm_stats.emplace_back(key, *v);
    }
}

/// Integrates a counter track as a step function (each sample holds until the next).
double integrate(const Samples& s, double clock_mhz) {
    double sum = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i)
        sum += s[i].second * (s[i + 1].first - s[i].first) * clock_mhz;
    return sum;
}

void derive(Model& model) {
    const Machine& m = model.machine;
    const bool stats = model.same_scope();
    for (auto& [idx, c] : model.cores) {
        if (!stats) c.mxu_flops = c.hbm_bytes = c.instructions = std::nullopt;
        if (c.first <= c.last) {
            c.span = c.last - c.first;
        } else if (model.board_cycles) {
            c.span = to_cycles(*model.board_cycles);
        }
        if (c.mxu_flops) {
            c.flops = *c.mxu_flops;
        } else {
            // Utilisation is useful PE-cycles over all PE-cycles, so its integral over cycles
            // times the PE count is the useful MACs.
            c.flops = 2.0 * m.pe_count() * integrate(c.util, m.clock_mhz);
            c.flops_estimated = true;
        }
        if (c.hbm_bytes) {
            c.bytes = *c.hbm_bytes;
        } else {
            c.bytes = double(c.dma_hbm_bytes);
            c.bytes_from_trace = true;
        }
        if (c.instructions) {
            c.insts = *c.instructions;
        } else {
            c.insts = double(c.events);
            c.insts_from_trace = true;
        }
    }
    // Only the cores that ran: a one-core run on an 8-core board shows one core, not 7 idle.
    auto idle = [](const Core& c) {
        return c.events == 0 && c.insts == 0 && c.flops == 0 && c.bytes == 0 && c.util.empty();
    };
    if (std::all_of(model.cores.begin(), model.cores.end(),
                    [&](const auto& kv) { return idle(kv.second); }))
        return;
    for (auto it = model.cores.begin(); it != model.cores.end();) {
        if (idle(it->second)) {
            ++model.hidden_cores;
            it = model.cores.erase(it);
        } else {
            ++it;
        }
    }
}

// ---- formatting ---------------------------------------------------------------------------

std::string escape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
        switch (ch) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += ch;
        }
    }
    return out;
}

/// 1234567 -> "1,234,567".
std::string grouped(double v) {
    const std::string digits = fmt::format("{:.0f}", std::max(0.0, std::round(v)));
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

/// 2.88e9 -> "2.88 G" + unit.
std::string si(double v, std::string_view unit) {
    static constexpr std::array<std::pair<double, const char*>, 5> kScales{
        {{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}}};
    for (const auto& [scale, prefix] : kScales)
        if (std::abs(v) >= scale) return fmt::format("{:.2f} {}{}", v / scale, prefix, unit);
    return fmt::format("{:.0f} {}", v, unit);
}

std::string pct(double v) {
    return fmt::format("{:.1f}%", 100.0 * v);
}

/// Compact axis label for a log-scale decade or a linear tick.
std::string tick(double v) {
    static constexpr std::array<std::pair<double, const char*>, 3> kScales{
        {{1e9, "G"}, {1e6, "M"}, {1e3, "k"}}};
    for (const auto& [scale, prefix] : kScales)
        if (v >= scale) return fmt::format("{:.3g}{}", v / scale, prefix);
    return fmt::format("{:.3g}", v);
}

/// The smallest of 1, 2, 5 x 10^k that is >= v.
double nice_max(double v) {
    if (v <= 0) return 1;
    const double p = std::pow(10.0, std::floor(std::log10(v)));
    for (const double f : {1.0, 2.0, 5.0, 10.0})
        if (f * p >= v * (1 - 1e-9)) return f * p;
    return 10 * p;
}

/// A distinct colour per core (cycled).
const char* colour(int idx) {
    static constexpr std::array<const char*, 8> kPalette{
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
    return kPalette[static_cast<size_t>(idx) % kPalette.size()];
}

constexpr const char* kSvgNs = "http://www.w3.org/2000/svg";

// ---- charts -------------------------------------------------------------------------------

/// The cycle range every over-time chart shares, so the small multiples line up.
struct TimeAxis {
    uint64_t x0 = 0, x1 = 1;
};

TimeAxis time_axis(const Model& model) {
    uint64_t lo = UINT64_MAX, hi = 0;
    const double mhz = model.machine.clock_mhz;
    for (const auto& [idx, c] : model.cores) {
        if (c.first <= c.last) {
            lo = std::min(lo, c.first);
            hi = std::max(hi, c.last);
        }
        for (const Samples* s : {&c.util, &c.gbps}) {
            for (const auto& [ts, v] : *s) {
                lo = std::min(lo, to_cycles(ts * mhz));
                hi = std::max(hi, to_cycles(ts * mhz));
            }
        }
    }
    if (lo == UINT64_MAX) return {};
    return {lo, std::max(hi, lo + 1)};
}

/// One small line chart of a counter track: value held from each sample to the next.
std::string line_chart(const std::string& kind, const Core& c, int idx, const Samples& samples,
                       const TimeAxis& ax, double mhz, double ymax, const std::string& yunit,
                       double yscale, std::optional<double> ref) {
    constexpr double kW = 300, kH = 130, kL = 46, kR = 8, kT = 18, kB = 22;
    const double pw = kW - kL - kR, ph = kH - kT - kB;
    const double span = double(ax.x1 - ax.x0);
    auto x = [&](double cycle) {
        return kL + pw * std::clamp((cycle - double(ax.x0)) / span, 0.0, 1.0);
    };
    auto y = [&](double v) { return kT + ph * (1.0 - std::clamp(v / ymax, 0.0, 1.0)); };

    std::string s =
        fmt::format(R"(<svg xmlns="{}" class="chart {}" data-core="{}" width="{}" height="{}" )"
                    R"(viewBox="0 0 {} {}" role="img" aria-label="{} {}">)"
                    "\n",
                    kSvgNs, kind, escape(c.name), kW, kH, kW, kH, escape(c.name), kind);
    s += fmt::format(R"(<text class="ct" x="{}" y="12">{}</text>)"
                     "\n",
                     kL, escape(c.name));
    // Grid and y labels at 0, half and full scale.
    for (const double f : {0.0, 0.5, 1.0}) {
        s += fmt::format(R"(<line class="grid" x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}"/>)", kL,
                         y(f * ymax), kW - kR, y(f * ymax));
        s += fmt::format(R"(<text class="yl" x="{}" y="{:.1f}">{}{}</text>)"
                         "\n",
                         kL - 3, y(f * ymax) + 3, tick(f * ymax * yscale), yunit);
    }
    for (const double f : {0.0, 0.5, 1.0}) {
        s += fmt::format(R"(<text class="xl" x="{:.1f}" y="{}">{}</text>)", kL + f * pw, kH - 6,
                         tick(f * span));
    }
    s += "\n";
    if (ref && *ref <= ymax) {
        s += fmt::format(R"(<line class="ref" x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}"/>)"
                         "\n",
                         kL, y(*ref), kW - kR, y(*ref));
    }
    if (samples.empty()) {
        s += fmt::format(R"(<text class="none" x="{:.1f}" y="{:.1f}">no samples</text>)"
                         "\n",
                         kL + pw / 2, kT + ph / 2);
    } else {
        std::string d;
        // Start on the baseline so the first window rises from 0 like the later ones.
        d += fmt::format("M{:.1f},{:.1f}", x(samples.front().first * mhz), y(0));
        for (const auto& [ts, v] : samples) {
            d += fmt::format(" H{:.1f} V{:.1f}", x(ts * mhz), y(v));
        }
        d += fmt::format(" H{:.1f}", x(double(ax.x1)));
        s += fmt::format(R"(<path class="line" stroke="{}" d="{}"/>)"
                         "\n",
                         colour(idx), d);
    }
    s += "</svg>\n";
    return s;
}

/// Log-scale roofline: attainable TFLOP/s against FLOP/byte, one point per core.
std::string roofline(const Model& model) {
    const Machine& m = model.machine;
    const double peak = m.peak_flops / 1e12;     // TFLOP/s
    const double bw = m.hbm_bytes_per_s / 1e12;  // TB/s: TFLOP/s per FLOP/byte
    const double ridge = peak / bw;
    struct Point {
        int idx;
        const Core* c;
        double ai, tflops;
    };
    std::vector<Point> points;
    for (const auto& [idx, c] : model.cores) {
        if (c.flops <= 0 || c.bytes <= 0 || c.span == 0) continue;
        const double seconds = m.clock().seconds(double(c.span));
        points.push_back(
            {idx, &c, c.flops / c.bytes, at_most(c.flops / seconds, m.peak_flops) / 1e12});
    }
    struct KernelPoint {
        size_t idx;
        const Kernel* k;
        double ai, tflops;
    };
    std::vector<KernelPoint> kpoints;
    for (size_t i = 0; i < model.kernels.size(); ++i) {
        const Kernel& k = model.kernels[i];
        if (k.flops <= 0 || k.hbm_bytes <= 0 || k.core_cycles <= 0) continue;
        kpoints.push_back({i, &k, k.ai(), at_most(k.tflops(m.clock_mhz), peak)});
    }
    double xlo = ridge, xhi = ridge, ylo = peak;
    for (const auto& p : points) {
        xlo = std::min(xlo, p.ai);
        xhi = std::max(xhi, p.ai);
        ylo = std::min(ylo, p.tflops);
    }
    for (const auto& p : kpoints) {
        xlo = std::min(xlo, p.ai);
        xhi = std::max(xhi, p.ai);
        ylo = std::min(ylo, p.tflops);
    }
    // Whole decades, at least one beyond the ridge and the points on each side.
    const double lx0 = std::floor(std::log10(xlo)) - 1, lx1 = std::ceil(std::log10(xhi)) + 1;
    const double ly1 = std::ceil(std::log10(peak * 1.01));
    const double ly0 = std::min(std::floor(std::log10(ylo)), ly1 - 3);
    // Where the bandwidth slope enters the plot (bottom edge or left edge).
    constexpr double kW = 600, kH = 380, kL = 64, kR = 24, kT = 16, kB = 48;
    const double pw = kW - kL - kR, ph = kH - kT - kB;
    auto x = [&](double ai) { return kL + pw * (std::log10(ai) - lx0) / (lx1 - lx0); };
    auto y = [&](double t) {
        return kT + ph * (1.0 - std::clamp((std::log10(t) - ly0) / (ly1 - ly0), 0.0, 1.0));
    };

    std::string s = fmt::format(
        R"(<svg xmlns="{}" class="chart roofline" width="{}" height="{}" viewBox="0 0 {} {}" )"
        R"(role="img" aria-label="roofline">)"
        "\n",
        kSvgNs, kW, kH, kW, kH);
    for (double d = lx0; d <= lx1 + 1e-9; ++d) {
        const double v = std::pow(10.0, d);
        s += fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}"/>)",
                         x(v), kT, kT + ph);
        s += fmt::format(R"(<text class="xl" x="{:.1f}" y="{}">{}</text>)"
                         "\n",
                         x(v), kT + ph + 16, tick(v));
    }
    for (double d = ly0; d <= ly1 + 1e-9; ++d) {
        const double v = std::pow(10.0, d);
        s += fmt::format(R"(<line class="grid" x1="{0}" y1="{1:.1f}" x2="{2}" y2="{1:.1f}"/>)", kL,
                         y(v), kL + pw);
        s += fmt::format(R"(<text class="yl" x="{}" y="{:.1f}">{}</text>)"
                         "\n",
                         kL - 4, y(v) + 4, tick(v));
    }
    s += fmt::format(R"(<text class="axis" x="{:.1f}" y="{}">{}</text>)"
                     "\n",
                     kL + pw / 2, kH - 8, "arithmetic intensity (FLOP/byte of HBM traffic)");
    s += fmt::format(R"svg(<text class="axis" transform="translate(14 {:.1f}) rotate(-90)">)svg"
                     "achieved TFLOP/s</text>\n",
                     kT + ph / 2);
    // The roof: the bandwidth slope up to the ridge, then flat at the MXU peak. Start the slope
    // where it crosses the bottom edge if that lies inside the x range.
    const double x_start = std::max(std::pow(10.0, lx0), std::pow(10.0, ly0) / bw);
    s += fmt::format(
        R"(<polyline class="roof" points="{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}"/>)"
        "\n",
        x(x_start), y(x_start * bw), x(ridge), y(peak), x(std::pow(10.0, lx1)), y(peak));
    s += fmt::format(R"(<text class="rl" x="{:.1f}" y="{:.1f}">peak {:.1f} TFLOP/s</text>)"
                     "\n",
                     x(ridge) + 6, y(peak) - 5, peak);
    s += fmt::format(
        R"(<text class="rl" x="{:.1f}" y="{:.1f}" text-anchor="end">HBM {:.1f} GB/s</text>)"
        "\n",
        x(ridge) - 8, y(peak) + 14, m.hbm_bytes_per_s / 1e9);
    for (const auto& p : points) {
        s += fmt::format(
            R"(<circle class="point" data-core="{}" cx="{:.1f}" cy="{:.1f}" r="5" fill="{}">)"
            R"(<title>{}: {:.2f} FLOP/B, {:.2f} TFLOP/s</title></circle>)"
            "\n",
            escape(p.c->name), x(p.ai), y(p.tflops), colour(p.idx), escape(p.c->name), p.ai,
            p.tflops);
    }
    for (const auto& p : kpoints) {
        // Kernels are diamonds, so they read apart from the cores' circles.
        const double cx = x(p.ai), cy = y(p.tflops);
        s += fmt::format(
            R"(<polygon class="kpoint" data-kernel="{}" points="{:.1f},{:.1f} {:.1f},{:.1f} )"
            R"({:.1f},{:.1f} {:.1f},{:.1f}" fill="{}"><title>kernel {}: {:.2f} FLOP/B, {:.2f} )"
            R"(TFLOP/s per core</title></polygon>)"
            "\n",
            escape(p.k->name), cx, cy - 6, cx + 6, cy, cx, cy + 6, cx - 6, cy, colour(int(p.idx)),
            escape(p.k->name), p.ai, p.tflops);
    }
    s += "</svg>\n";
    // The points in numbers: identical cores overlap on the plot.
    s += "<table><tr><th>core</th><th>FLOP/byte</th><th>TFLOP/s</th><th>roof at this "
         "intensity</th><th>of roof</th><th>bound</th></tr>\n";
    for (const auto& p : points) {
        const double roof = std::min(peak, p.ai * bw);
        s += fmt::format(
            "<tr><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td>{:.2f}</td>"
            "<td>{:.2f}</td><td>{:.2f}</td><td>{}</td><td>{}</td></tr>\n",
            colour(p.idx), escape(p.c->name), p.ai, p.tflops, roof,
            pct(at_most(p.tflops / roof, 1.0)), p.ai < ridge ? "memory" : "compute");
    }
    for (const auto& p : kpoints) {
        const double roof = std::min(peak, p.ai * bw);
        s += fmt::format(
            "<tr><td><span class=\"sw kd\" style=\"background:{}\"></span>kernel {}</td>"
            "<td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td><td>{}</td><td>{}</td></tr>\n",
            colour(int(p.idx)), escape(p.k->name), p.ai, p.tflops, roof,
            pct(at_most(p.tflops / roof, 1.0)), p.ai < ridge ? "memory" : "compute");
    }
    s += "</table>\n";
    if (kpoints.size() < model.kernels.size())
        s += "<p class=\"note\">Kernels without FLOPs or HBM bytes have no point.</p>\n";
    if (points.size() < model.cores.size())
        s += "<p class=\"note\">Cores without MXU FLOPs or HBM bytes have no point.</p>\n";
    return s;
}

/// Kernel cycles by role, from the kernel names the driver gives them.
struct KernelShares {
    double matmul = 0, optimizer = 0, allreduce = 0, total = 0;
};

KernelShares kernel_shares(const Model& model) {
    KernelShares k;
    auto has = [](const std::string& name, std::string_view part) {
        return name.find(part) != std::string::npos;
    };
    for (const Kernel& kn : model.kernels) {
        k.total += kn.cycles;
        if (has(kn.name, "adam") || has(kn.name, "sgd"))
            k.optimizer += kn.cycles;
        else if (has(kn.name, "allreduce"))
            k.allreduce += kn.cycles;
        else if (has(kn.name, "gemm") || has(kn.name, "matmul") || has(kn.name, "conv"))
            k.matmul += kn.cycles;
    }
    return k;
}

/// Advice in the spirit of PyTorch/XLA's debug analysis and Lightning's TPU pitfalls: each item
/// names the number that triggered it. Empty when nothing applies.
std::vector<std::string> advice(const Model& model) {
    std::vector<std::string> out;
    const Machine& m = model.machine;
    const double us = 1.0 / m.clock_mhz;
    const Result* r = model.result ? &*model.result : nullptr;
    auto value = [&](const char* key) { return r ? r->get(key) : std::nullopt; };
    const double steps = value("steps").value_or(1);
    if (const auto rows = value("batch_rows"); rows && *rows > 0 && *rows < m.rows) {
        double macs = 0, peak = 0;
        for (const auto& [idx, c] : model.cores) {
            macs += c.flops / 2;
            peak += sim::mxu_capacity(m.pe_count(), double(c.span));
        }
        out.push_back(fmt::format(
            "<b>Small batch:</b> {:.0f} examples per device stream {:.0f} rows through each "
            "{}x{} weight tile, which takes {} cycles to load: the MXUs are {} busy. Lightning's "
            "TPU docs list \"too small batch size\": use at least {} rows per device.",
            *rows, *rows, m.rows, m.cols, m.rows,
            pct(at_most(sim::mxu_utilization(macs, peak), 1.0)), m.rows));
    }
    if (const KernelShares k = kernel_shares(model); k.total > 0) {
        for (const auto& [what, cycles] :
             {std::pair{"Optimizer", k.optimizer}, std::pair{"Gradient all-reduce", k.allreduce}}) {
            if (cycles <= 0 || (cycles < 0.5 * k.matmul && cycles < 0.25 * k.total)) continue;
            out.push_back(fmt::format(
                "<b>{}:</b> {} cycles, {} of all kernel cycles, against {} cycles for all the "
                "matmuls ({}). Its cost follows the parameters, not the batch: a small model with "
                "a small batch spends its steps here, and larger batches amortise it.",
                what, grouped(cycles), pct(cycles / k.total), grouped(k.matmul),
                pct(k.matmul / k.total)));
        }
    }
    if (const auto syncs = value("host_syncs"); syncs && *syncs >= 0.5 * steps && steps > 1)
        out.push_back(fmt::format(
            "<b>Host syncs:</b> the loss was read back {:.0f} times in {:.0f} steps "
            "(log_every_n_steps={:.0f}): every read (<code>tensor.item()</code>) waits for the "
            "device, so the host stops tracing the next step while the device runs.",
            *syncs, steps, value("log_every_n_steps").value_or(1)));
    if (const auto changes = value("shape_changes"); changes && *changes > 0)
        out.push_back(fmt::format(
            "<b>Changing shapes:</b> {:.0f} training step(s) had a batch shape of their own and "
            "compiled again ({:.0f} steps compiled in all): every new tensor shape recompiles "
            "(a short last batch: use drop_last=True).",
            *changes, value("compiled_steps").value_or(0)));
    if (const auto compile = value("compile_cycles_estimate"),
        wall = value(std::string(sim::stat_names::kWallCycles).c_str());
        compile && wall && *wall > 0 && *compile > 0.25 * *wall)
        out.push_back(fmt::format(
            "<b>Compilation in the first steps:</b> compiling took {:.1f} ms of the steps' "
            "{:.1f} ms of wall clock (estimate; {:.0f} steps compiled): short runs are dominated "
            "by it, and it is paid again for every new graph.",
            *compile * us / 1e3, *wall * us / 1e3, value("compiled_steps").value_or(0)));
    if (r) {
        if (const auto wall = value(std::string(sim::stat_names::kWallCycles).c_str());
            wall && *wall > 2 * r->cycles)
            out.push_back(fmt::format(
                "<b>Host-bound steps:</b> the estimated wall clock of the steps, {:.3f} ms, is "
                "{:.1f}x their device time ({:.3f} ms): the device waits for the host's tracing "
                "and dispatch (about {:.0f} ops per step).",
                *wall * us / 1e3, *wall / r->cycles, r->cycles * us / 1e3,
                value("ops").value_or(0) / steps));
    }
    if (const auto fb = value("cpu_fallbacks"); fb && *fb > 0)
        out.push_back(fmt::format(
            "<b>CPU fallbacks:</b> {:.0f} ops ran on the CPU (<code>aten::</code> counters of the "
            "metrics report): each waits for the device and copies its data both ways.",
            *fb));
    return out;
}

/// Per-layer work from the trace's host "layers" track (tpusim model).
std::string layer_table(const Model& model) {
    const double us = 1.0 / model.machine.clock_mhz;
    double whole = 0;
    if (model.result)
        whole = model.result->cycles;
    else if (model.trace_model)
        whole = double(model.trace_model->second);
    std::string s =
        "<table class=\"layers\"><tr><th>layer</th><th>kind</th><th>spans</th><th>cycles</th>"
        "<th>time</th><th>share</th></tr>\n";
    for (const Layer& l : model.layers)
        s += fmt::format(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3f} us</td><td>{}</td></tr>\n",
            escape(l.name), escape(l.kind), l.spans, grouped(double(l.cycles)),
            double(l.cycles) * us,
            whole > 0 ? pct(std::min(1.0, double(l.cycles) / whole)) : std::string("-"));
    return s + "</table>\n";
}

/// Board power over time, estimated from the trace's own activity (hw::PowerModel).
struct PowerSeries {
    uint64_t x0 = 0, bucket = 1;  ///< first cycle and window of each value
    std::vector<double> watts;    ///< board power per window
    double peak = 0, average = 0, idle = 0;
};

PowerSeries power_series(const Model& model, const TimeAxis& ax) {
    const Machine& m = model.machine;
    const hw::BoardConfig& cfg = m.board;
    const hw::PowerModel pm(cfg);
    PowerSeries p;
    p.idle = pm.board_static_w();
    const uint64_t span = ax.x1 - ax.x0;
    if (span == 0) return p;
    // Windows of the trace's counter tracks, wider for long traces (at most ~400 points).
    p.bucket = std::max<uint64_t>({uint64_t(1), cfg.sim.trace_counter_cycles, (span + 399) / 400});
    p.x0 = ax.x0;
    const size_t n = size_t((span + p.bucket - 1) / p.bucket);
    std::vector<hw::Activity> act(n);
    // Spreads `amount` evenly over [b, e) into the windows it overlaps.
    auto spread = [&](uint64_t b, uint64_t e, double amount, double hw::Activity::*field) {
        if (amount <= 0) return;
        b = std::clamp(b, ax.x0, ax.x1);
        e = std::clamp(e, ax.x0, ax.x1);
        if (e <= b) {
            const size_t k = std::min(n - 1, size_t((b - ax.x0) / p.bucket));
            act[k].*field += amount;
            return;
        }
        for (uint64_t t = b; t < e;) {
            const size_t k = size_t((t - ax.x0) / p.bucket);
            const uint64_t end = std::min(e, ax.x0 + (k + 1) * p.bucket);
            act[std::min(k, n - 1)].*field += amount * double(end - t) / double(e - b);
            t = end;
        }
    };
    for (const auto& [idx, c] : model.cores) {
        for (size_t i = 0; i + 1 < c.util.size(); ++i) {
            const uint64_t b = to_cycles(c.util[i].first * m.clock_mhz);
            const uint64_t e = to_cycles(c.util[i + 1].first * m.clock_mhz);
            spread(b, e, c.util[i].second * m.pe_count() * double(e - b), &hw::Activity::mxu_macs);
        }
        for (const auto& [b, e, v] : c.hbm_events) spread(b, e, v, &hw::Activity::hbm_bytes);
        for (const auto& [b, e, v] : c.vpu_events) spread(b, e, v, &hw::Activity::vpu_flops);
    }
    for (const auto& [b, e, v] : model.ici_events) spread(b, e, v, &hw::Activity::ici_bytes);
    for (const auto& [b, e, v] : model.host_events) spread(b, e, v, &hw::Activity::host_bytes);
    double sum = 0;
    for (size_t k = 0; k < n; ++k) {
        const uint64_t len = std::min(p.bucket, span - k * p.bucket);
        const double w = p.idle + pm.dynamic(act[k]).total() / m.clock().seconds(double(len));
        p.watts.push_back(w);
        p.peak = std::max(p.peak, w);
        sum += w * double(len);
    }
    p.average = sum / double(span);
    return p;
}

/// The power series as one line chart, with the idle power dashed.
std::string power_chart(const PowerSeries& p) {
    constexpr double kW = 900, kH = 220, kL = 56, kR = 12, kT = 14, kB = 28;
    const double pw = kW - kL - kR, ph = kH - kT - kB;
    const double ymax = nice_max(std::max(p.peak, p.idle) * 1.05);
    const double span = double(p.watts.size() * p.bucket);
    auto x = [&](double cycle) { return kL + pw * std::clamp(cycle / span, 0.0, 1.0); };
    auto y = [&](double w) { return kT + ph * (1.0 - std::clamp(w / ymax, 0.0, 1.0)); };
    std::string s = fmt::format(
        R"(<svg xmlns="{}" class="chart power" width="{}" height="{}" viewBox="0 0 {} {}" )"
        R"(role="img" aria-label="board power over time">)"
        "\n",
        kSvgNs, kW, kH, kW, kH);
    for (const double f : {0.0, 0.5, 1.0}) {
        s += fmt::format(R"(<line class="grid" x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}"/>)", kL,
                         y(f * ymax), kW - kR, y(f * ymax));
        s += fmt::format(R"(<text class="yl" x="{}" y="{:.1f}">{} W</text>)"
                         "\n",
                         kL - 3, y(f * ymax) + 3, tick(f * ymax));
        s += fmt::format(R"(<text class="xl" x="{:.1f}" y="{}">{}</text>)", kL + f * pw, kH - 8,
                         tick(f * span));
    }
    s += fmt::format(R"(<line class="ref" x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}"/>)"
                     "\n",
                     kL, y(p.idle), kW - kR, y(p.idle));
    std::string d = fmt::format("M{:.1f},{:.1f}", x(0), y(p.watts.empty() ? 0 : p.watts[0]));
    for (size_t k = 0; k < p.watts.size(); ++k)
        d += fmt::format(" H{:.1f} V{:.1f}", x(double(k * p.bucket)), y(p.watts[k]));
    d += fmt::format(" H{:.1f}", x(span));
    s += fmt::format(R"(<path class="line" stroke="#d62728" d="{}"/>)"
                     "\n</svg>\n",
                     d);
    return s;
}

/// The estimate's figures: whole run from the stats, power over time from the trace.
std::string power_section(const Model& model, const PowerSeries& p) {
    const double chips = std::max(1u, model.machine.board.chips);
    std::string s = "<table class=\"power\">\n";
    auto row = [&](std::string_view k, const std::string& v) {
        s += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", k, v);
    };
    if (const auto& e = model.energy) {
        row("energy of the whole run (stats)", fmt::format("{:.4g} J", e->total_j));
        row("average power of the whole run (stats)",
            fmt::format("{:.1f} W = {:.1f} W per chip", e->average_w, e->average_w / chips));
        if (e->outside_kernels_j)
            row("energy outside kernels (idle cores, transfers)",
                fmt::format("{:.4g} J", *e->outside_kernels_j));
    }
    if (!p.watts.empty()) {
        row("average power over the trace",
            fmt::format("{:.1f} W = {:.1f} W per chip", p.average, p.average / chips));
        row(fmt::format("peak power ({}-cycle windows)", p.bucket),
            fmt::format("{:.1f} W = {:.1f} W per chip", p.peak, p.peak / chips));
    }
    row("idle board (static power)",
        fmt::format("{:.1f} W = {:.1f} W per chip", p.idle, p.idle / chips));
    s += "</table>\n";
    if (model.energy && !model.energy->blocks.empty()) {
        s += "<table class=\"energy\"><tr><th>blocks</th><th>energy</th><th>share</th></tr>\n";
        for (const auto& [kind, j] : model.energy->blocks)
            s += fmt::format("<tr><td>{}</td><td>{:.4g} J</td><td>{}</td></tr>\n", escape(kind), j,
                             pct(model.energy->total_j > 0 ? j / model.energy->total_j : 0.0));
        s += "</table>\n";
    }
    if (!p.watts.empty()) s += power_chart(p);
    return s;
}

// ---- page ---------------------------------------------------------------------------------

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}
p.note{color:#666;font-size:12px;margin:4px 0}
table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.multiples{display:flex;flex-wrap:wrap;gap:6px}
svg.chart{background:#fff;border:1px solid #eee}
svg text{font:10px system-ui,sans-serif;fill:#444}
svg text.ct{font-weight:600;fill:#222}
svg text.yl{text-anchor:end}svg text.xl{text-anchor:middle}
svg text.axis{font-size:12px;text-anchor:middle}svg text.none{text-anchor:middle;fill:#999}
svg text.rl{font-size:11px;fill:#000}
svg .grid{stroke:#eee}svg .line{fill:none;stroke-width:1.5}
svg .ref{stroke:#999;stroke-dasharray:4 3}
svg .roof{fill:none;stroke:#000;stroke-width:2}svg .point{stroke:#000;stroke-width:.5}
svg .kpoint{stroke:#000;stroke-width:.5}.sw.kd{transform:rotate(45deg) scale(.8)}
.bar{display:inline-block;height:8px;background:#1f77b4;margin-left:6px;vertical-align:middle}
.sw{display:inline-block;width:10px;height:10px;margin-right:6px}
.advice{background:#fff8e1;border:1px solid #f0c36d;padding:2px 14px;margin:14px 0}
.advice h2{border:none;margin:8px 0 2px}.advice li{margin:4px 0}
)";

std::string summary(const Model& model) {
    const Machine& m = model.machine;
    uint64_t lo = UINT64_MAX, hi = 0;
    double insts = 0, bytes = 0, flops = 0;
    for (const auto& [idx, c] : model.cores) {
        if (c.first <= c.last) {
            lo = std::min(lo, c.first);
            hi = std::max(hi, c.last);
        }
        insts += c.insts;
        bytes += c.bytes;
        flops += c.flops;
    }
    const uint64_t kernel = lo <= hi ? hi - lo : 0;
    const double total = model.board_cycles ? *model.board_cycles : double(model.trace_end);
    const double n = double(model.cores.size());
    const double util = at_most(
        sim::mxu_utilization(flops / 2, sim::mxu_capacity(m.pe_count(), double(kernel), n)), 1.0);
    const double us = 1.0 / m.clock_mhz;
    bool est_flops = false, trace_bytes = false, trace_insts = false;
    for (const auto& [idx, c] : model.cores) {
        est_flops |= c.flops_estimated;
        trace_bytes |= c.bytes_from_trace;
        trace_insts |= c.insts_from_trace;
    }

    std::string s = "<table class=\"summary\">\n";
    auto row = [&](std::string_view k, const std::string& v) {
        s += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", k, v);
    };
    // The command's own total first, saying what it counts; then the whole run.
    if (const auto& r = model.result) {
        const double steps = r->get(std::string(sim::stat_names::kSteps)).value_or(1);
        row("result: device time", fmt::format("{} cycles = {:.3f} ms{}<br><small>{}</small>",
                                               grouped(r->cycles), r->cycles * us / 1e3,
                                               steps > 1 ? fmt::format(" ({:.3f} ms per step)",
                                                                       r->cycles * us / 1e3 / steps)
                                                         : std::string(),
                                               escape(r->label)));
        if (const auto wall = r->get(std::string(sim::stat_names::kWallCycles)))
            row("result: wall clock (estimate)",
                fmt::format("{} cycles = {:.3f} ms{}; the device is busy {} of it", grouped(*wall),
                            *wall * us / 1e3,
                            steps > 1
                                ? fmt::format(" ({:.3f} ms per step)", *wall * us / 1e3 / steps)
                                : std::string(),
                            pct(*wall > 0 ? std::min(1.0, r->cycles / *wall) : 0.0)));
    } else if (model.trace_model) {
        row(fmt::format("result: {} (trace)", escape(model.trace_model->first)),
            fmt::format("{} cycles = {:.3f} ms", grouped(double(model.trace_model->second)),
                        double(model.trace_model->second) * us / 1e3));
    } else if (model.trace_steps) {
        row("result: training steps in the trace",
            fmt::format("{} steps, {} cycles = {:.3f} ms", model.trace_steps,
                        grouped(double(model.trace_step_cycles)),
                        double(model.trace_step_cycles) * us / 1e3));
    }
    row("cores", fmt::format("{}{}", model.cores.size(),
                             model.hidden_cores
                                 ? fmt::format(" ({} idle core{} not shown)", model.hidden_cores,
                                               model.hidden_cores == 1 ? "" : "s")
                                 : std::string()));
    row(model.board_cycles ? "whole run: total cycles (board, from stats)"
                           : "whole run: total cycles (trace)",
        fmt::format("{} = {:.3f} us", grouped(total), total * us));
    if (model.window)
        row("trace window",
            fmt::format("cycles {} to {}{}", grouped(double(model.window->first)),
                        grouped(double(model.window->second)),
                        model.have_stats && !model.same_scope()
                            ? " (the stats count the whole run: the figures below are the "
                              "trace's, the kernel table the stats')"
                            : ""));
    row("core activity (first to last core event)",
        fmt::format("{} cycles = {:.3f} us", grouped(double(kernel)), double(kernel) * us));
    row(trace_insts ? "instructions (unit events in the trace)" : "instructions", grouped(insts));
    row(trace_bytes ? "HBM bytes (DMA events in the trace)" : "HBM bytes",
        fmt::format("{} ({})", grouped(bytes), si(bytes, "B")));
    row(est_flops ? "MXU FLOPs (estimated from mxu_utilization)" : "MXU FLOPs",
        fmt::format("{} ({})", grouped(flops), si(flops, "FLOP")));
    row("MXU utilisation over the core activity", pct(util));
    if (kernel) {
        const double seconds = m.clock().seconds(double(kernel));
        row("achieved",
            fmt::format("{:.2f} TFLOP/s of {:.2f} peak, {:.1f} GB/s HBM",
                        at_most(flops / seconds, n * m.peak_flops) / 1e12, n * m.peak_flops / 1e12,
                        at_most(bytes / seconds, n * m.hbm_bytes_per_s) / 1e9));
    }
    const Host& h = model.host;
    if (h.writes || h.reads)
        row("host transfers",
            fmt::format("{} writes ({}), {} reads ({})", h.writes, si(double(h.write_bytes), "B"),
                        h.reads, si(double(h.read_bytes), "B")));
    row("clock", fmt::format("{:.1f} MHz{}", m.clock_mhz,
                             m.from_config   ? " (config)"
                             : m.clock_known ? " (from the trace)"
                                             : " (default)"));
    s += "</table>\n";

    // Per core.
    s += "<table class=\"cores\"><tr><th>core</th><th>cycles</th><th>instructions</th><th>HBM "
         "bytes</th><th>MXU FLOPs</th><th>MXU util.</th><th>TFLOP/s</th><th>FLOP/byte</th></tr>"
         "\n";
    for (const auto& [idx, c] : model.cores) {
        const double seconds = m.clock().seconds(double(c.span));
        const double cu = at_most(
            sim::mxu_utilization(c.flops / 2, sim::mxu_capacity(m.pe_count(), double(c.span))),
            1.0);
        s += fmt::format(
            "<tr><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2f}</td><td>{}</td></tr>\n",
            colour(idx), escape(c.name), grouped(double(c.span)), grouped(c.insts),
            grouped(c.bytes), grouped(c.flops), pct(cu),
            seconds > 0 ? at_most(c.flops / seconds, m.peak_flops) / 1e12 : 0.0,
            c.bytes > 0 ? fmt::format("{:.2f}", c.flops / c.bytes) : std::string("-"));
    }
    s += "</table>\n";
    return s;
}

/// HBM row behaviour per core and ICI link use, from the stats (empty without them).
std::string memory_tables(const Model& model) {
    std::string s;
    std::vector<std::string> keys;
    for (const auto& [idx, c] : model.cores)
        for (const auto& [k, v] : c.hbm_stats)
            if (k.find("bank") != 0 && std::find(keys.begin(), keys.end(), k) == keys.end())
                keys.push_back(k);
    if (!keys.empty()) {
        s += "<table class=\"hbm\"><tr><th>core</th>";
        for (const auto& k : keys) s += fmt::format("<th>{}</th>", escape(k));
        s += "<th>worst bank (conflicts)</th></tr>\n";
        for (const auto& [idx, c] : model.cores) {
            if (c.hbm_stats.empty()) continue;
            s += fmt::format("<tr><td>{}</td>", escape(c.name));
            std::pair<std::string, double> worst{"-", 0};
            for (const auto& k : keys) {
                const auto it = std::find_if(c.hbm_stats.begin(), c.hbm_stats.end(),
                                             [&](const auto& kv) { return kv.first == k; });
                const double v = it == c.hbm_stats.end() ? 0 : it->second;
                s += fmt::format("<td>{}</td>",
                                 v != std::floor(v) ? fmt::format("{:.3f}", v) : grouped(v));
            }
            for (const auto& [k, v] : c.hbm_stats)
                if (k.find("bank") == 0 && v > worst.second) worst = {k, v};
            s += fmt::format("<td>{} ({})</td></tr>\n", escape(worst.first), grouped(worst.second));
        }
        s += "</table>\n";
    }
    bool any_link = false;
    for (const Link& l : model.links) any_link |= l.bytes > 0;
    if (any_link) {
        s += "<table class=\"ici\"><tr><th>ICI link</th><th>bytes</th><th>utilisation</th></tr>\n";
        for (const Link& l : model.links)
            if (l.bytes > 0)
                s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", escape(l.name),
                                 grouped(l.bytes), pct(l.utilization));
        s += "</table>\n";
    }
    return s;
}

/// Per-kernel totals from the stats (empty without a `kernels` group).
std::string kernel_table(const Model& model) {
    const double clock = model.machine.clock_mhz;
    std::string s =
        "<table class=\"kernels\"><tr><th>kernel</th><th>launches</th><th>cycles</th>"
        "<th>time</th><th>FLOPs (MXU + VPU)</th><th>HBM bytes</th><th>ICI bytes</th>"
        "<th>MXU utilisation</th><th>FLOP/byte</th><th>TFLOP/s per core</th>"
        "<th>energy (estimate)</th></tr>\n";
    for (size_t i = 0; i < model.kernels.size(); ++i) {
        const Kernel& k = model.kernels[i];
        s += fmt::format(
            "<tr><td><span class=\"sw kd\" style=\"background:{}\"></span>{}</td><td>{}</td>"
            "<td>{}</td><td>{:.3f} us</td><td>{} ({} + {})</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{:.2f}</td><td>{:.3f}</td><td>{}</td></tr>\n",
            colour(int(i)), escape(k.name), grouped(k.launches), grouped(k.cycles),
            k.cycles / clock, grouped(k.flops), grouped(k.mxu_flops), grouped(k.vpu_flops),
            grouped(k.hbm_bytes), grouped(k.ici_bytes),
            k.mxu_util ? pct(at_most(*k.mxu_util, 1.0)) : "-", k.ai(),
            at_most(k.tflops(clock), model.machine.peak_flops / 1e12),
            k.energy_j ? fmt::format("{:.4g} J", *k.energy_j) : std::string("-"));
    }
    return s + "</table>\n";
}

std::string busy_table(const Model& model) {
    // Known units in pipeline order, then anything else by name.
    static constexpr std::array<std::string_view, 6> kOrder{"seq", "dma",  "vpu",
                                                            "ici", "mxu0", "mxu1"};
    std::vector<std::string> units;
    for (const auto u : kOrder) {
        for (const auto& [idx, c] : model.cores) {
            if (c.unit_busy.count(std::string(u))) {
                units.emplace_back(u);
                break;
            }
        }
    }
    std::map<std::string, bool> extra;
    for (const auto& [idx, c] : model.cores)
        for (const auto& [u, b] : c.unit_busy)
            if (std::find(kOrder.begin(), kOrder.end(), u) == kOrder.end()) extra[u] = true;
    for (const auto& [u, b] : extra) units.push_back(u);

    std::string s = "<table class=\"busy\"><tr><th>core</th><th>span (cycles)</th>";
    for (const auto& u : units) s += fmt::format("<th>{}</th>", escape(u));
    s += "</tr>\n";
    for (const auto& [idx, c] : model.cores) {
        s += fmt::format("<tr><td>{}</td><td>{}</td>", escape(c.name), grouped(double(c.span)));
        for (const auto& u : units) {
            const auto it = c.unit_busy.find(u);
            if (it == c.unit_busy.end()) {
                s += "<td>-</td>";
                continue;
            }
            const double f = c.span ? double(it->second) / double(c.span) : 0.0;
            s += fmt::format(
                "<td title=\"busy {} cycles; events sum to {} cycles\">{}<span class=\"bar\" "
                "style=\"width:{:.0f}px\"></span></td>",
                grouped(double(it->second)), grouped(double(c.unit_sum.at(u))), pct(f),
                std::min(f, 1.0) * 40);
        }
        s += "</tr>\n";
    }
    s += "</table>\n";
    return s;
}

}  // namespace

std::string render_report(const std::string& trace_json, const std::string& stats_json,
                          const std::string& title, const std::string& config_json) {
    Model model;
    if (!config_json.empty()) read_config(config_json, model.machine);
    read_trace(trace_json, model);
    if (!stats_json.empty()) read_stats(stats_json, model);
    derive(model);
    const Machine& m = model.machine;
    const TimeAxis ax = time_axis(model);

    std::string page;
    page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
    page += fmt::format("<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n", escape(title),
                        kStyle);
    page += fmt::format("<h1>{}</h1>\n", escape(title));
    page +=
        fmt::format("<p class=\"note\">tpusim report: {} cores, {}; roof from {}.</p>\n",
                    model.cores.size(), model.have_stats ? "counters from the stats" : "trace only",
                    m.from_config ? "the run's config" : "the default v3-8-like board");

    page += "<h2>Summary</h2>\n" + summary(model);
    if (const std::vector<std::string> items = advice(model); !items.empty()) {
        page += "<div class=\"advice\"><h2>Advice</h2>\n<ul>\n";
        for (const std::string& item : items) page += "<li>" + item + "</li>\n";
        page += "</ul></div>\n";
    }

    page += "<h2>MXU utilisation over time</h2>\n";
    page += fmt::format(
        "<p class=\"note\">Useful PE-cycles over all PE-cycles of each core's MXUs per counter "
        "window (trace counter <code>mxu_utilization</code>). x: cycles since cycle {}.</p>\n",
        grouped(double(ax.x0)));
    page += "<div class=\"multiples\">\n";
    for (const auto& [idx, c] : model.cores)
        page += line_chart("util", c, idx, c.util, ax, m.clock_mhz, 1.0, "%", 100.0, std::nullopt);
    page += "</div>\n";

    double gbps_max = 0;
    for (const auto& [idx, c] : model.cores)
        for (const auto& [ts, v] : c.gbps) gbps_max = std::max(gbps_max, v);
    const double peak_gbps = m.hbm_bytes_per_s / 1e9;
    page += "<h2>HBM bandwidth over time</h2>\n";
    page += fmt::format(
        "<p class=\"note\">GB/s moved by each core's DMA per counter window (trace counter "
        "<code>hbm_gbps</code>); dashed: the {:.1f} GB/s peak. x: cycles since cycle {}.</p>\n",
        peak_gbps, grouped(double(ax.x0)));
    page += "<div class=\"multiples\">\n";
    const double gmax = nice_max(std::max(gbps_max, peak_gbps));
    for (const auto& [idx, c] : model.cores)
        page += line_chart("hbm", c, idx, c.gbps, ax, m.clock_mhz, gmax, "", 1.0, peak_gbps);
    page += "</div>\n";

    page += "<h2>Power and energy (estimate)</h2>\n";
    page += fmt::format(
        "<p class=\"note\">An estimate, not a measurement: each block's static power while the "
        "board runs plus an energy per MAC, VPU operation and byte moved (hw/README.md, \"Power "
        "and energy\"; coefficients from {}). Published TPU v3 chip power: 450 W TDP, measured "
        "123 / 220 / 262 W min / mean / max (Cloud TPU v3 page). Dashed: the idle board.</p>\n",
        m.from_config ? "the run's config" : "the default config");
    page += power_section(model, power_series(model, ax));
    page += "<h2>Unit busy time</h2>\n";
    page +=
        "<p class=\"note\">Cycles in which the unit has an event in flight (the union of its "
        "events, which overlap when the unit queues work) over the core's span, first to last "
        "event. Hover a cell for the plain sum of event durations.</p>\n";
    page += busy_table(model);

    if (!model.kernels.empty()) {
        page += "<h2>Kernels</h2>\n";
        page +=
            "<p class=\"note\">Per kernel name, over all its launches (stats group "
            "<code>kernels</code>): cycles sum the launch durations; TFLOP/s per core divides "
            "the FLOPs by the launched cores' summed cycles, which places the kernel under the "
            "per-core roof below.</p>\n";
        page += kernel_table(model);
    }

    if (!model.layers.empty()) {
        page += "<h2>Layers</h2>\n";
        page +=
            "<p class=\"note\">From the trace's host <code>layers</code> track: each layer's "
            "spans of consecutive kernels (forward, then backward), their cycles, and their share "
            "of the result's device time.</p>\n";
        page += layer_table(model);
    }
    if (const std::string mem = memory_tables(model); !mem.empty())
        page += "<h2>HBM rows and ICI links</h2>\n" + mem;
    page += "<h2>Roofline</h2>\n";
    page += fmt::format(
        "<p class=\"note\">Per core: peak {:.1f} TFLOP/s = 2 x {} MXUs x {}x{} PEs x {:.1f} MHz; "
        "HBM {:.1f} GB/s. Circles: cores, MXU FLOPs over HBM bytes, FLOPs over the core's span. "
        "Diamonds: kernels, MXU + VPU FLOPs over HBM bytes, FLOPs over the launched cores' "
        "summed cycles.</p>\n",
        m.peak_flops / 1e12, m.mxus, m.rows, m.cols, m.clock_mhz, peak_gbps);
    page += roofline(model);
    page += "</body>\n</html>\n";
    return page;
}

}  // namespace tpu::traces
