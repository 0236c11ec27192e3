// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/kernel.h"

#include <bit>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tpu::driver {

LaunchArgs::LaunchArgs(const isa::Program& program)
    : m_program(program), m_values(program.args.size(), 0), m_set(program.args.size(), false) {}

size_t LaunchArgs::index_of(std::string_view name) const {
    for (size_t i = 0; i < m_program.args.size(); ++i)
        if (m_program.args[i] == name) return i;
    throw DeviceError(ErrorKind::Usage,
                      fmt::format("{}: '{}' is not a launch argument of the kernel (it has: {})",
                                  m_program.name, name, fmt::join(m_program.args, ", ")));
}

LaunchArgs& LaunchArgs::set(std::string_view name, uint32_t value) {
    const size_t i = index_of(name);
    if (m_set[i])
        throw DeviceError(ErrorKind::Usage, fmt::format("{}: launch argument '{}' is set twice",
                                                        m_program.name, name));
    m_values[i] = value;
    m_set[i] = true;
    return *this;
}

LaunchArgs& LaunchArgs::set(std::string_view name, const Buffer& buffer) {
    if (buffer.addr > UINT32_MAX)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: {} is at HBM address {:#x}, past the 4 GiB a kernel "
                                      "addresses",
                                      m_program.name, name, buffer.addr));
    return set(name, static_cast<uint32_t>(buffer.addr));
}

LaunchArgs& LaunchArgs::set_f32(std::string_view name, float value) {
    return set(name, std::bit_cast<uint32_t>(value));
}

std::vector<uint32_t> LaunchArgs::values() const {
    for (size_t i = 0; i < m_set.size(); ++i)
        if (!m_set[i])
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: launch argument '{}' (s{}) is not set",
                                          m_program.name, m_program.args[i], i + 1));
    return m_values;
}

Event launch(Device& dev, const std::vector<uint32_t>& cores, const isa::Program& program,
             const BindFn& bind) {
    return dev.launch(cores, program, [&](size_t i) {
        LaunchArgs args(program);
        bind(i, args);
        return args.values();
    });
}

}  // namespace tpu::driver
