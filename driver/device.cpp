// SPDX-License-Identifier: Apache-2.0
#include "driver/device.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "hw/board.h"
#include "sim/log.h"
#include "sim/tracer.h"

namespace tpu::driver {
namespace {

constexpr uint64_t kAlign = 256;
constexpr uint64_t kWindow = 1ull << 32;  // 32-bit HBM offsets in kernels

std::string human(uint64_t bytes) {
    if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", double(bytes) / double(1ull << 30));
    if (bytes >= (1ull << 20)) return fmt::format("{:.2f} MiB", double(bytes) / double(1ull << 20));
    if (bytes >= (1ull << 10)) return fmt::format("{:.2f} KiB", double(bytes) / double(1ull << 10));
    return fmt::format("{} B", bytes);
}

}  // namespace

std::unique_ptr<Device> Device::open(const hw::BoardConfig& cfg) {
    return std::unique_ptr<Device>(new Device(cfg));
}

Device::Device(const hw::BoardConfig& cfg)
    : m_cfg(std::make_unique<hw::BoardConfig>(cfg)), m_board(std::make_unique<hw::Board>(*m_cfg)) {
    const uint64_t capacity = std::min(m_cfg->hbm.bytes_per_core, kWindow) / kAlign * kAlign;
    m_free.resize(num_cores());
    m_used.resize(num_cores());
    for (auto& f : m_free) f.emplace(0, capacity);
}

Device::~Device() = default;

const hw::BoardConfig& Device::config() const {
    return *m_cfg;
}
uint32_t Device::num_cores() const {
    return m_cfg->cores();
}
hw::Board& Device::board() {
    return *m_board;
}
uint64_t Device::now_cycle() const {
    return m_board->now_cycle();
}
double Device::now_seconds() const {
    return m_board->now_seconds();
}

void Device::set_tracer(sim::Tracer* tracer) {
    m_tracer = tracer && tracer->enabled() ? tracer : nullptr;
    m_host_track = m_tracer ? m_tracer->track("host", "runtime") : -1;
    m_board->set_tracer(m_tracer);
}

static void check_core(uint32_t core, uint32_t n, const char* what) {
    if (core >= n)
        throw DeviceError(ErrorKind::Usage, fmt::format("{}: core {} does not exist (the board "
                                                        "has cores 0-{})",
                                                        what, core, n - 1));
}

Buffer Device::alloc(uint64_t bytes, uint32_t core) {
    check_core(core, num_cores(), "alloc");
    if (bytes == 0) throw DeviceError(ErrorKind::Usage, "alloc: 0 bytes requested");
    const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    auto& free = m_free[core];
    // First fit: addresses stay low and deterministic run to run.
    for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->second < need) continue;
        const uint64_t addr = it->first, size = it->second;
        free.erase(it);
        if (size > need) free.emplace(addr + need, size - need);
        m_used[core].emplace(addr, need);
        TPU_LOG(Debug, "driver", "alloc {} bytes at 0x{:x} on core {}", bytes, addr, core);
        return Buffer{core, addr, bytes};
    }
    throw DeviceError(ErrorKind::OutOfMemory,
                      fmt::format("out of HBM on core {}: requested {} ({} bytes), {} free ({} "
                                  "bytes), largest free block {} bytes",
                                  core, human(bytes), bytes, human(free_bytes(core)),
                                  free_bytes(core), largest_free_block(core)));
}

void Device::free(const Buffer& b) {
    check_core(b.core, num_cores(), "free");
    auto& used = m_used[b.core];
    const auto it = used.find(b.addr);
    if (it == used.end())
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("free: no live buffer at 0x{:x} on core {} (freed twice?)",
                                      b.addr, b.core));
    uint64_t addr = it->first, size = it->second;
    used.erase(it);
    auto& free = m_free[b.core];
    auto next = free.lower_bound(addr);
    if (next != free.end() && addr + size == next->first) {
        size += next->second;
        next = free.erase(next);
    }
    if (next != free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == addr) {
            prev->second += size;
            return;
        }
    }
    free.emplace(addr, size);
}

