// SPDX-License-Identifier: Apache-2.0
#include "driver/program_cache.h"

#include <chrono>

namespace tpu::driver {

std::string ProgramCache::kernel_name(const std::string& key) {
    return key.substr(0, key.find_first_of(" :"));
}

const isa::Program& ProgramCache::get(const std::string& key,
                                      const std::function<isa::Program()>& compile) {
    const auto it = m_programs.find(key);
    if (it != m_programs.end()) {
        ++m_hits;
        return it->second;
    }
    const auto t0 = std::chrono::steady_clock::now();
    isa::Program p = compile();
    if (p.name.empty()) p.name = kernel_name(key);
    m_compile_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++m_misses;
    return m_programs.emplace(key, std::move(p)).first->second;
}

}  // namespace tpu::driver
