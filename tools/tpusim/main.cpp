// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <systemc>

#include "sim/interrupt.h"
#include "tools/tpusim/commands.h"

namespace {
// SystemC prints its banner when the kernel starts, before sc_main; a static initialiser runs
// earlier still. An explicit user setting wins (overwrite = 0).
const int kQuietBanner = setenv("SYSTEMC_DISABLE_COPYRIGHT_MESSAGE", "1", 0);
}  // namespace

int sc_main(int argc, char* argv[]) {
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
        if (!known) {
            fmt::print(stderr, "tpusim: error: unknown command '{}' (commands: {})\n", argv[1],
                       names);
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    } catch (const tpu::cli::SourceError& e) {
        fmt::print(stderr, "{}\n", e.what());
        return 2;
    } catch (const tpu::cli::InputError& e) {
        fmt::print(stderr, "tpusim: error: {}\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        // Ctrl-C stops the simulation with an error carrying the state dump; 130 is the exit
        // code of a process ended by SIGINT, what scripts and shells expect.
        if (tpu::sim::interrupt_requested()) {
            fmt::print(stderr, "tpusim: {}\n", e.what());
            return 130;
        }
        if (dynamic_cast<const tpu::cli::RunError*>(&e)) {
            fmt::print(stderr, "tpusim: {}\n", e.what());
            return 1;
        }
        fmt::print(stderr, "tpusim: error: {}\n", e.what());
        return 1;
    }
    if (tpu::sim::interrupt_requested()) {
        // Interrupted after the last launch (e.g. while writing results): say so all the same.
        fmt::print(stderr, "tpusim: interrupted (Ctrl-C)\n");
        return 130;
    }
    return 0;
}
