// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "driver/device.h"
#include "driver/program_cache.h"

/// What every kernel of the library shares: launch arguments bound by the names the generator
/// declared, and the launch of a typed key's program.
namespace tpu::driver {

/// The launch-argument values of one core, set by the names the program declared
/// (isa::Builder::arg, listed in isa::Program::args): the generator that declares a register is
/// the one place that names it. values() checks that each one was set.
class LaunchArgs {
public:
    explicit LaunchArgs(const isa::Program& program);
    /// Sets argument `name` to a 32-bit value.
    LaunchArgs& set(std::string_view name, uint32_t value);
    /// Sets argument `name` to the HBM address of `buffer` (below 4 GiB).
    LaunchArgs& set(std::string_view name, const Buffer& buffer);
    /// Sets argument `name` to the bit pattern of `value`.
    LaunchArgs& set_f32(std::string_view name, float value);
    /// The values of s1, s2, ... Throws DeviceError(Usage) naming an argument never set.
    std::vector<uint32_t> values() const;

private:
    size_t index_of(std::string_view name) const;
    const isa::Program& m_program;
    std::vector<uint32_t> m_values;
    std::vector<bool> m_set;
};

/// Fills the launch arguments of core set index `index`.
using BindFn = std::function<void(size_t index, LaunchArgs& args)>;

/// Launches `program` on `cores`, core i with the arguments bind(i, ...) sets.
Event launch(Device& dev, const std::vector<uint32_t>& cores, const isa::Program& program,
             const BindFn& bind);

/// Compiles (or fetches from `cache`) the program of `key` and launches it on `cores`.
template <ProgramKey K>
Event launch(Device& dev, ProgramCache& cache, const K& key, const std::vector<uint32_t>& cores,
             const BindFn& bind) {
    return launch(dev, cores, cache.get(key), bind);
}

}  // namespace tpu::driver
