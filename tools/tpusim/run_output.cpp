// SPDX-License-Identifier: Apache-2.0
#include "tools/tpusim/run_output.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/config_io.h"
#include "sim/file_io.h"
#include "sim/metrics.h"
#include "sim/stat_names.h"
#include "sim/stats.h"
#include "sim/tracer.h"

namespace tpu::cli {
namespace {

std::pair<uint64_t, uint64_t> parse_window(const std::string& w) {
    if (w.empty()) return {0, 0};
    const size_t colon = w.find(':');
    auto num = [&](std::string_view s) {
        uint64_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size())
            throw InputError(fmt::format("--trace-window '{}': expected START:END in cycles", w));
        return v;
    };
    if (colon == std::string::npos)
        throw InputError(fmt::format("--trace-window '{}': expected START:END in cycles", w));
    const uint64_t a = num(std::string_view(w).substr(0, colon));
    const std::string_view rest = std::string_view(w).substr(colon + 1);
    const uint64_t b = rest.empty() ? 0 : num(rest);
    if (b != 0 && b <= a)
        throw InputError(fmt::format("--trace-window '{}': END must be after START", w));
    return {a, b};
}

/// A counter of the board's stats tree by dotted path below the root (0 if absent).
double stat(const sim::StatGroup& root, const std::string& path) {
    const sim::Counter* c = root.find(path);
    return c ? double(c->value()) : 0.0;
}

/// The activity counters of the whole board, from its stats tree (every rank's after
/// sync_stats()).
hw::Activity board_activity(const sim::StatGroup& root, const hw::BoardConfig& cfg) {
    namespace n = sim::stat_names;
    hw::Activity a;
    for (uint32_t c = 0; c < cfg.cores(); ++c) {
        const std::string core = fmt::format("{}{}.", n::kCorePrefix, c);
        for (uint32_t m = 0; m < cfg.core.mxus; ++m)
            a.mxu_macs += stat(root, fmt::format("{}{}{}.{}", core, n::kMxuPrefix, m, n::kMacs));
        a.vpu_flops += stat(root, fmt::format("{}{}.{}", core, n::kVpu, n::kFlops));
        a.hbm_bytes += stat(root, fmt::format("{}{}.{}", core, n::kDma, n::kHbmReadBytes)) +
                       stat(root, fmt::format("{}{}.{}", core, n::kDma, n::kHbmWriteBytes));
        a.ici_bytes += stat(root, fmt::format("{}{}.{}", core, n::kIci, n::kBytes));
    }
    for (uint32_t chip = 0; chip < cfg.chips; ++chip) {
        const std::string link = fmt::format("{}.chip{}.", n::kHost, chip);
        a.host_bytes += stat(root, link + std::string(n::kToDeviceBytes)) +
                        stat(root, link + std::string(n::kToHostBytes));
    }
    return a;
}

/// The energy of one kernel's launches (hw::PowerModel::work_energy).
hw::Energy kernel_energy(const hw::PowerModel& model, const driver::KernelStats& k) {
    hw::Activity a;
    a.mxu_macs = double(k.mxu_macs);
    a.vpu_flops = double(k.vpu_flops);
    a.hbm_bytes = double(k.hbm_bytes());
    a.ici_bytes = double(k.ici_bytes);
    return model.work_energy(a, double(k.core_cycles));
}

/// board.energy: the estimate per block kind, its totals, and the energy outside kernels.
void add_energy_stats(sim::StatGroup& root, std::vector<std::unique_ptr<sim::StatGroup>>& groups,
                      const RunEnergy& e) {
    namespace n = sim::stat_names;
    auto& top =
        *groups.emplace_back(std::make_unique<sim::StatGroup>(std::string(n::kEnergy), &root));
    top.add_formula(std::string(n::kTotalJ),
                    "estimated energy of the whole run: static power of every block while the "
                    "board ran, plus energy per MAC, VPU op and byte moved",
                    sim::StatUnit::Joules, [e] { return e.total_j(); });
    top.add_formula(std::string(n::kStaticJ),
                    "of which static energy (leakage, and a clocked chip's idle power)",
                    sim::StatUnit::Joules, [e] { return e.statics.total(); });
    top.add_formula(std::string(n::kDynamicJ), "of which dynamic energy (activity)",
                    sim::StatUnit::Joules, [e] { return e.dynamic.total(); });
    top.add_formula(std::string(n::kAveragePowerW),
                    "estimated average power of the board: total energy / simulated time",
                    sim::StatUnit::Watts, [e] { return e.average_power_w(); });
    top.add_formula(std::string(n::kIdlePowerW),
                    "estimated power of the board doing nothing: the static power of every block",
                    sim::StatUnit::Watts, [e] { return e.idle_power_w; });
    if (!e.kernels.empty())
        top.add_formula(std::string(n::kOutsideKernelsJ),
                        "energy outside every kernel: idle cores, host transfers, set-up (total - "
                        "the kernels' energy_j)",
                        sim::StatUnit::Joules, [e] { return e.total_j() - e.kernels_j(); });
    const std::pair<const char*, double hw::Energy::*> kinds[] = {
        {"mxu", &hw::Energy::mxu},    {"vpu", &hw::Energy::vpu},
        {"vmem", &hw::Energy::vmem},  {"hbm", &hw::Energy::hbm},
        {"ici", &hw::Energy::ici},    {"host_link", &hw::Energy::host_link},
        {"other", &hw::Energy::other}};
    for (const auto& [kind, member] : kinds) {
        auto& g = *groups.emplace_back(std::make_unique<sim::StatGroup>(kind, &top));
        const double st = e.statics.*member, dy = e.dynamic.*member;
        g.add_formula(std::string(n::kEnergyJ), "estimated energy of these blocks, board-wide",
                      sim::StatUnit::Joules, [st, dy] { return st + dy; });
        g.add_formula(std::string(n::kStaticJ), "of which static", sim::StatUnit::Joules,
                      [st] { return st; });
        g.add_formula(std::string(n::kDynamicJ), "of which dynamic", sim::StatUnit::Joules,
                      [dy] { return dy; });
    }
}

/// board.result: what the command reports as its result, labelled.
void add_result_stats(sim::StatGroup& root, std::vector<std::unique_ptr<sim::StatGroup>>& groups,
                      const std::vector<ResultStat>& result) {
    auto& g = *groups.emplace_back(
        std::make_unique<sim::StatGroup>(std::string(sim::stat_names::kResult), &root));
    for (const ResultStat& r : result) {
        const double v = r.value;
        g.add_formula(r.name, r.desc, r.unit, [v] { return v; });
    }
}

/// board.kernels.<name>: each kernel's totals, counters then the derived figures.
void add_kernel_stats(sim::StatGroup& root, std::vector<std::unique_ptr<sim::StatGroup>>& groups,
                      const std::vector<driver::KernelStats>& kernels, const RunEnergy& energy) {
    namespace n = sim::stat_names;
    auto& top =
        *groups.emplace_back(std::make_unique<sim::StatGroup>(std::string(n::kKernels), &root));
    for (size_t i = 0; i < kernels.size(); ++i) {
        const driver::KernelStats& k = kernels[i];
        // Group names cannot hold '.' (it separates stat paths).
        std::string name = k.name;
        std::replace(name.begin(), name.end(), '.', '_');
        auto& g = *groups.emplace_back(std::make_unique<sim::StatGroup>(name, &top));
        g.add(std::string(n::kLaunches), "completed launches of the kernel", sim::StatUnit::Count)
            .set(k.launches);
        g.add(std::string(n::kCycles), "sum of launch durations (launch to last core halted)",
              sim::StatUnit::Cycles)
            .set(k.cycles);
        g.add(std::string(n::kCoreCycles),
              "sum over launches and launched cores of each core's cycles", sim::StatUnit::Cycles)
            .set(k.core_cycles);
        g.add(std::string(n::kInstructions), "instructions issued on the launched cores",
              sim::StatUnit::Count)
            .set(k.instructions);
        g.add(std::string(n::kFlops), "2 x MXU multiply-accumulates + VPU fp32 operations",
              sim::StatUnit::Flops)
            .set(k.flops());
        g.add(std::string(n::kMxuFlops), "2 x MXU multiply-accumulates", sim::StatUnit::Flops)
            .set(2 * k.mxu_macs);
        g.add(std::string(n::kVpuFlops), "VPU fp32 operations", sim::StatUnit::Flops)
            .set(k.vpu_flops);
        g.add(std::string(n::kHbmReadBytes), "bytes read from HBM by DMA", sim::StatUnit::Bytes)
            .set(k.hbm_read_bytes);
        g.add(std::string(n::kHbmWriteBytes), "bytes written to HBM by DMA", sim::StatUnit::Bytes)
            .set(k.hbm_write_bytes);
        g.add(std::string(n::kIciBytes), "bytes sent over ICI", sim::StatUnit::Bytes)
            .set(k.ici_bytes);
        g.add_formula(std::string(n::kMxuUtilization),
                      "useful MXU MACs / (MXUs x rows x cols x cycles x launched cores)",
                      sim::StatUnit::Ratio, [k] { return k.mxu_utilization(); });
        g.add_formula("arithmetic_intensity", "FLOPs per HBM byte read or written",
                      sim::StatUnit::FlopsPerByte, [k] { return k.arithmetic_intensity(); });
        const double joules = energy.kernels.at(i).second.total();
        g.add_formula(std::string(n::kEnergyJ),
                      "estimated energy of the launches: their activity, their cores' static "
                      "power over their core cycles and those cores' share of their chips'",
                      sim::StatUnit::Joules, [joules] { return joules; });
    }
}

}  // namespace

