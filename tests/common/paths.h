// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace tpu::test {

/// Root of the source tree: $TPU_SOURCE_DIR, else the tree the test was built from.
inline std::string source_dir() {
    const char* d = std::getenv("TPU_SOURCE_DIR");
    return d ? d : TPU_SOURCE_DIR_DEFAULT;
}
/// Root of the build tree: $TPU_BINARY_DIR, else the tree the test was built in.
inline std::string binary_dir() {
    const char* d = std::getenv("TPU_BINARY_DIR");
    return d ? d : TPU_BINARY_DIR_DEFAULT;
}
/// A file's bytes ("" if it cannot be read; tests compare against expected content).
inline std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

/// An empty directory at `path` (whatever was there is removed first).
inline std::string fresh_dir(const std::string& path) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    return path;
}
/// The names of the entries of `dir`, to check that nothing else was created or left behind.
inline std::set<std::string> listing(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        names.insert(e.path().filename().string());
    return names;
}

/// The built tpusim executable.
inline std::string tpusim_exe() {
    return binary_dir() + "/bin/tpusim";
}

}  // namespace tpu::test
