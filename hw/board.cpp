// SPDX-License-Identifier: Apache-2.0
#include "hw/board.h"
#include "hw/host/host_link.h"
#include "hw/ici/ici_network.h"
#include "hw/mem/hbm_replicas.h"
#include "hw/mem/hbm_target.h"
#include "hw/mem/hbm_timing.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <systemc>

#include "sim/cluster.h"
#include "sim/interrupt.h"
#include "sim/log.h"
#include "sim/stat_names.h"
#include "sim/stats.h"
#include "sim/tracer.h"

namespace tpu::hw {
namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

/// Appends plain values and byte strings to a message between ranks.
struct Packer {
    std::vector<uint8_t> bytes;
    template <class T>
    void put(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        bytes.insert(bytes.end(), p, p + sizeof(T));
    }
    void put_bytes(std::span<const uint8_t> b) {
        put(uint64_t(b.size()));
        bytes.insert(bytes.end(), b.begin(), b.end());
    }
    void put_string(std::string_view s) {
        put_bytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
    }
};

/// Reads what a Packer wrote, in the same order.
struct Unpacker {
    std::span<const uint8_t> in;
    size_t at = 0;
    template <class T>
    T get() {
        T v;
        if (at + sizeof(T) > in.size()) throw std::logic_error("rank message ends early");
        std::memcpy(&v, in.data() + at, sizeof(T));
        at += sizeof(T);
        return v;
    }
    std::span<const uint8_t> get_bytes() {
        const auto n = get<uint64_t>();
        if (at + n > in.size()) throw std::logic_error("rank message ends early");
        const auto b = in.subspan(at, n);
        at += n;
        return b;
    }
    std::string get_string() {
        const auto b = get_bytes();
        return {reinterpret_cast<const char*>(b.data()), b.size()};
    }
    bool done() const { return at == in.size(); }
};

/// Each rank's message out of one allgather.
std::vector<std::vector<uint8_t>> gather_all(const Packer& mine) {
    std::vector<size_t> sizes;
    const std::vector<uint8_t> all = sim::Cluster::allgather(mine.bytes, &sizes);
    std::vector<std::vector<uint8_t>> out;
    size_t at = 0;
    for (size_t n : sizes) {
        out.emplace_back(all.begin() + long(at), all.begin() + long(at + n));
        at += n;
    }
    return out;
}

// Every field of CoreStats travels: a new one must be added to both functions below.
static_assert(sizeof(CoreStats) == 12 * sizeof(uint64_t) + 2 * sizeof(std::vector<uint64_t>));

void pack_core_stats(Packer& p, const CoreStats& s) {
    for (uint64_t v :
         {s.instructions, s.stall_queue, s.stall_wait, s.mxu_ops, s.vpu_ops, s.vpu_busy,
          s.vpu_flops, s.dma_ops, s.hbm_read_bytes, s.hbm_write_bytes, s.ici_ops, s.ici_bytes})
        p.put(v);
    for (const auto* vec : {&s.mxu_busy, &s.mxu_macs}) {
        p.put(uint64_t(vec->size()));
        for (uint64_t v : *vec) p.put(v);
    }
}

CoreStats unpack_core_stats(Unpacker& u) {
    CoreStats s;
    for (uint64_t* v : {&s.instructions, &s.stall_queue, &s.stall_wait, &s.mxu_ops, &s.vpu_ops,
                        &s.vpu_busy, &s.vpu_flops, &s.dma_ops, &s.hbm_read_bytes,
                        &s.hbm_write_bytes, &s.ici_ops, &s.ici_bytes})
        *v = u.get<uint64_t>();
    for (auto* vec : {&s.mxu_busy, &s.mxu_macs}) {
        vec->resize(u.get<uint64_t>());
        for (uint64_t& v : *vec) v = u.get<uint64_t>();
    }
    return s;
}

void pack_fault(Packer& p, const FaultInfo& f) {
    p.put(f.core);
    p.put(f.pc);
    p.put_string(f.instruction);
    p.put_string(f.unit);
    p.put(f.address);
    p.put(f.cycle);
    p.put_string(f.what);
}

FaultInfo unpack_fault(Unpacker& u) {
    FaultInfo f;
    f.core = u.get<uint32_t>();
    f.pc = u.get<uint32_t>();
    f.instruction = u.get_string();
    f.unit = u.get_string();
    f.address = u.get<uint64_t>();
    f.cycle = u.get<uint64_t>();
    f.what = u.get_string();
    return f;
}

}  // namespace

