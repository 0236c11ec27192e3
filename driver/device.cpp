// SPDX-License-Identifier: Apache-2.0
#include "driver/device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "hw/board.h"
#include "hw/host/host_link.h"
#include "sim/log.h"
#include "sim/tracer.h"

namespace tpu::driver {
namespace {

constexpr uint64_t kAlign = 256;

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
    const uint64_t capacity = window_bytes(*m_cfg);
    m_free.resize(num_cores());
    m_used.resize(num_cores());
    for (auto& f : m_free) f.emplace(0, capacity);
    // Above the window, below the resident programs at the top of HBM (hw/README.md, "Launch
    // timing"): only programs that set their window base address it.
    m_free_high.resize(num_cores());
    const uint64_t top =
        m_cfg->hbm.bytes_per_core > m_cfg->core.imem_bytes
            ? (m_cfg->hbm.bytes_per_core - m_cfg->core.imem_bytes) / kAlign * kAlign
            : 0;
    if (capacity == kHbmWindowBytes && top > capacity)
        for (auto& f : m_free_high) f.emplace(capacity, top - capacity);
}

Device::~Device() = default;

uint64_t Device::window_bytes(const hw::BoardConfig& cfg) {
    return std::min(cfg.hbm.bytes_per_core, kHbmWindowBytes) / kAlign * kAlign;
}

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
    m_link_tracks.clear();
    m_kernel_track = m_tracer ? m_tracer->track("host", "kernels") : -1;
    m_board->set_tracer(m_tracer);
}

static void check_core(uint32_t core, uint32_t n, const char* what) {
    if (core >= n)
        throw DeviceError(ErrorKind::Usage, fmt::format("{}: core {} does not exist (the board "
                                                        "has cores 0-{})",
                                                        what, core, n - 1));
}

namespace {

/// First fit in `free` (addresses stay low and deterministic run to run); nullopt if none.
std::optional<uint64_t> first_fit(std::map<uint64_t, uint64_t>& free, uint64_t need) {
    for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->second < need) continue;
        const uint64_t addr = it->first, size = it->second;
        free.erase(it);
        if (size > need) free.emplace(addr + need, size - need);
        return addr;
    }
    return std::nullopt;
}

}  // namespace

Buffer Device::alloc_wide(uint64_t bytes, uint32_t core) {
    check_core(core, num_cores(), "alloc");
    if (bytes == 0) throw DeviceError(ErrorKind::Usage, "alloc: 0 bytes requested");
    const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (const auto addr = first_fit(m_free[core], need)) {
        m_used[core].emplace(*addr, need);
        TPU_LOG(Debug, "driver", "alloc {} bytes at 0x{:x} on core {}", bytes, *addr, core);
        return Buffer{core, *addr, bytes};
    }
    if (const auto addr = first_fit(m_free_high[core], need)) {
        m_used[core].emplace(*addr, need);
        TPU_LOG(Debug, "driver", "alloc {} bytes at 0x{:x} on core {}", bytes, *addr, core);
        return Buffer{core, *addr, bytes};
    }
    return alloc(bytes, core);  // throws OutOfMemory with the window's figures
}

Buffer Device::alloc(uint64_t bytes, uint32_t core) {
    check_core(core, num_cores(), "alloc");
    if (bytes == 0) throw DeviceError(ErrorKind::Usage, "alloc: 0 bytes requested");
    const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    auto& free = m_free[core];
    if (const auto addr = first_fit(free, need)) {
        m_used[core].emplace(*addr, need);
        TPU_LOG(Debug, "driver", "alloc {} bytes at 0x{:x} on core {}", bytes, *addr, core);
        return Buffer{core, *addr, bytes};
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
    auto& free = addr >= kHbmWindowBytes ? m_free_high[b.core] : m_free[b.core];
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
    // A buffer may be a view into an allocation (e.g. one parameter of a flat buffer): it must
    // lie inside one live allocation.
    // Compared as lengths, not ends: an address plus a size near 2^64 wraps around.
    auto it = m_used[b.core].upper_bound(b.addr);
    if (it == m_used[b.core].begin() ||
        (--it, b.addr - it->first > it->second || b.bytes > it->second - (b.addr - it->first)))
        throw DeviceError(ErrorKind::Usage, fmt::format("{}: buffer at 0x{:x} on core {} is not "
                                                        "allocated",
                                                        what, b.addr, b.core));
    if (offset > b.bytes || bytes > b.bytes - offset)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: {} bytes at offset {} run past the {}-byte buffer", what,
                                      bytes, offset, b.bytes));
}

