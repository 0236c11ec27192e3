// SPDX-License-Identifier: Apache-2.0
#include "sim/interrupt.h"
#include "sim/file_io.h"

#include <unistd.h>
#include <atomic>
#include <csignal>

namespace tpu::sim {
namespace {

// Lock-free, so the handler may touch it (a plain bool would not be async-signal-safe).
std::atomic<bool> g_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigint(int) {
    if (g_requested.exchange(true)) {
        // The second Ctrl-C ends the process without destructors: remove what they would.
        remove_temporary_files();
        _exit(130);
    }
}

/// SIGTERM (kill, mpirun taking down the ranks of an aborted job) and SIGHUP (the terminal
/// closed): remove the temporary output files, then die of the signal as before, so the parent
/// sees the usual status.
extern "C" void on_termination(int sig) {
    remove_temporary_files();
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
}

}  // namespace

void install_interrupt_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    struct sigaction term {};
    term.sa_handler = on_termination;
    sigemptyset(&term.sa_mask);
    for (const int sig : {SIGTERM, SIGHUP}) {
        // A signal the parent chose to ignore (nohup's SIGHUP) stays ignored.
        struct sigaction old {};
        sigaction(sig, nullptr, &old);
        if (old.sa_handler != SIG_IGN) sigaction(sig, &term, nullptr);
    }
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
