// SPDX-License-Identifier: Apache-2.0
#pragma once

/// Ctrl-C: a flag set by the SIGINT handler and polled by the simulation, which then stops the
/// way a deadlock does (state dump, error) instead of the process dying mid-write.
namespace tpu::sim {

/// Installs the SIGINT handler. The first Ctrl-C requests a stop at the simulation's next
/// poll; a second one ends the process at once with exit code 130, for a host computation
/// that never polls, after removing the temporary output files (remove_temporary_files()).
/// SIGTERM and SIGHUP remove them too and then end the process as the signal would.
void install_interrupt_handler();
/// True once Ctrl-C was pressed (or request_interrupt() called).
bool interrupt_requested();
/// Requests a stop as Ctrl-C does (for tests and embedders).
void request_interrupt();
/// Forgets a request.
void clear_interrupt();

}  // namespace tpu::sim
