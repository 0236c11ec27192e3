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

/// board.kernels.<name>: each kernel's totals, counters then the derived figures.
void add_kernel_stats(sim::StatGroup& root, std::vector<std::unique_ptr<sim::StatGroup>>& groups,
                      const std::vector<driver::KernelStats>& kernels) {
    namespace n = sim::stat_names;
    auto& top =
        *groups.emplace_back(std::make_unique<sim::StatGroup>(std::string(n::kKernels), &root));
    for (const driver::KernelStats& k : kernels) {
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

void write_stats_file(const CommonOptions& opts, hw::Board& board) {
    write_stats_file(opts, board, {});
}

void write_stats(std::ostream& os, bool csv, hw::Board& board,
                 const std::vector<driver::KernelStats>& kernels) {
    // The blocks' own groups under the board's root; the per-kernel totals are the driver's,
    // attached for this one write.
    sim::StatGroup& root = board.stats();
    std::vector<std::unique_ptr<sim::StatGroup>> groups;
    if (!kernels.empty()) add_kernel_stats(root, groups, kernels);
    if (csv)
        root.write_csv(os);
    else
        root.write_json(os);
}

void write_stats_file(const CommonOptions& opts, hw::Board& board,
                      const std::vector<driver::KernelStats>& kernels) {
    if (opts.stats.empty()) return;
    board.sync_stats();
    const bool csv = opts.stats.size() > 4 && opts.stats.substr(opts.stats.size() - 4) == ".csv";
    hw::BoardConfig copy = board.config();
    try {
        sim::OutputFile out(opts.stats);
        write_stats(out.stream(), csv, board, kernels);
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