uint64_t Device::free_bytes(uint32_t core) const {
    uint64_t total = 0;
    for (const auto& [a, s] : m_free.at(core)) total += s;
    return total;
}

uint64_t Device::largest_free_block(uint32_t core) const {
    uint64_t best = 0;
    for (const auto& [a, s] : m_free.at(core)) best = std::max(best, s);
    return best;
}

void Device::check_range(const Buffer& b, uint64_t offset, uint64_t bytes, const char* what) const {
    check_core(b.core, num_cores(), what);
    const auto it = m_used[b.core].find(b.addr);
    if (it == m_used[b.core].end())
        throw DeviceError(ErrorKind::Usage, fmt::format("{}: buffer at 0x{:x} on core {} is not "
                                                        "allocated",
                                                        what, b.addr, b.core));
    if (offset > b.bytes || bytes > b.bytes - offset)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: {} bytes at offset {} run past the {}-byte buffer", what,
                                      bytes, offset, b.bytes));
}

uint64_t Device::link_cycles(uint64_t bytes) const {
    const double ns = m_cfg->host.setup_ns + double(bytes) / m_cfg->host.link_gb_per_s;
    return static_cast<uint64_t>(std::ceil(ns * m_cfg->clock_mhz / 1000.0));
}

void Device::write(const Buffer& b, const void* data, uint64_t bytes, uint64_t offset) {
    check_range(b, offset, bytes, "write");
    m_board->hbm(b.core).write(b.addr + offset, {static_cast<const uint8_t*>(data), bytes});
    host_transfer(b.core, bytes, true);
}

void Device::read(const Buffer& b, void* data, uint64_t bytes, uint64_t offset) {
    check_range(b, offset, bytes, "read");
    m_board->hbm(b.core).read(b.addr + offset, {static_cast<uint8_t*>(data), bytes});
    host_transfer(b.core, bytes, false);
}

void Device::host_transfer(uint32_t core, uint64_t bytes, bool to_device) {
    const uint64_t t0 = now_cycle(), cycles = link_cycles(bytes);
    m_board->advance(cycles);
    if (m_tracer)
        m_tracer->complete(m_host_track, to_device ? "write" : "read", t0, t0 + cycles,
                           {{"bytes", bytes}, {"core", uint64_t(core)}});
    ++(to_device ? m_metrics.h2d_transfers : m_metrics.d2h_transfers);
    (to_device ? m_metrics.h2d_bytes : m_metrics.d2h_bytes) += bytes;
    (to_device ? m_metrics.h2d_cycles : m_metrics.d2h_cycles) += cycles;
}

Event Device::launch(const std::vector<uint32_t>& cores, const isa::Program& program,
                     const std::function<std::vector<uint32_t>(size_t)>& args) {
    std::vector<std::vector<uint32_t>> per_core;
    for (size_t i = 0; i < cores.size(); ++i) {
        check_core(cores[i], num_cores(), "launch");
        per_core.push_back(args ? args(i) : std::vector<uint32_t>{});
    }
    const auto t0 = std::chrono::steady_clock::now();
    hw::LaunchResult r;
    try {
        for (uint32_t c : cores) m_board->load(c, program);
        r = m_board->run_each(cores, per_core);
    } catch (const hw::DeviceFault& f) {
        throw DeviceError(ErrorKind::Fault, f.what());
    } catch (const hw::DeadlockError& d) {
        throw DeviceError(ErrorKind::Deadlock, d.what());
    } catch (const std::invalid_argument& e) {
        throw DeviceError(ErrorKind::Usage, fmt::format("launch: {}", e.what()));
    }
    Event ev{r.start_cycle, r.end_cycle, r.cores, r.core_cycles,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
    ++m_metrics.launches;
    m_metrics.exec_cycles += r.end_cycle - r.start_cycle;
    m_metrics.exec_host_seconds += ev.host_seconds;
    return ev;
}

}  // namespace tpu::driver