void Device::write(const Buffer& b, const void* data, uint64_t bytes, uint64_t offset) {
    check_range(b, offset, bytes, "write");
    sync_core(b.core);
    // Over MPI only the rank that simulates the core keeps its memory; every rank times it.
    if (m_board->owns(b.core))
        m_board->hbm(b.core).write(b.addr + offset, {static_cast<const uint8_t*>(data), bytes});
    host_transfer(b.core, bytes, true);
}

void Device::read(const Buffer& b, void* data, uint64_t bytes, uint64_t offset) {
    check_range(b, offset, bytes, "read");
    sync_core(b.core);
    m_board->fetch(b.core, true, b.addr + offset, {static_cast<uint8_t*>(data), bytes});
    host_transfer(b.core, bytes, false);
}

uint64_t Device::read_digest(const Buffer& b, uint64_t h) {
    check_range(b, 0, b.bytes, "read");
    sync_core(b.core);
    h = m_board->digest(b.core, b.addr, b.bytes, h);
    host_transfer(b.core, b.bytes, false);
    return h;
}

void Device::write_timing(const Buffer& b, uint64_t bytes, uint64_t offset) {
    check_range(b, offset, bytes, "write");
    sync_core(b.core);
    host_transfer(b.core, bytes, true);
}

void Device::read_timing(const Buffer& b, uint64_t bytes, uint64_t offset) {
    check_range(b, offset, bytes, "read");
    sync_core(b.core);
    host_transfer(b.core, bytes, false);
}

void Device::host_transfer(uint32_t core, uint64_t bytes, bool to_device) {
    // The chip's link times the transfer. A write is posted: the host goes on at once, and what
    // depends on the data (a launch on the chip, a read) waits for the link (wait_for_link). A
    // read is a host sync: the host has the data only when the link has delivered it.
    const uint32_t chip = m_board->chip_of(core);
    const hw::HostTransfer t = m_board->host_link(chip).transfer(now_cycle(), bytes, to_device);
    if (!to_device) m_board->advance(t.end - now_cycle());
    if (m_tracer) {
        if (m_link_tracks.empty()) m_link_tracks.assign(m_cfg->chips, -2);
        int& track = m_link_tracks[chip];
        if (track == -2) track = m_tracer->track("host", fmt::format("link chip{}", chip));
        if (track >= 0)
            m_tracer->complete(track, to_device ? "write" : "read", t.begin, t.end,
                               {{"bytes", bytes}, {"core", uint64_t(core)}});
    }
    ++(to_device ? m_metrics.h2d_transfers : m_metrics.d2h_transfers);
    (to_device ? m_metrics.h2d_bytes : m_metrics.d2h_bytes) += bytes;
    (to_device ? m_metrics.h2d_cycles : m_metrics.d2h_cycles) += t.end - t.begin;
}

void Device::wait_for_links(const std::vector<uint32_t>& cores) {
    uint64_t ready = now_cycle();
    for (uint32_t c : cores)
        ready = std::max(ready, m_board->host_link(m_board->chip_of(c)).free_at());
    m_board->advance(ready - now_cycle());
}

// ---- launches --------------------------------------------------------------------------------

namespace {

/// Outcomes kept for launches that ran but were not waited on (synchronize-only callers).
constexpr size_t kKeptOutcomes = 4096;

/// "core 3", "cores 0-3", "cores 0,2,5-6" (ascending input).
std::string cores_text(std::vector<uint32_t> cores) {
    std::sort(cores.begin(), cores.end());
    std::string out;
    for (size_t i = 0; i < cores.size();) {
        size_t j = i;
        while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
        if (!out.empty()) out += ',';
        out += j == i ? fmt::format("{}", cores[i]) : fmt::format("{}-{}", cores[i], cores[j]);
        i = j + 1;
    }
    return fmt::format("{} {}", cores.size() == 1 ? "core" : "cores", out);
}

const std::string& kernel_name(const isa::Program& p) {
    static const std::string unnamed = "unnamed";
    return p.name.empty() ? unnamed : p.name;
}

}  // namespace