RunTrace::RunTrace(const CommonOptions& opts, const hw::BoardConfig& cfg)
    : m_tracer(std::make_unique<sim::Tracer>()) {
    if (!opts.trace.empty()) {
        const auto [b, e] = parse_window(opts.trace_window);
        try {
            m_tracer->open(opts.trace, cfg.clock_mhz, opts.trace_units, b, e);
            hw::BoardConfig copy = cfg;
            m_tracer->set_config(sim::dump_json(sim::root_of(copy)));
        } catch (const std::runtime_error& err) {
            throw InputError(fmt::format("--trace: {}", err.what()));
        }
    } else if (!opts.trace_units.empty() || !opts.trace_window.empty()) {
        throw InputError("--trace-units and --trace-window need --trace FILE");
    }
}

RunTrace::~RunTrace() = default;

void RunTrace::finish() {
    try {
        m_tracer->close();
    } catch (const sim::OutputError& e) {
        throw InputError(fmt::format("--trace: {}", e.what()));
    }
}

void load_memory(hw::Board& board, const std::vector<uint32_t>& cores, bool hbm, uint64_t addr,
                 std::span<const uint8_t> data, const std::string& what) {
    for (uint32_t c : cores) {
        hw::SparseMemory& mem = hbm ? board.hbm(c) : board.vmem(c);
        if (!mem.in_range(addr, data.size()))
            throw InputError(fmt::format("{}: {} bytes at 0x{:x} do not fit in {} ({} bytes)", what,
                                         data.size(), addr, mem.name(), mem.size()));
        if (board.owns(c)) mem.write(addr, data);
    }
}

