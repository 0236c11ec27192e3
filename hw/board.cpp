// SPDX-License-Identifier: Apache-2.0
#include "hw/board.h"
#include "hw/host/host_link.h"
#include "hw/ici/ici_network.h"
#include "hw/mem/hbm_target.h"
#include "hw/mem/hbm_timing.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <systemc>

#include "sim/interrupt.h"
#include "sim/log.h"
#include "sim/stat_names.h"
#include "sim/stats.h"
#include "sim/tracer.h"

namespace tpu::hw {
namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

}  // namespace

/// One TensorCore in SystemC: a thread that runs the CoreModel ahead of simulated time and
/// sleeps only where the model needs time to pass (no clock, no per-cycle process).
class TensorCore : public sc_core::sc_module {
public:
    SC_HAS_PROCESS(TensorCore);
    TensorCore(sc_core::sc_module_name name, CoreModel& model, uint64_t period_ps,
               std::function<void()> on_stop)
        : sc_module(name), m_model(model), m_period_ps(period_ps), m_on_stop(std::move(on_stop)) {
        SC_THREAD(main);
    }

    void launch() {
        m_done = false;
        m_fault.reset();
        m_start.notify(sc_core::SC_ZERO_TIME);
    }
    void wake() { m_wake.notify(sc_core::SC_ZERO_TIME); }
    bool done() const { return m_done; }
    const std::optional<FaultInfo>& fault() const { return m_fault; }
    bool waiting() const { return m_waiting; }

private:
    uint64_t now() const {
        return static_cast<uint64_t>(sc_core::sc_time_stamp().value() / m_period_ps);
    }
    sc_core::sc_time until(uint64_t cycle) const {
        return sc_core::sc_time(static_cast<double>((cycle - now()) * m_period_ps), sc_core::SC_PS);
    }

    void main() {
        for (;;) {
            sc_core::wait(m_start);
            {
                for (;;) {
                    const auto st = m_model.run(now());
                    if (st.block == CoreModel::Block::Faulted) {
                        m_fault = m_model.fault();
                        m_done = true;
                        m_on_stop();
                        break;
                    }
                    if (st.block == CoreModel::Block::Sync) {
                        sc_core::wait(until(st.cycle));
                    } else if (st.block == CoreModel::Block::WaitFlag) {
                        const uint64_t t = m_model.next_flag_event(now());
                        m_waiting = true;
                        if (t == kNever)
                            sc_core::wait(m_wake);
                        else
                            sc_core::wait(until(t), m_wake);
                        m_waiting = false;
                    } else {
                        if (st.cycle > now()) sc_core::wait(until(st.cycle));
                        m_done = true;
                        m_on_stop();
                        break;
                    }
                }
            }
        }
    }

    CoreModel& m_model;
    uint64_t m_period_ps;
    std::function<void()> m_on_stop;
    sc_core::sc_event m_start, m_wake;
    bool m_done = true;
    bool m_waiting = false;
    std::optional<FaultInfo> m_fault;
};

struct Board::Impl : CoreEnv {
    BoardConfig cfg;
    uint64_t period_ps;
    std::vector<std::unique_ptr<SparseMemory>> hbm, vmem;
    /// Per core: the HBM timing that the core's DMA and the TLM target share.
    std::vector<std::unique_ptr<HbmTimingModel>> hbm_timing;
    std::vector<std::unique_ptr<HbmTarget>> hbm_targets;
    std::vector<std::unique_ptr<CoreModel>> models;
    std::vector<std::unique_ptr<TensorCore>> modules;
    sim::StatGroup stats{"board"};                            ///< root of every block's statistics
    std::unique_ptr<sim::StatGroup> host_stats;               ///< board.host
    std::vector<std::unique_ptr<HostLink>> host_links;        ///< per chip
    std::vector<std::unique_ptr<sim::StatGroup>> hbm_groups;  ///< per core: coreN.hbm
    IciNetwork ici;                                           ///< link timing and statistics
    std::vector<IciHop> hops;          ///< scratch: the links of the latest transfer
    uint64_t ici_calls = 0;            ///< transfers so far (retires old link promises)
    sim::Tracer* tracer = nullptr;     ///< link transfers go to the "ici" process
    std::vector<int> link_tracks;      ///< per link: trace track, -2 before first use
    std::vector<int> launch_tracks;    ///< host, then per core: launch-phase track, -2 unmade
    std::vector<uint32_t> launch_set;  ///< cores of the current launch, ascending
    uint32_t outstanding = 0;
    bool faulted = false;
    /// Host time by which the current launch must end (sim.max_host_seconds; none if 0).
    std::optional<std::chrono::steady_clock::time_point> host_deadline;
    std::string stop_reason;  ///< why the current launch was stopped ("" while it runs)
    bool stop_on_fault = false;