/// The SystemC simulation context a board runs in (hw/README.md, "One board, one SystemC
/// context"). SystemC keeps its whole kernel state (time, event queues, processes, the module
/// registry) in the current context; a board that makes its own current whenever it is called
/// shares nothing with any other board, and deleting it frees the board's processes and events.
class SimContext {
public:
    SimContext() : m_ctx(new sc_core::sc_simcontext) {
        idle();  // remembered before the first board's context replaces it
        enter();
    }
    ~SimContext() {
        const bool current = sc_core::sc_curr_simcontext == m_ctx;
        delete m_ctx;
        if (current) set(idle());
    }
    SimContext(const SimContext&) = delete;
    SimContext& operator=(const SimContext&) = delete;

    /// Makes this context SystemC's current one (sc_start, sc_time_stamp, new modules).
    void enter() const { set(m_ctx); }
    sc_core::sc_simcontext* get() const { return m_ctx; }

    static void set(sc_core::sc_simcontext* c) {
        sc_core::sc_curr_simcontext = c;
        sc_core::sc_default_global_context = c;
    }
    /// The context that is current while no board is: the one the process started with.
    static sc_core::sc_simcontext* idle() {
        static sc_core::sc_simcontext* const base = sc_core::sc_get_curr_simcontext();
        return base;
    }

private:
    sc_core::sc_simcontext* m_ctx;
};

/// One TensorCore in SystemC: a method process that runs the CoreModel ahead of simulated time
/// and asks to be triggered again only where the model needs time to pass (no clock, no
/// per-cycle process). A method rather than a thread: it has no stack of its own, so a board
/// can be torn down at any point, and AddressSanitizer can follow every path.
class TensorCore : public sc_core::sc_module {
public:
    SC_HAS_PROCESS(TensorCore);
    TensorCore(sc_core::sc_module_name name, CoreModel& model, uint64_t period_ps,
               std::function<void()> on_stop)
        : sc_module(name), m_model(model), m_period_ps(period_ps), m_on_stop(std::move(on_stop)) {
        // Runs once at initialisation, where it waits for the first launch.
        SC_METHOD(step);
    }

    void launch() {
        m_done = false;
        m_fault.reset();
        m_state = State::Running;
        m_start.notify(sc_core::SC_ZERO_TIME);
    }
    void wake() { m_wake.notify(sc_core::SC_ZERO_TIME); }
    /// Ends the core's part in a launch that stopped without it (a fault elsewhere, a deadlock,
    /// a stop): whatever it still waits for, it does nothing more until the next launch.
    void abandon() { m_state = State::Idle; }
    bool done() const { return m_done; }
    const std::optional<FaultInfo>& fault() const { return m_fault; }

private:
    /// Idle: waits for a launch. Running: runs the model whenever triggered. Halting: halted,
    /// waits for its last unit to drain.
    enum class State : uint8_t { Idle, Running, Halting };

    uint64_t now() const {
        return static_cast<uint64_t>(simcontext()->time_stamp().value() / m_period_ps);
    }
    sc_core::sc_time until(uint64_t cycle) const {
        return sc_core::sc_time(static_cast<double>((cycle - now()) * m_period_ps), sc_core::SC_PS);
    }
    void finish() {
        m_done = true;
        m_state = State::Idle;
        next_trigger(m_start);
        m_on_stop();
    }