LaunchHandle Device::enqueue(const std::vector<uint32_t>& cores, const isa::Program& program,
                             const ArgsFn& args, bool copy) {
    // Usage errors surface here, at the call that made them, not at a later wait.
    if (m_stopped)
        throw DeviceError(ErrorKind::Usage,
                          "launch: the board stopped on a device fault; open a "
                          "new device to run again");
    if (cores.empty()) throw DeviceError(ErrorKind::Usage, "launch: launch on an empty core set");
    std::vector<bool> seen(num_cores(), false);
    for (uint32_t c : cores) {
        check_core(c, num_cores(), "launch");
        if (seen[c])
            throw DeviceError(ErrorKind::Usage, "launch: a core appears twice in the launch set");
        seen[c] = true;
    }
    const uint64_t bytes = program.code.size() * uint64_t(isa::kInstrBytes);
    if (bytes > m_cfg->core.imem_bytes)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("launch: core {}: program of {} instructions ({} bytes) "
                        "does not fit in instruction memory ({} bytes, "
                        "core.imem_bytes)",
                        cores[0], program.code.size(), bytes, m_cfg->core.imem_bytes));
    Pending p;
    p.id = m_next_id;
    p.cores = cores;
    for (size_t i = 0; i < cores.size(); ++i) {
        p.args.push_back(args ? args(i) : std::vector<uint32_t>{});
        if (p.args.back().size() >= size_t(isa::kNumSregs))
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("launch: core {}: {} launch arguments; at most {} fit "
                                          "in s1..s{}",
                                          cores[i], p.args.back().size(), isa::kNumSregs - 1,
                                          isa::kNumSregs - 1));
    }
    if (copy) {
        p.owned = std::make_unique<isa::Program>(program);
        p.program = p.owned.get();
    } else {
        p.program = &program;
    }
    ++m_next_id;
    m_queue.push_back(std::move(p));
    return LaunchHandle{m_next_id - 1};
}

LaunchHandle Device::launch_async(const std::vector<uint32_t>& cores, const isa::Program& program,
                                  const ArgsFn& args) {
    return enqueue(cores, program, args, true);
}

Event Device::launch(const std::vector<uint32_t>& cores, const isa::Program& program,
                     const ArgsFn& args) {
    // The program is not copied: the launch runs before this call returns.
    const LaunchHandle h = enqueue(cores, program, args, false);
    try {
        run_until(h.id);
    } catch (const DeviceError&) {
        // Reported from h's own outcome below (its fault, or the earlier launch that stopped it).
    }
    Outcome o = take(h);
    if (o.failed) throw DeviceError(o.kind, o.raw);
    return std::move(o.event);
}

Event Device::wait(LaunchHandle h) {
    if (h.id == 0 || h.id >= m_next_id)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("wait: launch #{} was never issued by this device", h.id));
    try {
        run_until(h.id);
    } catch (const DeviceError&) {
        // Reported from h's own outcome below.
    }
    Outcome o = take(h);
    if (o.failed) throw DeviceError(o.kind, o.text);
    return std::move(o.event);
}

void Device::synchronize() {
    if (!m_queue.empty()) run_until(m_queue.back().id);
    std::vector<uint32_t> all(num_cores());
    for (uint32_t c = 0; c < num_cores(); ++c) all[c] = c;
    wait_for_links(all);
}

Device::Outcome Device::take(LaunchHandle h) {
    const auto it = m_done.find(h.id);
    if (it == m_done.end())
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("wait: launch #{} was already waited on (or dropped: the "
                                      "device keeps the outcomes of the last {} launches nobody "
                                      "waited on)",
                                      h.id, kKeptOutcomes));
    Outcome o = std::move(it->second);
    m_done.erase(it);
    return o;
}

void Device::run_until(uint64_t id) {
    while (!m_queue.empty() && m_queue.front().id <= id) run_batch();
}