    explicit Impl(const BoardConfig& c) : cfg(c), period_ps(c.period_ps()), ici(c) {
        const uint32_t n = cfg.cores();
        for (uint32_t i = 0; i < n; ++i) {
            hbm.push_back(std::make_unique<SparseMemory>(fmt::format("core{}.hbm", i),
                                                         cfg.hbm.bytes_per_core));
            vmem.push_back(
                std::make_unique<SparseMemory>(fmt::format("core{}.vmem", i), cfg.core.vmem_bytes));
            hbm_timing.push_back(make_hbm_timing(cfg));
            models.push_back(
                std::make_unique<CoreModel>(i, cfg, *hbm[i], *vmem[i], this, hbm_timing[i].get()));
            hbm_targets.emplace_back();  // made on request: an unbound socket fails elaboration
        }
        // Every block's statistics under one root: stats.json is one walk of it.
        stats.add(std::string(sim::stat_names::kCycles),
                  "board cycles since the simulation started", sim::StatUnit::Cycles,
                  [this] { return now_cycle(); });
        for (uint32_t i = 0; i < n; ++i) {
            sim::StatGroup& core = models[i]->register_stats(stats);
            hbm_groups.push_back(
                std::make_unique<sim::StatGroup>(std::string(sim::stat_names::kHbm), &core));
            hbm_timing[i]->register_stats(*hbm_groups.back());
        }
        ici.register_stats(stats, [this] { return now_cycle(); });
        host_stats = std::make_unique<sim::StatGroup>(std::string(sim::stat_names::kHost), &stats);
        for (uint32_t chip = 0; chip < cfg.chips; ++chip)
            host_links.push_back(std::make_unique<HostLink>(fmt::format("chip{}", chip), cfg.host,
                                                            cfg.clock(), host_stats.get()));
        for (uint32_t i = 0; i < n; ++i)
            modules.push_back(std::make_unique<TensorCore>(fmt::format("core{}", i).c_str(),
                                                           *models[i], period_ps, [this, i] {
                                                               --outstanding;
                                                               // The board refuses further launches
                                                               // after a fault, so stopping for
                                                               // good is fine (and sc_pause from a
                                                               // thread confuses AddressSanitizer).
                                                               if (modules[i]->fault())
                                                                   sc_core::sc_stop();
                                                           }));
    }

    uint32_t num_cores() const override { return cfg.cores(); }

    /// Writes a transfer that arrives as `a` into `dst`'s HBM at `addr` (hw/README.md, "ICI
    /// network"): each dma_chunk_bytes piece is posted to the destination's HBM timing when its
    /// last byte has arrived; returns the latest completion.
    uint64_t remote_hbm_write(uint32_t dst, uint64_t addr, uint64_t bytes, const IciArrival& a) {
        uint64_t done = a.last;
        for (uint64_t off = 0; off < bytes; off += cfg.core.dma_chunk_bytes) {
            const auto len =
                static_cast<uint32_t>(std::min<uint64_t>(cfg.core.dma_chunk_bytes, bytes - off));
            const uint64_t in = std::min(a.last, a.first + ici.ser_cycles(off + len));
            done = std::max(done, hbm_timing[dst]->access(in, addr + off, len, true));
        }
        return done;
    }

    /// An "ici" process with one track per link direction ("core3+x"): when each transfer
    /// occupies the link.
    void trace_link(const IciHop& hop, uint64_t bytes, uint32_t src, uint32_t dst) {
        if (!tracer || hop.end <= hop.begin) return;
        if (link_tracks.empty()) link_tracks.assign(ici.num_links(), -2);
        int& track = link_tracks[hop.link];
        if (track == -2) track = tracer->track("ici", IciNetwork::link_name(hop.link));
        if (track >= 0)
            tracer->complete(track, "transfer", hop.begin, hop.end,
                             {{"bytes", bytes}, {"src", uint64_t(src)}, {"dst", uint64_t(dst)}});
    }