void check_dump(hw::Board& board, uint32_t core, bool hbm, uint64_t addr, uint64_t bytes,
                const std::string& what) {
    const hw::SparseMemory& mem = hbm ? board.hbm(core) : board.vmem(core);
    if (bytes == 0 || !mem.in_range(addr, bytes))
        throw InputError(fmt::format("{}: {} bytes at 0x{:x} are not inside {} ({} bytes)", what,
                                     bytes, addr, mem.name(), mem.size()));
}

RunSession::RunSession(const hw::BoardConfig& cfg, const CommonOptions& opts)
    : m_opts(opts),
      m_trace(opts, cfg),
      m_owned(driver::Device::open(cfg)),
      m_dev(m_owned.get()),
      m_cfg(m_dev->config()) {
    m_dev->set_tracer(m_trace.get());
}

RunSession::RunSession(driver::Device& dev, const CommonOptions& opts)
    : m_opts(opts), m_trace(opts, dev.config()), m_dev(&dev), m_cfg(dev.config()) {
    m_dev->set_tracer(m_trace.get());
}

RunSession::~RunSession() {
    // A borrowed device outlives the tracer about to close.
    if (!m_owned) m_dev->set_tracer(nullptr);
}

hw::LaunchResult RunSession::launch(const std::string& source, const isa::Program& program,
                                    const std::vector<uint32_t>& cores,
                                    const std::vector<uint32_t>& args) {
    m_before.clear();
    for (uint32_t c = 0; c < board().num_cores(); ++c) m_before.push_back(board().core(c).stats());
    try {
        const driver::Event ev = m_dev->launch(cores, program, [&](size_t) { return args; });
        m_host_seconds += ev.host_seconds;
        return hw::LaunchResult{ev.start_cycle, ev.end_cycle, ev.cores, ev.core_cycles};
    } catch (const driver::DeviceError& e) {
        if (e.kind() == driver::ErrorKind::Usage || e.kind() == driver::ErrorKind::OutOfMemory)
            throw InputError(e.what());
        throw RunError(fmt::format("{}: {}", source, e.what()));
    }
}

