// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/paths.h"

namespace tpu::test {

/// What a tpusim invocation produced.
struct CliResult {
    int code;         ///< exit code (-1 if killed by a signal)
    std::string out;  ///< stdout
    std::string err;  ///< stderr
};

/// A path in the temporary directory private to this test process (ctest runs tests in
/// parallel, all sharing TempDir()).
inline std::string tmp(const std::string& name) {
    return ::testing::TempDir() + "/tpusim-" + std::to_string(getpid()) + "-" + name;
}

/// Runs `tpusim ARGS` through the shell and captures both streams.
inline CliResult tpusim(const std::string& args) {
    const std::string err_file = tmp("stderr.txt");
    const std::string cmd = tpusim_exe() + " " + args + " 2>" + err_file;
    CliResult r{};
    FILE* p = popen(cmd.c_str(), "r");
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(err_file);
    std::stringstream ss;
    ss << in.rdbuf();
    r.err = ss.str();
    return r;
}

}  // namespace tpu::test
