// SPDX-License-Identifier: Apache-2.0
#include "driver/program_cache.h"

#include <chrono>

namespace tpu::driver {

isa::Program ProgramCache::compile(const std::string& name,
                                   const std::function<isa::Program()>& generate) {
    const auto t0 = std::chrono::steady_clock::now();
    isa::Program p = generate();
    if (p.name.empty()) p.name = name;
    m_compile_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++m_misses;
    return p;
}

std::string ProgramCache::kernel_name(const std::string& key) {
    return key.substr(0, key.find_first_of(" :"));
}

const isa::Program& ProgramCache::get(const std::string& key,
                                      const std::function<isa::Program()>& compile) {
    const auto it = m_legacy.find(key);
    if (it != m_legacy.end()) {
        ++m_hits;
        return it->second;
    }
    return m_legacy.emplace(key, this->compile(kernel_name(key), compile)).first->second;
}

}  // namespace tpu::driver
