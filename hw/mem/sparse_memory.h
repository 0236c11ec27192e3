// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

namespace tpu::hw {

/// Byte-addressed memory of a fixed size whose pages are allocated on first write, so a 16 GiB
/// HBM costs only what is written. Unwritten bytes read as zero. Every access is bounds-checked
/// by the caller through in_range(); the methods assume a checked range.
class SparseMemory {
public:
    static constexpr uint64_t kPageBytes = 64 * 1024;  ///< allocation granule

    /// A memory of `size_bytes`; `name` appears in error messages.
    SparseMemory(std::string name, uint64_t size_bytes);

    uint64_t size() const { return m_size; }
    const std::string& name() const { return m_name; }
    /// True when [addr, addr + bytes) lies inside the memory (no overflow).
    bool in_range(uint64_t addr, uint64_t bytes) const {
        return addr <= m_size && bytes <= m_size - addr;
    }
    /// Copies out; requires in_range.
    void read(uint64_t addr, std::span<uint8_t> out) const;
    /// Copies in, allocating pages; requires in_range.
    void write(uint64_t addr, std::span<const uint8_t> in);
    /// Fills with a byte value; requires in_range.
    void fill(uint64_t addr, uint64_t bytes, uint8_t value);
    /// Host bytes actually allocated.
    uint64_t resident_bytes() const { return m_pages.size() * kPageBytes; }

private:
    uint8_t* page(uint64_t index, bool create);
    const uint8_t* page(uint64_t index) const;

    std::string m_name;
    uint64_t m_size;
    std::unordered_map<uint64_t, std::unique_ptr<uint8_t[]>> m_pages;
};

}  // namespace tpu::hw