double RunSession::mxu_utilization(const hw::LaunchResult& res) const {
    const double array = double(m_cfg.core.mxus) * m_cfg.core.mxu_rows * m_cfg.core.mxu_cols;
    uint64_t macs = 0, cycles = res.end_cycle - res.start_cycle;
    for (uint32_t c : res.cores) {
        const auto& s = m_dev->board().core(c).stats();
        for (size_t i = 0; i < s.mxu_macs.size(); ++i)
            macs += s.mxu_macs[i] - m_before[c].mxu_macs[i];
    }
    return sim::mxu_utilization(double(macs),
                                sim::mxu_capacity(array, double(cycles), double(res.cores.size())));
}

std::string RunSession::result_json(const hw::LaunchResult& res) const {
    nlohmann::ordered_json j;
    j["cycles"] = res.end_cycle - res.start_cycle;
    j["simulated_seconds"] = m_cfg.clock().seconds(double(res.end_cycle - res.start_cycle));
    j["host_seconds"] = m_host_seconds;
    j["mxu_utilization"] = mxu_utilization(res);
    auto& arr = j["cores"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < res.cores.size(); ++i) {
        const uint32_t c = res.cores[i];
        const auto& s = m_dev->board().core(c).stats();
        const auto& b = m_before[c];
        arr.push_back({{"id", c},
                       {"cycles", res.core_cycles[i]},
                       {"instructions", s.instructions - b.instructions},
                       {"hbm_read_bytes", s.hbm_read_bytes - b.hbm_read_bytes},
                       {"hbm_write_bytes", s.hbm_write_bytes - b.hbm_write_bytes}});
    }
    return j.dump();
}

void RunSession::report(const hw::LaunchResult& res) {
    if (m_opts.json) {
        fmt::print("{}\n", result_json(res));
    } else {
        fmt::print("{:>4} {:>12} {:>12} {:>10} {:>12} {:>12}\n", "core", "cycles", "time_us",
                   "instrs", "hbm_read", "hbm_write");
        for (size_t i = 0; i < res.cores.size(); ++i) {
            const uint32_t c = res.cores[i];
            const auto& s = m_dev->board().core(c).stats();
            const auto& b = m_before[c];
            fmt::print("{:>4} {:>12} {:>12.3f} {:>10} {:>12} {:>12}\n", c, res.core_cycles[i],
                       m_cfg.clock().us(double(res.core_cycles[i])),
                       s.instructions - b.instructions, s.hbm_read_bytes - b.hbm_read_bytes,
                       s.hbm_write_bytes - b.hbm_write_bytes);
        }
        const uint64_t cycles = res.end_cycle - res.start_cycle;
        fmt::print(
            "total: {} cycles = {:.3f} us at {} MHz; MXU utilisation {:.1f}%; host {:.3f} s\n",
            cycles, m_cfg.clock().us(double(cycles)), m_cfg.clock_mhz, 100.0 * mxu_utilization(res),
            m_host_seconds);
    }
    finish();
}

void RunSession::finish() {
    write_stats_file(m_opts, m_dev->board(), m_dev->kernel_stats());
    m_dev->set_tracer(nullptr);
    m_trace.finish();
}

double RunEnergy::kernels_j() const {
    double sum = 0;
    for (const auto& [name, e] : kernels) sum += e.total();
    return sum;
}