    /// Cycle the program of `core`, requested at `start`, is in instruction memory: the
    /// fetch engine posts every dma_chunk_bytes request of it at once to the core's HBM, where
    /// the runtime keeps loaded programs (the top imem_bytes of the core's HBM).
    uint64_t fetch_program(uint32_t core, uint64_t start) {
        const uint64_t bytes = models[core]->program_bytes();
        const uint64_t base = cfg.hbm.bytes_per_core -
                              std::min<uint64_t>(cfg.hbm.bytes_per_core, cfg.core.imem_bytes);
        uint64_t done = start;
        for (uint64_t off = 0; off < bytes; off += cfg.core.dma_chunk_bytes) {
            const auto len =
                static_cast<uint32_t>(std::min<uint64_t>(cfg.core.dma_chunk_bytes, bytes - off));
            done = std::max(done, hbm_timing[core]->access(start, base + off, len, false));
        }
        return done;
    }

    /// A launch phase on the host's "launch" track (core < 0) or core N's "launch" track.
    void trace_launch(int core, std::string_view what, uint64_t begin, uint64_t end) {
        if (!tracer || end <= begin) return;
        const size_t slot = size_t(core + 1);
        if (launch_tracks.size() <= slot) launch_tracks.resize(models.size() + 1, -2);
        int& track = launch_tracks[slot];
        if (track == -2)
            track = tracer->track(core < 0 ? std::string("host") : fmt::format("core{}", core),
                                  "launch");
        if (track >= 0) tracer->complete(track, what, begin, end);
    }

    uint64_t ici_transfer(uint32_t src, uint32_t dst, uint64_t start, uint64_t bytes, bool to_hbm,
                          uint64_t addr) override {
        hops.clear();
        const IciArrival a = ici.transfer(src, dst, start, bytes, tracer ? &hops : nullptr);
        for (const IciHop& h : hops) trace_link(h, bytes, src, dst);
        // Every later transfer starts at or after the caller's cycle, which is simulated time.
        if (++ici_calls % 256 == 0) ici.retire(now_cycle());
        return to_hbm ? remote_hbm_write(dst, addr, bytes, a) : a.last;
    }
    uint64_t ici_message(uint32_t src, uint32_t dst, uint64_t start) override {
        return ici.message(src, dst, start);
    }
    uint64_t now_cycle() const {
        return static_cast<uint64_t>(sc_core::sc_time_stamp().value() / period_ps);
    }
    const std::vector<uint32_t>& launched() const override { return launch_set; }
    SparseMemory& remote_memory(uint32_t core, bool is_hbm) override {
        return is_hbm ? *hbm[core] : *vmem[core];
    }
    RaceDetector& remote_race_detector(uint32_t core) override {
        return models[core]->race_detector();
    }
    bool stop_requested() override {
        if (stop_reason.empty()) {
            if (sim::interrupt_requested())
                stop_reason = "interrupted (Ctrl-C)";
            else if (host_deadline && std::chrono::steady_clock::now() > *host_deadline)
                stop_reason = fmt::format(
                    "the launch ran past sim.max_host_seconds = {} host seconds without halting",
                    cfg.sim.max_host_seconds);
            else
                return false;
        }
        // sc_start() returns once the current delta cycle ends; launch() then reports.
        sc_core::sc_pause();
        return true;
    }
    void remote_signal(uint32_t core, uint32_t flag, uint32_t amount, uint64_t cycle) override {
        models[core]->schedule_flag(flag, amount, cycle);
        modules[core]->wake();
    }
};

namespace {
/// SystemC's default handler prints to stdout, where a warning (e.g. W545) would corrupt the
/// --json output; everything it displays goes to stderr instead, the rest is done as before.
void report_to_stderr(const sc_core::sc_report& rep, const sc_core::sc_actions& actions) {
    if (actions & sc_core::SC_DISPLAY)
        std::fprintf(stderr, "%s\n", sc_core::sc_report_compose_message(rep).c_str());
    sc_core::sc_report_handler::default_handler(rep, actions & ~sc_core::SC_DISPLAY);
}
}  // namespace

Board::Board(const BoardConfig& cfg) : m_impl(std::make_unique<Impl>(cfg)) {
    // sc_stop() on a fault would print "Simulation stopped by user" to stdout; the fault
    // itself is the report.
    sc_core::sc_report_handler::set_actions("/OSCI/SystemC", sc_core::SC_INFO,
                                            sc_core::SC_DO_NOTHING);
    // Likewise W545: cores faulting in the same delta cycle each call sc_stop(), and the
    // warning about the second call says nothing about the kernel.
    sc_core::sc_report_handler::set_actions(sc_core::SC_ID_SIMULATION_STOP_CALLED_TWICE_,
                                            sc_core::SC_DO_NOTHING);
    sc_core::sc_report_handler::set_handler(report_to_stderr);
}
Board::~Board() = default;

const BoardConfig& Board::config() const {
    return m_impl->cfg;
}
uint32_t Board::num_cores() const {
    return m_impl->cfg.cores();
}

