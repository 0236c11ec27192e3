// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

namespace tpu::hw {

/// Byte-addressed memory of a fixed size that costs host memory only where it is written, so a
/// 16 GiB HBM costs only what is used. Unwritten bytes read as zero. Callers bounds-check every
/// access through in_range() (a device fault names the instruction); read, write and fill check
/// again and throw std::out_of_range naming the memory, so a missed check is an error, never a
/// write outside the reservation. data() cannot check the length the caller goes on to use.
///
/// The memory is one reservation of address space (mmap, MAP_NORESERVE) whose pages the OS
/// zeroes on first touch, so nothing is zero-filled ahead of a write and units can work on
/// spans in place (data()). Where the OS refuses the reservation (strict overcommit) it falls
/// back to 64 KiB pages allocated on first write, zeroing only the bytes that write leaves.
///
/// A memory whose values nothing observes (a timing-only board, sim.functional = false, or a
/// core another MPI rank simulates) holds no bytes at all: Backing::None keeps the bounds
/// checks, drops writes and reads zeros, so host memory does not grow with the data.
class SparseMemory {
public:
    static constexpr uint64_t kPageBytes = 64 * 1024;  ///< allocation granule of the fallback

    /// How the bytes are held: one reservation when the OS grants it, pages, or none at all.
    enum class Backing { Reserve, Pages, None };

    /// A memory of `size_bytes`; `name` appears in error messages. `Pages` forces the fallback
    /// (tests cover both); `None` holds no values (writes are dropped, reads are zeros).
    SparseMemory(std::string name, uint64_t size_bytes, Backing backing = Backing::Reserve);
    ~SparseMemory();
    SparseMemory(const SparseMemory&) = delete;
    SparseMemory& operator=(const SparseMemory&) = delete;

    uint64_t size() const { return m_size; }
    const std::string& name() const { return m_name; }
    /// True when [addr, addr + bytes) lies inside the memory (no overflow).
    bool in_range(uint64_t addr, uint64_t bytes) const {
        return addr <= m_size && bytes <= m_size - addr;
    }
    /// True when data() gives direct access (the reservation succeeded).
    bool contiguous() const { return m_base != nullptr; }
    /// False for Backing::None: the memory keeps no values.
    bool holds_values() const { return m_holds; }
    /// The bytes from `addr` on, in place; requires contiguous() and in_range.
    uint8_t* data(uint64_t addr) { return m_base + addr; }
    const uint8_t* data(uint64_t addr) const { return m_base + addr; }
    /// Copies out; outside the memory is std::out_of_range.
    void read(uint64_t addr, std::span<uint8_t> out) const;
    /// Copies in; outside the memory is std::out_of_range. `in` may overlap this memory's own
    /// bytes.
    void write(uint64_t addr, std::span<const uint8_t> in);
    /// Fills with a byte value; outside the memory is std::out_of_range.
    void fill(uint64_t addr, uint64_t bytes, uint8_t value);

private:
    /// Throws std::out_of_range unless in_range(addr, bytes); `what` names the access.
    void check(uint64_t addr, uint64_t bytes, const char* what) const;
    uint8_t* page(uint64_t index, uint64_t keep_off, uint64_t keep_bytes);
    const uint8_t* page(uint64_t index) const;

    std::string m_name;
    uint64_t m_size;
    uint8_t* m_base = nullptr;  ///< the reservation, or null in the paged fallback
    bool m_holds = true;        ///< false for Backing::None
    std::unordered_map<uint64_t, std::unique_ptr<uint8_t[]>> m_pages;
};

}  // namespace tpu::hw
