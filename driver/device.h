// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hw/board_config.h"
#include "isa/isa.h"
#include "sim/metrics.h"

namespace tpu::hw {
class Board;
struct CoreStats;
}  // namespace tpu::hw
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
    Stopped,      ///< stopped from the host: Ctrl-C or sim.max_host_seconds (state dump)
};

/// Every driver failure. The message says what happened and where.
class DeviceError : public std::runtime_error {
public:
    DeviceError(ErrorKind kind, const std::string& what) : std::runtime_error(what), m_kind(kind) {}
    ErrorKind kind() const { return m_kind; }

private:
    ErrorKind m_kind;
};

/// Kernels address HBM with 32-bit offsets: buffers come from the first 4 GiB of each core's
/// HBM, and no buffer (so no tensor) is larger.
inline constexpr uint64_t kHbmWindowBytes = uint64_t(1) << 32;

/// A range of one core's HBM.
struct Buffer {
    uint32_t core = 0;   ///< owning core
    uint64_t addr = 0;   ///< byte address in that core's HBM
    uint64_t bytes = 0;  ///< size
};

/// A completed launch: when it ran, in board cycles.
struct Event {
    uint64_t start_cycle = 0;           ///< cycle the host rang the launch's doorbell
    uint64_t end_cycle = 0;             ///< cycle its completion reached the host
    std::vector<uint32_t> cores;        ///< launched cores, ascending
    std::vector<uint64_t> core_cycles;  ///< cycles per core, same order
    double host_seconds = 0;            ///< host time spent simulating it
};

/// Names a launch queued by Device::launch_async; Device::wait takes it once.
struct LaunchHandle {
    uint64_t id = 0;  ///< 1, 2, ... in issue order; 0 names no launch
};

/// Totals over every completed launch of one kernel (programs grouped by isa::Program::name).
struct KernelStats {
    std::string name;              ///< kernel name ("unnamed" for programs without one)
    uint64_t launches = 0;         ///< completed launches
    uint64_t cycles = 0;           ///< sum of launch durations (doorbell to completion)
    uint64_t core_cycles = 0;      ///< sum over launches and their cores of each core's cycles
    uint64_t instructions = 0;     ///< instructions issued on the launched cores
    uint64_t mxu_macs = 0;         ///< useful MXU multiply-accumulates
    uint64_t mxu_peak_macs = 0;    ///< MACs the launched cores' MXUs could do in `cycles`
    uint64_t vpu_flops = 0;        ///< VPU fp32 operations
    uint64_t hbm_read_bytes = 0;   ///< bytes DMA read from HBM
    uint64_t hbm_write_bytes = 0;  ///< bytes DMA wrote to HBM
    uint64_t ici_bytes = 0;        ///< bytes sent over ICI

    /// Adds each counter of `o` (the name stays).
    KernelStats& operator+=(const KernelStats& o);
    /// Each counter minus that of `earlier`, a snapshot of the same totals (the name stays).
    KernelStats since(const KernelStats& earlier) const;
    /// 2 x MXU MACs + VPU FLOPs.
    uint64_t flops() const { return 2 * mxu_macs + vpu_flops; }
    /// HBM bytes read and written.
    uint64_t hbm_bytes() const { return hbm_read_bytes + hbm_write_bytes; }
    /// Useful MACs over the launched cores' MXU capacity during the launches (0..1).
    double mxu_utilization() const {
        return sim::mxu_utilization(double(mxu_macs), double(mxu_peak_macs));
    }
    /// FLOPs per HBM byte (0 when the kernel moved no HBM bytes).
    double arithmetic_intensity() const {
        return hbm_bytes() ? double(flops()) / double(hbm_bytes()) : 0.0;
    }
};

/// Counters for the trainer's metrics report and the CLI.
struct DeviceMetrics {
    uint64_t launches = 0;         ///< program launches
    uint64_t batches = 0;          ///< board runs (launches on disjoint cores share one)
    uint64_t exec_cycles = 0;      ///< board cycles spent in launches (overlapping ones once)
    uint64_t implicit_syncs = 0;   ///< reads/writes that first had to run queued launches
    double exec_host_seconds = 0;  ///< host seconds spent simulating launches
    uint64_t h2d_transfers = 0;    ///< host-to-device writes
    uint64_t h2d_bytes = 0;        ///< bytes written
    uint64_t h2d_cycles = 0;       ///< host-link cycles of writes (summed over chips' links)
    uint64_t d2h_transfers = 0;    ///< device-to-host reads (host syncs)
    uint64_t d2h_bytes = 0;        ///< bytes read
    uint64_t d2h_cycles = 0;       ///< host-link cycles of reads (summed over chips' links)
};

