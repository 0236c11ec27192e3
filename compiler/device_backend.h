// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compiler/codegen.h"
#include "compiler/lazy.h"
#include "driver/device.h"

/// The device backend (compiler/README.md, "Running on the device"): compiled steps run as
/// generated programs on a driver::Device, one launch per step over the replica core set.
namespace tpu::compiler {

/// What the device backend did, for reports and tests.
struct DeviceBackendStats {
    uint64_t executions = 0;    ///< steps run
    uint64_t launches = 0;      ///< device programs launched (one per step without custom calls)
    uint64_t host_fusions = 0;  ///< custom fusions and host fallbacks run on the host
    uint64_t fallback_fusions = 0;  ///< of those, fusions not generated yet (host_fallback)
    std::map<std::string, uint64_t> fallbacks;  ///< each fallback's reason, times it ran
    uint64_t programs_generated = 0;  ///< steps whose code was generated (a new compiled step)
    double codegen_seconds = 0;       ///< host time spent generating code
    uint64_t device_bytes = 0;        ///< HBM the backend holds now, per core
    uint64_t peak_device_bytes = 0;   ///< the most it held at once, per core
    driver::Event last_launch{};      ///< the last launch (its cycles are the step's device time)
    uint64_t last_step_cycles = 0;    ///< the last step: first launch's start to last launch's end
    /// With time_fusions(true), per fusion of the last step: a device fusion's cycles inside
    /// its program (from the issue of its first instruction, its boundary set-up included, to
    /// the next fusion's; the first from the launch's start, the last to its end), a host
    /// fusion's the device cycles between the launches around it (shared equally by
    /// consecutive host fusions; from the step's start or to its end when no launch precedes
    /// or follows). They sum to last_step_cycles plus the host fusions outside the launches.
    std::vector<uint64_t> last_fusion_cycles;
    /// The same fusions' [begin, end) device cycles (last_fusion_cycles[i] = end - begin), for
    /// a trace's fusion track.
    std::vector<std::pair<uint64_t, uint64_t>> last_fusion_spans;
    /// host-link cycles of the writes that put tensors on the device (parameters, inputs and
    /// constants, written when the first step that reads them runs, or relayouted)
    uint64_t h2d_cycles = 0;
};

/// The evaluator options that give the bits a DeviceBackend on `cores` of board `cfg` gives:
/// its MXU's K per pass, the VPU's lanes and sublanes, and its all-reduce's order of additions
/// (driver::allreduce_reference(cfg, cores, ...): the torus where the code takes the torus).
EvalOptions device_eval_options(const hw::BoardConfig& cfg, const std::vector<uint32_t>& cores,
                                EvalOptions o = {});

/// Runs compiled steps on `cores` of `device` (replica r on cores[r]). Parameters are written
/// to HBM once, in the layout the compiler gave them, and stay there across steps (an update
/// writes over them in place); inputs and constants are written per step over the host link
/// (timed), the temp arena and outputs are allocated per step, and the step's program runs as
/// one launch over the replica set: every core runs the same program, its launch arguments
/// are its replica's buffer addresses. A host read is a timed transfer. Custom fusions run on
/// the host between launches, their operands and results crossing the host link (timed).
/// Data handed out by the backend must not outlive `device`.
class DeviceBackend : public Backend {
public:
    DeviceBackend(driver::Device& device, std::vector<uint32_t> cores, CodegenOptions codegen,
                  EvalOptions host = {});
    size_t replicas() const override { return m_cores.size(); }
    bool keeps_values() const override;
    DataPtr upload(const Shape& s, const std::vector<std::vector<float>>& values) override;
    std::vector<float> download(const DataPtr& d, size_t r) override;
    std::vector<DataPtr> execute(const CompiledStep& step, const std::vector<DataPtr>& parameters,
                                 const std::vector<DataPtr>& inputs) override;

    const DeviceBackendStats& stats() const { return *m_stats; }
    /// Times each fusion of every step (DeviceBackendStats::last_fusion_cycles) from the first
    /// core's instruction record (hw::CoreModel::record): off by default, it keeps a record per
    /// executed instruction of that core while a step runs.
    void time_fusions(bool on) { m_time_fusions = on; }
    /// The generated code of `step` (generated on first use; cached by the step's graph hash):
    /// the wide programs when its plan exceeds the 4 GiB window (CodegenOptions).
    const StepProgram& program(const CompiledStep& step);

    struct Allocation;

private:
    /// Throws CompileError when the step's memory plan does not fit one core's HBM window.
    void check_window(const CompiledStep& step) const;
    /// Whether the step's programs address HBM beyond the 4 GiB window
    /// (CodegenOptions::wide_addresses): its plan does not fit the window.
    bool wide(const CompiledStep& step) const;

    driver::Device& m_dev;
    std::vector<uint32_t> m_cores;
    CodegenOptions m_codegen;
    EvalOptions m_host;
    /// The generated code by (graph hash, CodegenOptions::wide_addresses).
    const StepProgram& program(const CompiledStep& step, bool wide_addresses);
    std::map<std::pair<uint64_t, bool>, std::shared_ptr<const StepProgram>> m_programs;
    /// A program segment's derived arena (ProgramSegment::derived) and, per buffer, the
    /// parameter memory and rewrite count it was last computed from.
    struct DerivedArena {
        struct Made {
            std::weak_ptr<Allocation> source;
            uint64_t rewrites = 0;
        };
        std::shared_ptr<Allocation> mem;
        std::vector<Made> made;
    };
    std::map<std::pair<uint64_t, size_t>, DerivedArena> m_derived;  // by (source hash, segment)
    std::shared_ptr<DeviceBackendStats> m_stats;  // allocations count their bytes here
    bool m_time_fusions = false;
};

}  // namespace tpu::compiler