static void check_core(uint32_t core, uint32_t n) {
    if (core >= n)
        throw std::invalid_argument(
            fmt::format("core {} does not exist (the board has cores 0-{})", core, n - 1));
}

HbmTarget& Board::hbm_target(uint32_t core) {
    auto& t = m_impl->hbm_targets.at(core);
    if (!t)
        t = std::make_unique<HbmTarget>(fmt::format("core{}_hbm", core).c_str(), *m_impl->hbm[core],
                                        *m_impl->hbm_timing[core], m_impl->period_ps);
    return *t;
}

SparseMemory& Board::hbm(uint32_t core) {
    check_core(core, num_cores());
    return *m_impl->hbm[core];
}
SparseMemory& Board::vmem(uint32_t core) {
    check_core(core, num_cores());
    return *m_impl->vmem[core];
}
CoreModel& Board::core(uint32_t core) {
    check_core(core, num_cores());
    return *m_impl->models[core];
}

void Board::load(uint32_t core, const isa::Program& program) {
    this->core(core).load(program);
}

uint64_t Board::now_cycle() const {
    return m_impl->now_cycle();
}
const IciNetwork& Board::ici() const {
    return m_impl->ici;
}
uint32_t Board::chip_of(uint32_t core) const {
    check_core(core, num_cores());
    return core / m_impl->cfg.cores_per_chip;
}
HostLink& Board::host_link(uint32_t chip) {
    if (chip >= m_impl->host_links.size())
        throw std::invalid_argument(fmt::format("chip {} does not exist (the board has chips 0-{})",
                                                chip, m_impl->host_links.size() - 1));
    return *m_impl->host_links[chip];
}
sim::StatGroup& Board::stats() {
    return m_impl->stats;
}
double Board::now_seconds() const {
    // From cycles at the exact period: SystemC's step is the period rounded to whole ps.
    return m_impl->cfg.clock().seconds(double(now_cycle()));
}

void Board::advance(uint64_t cycles) {
    if (cycles == 0) return;
    if (sc_core::sc_get_status() == sc_core::SC_ELABORATION)
        sc_core::sc_start(sc_core::SC_ZERO_TIME);
    sc_core::sc_start(
        sc_core::sc_time(static_cast<double>(cycles * m_impl->period_ps), sc_core::SC_PS));
}

void Board::set_tracer(sim::Tracer* tracer) {
    for (auto& m : m_impl->models) m->set_tracer(tracer);
    m_impl->tracer = tracer && tracer->enabled() ? tracer : nullptr;
    m_impl->link_tracks.clear();
    m_impl->launch_tracks.clear();
}

LaunchResult Board::run(const std::vector<uint32_t>& cores, const std::vector<uint32_t>& args) {
    return run_each(cores, std::vector<std::vector<uint32_t>>(cores.size(), args));
}

