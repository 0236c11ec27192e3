// SPDX-License-Identifier: Apache-2.0
#include "sim/interrupt.h"

#include <unistd.h>
#include <atomic>
#include <csignal>

namespace tpu::sim {
namespace {

// Lock-free, so the handler may touch it (a plain bool would not be async-signal-safe).
std::atomic<bool> g_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigint(int) {
    if (g_requested.exchange(true)) _exit(130);
}

}  // namespace

void install_interrupt_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
}

bool interrupt_requested() {
    return g_requested.load(std::memory_order_relaxed);
}

void request_interrupt() {
    g_requested.store(true);
}

void clear_interrupt() {
    g_requested.store(false);
}

}  // namespace tpu::sim
