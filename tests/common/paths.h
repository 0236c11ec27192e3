// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdlib>
#include <string>

namespace tpu::test {

/// Root of the source tree (set by CTest; falls back to the working directory).
inline std::string source_dir() {
    const char* d = std::getenv("TPU_SOURCE_DIR");
    return d ? d : ".";
}
/// Root of the build tree (set by CTest).
inline std::string binary_dir() {
    const char* d = std::getenv("TPU_BINARY_DIR");
    return d ? d : "build";
}
/// The built tpusim executable.
inline std::string tpusim_exe() { return binary_dir() + "/bin/tpusim"; }

}  // namespace tpu::test
