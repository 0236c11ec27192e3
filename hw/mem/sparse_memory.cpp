// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/sparse_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace tpu::hw {

SparseMemory::SparseMemory(std::string name, uint64_t size_bytes, Backing backing)
    : m_name(std::move(name)), m_size(size_bytes), m_holds(backing != Backing::None) {
    if (m_size == 0 || backing != Backing::Reserve) return;
    // MAP_NORESERVE: the OS commits (and zeroes) a page only when it is first written; reading
    // an untouched page maps the shared zero page.
    void* p = ::mmap(nullptr, m_size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) m_base = static_cast<uint8_t*>(p);
}

SparseMemory::~SparseMemory() {
    if (m_base) ::munmap(m_base, m_size);
}

// A new page is left uninitialised where the caller is about to write
// [keep_off, keep_off + keep_bytes) and zeroed elsewhere.
uint8_t* SparseMemory::page(uint64_t index, uint64_t keep_off, uint64_t keep_bytes) {
    auto it = m_pages.find(index);
    if (it != m_pages.end()) return it->second.get();
    std::unique_ptr<uint8_t[]> p(new uint8_t[kPageBytes]);
    std::memset(p.get(), 0, keep_off);
    std::memset(p.get() + keep_off + keep_bytes, 0, kPageBytes - keep_off - keep_bytes);
    uint8_t* raw = p.get();
    m_pages.emplace(index, std::move(p));
    return raw;
}

const uint8_t* SparseMemory::page(uint64_t index) const {
    auto it = m_pages.find(index);
    return it == m_pages.end() ? nullptr : it->second.get();
}

void SparseMemory::check(uint64_t addr, uint64_t bytes, const char* what) const {
    if (!in_range(addr, bytes))
        throw std::out_of_range(fmt::format("{}: {} of {} bytes at 0x{:x} is outside its {} bytes",
                                            m_name, what, bytes, addr, m_size));
}

void SparseMemory::read(uint64_t addr, std::span<uint8_t> out) const {
    check(addr, out.size(), "read");
    if (!m_holds) {
        if (!out.empty()) std::memset(out.data(), 0, out.size());
        return;
    }
    if (m_base) {
        if (!out.empty()) std::memmove(out.data(), m_base + addr, out.size());
        return;
    }
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
    check(addr, in.size(), "write");
    if (!m_holds) return;
    if (m_base) {
        if (!in.empty()) std::memmove(m_base + addr, in.data(), in.size());
        return;
    }
    uint64_t done = 0;
    while (done < in.size()) {
        const uint64_t a = addr + done;
        const uint64_t off = a % kPageBytes;
        const uint64_t n = std::min<uint64_t>(kPageBytes - off, in.size() - done);
        std::memcpy(page(a / kPageBytes, off, n) + off, in.data() + done, n);
        done += n;
    }
}

void SparseMemory::fill(uint64_t addr, uint64_t bytes, uint8_t value) {
    check(addr, bytes, "fill");
    if (!m_holds) return;
    if (m_base) {
        std::memset(m_base + addr, value, bytes);
        return;
    }
    uint64_t done = 0;
    while (done < bytes) {
        const uint64_t a = addr + done;
        const uint64_t off = a % kPageBytes;
        const uint64_t n = std::min<uint64_t>(kPageBytes - off, bytes - done);
        if (value != 0) {
            std::memset(page(a / kPageBytes, off, n) + off, value, n);
        } else if (auto it = m_pages.find(a / kPageBytes); it != m_pages.end()) {
            std::memset(it->second.get() + off, 0, n);  // absent pages already read as zero
        }
        done += n;
    }
}

}  // namespace tpu::hw
