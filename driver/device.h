// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hw/board_config.h"
#include "isa/isa.h"

namespace tpu::hw {
class Board;
}
namespace tpu::sim {
class Tracer;
}

/// The host runtime: device memory, timed transfers, program launches, events and errors.
/// No SystemC or Eigen in this header.
namespace tpu::driver {

/// What kind of failure a DeviceError reports.
enum class ErrorKind : uint8_t {
    Usage,        ///< bad argument: unknown core, buffer out of range, freed twice, ...
    OutOfMemory,  ///< an allocation that does not fit
    Fault,        ///< a kernel faulted on the device (core, pc, instruction, address)
    Deadlock,     ///< every running core waits on a flag nothing can raise (state dump)
};

/// Every driver failure. The message says what happened and where.
class DeviceError : public std::runtime_error {
public:
    DeviceError(ErrorKind kind, const std::string& what) : std::runtime_error(what), m_kind(kind) {}
    ErrorKind kind() const { return m_kind; }

private:
    ErrorKind m_kind;
};

/// A range of one core's HBM.
struct Buffer {
    uint32_t core = 0;   ///< owning core
    uint64_t addr = 0;   ///< byte address in that core's HBM
    uint64_t bytes = 0;  ///< size
};

/// A completed launch: when it ran, in board cycles.
struct Event {
    uint64_t start_cycle = 0;           ///< launch cycle
    uint64_t end_cycle = 0;             ///< last core halted
    std::vector<uint32_t> cores;        ///< launched cores, ascending
    std::vector<uint64_t> core_cycles;  ///< cycles per core, same order
    double host_seconds = 0;            ///< host time spent simulating it
};

/// Counters for the trainer's metrics report and the CLI.
struct DeviceMetrics {
    uint64_t launches = 0;         ///< program launches
    uint64_t exec_cycles = 0;      ///< board cycles spent in launches
    double exec_host_seconds = 0;  ///< host seconds spent simulating launches
    uint64_t h2d_transfers = 0;    ///< host-to-device writes
    uint64_t h2d_bytes = 0;        ///< bytes written
    uint64_t h2d_cycles = 0;       ///< board cycles spent on writes
    uint64_t d2h_transfers = 0;    ///< device-to-host reads (host syncs)
    uint64_t d2h_bytes = 0;        ///< bytes read
    uint64_t d2h_cycles = 0;       ///< board cycles spent on reads
};

/// A simulated board seen from the host. Launches run to completion before returning (the
/// host thread is the only client), and every transfer advances device time by its cost on
/// the chip's host link.
class Device {
public:
    /// Builds the board. One Device per process (SystemC elaborates one design per process).
    static std::unique_ptr<Device> open(const hw::BoardConfig& cfg);
    ~Device();

    const hw::BoardConfig& config() const;
    uint32_t num_cores() const;

    /// HBM on `core`, 256-byte aligned. Kernels address 32-bit HBM offsets, so buffers come
    /// from the first 4 GiB of each core's HBM. Throws OutOfMemory naming requested and free
    /// bytes.
    Buffer alloc(uint64_t bytes, uint32_t core);
    /// Returns a buffer to its core's free list (neighbours coalesce).
    void free(const Buffer& buffer);
    /// Free bytes and the largest free block on a core.
    uint64_t free_bytes(uint32_t core) const;
    uint64_t largest_free_block(uint32_t core) const;

    /// Host -> device copy into `buffer` at `offset`; costs set-up + bytes / bandwidth.
    void write(const Buffer& buffer, const void* data, uint64_t bytes, uint64_t offset = 0);
    /// Device -> host copy (a host sync).
    void read(const Buffer& buffer, void* data, uint64_t bytes, uint64_t offset = 0);

    /// Loads `program` on `cores` and runs it; `args(i)` are the launch arguments (s1, s2,
    /// ...) of cores[i]. Device faults and deadlocks throw DeviceError.
    Event launch(const std::vector<uint32_t>& cores, const isa::Program& program,
                 const std::function<std::vector<uint32_t>(size_t index)>& args = {});

    uint64_t now_cycle() const;
    double now_seconds() const;
    const DeviceMetrics& metrics() const { return m_metrics; }
    /// Traces launches and transfers (nullptr: off).
    void set_tracer(sim::Tracer* tracer);
    /// The board (memories, per-core stats) for tools and tests.
    hw::Board& board();

private:
    explicit Device(const hw::BoardConfig& cfg);
    void check_range(const Buffer& b, uint64_t offset, uint64_t bytes, const char* what) const;
    uint64_t link_cycles(uint64_t bytes) const;
    /// Advances device time by a host-link transfer and counts it.
    void host_transfer(uint32_t core, uint64_t bytes, bool to_device);

    std::unique_ptr<hw::BoardConfig> m_cfg;
    std::unique_ptr<hw::Board> m_board;
    std::vector<std::map<uint64_t, uint64_t>> m_free;  ///< per core: free block addr -> size
    std::vector<std::map<uint64_t, uint64_t>> m_used;  ///< per core: live buffer addr -> size
    DeviceMetrics m_metrics;
    sim::Tracer* m_tracer = nullptr;
    int m_host_track = -1;
};

}  // namespace tpu::driver