RunEnergy estimate_energy(hw::Board& board, const std::vector<driver::KernelStats>& kernels) {
    board.sync_stats();
    const hw::BoardConfig& cfg = board.config();
    const hw::PowerModel model(cfg);
    const sim::StatGroup& root = board.stats();
    const double cycles = stat(root, std::string(sim::stat_names::kCycles));
    RunEnergy e;
    e.seconds = cfg.clock().seconds(cycles);
    e.idle_power_w = model.board_static_w();
    e.statics = model.static_energy(cycles * cfg.cores(), cycles * cfg.chips);
    e.dynamic = model.dynamic(board_activity(root, cfg));
    for (const driver::KernelStats& k : kernels)
        e.kernels.emplace_back(k.name, kernel_energy(model, k));
    return e;
}

nlohmann::ordered_json energy_json(const RunEnergy& e) {
    nlohmann::ordered_json j;
    j["total_j"] = e.total_j();
    j["static_j"] = e.statics.total();
    j["dynamic_j"] = e.dynamic.total();
    j["average_power_w"] = e.average_power_w();
    j["idle_power_w"] = e.idle_power_w;
    j["seconds"] = e.seconds;
    auto& b = j["blocks"] = nlohmann::ordered_json::object();
    const hw::Energy& s = e.statics;
    const hw::Energy& d = e.dynamic;
    b["mxu"] = s.mxu + d.mxu;
    b["vpu"] = s.vpu + d.vpu;
    b["vmem"] = s.vmem + d.vmem;
    b["hbm"] = s.hbm + d.hbm;
    b["ici"] = s.ici + d.ici;
    b["host_link"] = s.host_link + d.host_link;
    b["other"] = s.other + d.other;
    auto& k = j["kernels"] = nlohmann::ordered_json::array();
    for (const auto& [name, en] : e.kernels)
        k.push_back({{"name", name}, {"energy_j", en.total()}});
    if (!e.kernels.empty()) j["outside_kernels_j"] = e.total_j() - e.kernels_j();
    return j;
}

void write_stats_file(const CommonOptions& opts, hw::Board& board) {
    write_stats_file(opts, board, {});
}

void write_stats(std::ostream& os, bool csv, hw::Board& board,
                 const std::vector<driver::KernelStats>& kernels,
                 const std::vector<ResultStat>& result) {
    // The blocks' own groups under the board's root; the per-kernel totals are the driver's,
    // the energy estimate and the result the command's, attached for this one write.
    sim::StatGroup& root = board.stats();
    std::vector<std::unique_ptr<sim::StatGroup>> groups;
    const RunEnergy energy = estimate_energy(board, kernels);
    if (!result.empty()) add_result_stats(root, groups, result);
    if (!kernels.empty()) add_kernel_stats(root, groups, kernels, energy);
    add_energy_stats(root, groups, energy);
    if (csv)
        root.write_csv(os);
    else
        root.write_json(os);
}

void write_stats_file(const CommonOptions& opts, hw::Board& board,
                      const std::vector<driver::KernelStats>& kernels,
                      const std::vector<ResultStat>& result) {
    if (opts.stats.empty()) return;
    board.sync_stats();
    const bool csv = opts.stats.size() > 4 && opts.stats.substr(opts.stats.size() - 4) == ".csv";
    hw::BoardConfig copy = board.config();
    try {
        sim::OutputFile out(opts.stats);
        write_stats(out.stream(), csv, board, kernels, result);
        out.commit();
        // The effective config beside every stats file, so a result always says what
        // produced it; not beside a device (/dev/null.config.json would be a stray file).
        if (!out.in_place())
            sim::write_output_file(opts.stats + ".config.json", sim::dump_json(sim::root_of(copy)));
    } catch (const sim::OutputError& e) {
        throw InputError(fmt::format("--stats: {}", e.what()));
    }
}

void throw_as_cli_error(const driver::DeviceError& e) {
    if (e.kind() == driver::ErrorKind::Usage || e.kind() == driver::ErrorKind::OutOfMemory)
        throw InputError(e.what());
    throw RunError(e.what());
}

}  // namespace tpu::cli