void Device::sync_core(uint32_t core) {
    uint64_t last = 0;
    for (const Pending& p : m_queue)
        if (std::find(p.cores.begin(), p.cores.end(), core) != p.cores.end()) last = p.id;
    if (last == 0) return;
    ++m_metrics.implicit_syncs;
    run_until(last);
}

void Device::run_batch() {
    // (1) The batch: the longest run of queued launches whose core sets are pairwise disjoint.
    // They start together in one board run; a launch that shares a core waits for the next run,
    // which keeps launches in order per core.
    std::vector<Pending> batch;
    std::vector<bool> busy(num_cores(), false);
    while (!m_queue.empty()) {
        Pending& p = m_queue.front();
        if (std::any_of(p.cores.begin(), p.cores.end(), [&](uint32_t c) { return busy[c]; })) break;
        for (uint32_t c : p.cores) busy[c] = true;
        batch.push_back(std::move(p));
        m_queue.pop_front();
    }
    std::vector<uint32_t> cores;
    std::vector<std::vector<uint32_t>> args;
    std::vector<size_t> owner(num_cores(), 0);
    for (size_t i = 0; i < batch.size(); ++i)
        for (size_t j = 0; j < batch[i].cores.size(); ++j) {
            cores.push_back(batch[i].cores[j]);
            args.push_back(batch[i].args[j]);
            owner[batch[i].cores[j]] = i;
        }
    std::vector<hw::CoreStats> before;
    for (uint32_t c = 0; c < num_cores(); ++c) before.push_back(m_board->core(c).stats());

    // (2) Load every core with its launch's program and start them at one cycle, once the host
    // links of their chips have delivered what the host posted (the doorbell queues behind it).
    wait_for_links(cores);
    const auto t0 = std::chrono::steady_clock::now();
    hw::LaunchResult r;
    try {
        for (const Pending& p : batch)
            for (uint32_t c : p.cores) m_board->load(c, *p.program);
        r = m_board->run_each(cores, args);
    } catch (const hw::DeviceFault& f) {
        fail(batch, {owner.at(f.info().core)}, ErrorKind::Fault, f.what());
    } catch (const hw::DeadlockError& d) {
        std::vector<size_t> all(batch.size());
        for (size_t i = 0; i < all.size(); ++i) all[i] = i;
        fail(batch, all, ErrorKind::Deadlock, d.what());
    } catch (const hw::StoppedError& d) {
        std::vector<size_t> all(batch.size());
        for (size_t i = 0; i < all.size(); ++i) all[i] = i;
        fail(batch, all, ErrorKind::Stopped, d.what());
    } catch (const std::invalid_argument& e) {
        fail(batch, {0}, ErrorKind::Usage, fmt::format("launch: {}", e.what()));
    }
    const double host =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++m_metrics.batches;
    m_metrics.launches += batch.size();
    m_metrics.exec_cycles += r.end_cycle - r.start_cycle;
    m_metrics.exec_host_seconds += host;

    // (3) Each launch's Event from its own cores, and its per-kernel counters.
    for (Pending& p : batch) {
        Event ev;
        ev.start_cycle = ev.end_cycle = r.start_cycle;
        ev.cores = p.cores;
        std::sort(ev.cores.begin(), ev.cores.end());
        for (uint32_t c : ev.cores) {
            const size_t k = size_t(std::find(r.cores.begin(), r.cores.end(), c) - r.cores.begin());
            ev.core_cycles.push_back(r.core_cycles.at(k));
            ev.end_cycle = std::max(ev.end_cycle, r.start_cycle + r.core_cycles[k]);
        }
        ev.end_cycle += r.completion_cycles;
        ev.host_seconds = host;
        account(p, ev, before);
        if (m_tracer) {
            const std::string where = cores_text(p.cores);
            m_tracer->complete(m_kernel_track, kernel_name(*p.program), ev.start_cycle,
                               ev.end_cycle, {{"launch", p.id}, {"cores", where}});
        }
        m_done[p.id].event = std::move(ev);
    }
    while (m_done.size() > kKeptOutcomes) m_done.erase(m_done.begin());
}

