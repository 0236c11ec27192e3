// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/device.h"
#include "hw/board.h"
#include "hw/power/power_model.h"
#include "sim/stats.h"
#include "tools/tpusim/commands.h"

namespace tpu::sim {
class Tracer;
}

namespace tpu::cli {

/// The --trace file of a command (closed tracer when --trace is absent); validates
/// --trace-units / --trace-window.
class RunTrace {
public:
    RunTrace(const CommonOptions& opts, const hw::BoardConfig& cfg);
    ~RunTrace();
    sim::Tracer* get() { return m_tracer.get(); }
    /// Completes and closes the trace file; a failed write becomes InputError naming --trace.
    /// (Without it the destructor closes the file and can only log such an error.)
    void finish();

private:
    std::unique_ptr<sim::Tracer> m_tracer;
};

/// Rethrows a device error as the command line's: bad input (Usage, OutOfMemory) as
/// InputError (exit 2), anything else as RunError (exit 1).
[[noreturn]] void throw_as_cli_error(const driver::DeviceError& e);

/// One statistic of what a command reports as its result (stats group board.result).
struct ResultStat {
    std::string name;  ///< key
    std::string desc;  ///< what it counts, in words a reader of the report sees
    sim::StatUnit unit;
    double value = 0;
};

/// The run's power and energy estimate (hw/power/power_model.h), from the board's counters.
struct RunEnergy {
    double seconds = 0;       ///< simulated time of the whole run
    double idle_power_w = 0;  ///< the board's static power
    hw::Energy statics;       ///< static energy per block kind
    hw::Energy dynamic;       ///< dynamic energy per block kind
    /// Per kernel name: its launches' dynamic energy, its cores' static energy over its core
    /// cycles and their share of their chips' (hw::PowerModel::work_energy).
    std::vector<std::pair<std::string, hw::Energy>> kernels;

    double total_j() const { return statics.total() + dynamic.total(); }
    double kernels_j() const;
    double average_power_w() const { return seconds > 0 ? total_j() / seconds : 0.0; }
};
/// The energy estimate of everything `board` did so far (stats synced first).
RunEnergy estimate_energy(hw::Board& board, const std::vector<driver::KernelStats>& kernels);
/// The estimate as --json prints it: {"total_j", "average_power_w", "idle_power_w",
/// "blocks": {"mxu": J, ...}, "kernels": [{"name", "energy_j"}], "outside_kernels_j"}.
nlohmann::ordered_json energy_json(const RunEnergy& e);

/// Writes the statistics tree of every core of the board as JSON (or CSV), with a `kernels` group
/// holding each kernel's totals (Device::kernel_stats()) and energy when there are any, the
/// `energy` group and, when not empty, the `result` group. Over MPI call board.sync_stats()
/// first.
void write_stats(std::ostream& os, bool csv, hw::Board& board,
                 const std::vector<driver::KernelStats>& kernels,
                 const std::vector<ResultStat>& result = {});

/// Writes --stats (JSON, or CSV for a .csv name) from every core of the board, and the
/// effective config beside it (FILE.config.json).
void write_stats_file(const CommonOptions& opts, hw::Board& board);
/// As above, with a `kernels` group holding each kernel's totals (Device::kernel_stats()) and
/// its energy, the `energy` group (the estimate per block kind), and a `result` group holding
/// `result` (what the command reports, labelled) when it is not empty. Nothing in the file
/// depends on host time, so the same command writes the same bytes.
void write_stats_file(const CommonOptions& opts, hw::Board& board,
                      const std::vector<driver::KernelStats>& kernels,
                      const std::vector<ResultStat>& result = {});

/// The kernel of `tpusim run`: a program image (TPUPROG1) or assembly text. An unreadable or
/// undecodable file is an InputError, an assembly error a SourceError ("FILE:LINE:COL: ...").
isa::Program load_kernel(const std::string& path);

/// Copies `data` into the HBM (or VMEM) of each of `cores` at `addr` before a run, as a loader
/// does (untimed); a range outside that memory is an InputError starting with `what`.
void load_memory(hw::Board& board, const std::vector<uint32_t>& cores, bool hbm, uint64_t addr,
                 std::span<const uint8_t> data, const std::string& what);
/// Throws InputError starting with `what` unless `bytes` (> 0) at `addr` lie inside the HBM (or
/// VMEM) of `core`: checked before a run, so a bad dump costs no simulation.
void check_dump(hw::Board& board, uint32_t core, bool hbm, uint64_t addr, uint64_t bytes,
                const std::string& what);

/// One simulation as the CLI runs it: the device, the optional trace, the launches, and the
/// result printed as text or --json, with --stats written at the end.
class RunSession {
public:
    /// Opens a device of `cfg` for this session.
    RunSession(const hw::BoardConfig& cfg, const CommonOptions& opts);
    /// Runs on `dev`, which outlives the session (the Python module's Board); the session traces
    /// it until finish() or its end.
    RunSession(driver::Device& dev, const CommonOptions& opts);
    ~RunSession();

    hw::Board& board() { return m_dev->board(); }
    driver::Device& device() { return *m_dev; }
    /// Runs `program` on `cores` through the driver (so it counts in the per-kernel stats);
    /// device faults and deadlocks become RunError prefixed with `source` (the kernel file).
    hw::LaunchResult launch(const std::string& source, const isa::Program& program,
                            const std::vector<uint32_t>& cores,
                            const std::vector<uint32_t>& args = {});
    /// Host seconds spent inside launches so far.
    double host_seconds() const { return m_host_seconds; }
    /// Per-core MXU utilisation of a launch: useful MACs / (MXUs x R x C x cycles).
    double mxu_utilization(const hw::LaunchResult& res) const;
    /// Prints the result of the last launch (text table, or JSON with --json), then finish().
    void report(const hw::LaunchResult& res);
    /// Writes --stats, stops tracing the device and completes --trace.
    void finish();
    /// The result JSON (what --json prints).
    std::string result_json(const hw::LaunchResult& res) const;

private:
    const CommonOptions& m_opts;
    RunTrace m_trace;  ///< declared first: the device stops tracing before the file closes
    std::unique_ptr<driver::Device> m_owned;  ///< the device, unless borrowed
    driver::Device* m_dev;
    const hw::BoardConfig& m_cfg;
    double m_host_seconds = 0;
    std::vector<hw::CoreStats> m_before;
};

}  // namespace tpu::cli