LaunchResult Board::run_each(const std::vector<uint32_t>& cores,
                             const std::vector<std::vector<uint32_t>>& args) {
    Impl& im = *m_impl;
    if (args.size() != cores.size())
        throw std::invalid_argument(
            fmt::format("{} argument lists for {} cores", args.size(), cores.size()));
    if (im.faulted)
        throw std::invalid_argument(
            "the board stopped on a device fault; open a new device to run again");
    if (cores.empty()) throw std::invalid_argument("launch on an empty core set");
    std::vector<uint32_t> set = cores;
    std::sort(set.begin(), set.end());
    if (std::adjacent_find(set.begin(), set.end()) != set.end())
        throw std::invalid_argument("a core appears twice in the launch set");
    for (uint32_t c : set) check_core(c, num_cores());

    // The core threads must have reached their first wait before a launch can notify them.
    if (sc_core::sc_get_status() == sc_core::SC_ELABORATION)
        sc_core::sc_start(sc_core::SC_ZERO_TIME);
    if (sim::interrupt_requested())
        throw StoppedError(
            fmt::format("interrupted (Ctrl-C) before the launch at cycle {}", now_cycle()));
    im.stop_reason.clear();
    im.host_deadline.reset();
    if (im.cfg.sim.max_host_seconds > 0)
        im.host_deadline = std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(im.cfg.sim.max_host_seconds));
    im.launch_set = set;
    LaunchResult res;
    res.start_cycle = now_cycle();
    res.cores = set;
    const bool costs = im.cfg.sim.launch_costs;
    res.completion_cycles = costs ? im.cfg.ns_to_cycles(im.cfg.host.completion_ns) : 0;
    // Launch timing (hw/README.md): (1) the doorbell reaches the chip, (2) each core fetches its
    // program from HBM into instruction memory, (3) the sequencer issues the first instruction.
    const uint64_t rung =
        res.start_cycle + (costs ? im.cfg.ns_to_cycles(im.cfg.host.doorbell_ns) : 0);
    im.trace_launch(-1, "doorbell", res.start_cycle, rung);
    for (size_t i = 0; i < cores.size(); ++i) {
        const uint32_t c = cores[i];
        const uint64_t fetched = costs ? im.fetch_program(c, rung) : rung;
        const uint64_t first = fetched + (costs ? im.cfg.core.first_instr_cycles : 0);
        im.trace_launch(int(c), "imem_fetch", rung, fetched);
        im.trace_launch(int(c), "first_instr", fetched, first);
        im.models[c]->start(first, args[i]);
    }
    for (uint32_t c : set) im.modules[c]->launch();
    im.outstanding = static_cast<uint32_t>(set.size());
    TPU_LOG(Info, "board", "launch on {} core(s) at cycle {}", set.size(), res.start_cycle);
    while (im.outstanding > 0) {
        sc_core::sc_start();
        bool fault = false;
        for (uint32_t c : set) fault |= im.modules[c]->fault().has_value();
        if (fault) break;
        // A launch that takes too long in host time, or Ctrl-C: the state dump of a deadlock.
        if (im.outstanding > 0 && (!im.stop_reason.empty() || im.stop_requested())) {
            std::string dump;
            for (uint32_t c : set)
                if (!im.modules[c]->done()) dump += "\n  " + im.models[c]->dump_state();
            im.faulted = true;
            throw StoppedError(fmt::format("{}{}", im.stop_reason, dump));
        }
        if (im.outstanding > 0 && !sc_core::sc_pending_activity()) {
            std::string dump;
            for (uint32_t c : set)
                if (!im.modules[c]->done()) dump += "\n  " + im.models[c]->dump_state();
            im.faulted = true;
            throw DeadlockError(fmt::format(
                "deadlock at cycle {}: every running core waits on a flag that nothing can raise{}",
                now_cycle(), dump));
        }
    }
    for (uint32_t c : set)
        if (im.modules[c]->fault()) {
            im.faulted = true;
            throw DeviceFault(*im.modules[c]->fault());
        }
    uint64_t last_halt = res.start_cycle;
    for (uint32_t c : set) {
        const uint64_t end = im.models[c]->local_cycle();
        res.core_cycles.push_back(end - res.start_cycle);
        last_halt = std::max(last_halt, end);
        TPU_LOG(Debug, fmt::format("board.core{}", c), "halted after {} cycles, {} instructions",
                end - res.start_cycle, im.models[c]->stats().instructions);
    }
    // (4) The completion write-back and interrupt reach the host; the next launch starts after.
    res.end_cycle = last_halt + res.completion_cycles;
    im.trace_launch(-1, "completion", last_halt, res.end_cycle);
    if (res.end_cycle > now_cycle()) advance(res.end_cycle - now_cycle());
    return res;
}

std::vector<uint32_t> parse_core_set(const std::string& text, uint32_t num_cores) {
    std::vector<uint32_t> out;
    if (text == "all") {
        for (uint32_t i = 0; i < num_cores; ++i) out.push_back(i);
        return out;
    }
    auto number = [&](std::string_view s) {
        uint32_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || p != s.data() + s.size())
            throw std::invalid_argument(
                fmt::format("bad core list '{}': '{}' is not a core number", text, s));
        if (v >= num_cores)
            throw std::invalid_argument(
                fmt::format("bad core list '{}': core {} does not exist (the board has cores 0-{})",
                            text, v, num_cores - 1));
        return v;
    };
    std::string_view rest = text;
    while (true) {
        const size_t comma = rest.find(',');
        const std::string_view part = rest.substr(0, comma);
        const size_t dash = part.find('-');
        if (dash == std::string_view::npos) {
            out.push_back(number(part));
        } else {
            const uint32_t a = number(part.substr(0, dash)), b = number(part.substr(dash + 1));
            if (b < a)
                throw std::invalid_argument(
                    fmt::format("bad core list '{}': range {} is backwards", text, part));
            for (uint32_t i = a; i <= b; ++i) out.push_back(i);
        }
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
    }
    std::sort(out.begin(), out.end());
    if (std::adjacent_find(out.begin(), out.end()) != out.end())
        throw std::invalid_argument(fmt::format("bad core list '{}': a core appears twice", text));
    return out;
}

}  // namespace tpu::hw