/// A simulated board seen from the host. launch() runs to completion before returning;
/// launch_async() queues and the queue runs at wait(), synchronize() or a read/write of a core
/// it uses (driver/README.md has the rules). Every transfer is timed on its chip's host link;
/// links of different chips work in parallel.
class Device {
public:
    /// Builds the board, in its own SystemC context: a process may open any number of devices,
    /// one after another or alive at once (a faulted one included), each starting at cycle 0.
    static std::unique_ptr<Device> open(const hw::BoardConfig& cfg);
    ~Device();

    const hw::BoardConfig& config() const;
    uint32_t num_cores() const;
    /// Bytes of one core's HBM that alloc() hands out: min(HBM per core, kHbmWindowBytes),
    /// whole 256-byte blocks. A tool can check a size against it before building a board.
    static uint64_t window_bytes(const hw::BoardConfig& cfg);

    /// HBM on `core`, 256-byte aligned. Kernels address 32-bit HBM offsets, so buffers come
    /// from the first 4 GiB of each core's HBM. Throws OutOfMemory naming requested and free
    /// bytes.
    Buffer alloc(uint64_t bytes, uint32_t core);
    /// HBM on `core` for programs that map their own HBM windows (`hbm.map`, isa/README.md):
    /// as alloc() while the 4 GiB window has room, else from the HBM above it (below the
    /// programs the runtime keeps at the top, `core.imem_bytes`).
    Buffer alloc_wide(uint64_t bytes, uint32_t core);
    /// Returns a buffer to its core's free list (neighbours coalesce).
    void free(const Buffer& buffer);
    /// Free bytes and the largest free block on a core.
    uint64_t free_bytes(uint32_t core) const;
    uint64_t largest_free_block(uint32_t core) const;

    /// Host -> device copy into `buffer` at `offset`, posted on the host link of the buffer's
    /// chip (set-up + bytes / bandwidth, hw/host/host_link.h): the call returns at once and a
    /// launch on that chip starts when the link has delivered it.
    void write(const Buffer& buffer, const void* data, uint64_t bytes, uint64_t offset = 0);
    /// Device -> host copy (a host sync): device time advances to the end of the transfer.
    void read(const Buffer& buffer, void* data, uint64_t bytes, uint64_t offset = 0);
    /// write() without the bytes: the transfer is timed, traced and counted exactly as a
    /// write() of `bytes`, but the buffer keeps its contents. For callers whose data nothing
    /// observes: with sim.functional=false no unit moves or computes values, so packing and
    /// copying operands only costs host time.
    void write_timing(const Buffer& buffer, uint64_t bytes, uint64_t offset = 0);
    /// FNV-1a (64-bit) of the buffer's bytes continuing from `h`, timed and counted as a read()
    /// of them: for comparing results without holding them (on a pod slice only the 8-byte
    /// digest leaves the rank that simulates the core).
    uint64_t read_digest(const Buffer& buffer, uint64_t h);
    /// read() without the bytes: the host sync, its timing and counters are those of a read()
    /// of `bytes`; nothing is copied out. The timing-only counterpart of write_timing().
    void read_timing(const Buffer& buffer, uint64_t bytes, uint64_t offset = 0);

    /// Launch arguments (s1, s2, ...) of cores[index].
    using ArgsFn = std::function<std::vector<uint32_t>(size_t index)>;

    /// Loads `program` on `cores` and runs it (launch_async + wait); `args(i)` are the launch
    /// arguments of cores[i]. Device faults and deadlocks throw DeviceError.
    Event launch(const std::vector<uint32_t>& cores, const isa::Program& program,
                 const ArgsFn& args = {});
    /// Queues a launch and returns at once; it runs at the next wait/synchronize/read/write.
    /// The program and the arguments are copied now. Bad arguments throw Usage at once.
    LaunchHandle launch_async(const std::vector<uint32_t>& cores, const isa::Program& program,
                              const ArgsFn& args = {});
    /// Runs queued launches up to and including `h` (with the launches started together with
    /// it); returns its Event; throws its fault. Each handle can be waited once.
    Event wait(LaunchHandle h);
    /// Runs every queued launch and waits for every host link to be idle; throws the first
    /// fault.
    void synchronize();
    /// Launches queued and not yet run.
    size_t queued_launches() const { return m_queue.size(); }
    /// Per-kernel totals in order of each kernel's first completed launch.
    const std::vector<KernelStats>& kernel_stats() const { return m_kernels; }
    /// The sum of kernel_stats() (named "all").
    KernelStats kernel_totals() const;

