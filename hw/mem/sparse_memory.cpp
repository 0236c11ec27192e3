// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/sparse_memory.h"

#include <algorithm>
#include <cstring>

namespace tpu::hw {

SparseMemory::SparseMemory(std::string name, uint64_t size_bytes)
    : m_name(std::move(name)), m_size(size_bytes) {}

uint8_t* SparseMemory::page(uint64_t index, bool create) {
    auto it = m_pages.find(index);
    if (it != m_pages.end()) return it->second.get();
    if (!create) return nullptr;
    auto p = std::make_unique<uint8_t[]>(kPageBytes);  // value-initialised: zero
    uint8_t* raw = p.get();
    m_pages.emplace(index, std::move(p));
    return raw;
}

const uint8_t* SparseMemory::page(uint64_t index) const {
    auto it = m_pages.find(index);
    return it == m_pages.end() ? nullptr : it->second.get();
}

void SparseMemory::read(uint64_t addr, std::span<uint8_t> out) const {
    uint64_t done = 0;
    while (done < out.size()) {
        const uint64_t a = addr + done;
        const uint64_t off = a % kPageBytes;
        const uint64_t n = std::min<uint64_t>(kPageBytes - off, out.size() - done);
        const uint8_t* p = page(a / kPageBytes);
        if (p)
            std::memcpy(out.data() + done, p + off, n);
        else
            std::memset(out.data() + done, 0, n);
        done += n;
    }
}

void SparseMemory::write(uint64_t addr, std::span<const uint8_t> in) {
    uint64_t done = 0;
    while (done < in.size()) {
        const uint64_t a = addr + done;
        const uint64_t off = a % kPageBytes;
        const uint64_t n = std::min<uint64_t>(kPageBytes - off, in.size() - done);
        std::memcpy(page(a / kPageBytes, true) + off, in.data() + done, n);
        done += n;
    }
}

void SparseMemory::fill(uint64_t addr, uint64_t bytes, uint8_t value) {
    uint64_t done = 0;
    while (done < bytes) {
        const uint64_t a = addr + done;
        const uint64_t off = a % kPageBytes;
        const uint64_t n = std::min<uint64_t>(kPageBytes - off, bytes - done);
        uint8_t* p = page(a / kPageBytes, value != 0);
        if (p) std::memset(p + off, value, n);
        done += n;
    }
}

}  // namespace tpu::hw
