// SPDX-License-Identifier: Apache-2.0
#include "trainer/host_timeline.h"

#include <algorithm>
#include <cmath>

namespace tpu::trainer {

HostTimeline::HostTimeline(const hw::RuntimeConfig& cfg, sim::ClockDomain clock)
    : m_cfg(cfg), m_clock(clock) {}

uint64_t HostTimeline::cycles_of_us(double us) const {
    // Each phase is rounded once, to the nearest cycle of the core clock the trace uses.
    return static_cast<uint64_t>(std::llround(std::max(0.0, us) * m_clock.mhz()));
}

uint64_t HostTimeline::trace_cycles(uint64_t ops) const {
    return cycles_of_us(m_cfg.step_overhead_us + double(ops) * m_cfg.trace_op_us);
}

uint64_t HostTimeline::compile_cycles(uint64_t ops) const {
    return cycles_of_us(1000.0 * (m_cfg.compile_base_ms + double(ops) * m_cfg.compile_op_ms));
}

const StepWall& HostTimeline::add(const HostStep& step) {
    StepWall w;
    const uint64_t previous_end = m_device_free;
    // (1) The host records the graph while the device may still run the previous step.
    w.trace_begin = m_host_free;
    w.trace_end = w.trace_begin + trace_cycles(step.ops);
    // (2) A CPU fallback needs its inputs on the host: the graph so far runs first.
    uint64_t t = w.trace_end;
    for (size_t i = 0; i < step.cpu_fallbacks.size(); ++i)
        t = std::max(t, m_device_free) + cycles_of_us(m_cfg.dispatch_us + m_cfg.cpu_fallback_us);
    w.fallback_end = t;
    // (3) mark_step waits for the device lock the previous execution holds.
    w.lock_end = std::max(t, m_device_free);
    // (4) Compile on a miss, then hand the program(s) to the device.
    w.compile_end = w.lock_end + (step.compiled ? compile_cycles(step.ops) : 0);
    w.dispatch_end = w.compile_end + step.dispatches * cycles_of_us(m_cfg.dispatch_us);
    w.device_begin = std::max(w.dispatch_end, m_device_free);
    w.device_end = w.device_begin + step.device_cycles;
    w.device_idle = w.device_begin - previous_end;
    w.wall_cycles = w.device_end - previous_end;
    // (5) A read waits for the step's results; otherwise the host runs ahead to the next step.
    w.host_end =
        step.reads ? w.device_end + step.reads * cycles_of_us(m_cfg.host_read_us) : w.dispatch_end;
    m_host_free = w.host_end;
    m_device_free = w.device_end;
    m_device_busy += step.device_cycles;
    m_steps.push_back(w);
    return m_steps.back();
}

}  // namespace tpu::trainer
