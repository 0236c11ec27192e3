// SPDX-License-Identifier: Apache-2.0
// Placeholder until its issue lands: the command exists and says so.
#include <CLI/CLI.hpp>

#include "tools/tpusim/commands.h"

namespace tpu::cli {

void register_gemm_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("gemm", "(not available yet)");
    cmd->allow_extras();
    cmd->callback([] { throw RunError("'gemm' is not implemented yet"); });
}

}  // namespace tpu::cli
