// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hw/host/runtime_config.h"
#include "sim/clock_domain.h"

namespace tpu::trainer {

/// What the host did for one step's graph: fed by the trainer today (its eager kernel calls
/// stand for the ops of the step), by a compiler's one program per step later.
struct HostStep {
    uint64_t ops = 0;            ///< ops recorded into the step's lazy graph
    bool compiled = false;       ///< the graph missed the compile cache (compiled before running)
    uint32_t dispatches = 1;     ///< programs handed to the device (one per graph)
    uint32_t reads = 0;          ///< host reads at the end of the step (.item()): each waits
    uint64_t device_cycles = 0;  ///< the device's simulated cycles for the step
    /// Ops run on the CPU instead of the device ("aten::nonzero"), in the order they ran.
    std::vector<std::string> cpu_fallbacks;
};

/// Where one step sits on the estimated wall clock, in core-clock cycles since the timeline's
/// origin. Phases follow each other on the host: trace, fallbacks, wait, compile, dispatch,
/// then (reads only) wait for the device and read.
struct StepWall {
    uint64_t trace_begin = 0;   ///< the host starts recording the step's graph
    uint64_t trace_end = 0;     ///< recorded (ops x trace_op_us + step_overhead_us)
    uint64_t fallback_end = 0;  ///< CPU fallbacks done (== trace_end without any)
    uint64_t lock_end = 0;      ///< the previous step's execution is over (the device lock)
    uint64_t compile_end = 0;   ///< compiled on a cache miss (== lock_end on a hit)
    uint64_t dispatch_end = 0;  ///< handed to the device
    uint64_t device_begin = 0;  ///< the device starts the step
    uint64_t device_end = 0;    ///< the device finishes it
    uint64_t host_end = 0;      ///< the host goes on to the next step
    uint64_t device_idle = 0;   ///< cycles the device waited for the host before this step
    /// This step's share of the wall clock: from the previous step's device end to this one's.
    uint64_t wall_cycles = 0;
};

/// The host side of training steps, modelled as PyTorch/XLA runs them on a TPU (the costs are
/// config().runtime fields, trainer/README.md "Host timeline"):
///
///   trace:    the host runs the step's Python and records its ops into a lazy graph:
///             step_overhead_us + ops x trace_op_us, while the device still runs the previous
///             step (asynchronous execution);
///   fallback: each op that falls back to the CPU needs its inputs: the host waits for the
///             device, dispatches the graph so far, and pays cpu_fallback_us;
///   wait:     mark_step takes the device lock, which the previous step's execution holds until
///             it completes (pytorch/xla#3434, DeviceLockWait), so steps never overlap on the
///             device;
///   compile:  on a compile-cache miss, compile_base_ms + ops x compile_op_ms;
///   dispatch: dispatch_us per program; the device starts when it is handed over;
///   read:     a host read (.item()) waits for the step's execution to finish, then costs
///             host_read_us (the host-link transfer is in the device cycles already); without
///             one the host goes straight on to trace the next step.
///
/// So a step without reads takes max(trace, previous device time) + compile + dispatch, and a
/// step with a read trace + compile + dispatch + device time + read: the host and the device
/// no longer overlap. Worked example (defaults, 40 ops, 0.2 ms of device time, no read, cache
/// hit): trace 0.1 + 40 x 0.03 = 1.3 ms > 0.2 ms, so a step takes 1.3 + 0.6 = 1.9 ms of wall
/// clock and the device is idle 1.7 ms of it (host-bound).
class HostTimeline {
public:
    HostTimeline(const hw::RuntimeConfig& cfg, sim::ClockDomain clock);

    /// Places the next step on the timeline and returns where it went.
    const StepWall& add(const HostStep& step);
    /// Every step so far, in order.
    const std::vector<StepWall>& steps() const { return m_steps; }
    /// Estimated wall-clock cycles of the steps so far (origin to the last device end).
    uint64_t wall_cycles() const { return m_device_free; }
    /// Device cycles of the steps so far (the simulated device time).
    uint64_t device_cycles() const { return m_device_busy; }
    /// Cycles the device waited for the host.
    uint64_t device_idle_cycles() const { return m_device_free - m_device_busy; }
    /// The compile time of a graph of `ops` ops on a cache miss, in cycles.
    uint64_t compile_cycles(uint64_t ops) const;
    /// Tracing a step of `ops` ops, in cycles.
    uint64_t trace_cycles(uint64_t ops) const;
    const hw::RuntimeConfig& config() const { return m_cfg; }
    sim::ClockDomain clock() const { return m_clock; }

private:
    uint64_t cycles_of_us(double us) const;

    hw::RuntimeConfig m_cfg;
    sim::ClockDomain m_clock;
    std::vector<StepWall> m_steps;
    uint64_t m_host_free = 0;    ///< when the host starts the next step
    uint64_t m_device_free = 0;  ///< when the device finished its last step
    uint64_t m_device_busy = 0;  ///< device cycles of every step
};

}  // namespace tpu::trainer