    uint64_t now_cycle() const;
    double now_seconds() const;
    const DeviceMetrics& metrics() const { return m_metrics; }
    /// Traces launches and transfers (nullptr: off).
    void set_tracer(sim::Tracer* tracer);
    /// The board (memories, per-core stats) for tools and tests.
    hw::Board& board();

private:
    /// A launch in the queue.
    struct Pending {
        uint64_t id = 0;
        std::vector<uint32_t> cores;              ///< as given (args order)
        std::vector<std::vector<uint32_t>> args;  ///< per cores[i]
        const isa::Program* program = nullptr;    ///< `owned`, or the caller's for launch()
        std::unique_ptr<isa::Program> owned;
    };
    /// How a launch ended, kept until it is waited on.
    struct Outcome {
        Event event;
        bool failed = false;
        ErrorKind kind = ErrorKind::Fault;
        std::string raw;   ///< the error as the board reported it (launch() throws this)
        std::string text;  ///< the error naming the launch (wait() throws this)
    };

    explicit Device(const hw::BoardConfig& cfg);
    LaunchHandle enqueue(const std::vector<uint32_t>& cores, const isa::Program& program,
                         const ArgsFn& args, bool copy);
    /// Runs queue batches until launch `id` has run.
    void run_until(uint64_t id);
    /// Runs the queued launches a read or write of `core` depends on.
    void sync_core(uint32_t core);
    /// Runs the first batch of the queue (consecutive launches on disjoint cores) together;
    /// on a fault records every outcome, empties the queue and throws the fault.
    void run_batch();
    /// Records a failed batch: `culprits` (indices into `batch`) failed with `raw`, the other
    /// launches of the batch and of the queue did not run. Throws the first culprit's error.
    [[noreturn]] void fail(std::vector<Pending>& batch, const std::vector<size_t>& culprits,
                           ErrorKind kind, const std::string& raw);
    /// Takes the outcome of `h` (Usage error for unknown or already waited handles).
    Outcome take(LaunchHandle h);
    void account(const Pending& p, const Event& ev, const std::vector<hw::CoreStats>& before);
    void check_range(const Buffer& b, uint64_t offset, uint64_t bytes, const char* what) const;
    /// Times a transfer on the host link of `core`'s chip and counts it; a read also advances
    /// device time to its end (the host waits for the data).
    void host_transfer(uint32_t core, uint64_t bytes, bool to_device);
    /// Advances device time until the host links of the chips of `cores` are idle.
    void wait_for_links(const std::vector<uint32_t>& cores);

    std::unique_ptr<hw::BoardConfig> m_cfg;
    std::unique_ptr<hw::Board> m_board;
    std::vector<std::map<uint64_t, uint64_t>> m_free;  ///< per core: free block addr -> size
    /// Per core: free blocks above the window (alloc_wide), addr -> size.
    std::vector<std::map<uint64_t, uint64_t>> m_free_high;
    std::vector<std::map<uint64_t, uint64_t>> m_used;  ///< per core: live buffer addr -> size
    DeviceMetrics m_metrics;
    std::deque<Pending> m_queue;
    std::map<uint64_t, Outcome> m_done;  ///< ran, not yet waited on
    uint64_t m_next_id = 1;
    bool m_stopped = false;  ///< a launch faulted or deadlocked: the board runs nothing more
    std::string m_stop_reason;
    std::vector<KernelStats> m_kernels;
    std::map<std::string, size_t> m_kernel_index;
    sim::Tracer* m_tracer = nullptr;
    std::vector<int> m_link_tracks;  ///< per chip: host/link chipN, -2 before first use
    int m_kernel_track = -1;         ///< host/kernels: one span per launch, named after its kernel
};

}  // namespace tpu::driver