    void step() {
        if (m_state == State::Idle) {
            next_trigger(m_start);
            return;
        }
        if (m_state == State::Halting) {
            finish();
            return;
        }
        const auto st = m_model.run(now());
        switch (st.block) {
            case CoreModel::Block::Faulted:
                m_fault = m_model.fault();
                finish();
                return;
            case CoreModel::Block::Sync:
                next_trigger(until(st.cycle));
                return;
            case CoreModel::Block::WaitFlag: {
                const uint64_t t = m_model.next_flag_event(now());
                if (t == kNever)
                    next_trigger(m_wake);
                else
                    next_trigger(until(t), m_wake);
                return;
            }
            case CoreModel::Block::Halted:
                if (st.cycle > now()) {
                    m_state = State::Halting;
                    next_trigger(until(st.cycle));
                } else {
                    finish();
                }
                return;
        }
    }

    CoreModel& m_model;
    uint64_t m_period_ps;
    std::function<void()> m_on_stop;
    sc_core::sc_event m_start, m_wake;
    State m_state = State::Idle;
    bool m_done = true;
    std::optional<FaultInfo> m_fault;
};

struct Board::Impl : CoreEnv {
    /// First member: every SystemC object below is made in it and destroyed before it.
    SimContext context;
    BoardConfig cfg;
    uint64_t period_ps;
    std::vector<std::unique_ptr<SparseMemory>> hbm, vmem;
    /// The HBM timing of this rank's cores, served once while their requests agree
    /// (sim.share_hbm_timing); declared before hbm_timing, whose members refer to it.
    std::unique_ptr<HbmReplicaGroup> hbm_replicas;
    /// Per core: the HBM timing that the core's DMA and the TLM target share.
    std::vector<std::unique_ptr<HbmTimingModel>> hbm_timing;
    std::vector<std::unique_ptr<HbmTarget>> hbm_targets;
    std::vector<std::unique_ptr<CoreModel>> models;
    std::vector<std::unique_ptr<TensorCore>> modules;
    sim::StatGroup stats{"board"};                            ///< root of every block's statistics
    std::unique_ptr<sim::StatGroup> host_stats;               ///< board.host
    std::vector<std::unique_ptr<HostLink>> host_links;        ///< per chip
    std::vector<std::unique_ptr<sim::StatGroup>> hbm_groups;  ///< per core: coreN.hbm
    std::vector<sim::StatGroup*> core_groups;                 ///< per core: board.coreN
    IciNetwork ici;                                           ///< link timing and statistics
    std::vector<IciHop> hops;  ///< scratch: the links of the latest transfer
    uint64_t ici_calls = 0;    ///< transfers so far (retires old link promises)
    /// ICI window in cycles (the hop latency; 0: posts resolve at once), hw/README.md.
    uint64_t window = 0;
    std::vector<IciPost> posts;       ///< posted in the current window, not resolved yet
    std::vector<IciEngine> delivery;  ///< per source core: in-order delivery of its posts
    /// MPI ranks sharing the board (hw/README.md, "Pod slices on MPI"): this one simulates
    /// cores [rank * cores_per_rank, (rank + 1) * cores_per_rank).
    int rank = 0, ranks = 1;
    uint32_t cores_per_rank = 0;
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

