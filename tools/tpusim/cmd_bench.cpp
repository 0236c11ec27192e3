// SPDX-License-Identifier: Apache-2.0
// Placeholder until its issue lands: the command exists and says so.
#include <CLI/CLI.hpp>

#include "tools/tpusim/commands.h"

namespace tpu::cli {

void register_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "(not available yet)");
    cmd->allow_extras();
    cmd->callback([] { throw RunError("'bench' is not implemented yet"); });
}

}  // namespace tpu::cli
