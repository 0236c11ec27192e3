// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "isa/isa.h"

namespace tpu::driver {

/// Compiled kernels keyed by kernel, shape and precision. A changing shape shows up as new
/// misses (recompilation), as it does on a real TPU.
class ProgramCache {
public:
    /// The cached program for `key`, or `compile()`'s result (timed and counted as a miss).
    /// A compiled program without a name is named kernel_name(key), so per-kernel statistics
    /// group every shape of a kernel together.
    const isa::Program& get(const std::string& key, const std::function<isa::Program()>& compile);
    /// The kernel part of a key: up to the first space or ':' ("gemm R128 C128 ..." -> "gemm").
    static std::string kernel_name(const std::string& key);
    uint64_t hits() const { return m_hits; }
    uint64_t misses() const { return m_misses; }
    /// Host seconds spent compiling (misses only).
    double compile_seconds() const { return m_compile_seconds; }

private:
    std::map<std::string, isa::Program> m_programs;
    uint64_t m_hits = 0, m_misses = 0;
    double m_compile_seconds = 0;
};

}  // namespace tpu::driver
