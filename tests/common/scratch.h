// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace tpu::test {

/// `name` inside a directory private to this test process (ctest runs tests in parallel, all
/// sharing TempDir()). The directory is made on first use and removed, with everything the
/// test left in it, when the process exits; a forked child (death tests, bench cases) that
/// exits leaves it alone.
inline std::string scratch(const std::string& name) {
    struct Dir {
        pid_t owner = ::getpid();
        std::filesystem::path path = std::filesystem::path(::testing::TempDir()) /
                                     ("tpusim-test-" + std::to_string(::getpid()));
        Dir() { std::filesystem::create_directories(path); }
        ~Dir() {
            std::error_code ec;  // best effort: a failure to clean up fails no test
            if (::getpid() == owner) std::filesystem::remove_all(path, ec);
        }
    };
    static const Dir dir;
    return (dir.path / name).string();
}

}  // namespace tpu::test