    explicit Impl(const BoardConfig& c)
        : cfg(c), period_ps(c.period_ps()), ici(c), window(ici.hop_cycles()) {
        const uint32_t n = cfg.cores();
        delivery.resize(n);
        rank = sim::Cluster::rank();
        ranks = sim::Cluster::size();
        cores_per_rank = n;
        if (ranks > 1) {
            const uint32_t hosts = cfg.hosts();
            if (hosts % uint32_t(ranks) != 0)
                throw std::invalid_argument(
                    fmt::format("{} MPI ranks do not divide the board's {} TPU hosts ({} chips, "
                                "chips_per_host = {}): run 1 rank or a divisor of {}",
                                ranks, hosts, cfg.chips, cfg.chips_per_host, hosts));
            if (window == 0)
                throw std::invalid_argument(
                    "ici.hop_latency_ns: a board split over MPI ranks needs a hop latency of at "
                    "least one cycle (it is the ranks' lookahead)");
            if (cfg.sim.race_detector)
                throw std::invalid_argument(
                    "sim.race_detector: the race detector works in one process only; run it "
                    "without mpirun");
            cores_per_rank = n / uint32_t(ranks);
        }
        // This rank's cores are [first_owned, first_owned + cores_per_rank).
        const uint32_t first_owned = uint32_t(rank) * cores_per_rank;
        if (cfg.sim.share_hbm_timing && cfg.hbm.model == "hbm2" && cores_per_rank > 1)
            hbm_replicas = std::make_unique<HbmReplicaGroup>(cfg, cores_per_rank);
        for (uint32_t i = 0; i < n; ++i) {
            // Values live only where something computes with them: not on a timing-only board,
            // not for a core another rank simulates (hw/README.md, "Timing-only mode").
            const auto backing = cfg.sim.functional && owns(i) ? SparseMemory::Backing::Reserve
                                                               : SparseMemory::Backing::None;
            hbm.push_back(std::make_unique<SparseMemory>(fmt::format("core{}.hbm", i),
                                                         cfg.hbm.bytes_per_core, backing));
            vmem.push_back(std::make_unique<SparseMemory>(fmt::format("core{}.vmem", i),
                                                          cfg.core.vmem_bytes, backing));
            hbm_timing.push_back(hbm_replicas && owns(i) ? hbm_replicas->member(i - first_owned)
                                                         : make_hbm_timing(cfg));
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
            core_groups.push_back(&core);
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
                                                               // The launch ends at this delta
                                                               // cycle's end; the board is
                                                               // marked faulted and can still
                                                               // be read and advanced.
                                                               if (modules[i]->fault())
                                                                   sc_core::sc_pause();
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

    /// Reserves the network for `p` and returns when its data is in the destination's memory
    /// (or the message there), before in-order delivery.
    /// With `time_hbm` false (another rank simulates the destination), an HBM write's
    /// completion is left to that rank and kNever returned.
    uint64_t land(const IciPost& p, bool time_hbm = true) {
        if (p.signal) return ici.message(p.src, p.dst, p.start);
        hops.clear();
        const IciArrival a = ici.transfer(p.src, p.dst, p.start, p.bytes, tracer ? &hops : nullptr);
        for (const IciHop& h : hops)
            if (owns(IciNetwork::link_core(h.link))) trace_link(h, p.bytes, p.src, p.dst);
        if (!p.hbm) return a.last;
        return time_hbm ? remote_hbm_write(p.dst, p.addr, p.bytes, a) : kNever;
    }
    /// The destination's side of a resolved post: the data, then the flag at `done`.
    void deliver(const IciPost& p, uint64_t done) {
        if (!p.data.empty()) (p.hbm ? *hbm[p.dst] : *vmem[p.dst]).write(p.addr, p.data);
        models[p.dst]->schedule_flag(p.flag, p.amount, done);
        modules[p.dst]->wake();
    }
    bool owns(uint32_t core) const { return ranks == 1 || core / cores_per_rank == uint32_t(rank); }
    int rank_of(uint32_t core) const { return ranks == 1 ? 0 : int(core / cores_per_rank); }

    /// This rank's posts for rank `to`: every post's header (each rank reserves every post),
    /// and the bytes only of the posts whose destination `to` simulates.
    void pack_posts(Packer& out, int to) const {
        for (const IciPost& p : posts) {
            out.put(p.issue);
            out.put(p.src);
            out.put(p.dst);
            out.put(p.seq);
            out.put(p.start);
            out.put(uint8_t(uint8_t(p.signal) | uint8_t(p.hbm) << 1));
            out.put(p.addr);
            out.put(p.bytes);
            out.put(p.flag);
            out.put(p.amount);
            out.put_bytes(rank_of(p.dst) == to ? std::span(p.data) : std::span<const uint8_t>{});
        }
    }
    /// Another rank's posts (the rest of its message), into `all`.
    void unpack_posts(Unpacker& u, std::vector<IciPost>& all) const {
        while (!u.done()) {
            IciPost p;
            p.issue = u.get<uint64_t>();
            p.src = u.get<uint32_t>();
            p.dst = u.get<uint32_t>();
            p.seq = u.get<uint64_t>();
            p.start = u.get<uint64_t>();
            const auto kind = u.get<uint8_t>();
            p.signal = kind & 1;
            p.hbm = kind & 2;
            p.addr = u.get<uint64_t>();
            p.bytes = u.get<uint64_t>();
            p.flag = u.get<uint32_t>();
            p.amount = u.get<uint32_t>();
            const auto data = u.get_bytes();
            if (owns(p.dst)) p.data.assign(data.begin(), data.end());
            all.push_back(std::move(p));
        }
    }

    /// The window ends: every post of it, from every rank (`all`), in (issue cycle, source
    /// core, source order). Each rank keeps the whole network and each source's in-order
    /// delivery and reserves every post in that order, so all ranks hold the same calendars; a
    /// post's destination HBM is timed by the rank that simulates the destination.
    void resolve_window(std::vector<IciPost> all) {
        std::sort(all.begin(), all.end(), [](const IciPost& a, const IciPost& b) {
            return std::tie(a.issue, a.src, a.seq) < std::tie(b.issue, b.src, b.seq);
        });
        // Links first, in order; a write into another rank's HBM is done when that rank says.
        std::vector<uint64_t> landed(all.size());
        Packer hbm_done;
        bool ask = false;
        for (size_t i = 0; i < all.size(); ++i) {
            const IciPost& p = all[i];  // p.hbm: a transfer into HBM (never a signal)
            landed[i] = land(p, !p.hbm || owns(p.dst));
            ask |= p.hbm && rank_of(p.dst) != rank_of(p.src);
            if (p.hbm && owns(p.dst) && rank_of(p.src) != rank) {
                hbm_done.put(uint64_t(i));
                hbm_done.put(landed[i]);
            }
        }
        // Every rank knows whether some write crossed ranks, so all of them take part or none.
        if (ranks > 1 && ask)
            for (const auto& msg : gather_all(hbm_done)) {
                Unpacker u{msg};
                while (!u.done()) {
                    const auto i = u.get<uint64_t>();
                    landed[i] = u.get<uint64_t>();
                }
            }
        for (size_t i = 0; i < all.size(); ++i) {
            const IciPost& p = all[i];
            const uint64_t done = delivery[p.src].deliver(p.dst, landed[i]);
            if (owns(p.dst)) deliver(p, done);
            if (owns(p.src)) {
                models[p.src]->ici_done(p.seq, done);
                modules[p.src]->wake();
            }
        }
        ici_calls += all.size();
        // Every later post issues at or after the window's end, which is simulated time now.
        if (ici_calls >= 256) ici.retire(now_cycle()), ici_calls = 0;
    }
    /// End of the window the pending posts were issued in (windows start at multiples of it).
    uint64_t window_end() const { return (posts.front().issue / window + 1) * window; }
    uint64_t ici_post(IciPost p) override {
        // A post to the core itself uses no link and may be done within the window; without
        // hop latency there is no window. Both resolve at once.
        if (p.src == p.dst || window == 0) {
            const uint64_t done = delivery[p.src].deliver(p.dst, land(p));
            deliver(p, done);
            return done;
        }
        // run_each() then runs to the end of the window and resolves it (over MPI it runs
        // window by window anyway).
        if (posts.empty() && ranks == 1) sc_core::sc_pause();
        posts.push_back(std::move(p));
        return kIciPending;
    }
    /// From the board's own context: statistics read it while another board may be current.
    uint64_t now_cycle() const {
        return static_cast<uint64_t>(context.get()->time_stamp().value() / period_ps);
    }
    const std::vector<uint32_t>& launched() const override { return launch_set; }
    SparseMemory& remote_memory(uint32_t core, bool is_hbm) override {
        return is_hbm ? *hbm[core] : *vmem[core];
    }
    RaceDetector& remote_race_detector(uint32_t core) override {
        return models[core]->race_detector();
    }
    bool stop_requested() override {
        if (!stop_due()) return false;
        // sc_start() returns once the current delta cycle ends; launch() then reports.
        sc_core::sc_pause();
        return true;
    }
    /// True (with stop_reason set) when the launch must stop: Ctrl-C or the host-time limit.
    bool stop_due() {
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
        return true;
    }
    /// Runs simulated time to `cycle` (events at `cycle` itself run in the next call); with
    /// `starve`, stops at the last event before it if nothing else is scheduled.
    void run_to(uint64_t cycle, bool starve = false) {
        if (starve && !sc_core::sc_pending_activity()) return;
        if (cycle > now_cycle())
            sc_core::sc_start(
                sc_core::sc_time(static_cast<double>((cycle - now_cycle()) * period_ps),
                                 sc_core::SC_PS),
                starve ? sc_core::SC_EXIT_ON_STARVATION : sc_core::SC_RUN_TO_TIME);
    }
    /// A launch that ended early (fault, deadlock, stop) leaves its cores as they were: none of
    /// them runs again, whatever it was waiting for, so the board can still be advanced.
    void abandon_launch() {
        for (uint32_t c : launch_set)
            if (owns(c)) modules[c]->abandon();
        posts.clear();
    }
    /// The state of each unfinished core of the launch, from every rank, in core order.
    std::string dump_unfinished() {
        std::string dump;
        for (uint32_t c : launch_set)
            if (owns(c) && !modules[c]->done()) dump += "\n  " + models[c]->dump_state();
        if (ranks == 1) return dump;
        Packer mine;
        mine.put_string(dump);
        std::string all;
        for (const auto& m : gather_all(mine)) all += Unpacker{m}.get_string();
        return all;
    }
    /// Runs the launch to its end in one process: freely until a core posts on the ICI, then
    /// to the end of that window, which resolves.
    void run_alone() {
        while (outstanding > 0 || !posts.empty()) {
            if (posts.empty())
                sc_core::sc_start();  // until every core halted, a post (sc_pause), no activity
            else
                run_to(window_end());
            bool fault = false;
            for (uint32_t c : launch_set) fault |= modules[c]->fault().has_value();
            if (fault) return;
            // A launch too long in host time, or Ctrl-C: the state dump of a deadlock.
            if (outstanding > 0 && (!stop_reason.empty() || stop_requested())) {
                faulted = true;
                throw StoppedError(fmt::format("{}{}", stop_reason, dump_unfinished()));
            }
            if (!posts.empty()) {
                if (now_cycle() >= window_end()) resolve_window(std::exchange(posts, {}));
                continue;
            }
            if (outstanding > 0 && !sc_core::sc_pending_activity()) {
                faulted = true;
                throw DeadlockError(
                    fmt::format("deadlock at cycle {}: every running core waits "
                                "on a flag that nothing can raise{}",
                                now_cycle(), dump_unfinished()));
            }
        }
    }
    /// Runs the launch to its end on every rank, window by window (conservative
    /// synchronisation, lookahead = one hop): each window every rank says where it stands and
    /// sends its posts, all resolve them, and the next window starts at the earliest event
    /// of any rank. Returns with every rank's cores halted, or with a fault on some rank.
    void run_ranks() {
        uint64_t end = now_cycle();  // of the window that just ran
        uint64_t windows = 0, posted = 0;
        const auto host_start = std::chrono::steady_clock::now();
        std::chrono::steady_clock::duration in_gather{};
        for (;;) {
            Packer head;
            const uint64_t next =
                sc_core::sc_pending_activity()
                    ? now_cycle() + static_cast<uint64_t>(
                                        sc_core::sc_time_to_pending_activity().value() / period_ps)
                    : kNever;
            bool fault = false;
            for (uint32_t c : launch_set) fault |= owns(c) && modules[c]->fault().has_value();
            const bool stop = outstanding > 0 && stop_due();
            head.put(next);
            head.put(uint64_t(outstanding));
            head.put(uint8_t(fault));
            head.put_string(stop ? stop_reason : std::string());
            // Each rank gets every header but the payloads of its own cores' posts only: an
            // all-to-all, where an allgather would send every payload to every rank.
            std::vector<std::vector<uint8_t>> out(static_cast<size_t>(ranks));
            for (int r = 0; r < ranks; ++r) {
                if (r == rank) continue;  // this rank keeps its own posts
                Packer m = head;
                pack_posts(m, r);
                out[size_t(r)] = std::move(m.bytes);
            }
            out[size_t(rank)] = std::move(head.bytes);
            const auto gather_start = std::chrono::steady_clock::now();
            const auto msgs = sim::Cluster::alltoallv(out);
            in_gather += std::chrono::steady_clock::now() - gather_start;
            ++windows;
            uint64_t g_next = kNever, g_out = 0;
            bool g_fault = false;
            std::string g_stop;
            std::vector<IciPost> all;
            for (int r = 0; r < ranks; ++r) {
                Unpacker u{msgs[size_t(r)]};
                g_next = std::min(g_next, u.get<uint64_t>());
                g_out += u.get<uint64_t>();
                g_fault |= u.get<uint8_t>() != 0;
                const std::string why = u.get_string();
                if (g_stop.empty()) g_stop = why;
                if (r == rank)
                    for (IciPost& p : posts) all.push_back(std::move(p));
                else
                    unpack_posts(u, all);
            }
            posts.clear();
            if (g_fault) return;
            if (!g_stop.empty()) {
                faulted = true;
                throw StoppedError(fmt::format("{}{}", g_stop, dump_unfinished()));
            }
            posted += all.size();
            // A rank stops where its last event was (so the launch ends where it would in one
            // process); while the launch goes on, all of them are at the window's end.
            if (g_out == 0 && all.empty()) {
                // What synchronising cost this launch: how many windows, and the host time
                // spent in the exchange (waiting for the slowest rank included).
                const auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
                TPU_LOG(Debug, "board",
                        "rank {}: {} windows, {} ICI posts, {:.6f} of {:.6f} host s "
                        "in the exchange",
                        rank, windows, posted, secs(in_gather),
                        secs(std::chrono::steady_clock::now() - host_start));
                return;
            }
            run_to(end);
            // Resolving wakes the posts' cores at once: the next window starts now.
            if (!all.empty()) {
                g_next = now_cycle();
                resolve_window(std::move(all));
            }
            if (g_next == kNever) {
                faulted = true;
                throw DeadlockError(
                    fmt::format("deadlock at cycle {}: every running core waits "
                                "on a flag that nothing can raise{}",
                                now_cycle(), dump_unfinished()));
            }
            end = (g_next / window + 1) * window;
            run_to(end, true);
        }
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
    sc_core::sc_report_handler::set_handler(report_to_stderr);
}

Board::~Board() {
    // The blocks are torn down in their own context, which goes last (SimContext then makes the
    // process's own context current); a board that was current stays current.
    sc_core::sc_simcontext* const current = sc_core::sc_curr_simcontext;
    const bool mine = current == m_impl->context.get();
    m_impl->context.enter();
    m_impl.reset();
    if (!mine) SimContext::set(current);
}

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
    m_impl->context.enter();  // the target, and the initiator bound to it next, live there
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
bool Board::owns(uint32_t core) const {
    check_core(core, num_cores());
    return m_impl->owns(core);
}
int Board::rank_of(uint32_t core) const {
    check_core(core, num_cores());
    return m_impl->rank_of(core);
}
void Board::fetch(uint32_t core, bool hbm, uint64_t addr, std::span<uint8_t> out) {
    check_core(core, num_cores());
    if (m_impl->owns(core)) (hbm ? *m_impl->hbm[core] : *m_impl->vmem[core]).read(addr, out);
    if (m_impl->ranks > 1) sim::Cluster::broadcast(m_impl->rank_of(core), out);
}
uint64_t Board::digest(uint32_t core, uint64_t addr, uint64_t bytes, uint64_t h) {
    check_core(core, num_cores());
    if (m_impl->owns(core)) {
        std::vector<uint8_t> buf(std::min<uint64_t>(bytes, 1 << 20));
        for (uint64_t at = 0; at < bytes; at += buf.size()) {
            const auto span = std::span(buf).first(std::min<uint64_t>(buf.size(), bytes - at));
            m_impl->hbm[core]->read(addr + at, span);
            for (uint8_t b : span) h = (h ^ b) * 1099511628211ull;
        }
    }
    if (m_impl->ranks > 1)
        sim::Cluster::broadcast(m_impl->rank_of(core),
                                std::span(reinterpret_cast<uint8_t*>(&h), sizeof h));
    return h;
}

void Board::sync_stats() {
    Impl& im = *m_impl;
    if (im.ranks == 1) return;
    Packer mine;
    for (uint32_t c = 0; c < num_cores(); ++c) {
        if (!im.owns(c)) continue;
        std::vector<uint64_t> counters;
        std::vector<double> formulas;
        im.core_groups[c]->snapshot(counters, formulas);
        mine.put(c);
        mine.put_bytes({reinterpret_cast<const uint8_t*>(counters.data()), counters.size() * 8});
        mine.put_bytes({reinterpret_cast<const uint8_t*>(formulas.data()), formulas.size() * 8});
    }
    for (const auto& msg : gather_all(mine)) {
        Unpacker u{msg};
        while (!u.done()) {
            const auto c = u.get<uint32_t>();
            const auto cb = u.get_bytes(), fb = u.get_bytes();
            std::vector<uint64_t> counters(cb.size() / 8);
            std::vector<double> formulas(fb.size() / 8);
            std::memcpy(counters.data(), cb.data(), cb.size());
            std::memcpy(formulas.data(), fb.data(), fb.size());
            if (!im.owns(c)) im.core_groups[c]->mirror(counters, formulas);
        }
    }
}
double Board::now_seconds() const {
    // From cycles at the exact period: SystemC's step is the period rounded to whole ps.
    return m_impl->cfg.clock().seconds(double(now_cycle()));
}

void Board::advance(uint64_t cycles) {
    if (cycles == 0) return;
    m_impl->context.enter();
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

    m_impl->context.enter();
    // The core processes must have run their initialisation (waiting for a launch) before a
    // launch can notify them.
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
        im.delivery[c].start_at(rung);
        if (!im.owns(c)) continue;  // another rank simulates it
        const uint64_t fetched = costs ? im.fetch_program(c, rung) : rung;
        const uint64_t first = fetched + (costs ? im.cfg.core.first_instr_cycles : 0);
        im.trace_launch(int(c), "imem_fetch", rung, fetched);
        im.trace_launch(int(c), "first_instr", fetched, first);
        im.models[c]->start(first, args[i]);
    }
    im.outstanding = 0;
    for (uint32_t c : set)
        if (im.owns(c)) im.modules[c]->launch(), ++im.outstanding;
    TPU_LOG(Info, "board", "launch on {} core(s) at cycle {}", set.size(), res.start_cycle);
    try {
        if (im.ranks == 1)
            im.run_alone();
        else
            im.run_ranks();
    } catch (...) {
        im.abandon_launch();  // a deadlock or a stop
        throw;
    }
    // The lowest faulting core's fault, and every core's halt, on every rank.
    std::optional<FaultInfo> fault;
    for (uint32_t c : set)
        if (im.owns(c) && im.modules[c]->fault()) {
            fault = *im.modules[c]->fault();
            break;
        }
    std::vector<uint64_t> ends(num_cores(), 0);
    for (uint32_t c : set)
        if (im.owns(c)) ends[c] = im.models[c]->local_cycle();
    if (im.ranks > 1) {
        Packer mine;
        mine.put(uint8_t(fault.has_value()));
        if (fault) pack_fault(mine, *fault);
        for (uint32_t c : set)
            if (im.owns(c)) {
                mine.put(c);
                mine.put(ends[c]);
                pack_core_stats(mine, im.models[c]->stats());
            }
        for (const auto& msg : gather_all(mine)) {
            Unpacker u{msg};
            if (u.get<uint8_t>()) {
                FaultInfo f = unpack_fault(u);
                if (!fault || f.core < fault->core) fault = std::move(f);
            }
            while (!u.done()) {
                const auto c = u.get<uint32_t>();
                ends[c] = u.get<uint64_t>();
                CoreStats st = unpack_core_stats(u);
                if (!im.owns(c)) im.models[c]->mirror_stats(std::move(st));
            }
        }
    }
    if (fault) {
        im.faulted = true;
        im.abandon_launch();
        throw DeviceFault(*fault);
    }
    uint64_t last_halt = res.start_cycle;
    for (uint32_t c : set) {
        const uint64_t end = ends[c];
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
