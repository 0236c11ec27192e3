// SPDX-License-Identifier: Apache-2.0
// Runs the built tpusim executable for end-to-end tests and captures what it printed.
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/paths.h"
#include "tests/common/scratch.h"

namespace tpu::test {

/// What a tpusim invocation produced.
struct CliResult {
    int code = -1;    ///< exit code (-1 if it was killed by a signal or could not start)
    std::string out;  ///< everything written to stdout
    std::string err;  ///< everything written to stderr
};

/// A path in the temporary directory private to this test process, removed at exit.
inline std::string tmp(const std::string& name) {
    return scratch(name);
}

/// TEXT as one single-quoted shell word, for paths and values with spaces or metacharacters.
inline std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

/// Runs the shell command CMD and captures its exit code, stdout and stderr.
inline CliResult run_command(const std::string& cmd) {
    // stdout comes through the pipe; stderr goes to a file so the two streams stay separate.
    static int calls = 0;
    const std::string err_file = tmp("stderr-" + std::to_string(++calls) + ".txt");
    CliResult r;
    FILE* p = popen((cmd + " 2>" + shell_quote(err_file)).c_str(), "r");
    if (p == nullptr) {
        r.err = "popen failed: " + cmd;
        return r;
    }
    std::array<char, 4096> buf{};
    size_t n = 0;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(p);
    r.code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = slurp(err_file);
    std::error_code ec;
    std::filesystem::remove(err_file, ec);
    return r;
}

/// Runs `tpusim ARGS`; ARGS is shell text, so quote paths with shell_quote() when needed.
inline CliResult tpusim(const std::string& args) {
    return run_command(shell_quote(tpusim_exe()) + " " + args);
}

/// Runs `tpusim ARGS --json`, expects exit 0 and returns the parsed output (an empty object,
/// after a test failure naming the command, otherwise).
inline nlohmann::json tpusim_json(const std::string& args) {
    const CliResult r = tpusim(args + " --json");
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

}  // namespace tpu::test
