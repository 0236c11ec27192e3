// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <systemc>

#include "sim/cluster.h"
#include "sim/interrupt.h"
#include "tools/tpusim/commands.h"

namespace {
// SystemC prints its banner when the kernel starts, before sc_main; a static initialiser runs
// earlier still. An explicit user setting wins (overwrite = 0).
const int kQuietBanner = setenv("SYSTEMC_DISABLE_COPYRIGHT_MESSAGE", "1", 0);
}  // namespace

namespace {
/// Ends the process with `rc` after `message` (if any) went to stderr. Over MPI a failing rank
/// takes the others down with it (they may be waiting for it in a collective), and only rank 0
/// prints results, so the others' stdout goes nowhere.
/// `message` is printed after "tpusim: " (Cluster::abort's "tpusim: rank R of N: " over MPI),
/// or as it is with `bare` (a source error names its file and line first).
int finish(int rc, const std::string& message = {}, bool bare = false) {
    using tpu::sim::Cluster;
    if (Cluster::distributed() && rc != 0) Cluster::abort(message, rc);
    if (!message.empty()) fmt::print(stderr, "{}{}\n", bare ? "" : "tpusim: ", message);
    Cluster::finalize();
    return rc;
}

int run(int argc, char* argv[]);
}  // namespace

int sc_main(int argc, char* argv[]) {
    tpu::sim::Cluster::init(&argc, &argv);
    if (tpu::sim::Cluster::rank() != 0 && !std::freopen("/dev/null", "w", stdout))
        return finish(1, "error: cannot send rank output to /dev/null");
    return run(argc, argv);
}

namespace {
int run(int argc, char* argv[]) {
    tpu::sim::install_interrupt_handler();
    CLI::App app{"tpusim: a cycle-level simulator of an 8-core TPU board"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "tpusim 0.1.0");
    // Subcommands inherit this: every option's --help line shows its default.
    app.option_defaults()->always_capture_default();
    tpu::cli::register_asm_commands(app);
    tpu::cli::register_config_command(app);
    tpu::cli::register_run_command(app);
    tpu::cli::register_gemm_command(app);
    tpu::cli::register_train_command(app);
    tpu::cli::register_report_command(app);
    tpu::cli::register_bench_command(app);
    tpu::cli::register_validate_command(app);
    tpu::cli::register_op_command(app);
    tpu::cli::register_model_command(app);
    if (argc > 1 && argv[1][0] != '-') {
        // CLI11 would only say "A subcommand is required"; name the typo and the choices.
        std::string names;
        bool known = false;
        for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
            names += (names.empty() ? "" : ", ") + sub->get_name();
            known |= sub->get_name() == argv[1];
        }
        if (!known)
            return finish(
                2, fmt::format("error: unknown command '{}' (commands: {})", argv[1], names));
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return finish(rc == 0 ? 0 : 2);
    } catch (const tpu::cli::SourceError& e) {
        return finish(2, e.what(), true);
    } catch (const tpu::cli::InputError& e) {
        return finish(2, fmt::format("error: {}", e.what()));
    } catch (const std::bad_alloc&) {
        // Sizes are checked against the board before anything is allocated; what is left is a
        // host too small for what the board holds.
        return finish(1, "error: the host ran out of memory for the sizes asked for");
    } catch (const std::length_error&) {
        return finish(1, "error: the host ran out of memory for the sizes asked for");
    } catch (const std::exception& e) {
        // Ctrl-C stops the simulation with an error carrying the state dump; 130 is the exit
        // code of a process ended by SIGINT, what scripts and shells expect.
        if (tpu::sim::interrupt_requested()) return finish(130, e.what());
        if (dynamic_cast<const tpu::cli::RunError*>(&e)) return finish(1, e.what());
        return finish(1, fmt::format("error: {}", e.what()));
    }
    // Interrupted after the last launch (e.g. while writing results): say so all the same.
    if (tpu::sim::interrupt_requested()) return finish(130, "interrupted (Ctrl-C)");
    return finish(0);
}
}  // namespace
