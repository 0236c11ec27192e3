// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <csignal>

#include "sim/interrupt.h"

namespace tpu::python {

/// While alive, Ctrl-C stops the simulation as in the CLI (a state dump, then the error, which
/// the module raises as KeyboardInterrupt) instead of waiting for Python's handler, which runs
/// only once the call returns. Python's own handler is back afterwards.
class InterruptScope {
public:
    InterruptScope() {
        sigaction(SIGINT, nullptr, &m_saved);
        sim::install_interrupt_handler();
    }
    ~InterruptScope() { sigaction(SIGINT, &m_saved, nullptr); }
    InterruptScope(const InterruptScope&) = delete;
    InterruptScope& operator=(const InterruptScope&) = delete;

private:
    struct sigaction m_saved {};
};

}  // namespace tpu::python