void Device::fail(std::vector<Pending>& batch, const std::vector<size_t>& culprits, ErrorKind kind,
                  const std::string& raw) {
    auto identity = [](const Pending& p) {
        return fmt::format("launch #{} ('{}' on {})", p.id, kernel_name(*p.program),
                           cores_text(p.cores));
    };
    std::string first;
    for (size_t i : culprits) first += (first.empty() ? "" : ", ") + identity(batch[i]);
    first += ": " + raw;
    std::vector<bool> culprit(batch.size(), false);
    for (size_t i : culprits) {
        culprit[i] = true;
        m_done[batch[i].id] = Outcome{{}, true, kind, raw, identity(batch[i]) + ": " + raw};
    }
    auto cancel = [&](const Pending& p) {
        const std::string text = identity(p) + " did not complete: " + first;
        m_done[p.id] = Outcome{{}, true, kind, text, text};
    };
    for (size_t i = 0; i < batch.size(); ++i)
        if (!culprit[i]) cancel(batch[i]);
    for (const Pending& p : m_queue) cancel(p);
    m_queue.clear();
    // The board stops for good on a fault or deadlock (kernels may have left any state).
    if (kind != ErrorKind::Usage) m_stopped = true;
    while (m_done.size() > kKeptOutcomes) m_done.erase(m_done.begin());
    throw DeviceError(kind, first);
}

KernelStats& KernelStats::operator+=(const KernelStats& o) {
    launches += o.launches;
    cycles += o.cycles;
    core_cycles += o.core_cycles;
    instructions += o.instructions;
    mxu_macs += o.mxu_macs;
    mxu_peak_macs += o.mxu_peak_macs;
    vpu_flops += o.vpu_flops;
    hbm_read_bytes += o.hbm_read_bytes;
    hbm_write_bytes += o.hbm_write_bytes;
    ici_bytes += o.ici_bytes;
    return *this;
}

KernelStats KernelStats::since(const KernelStats& e) const {
    KernelStats d{name};
    d.launches = launches - e.launches;
    d.cycles = cycles - e.cycles;
    d.core_cycles = core_cycles - e.core_cycles;
    d.instructions = instructions - e.instructions;
    d.mxu_macs = mxu_macs - e.mxu_macs;
    d.mxu_peak_macs = mxu_peak_macs - e.mxu_peak_macs;
    d.vpu_flops = vpu_flops - e.vpu_flops;
    d.hbm_read_bytes = hbm_read_bytes - e.hbm_read_bytes;
    d.hbm_write_bytes = hbm_write_bytes - e.hbm_write_bytes;
    d.ici_bytes = ici_bytes - e.ici_bytes;
    return d;
}

KernelStats Device::kernel_totals() const {
    KernelStats t{"all"};
    for (const KernelStats& k : m_kernels) t += k;
    return t;
}

void Device::account(const Pending& p, const Event& ev, const std::vector<hw::CoreStats>& before) {
    const std::string& name = kernel_name(*p.program);
    auto [it, fresh] = m_kernel_index.emplace(name, m_kernels.size());
    if (fresh) m_kernels.push_back(KernelStats{name});
    KernelStats& k = m_kernels[it->second];
    const uint64_t duration = ev.end_cycle - ev.start_cycle;
    const auto& core = m_cfg->core;
    ++k.launches;
    k.cycles += duration;
    k.mxu_peak_macs +=
        uint64_t(core.mxus) * core.mxu_rows * core.mxu_cols * duration * ev.cores.size();
    for (size_t i = 0; i < ev.cores.size(); ++i) {
        const hw::CoreStats& s = m_board->core(ev.cores[i]).stats();
        const hw::CoreStats& b = before[ev.cores[i]];
        k.core_cycles += ev.core_cycles[i];
        k.instructions += s.instructions - b.instructions;
        for (size_t m = 0; m < s.mxu_macs.size(); ++m) k.mxu_macs += s.mxu_macs[m] - b.mxu_macs[m];
        k.vpu_flops += s.vpu_flops - b.vpu_flops;
        k.hbm_read_bytes += s.hbm_read_bytes - b.hbm_read_bytes;
        k.hbm_write_bytes += s.hbm_write_bytes - b.hbm_write_bytes;
        k.ici_bytes += s.ici_bytes - b.ici_bytes;
    }
}

}  // namespace tpu::driver
