// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "hw/mem/hbm_config.h"
#include "hw/mem/hbm_timing.h"

namespace tpu::hw {

/// One column access (one burst) of a request, decoded to its bank. The column does not change
/// the timing, so it is not carried.
struct HbmColumnAccess {
    uint32_t bank_group = 0;  ///< bank group within the pseudo-channel
    uint32_t bank = 0;        ///< bank within the bank group
    uint64_t row = 0;         ///< row within the bank
};

/// Where a byte lives: see hw/README.md, "HBM", for the bit layout.
struct HbmLocation {
    uint32_t pseudo_channel = 0;  ///< 0 .. channels x pseudo_channels - 1
    uint32_t channel = 0;         ///< physical channel (pseudo_channel % channels)
    uint64_t local = 0;           ///< byte offset inside the pseudo-channel
    HbmColumnAccess bank;         ///< bank group, bank and row of the byte's burst
    uint32_t column = 0;          ///< burst index within the row
};

/// The HBM address map. Granules of `interleave_bytes` rotate over every pseudo-channel; inside
/// a pseudo-channel consecutive bursts rotate over the bank groups, then walk the columns of a
/// row, then the banks of a group, then the rows.
class HbmAddressMap {
public:
    /// Geometry from `cfg` (validated: a burst fits in a granule and in a row).
    explicit HbmAddressMap(const HbmConfig& cfg);
    /// Decodes byte address `addr`. Inline: the DMA path decodes every granule, and an
    /// out-of-line call returns the location through memory, which the caller then waits on.
    HbmLocation decode(uint64_t addr) const;
    /// Bank group, bank and row of burst number `burst` (local byte address / burst_bytes())
    /// inside a pseudo-channel.
    HbmColumnAccess bank_of_burst(uint64_t burst) const {
        HbmColumnAccess b;
        b.bank_group = static_cast<uint32_t>(burst & (m_bank_groups - 1));
        burst >>= m_sh_groups + m_sh_cols;
        b.bank = static_cast<uint32_t>(burst & (m_banks_per_group - 1));
        b.row = burst >> m_sh_banks;
        return b;
    }
    /// The burst number after the last one of `burst`'s bank row (bank groups x columns).
    uint64_t next_row_burst(uint64_t burst) const {
        const uint32_t sh = m_sh_groups + m_sh_cols;
        return ((burst >> sh) + 1) << sh;
    }
    /// Granule number (address / interleave_bytes()) of local granule `k` of pseudo-channel
    /// `pc`: the inverse of decode() at granule resolution. The hash only mixes in bits of `k`
    /// (granule / P and granule / P^2), so pc = j XOR k mod P XOR (k / P) mod P for the granule
    /// k x P + j, and j follows from pc and k.
    uint64_t granule_of(uint32_t pc, uint64_t k) const {
        const uint64_t mask = m_pcs - 1;
        uint64_t j = pc;
        if (m_xor) j ^= (k & mask) ^ ((k >> m_sh_pcs) & mask);
        return (k << m_sh_pcs) | j;
    }
    /// The pseudo-channel of granule number `granule` (address / interleave_bytes()), as decode()
    /// finds it; its local granule number is granule / pseudo_channels().
    uint32_t pseudo_channel_of_granule(uint64_t granule) const {
        const uint64_t pc_mask = m_pcs - 1;
        uint64_t pc = granule & pc_mask;
        if (m_xor) {
            pc ^= (granule >> m_sh_pcs) & pc_mask;
            pc ^= (granule >> (2 * m_sh_pcs)) & pc_mask;
        }
        return static_cast<uint32_t>(pc);
    }
    /// Bursts in one bank row across the bank groups (the span next_row_burst() steps over).
    uint64_t bursts_per_bank_row() const { return uint64_t(m_bank_groups) << m_sh_cols; }
    /// Bytes one column command moves on a pseudo-channel.
    uint32_t burst_bytes() const { return m_burst_bytes; }
    /// Pseudo-channels in total (channels x pseudo_channels).
    uint32_t pseudo_channels() const { return m_pcs; }
    /// Bytes per interleave granule.
    uint32_t interleave_bytes() const { return m_interleave; }

private:
    uint32_t m_pcs, m_channels, m_interleave, m_burst_bytes, m_bursts_per_row;
    uint32_t m_bank_groups, m_banks_per_group;
    bool m_xor = true;  ///< address_hash == "xor"
    /// log2 of the geometry (every size is a power of two, checked by the config), so decode
    /// shifts and masks instead of dividing: it runs once per burst.
    uint32_t m_sh_interleave, m_sh_pcs, m_sh_burst, m_sh_groups, m_sh_cols, m_sh_banks;
};

inline HbmLocation HbmAddressMap::decode(uint64_t addr) const {
    HbmLocation l;
    const uint64_t granule = addr >> m_sh_interleave, pc_mask = m_pcs - 1;
    uint64_t pc = granule & pc_mask;
    if (m_xor) {
        // XOR with the next two groups of granule bits: for fixed higher bits this permutes the
        // P granules of a group (so the map stays one-to-one), and a stride of any power of two
        // granules still visits every pseudo-channel.
        pc ^= (granule >> m_sh_pcs) & pc_mask;
        pc ^= (granule >> (2 * m_sh_pcs)) & pc_mask;
    }
    l.pseudo_channel = static_cast<uint32_t>(pc);
    l.channel = l.pseudo_channel & (m_channels - 1);
    l.local = ((granule >> m_sh_pcs) << m_sh_interleave) | (addr & (m_interleave - 1));
    // Bank groups rotate fastest: a stream then alternates groups and its column commands are
    // CCD_S apart (one burst of data) instead of CCD_L (two on the default board).
    const uint64_t burst = l.local >> m_sh_burst;
    l.bank = bank_of_burst(burst);
    l.column = static_cast<uint32_t>((burst >> m_sh_groups) & (m_bursts_per_row - 1));
    return l;
}

/// Busy-until timing of one pseudo-channel's controller and banks: FCFS at burst granularity,
/// open or closed page, refresh. Every request costs O(its bursts) and no clock runs; the
/// cycle-stepped reference (hw/reference/hbm_ref.h) proves it exact. Times are HBM cycles (tCK).
class Hbm2PseudoChannel {
public:
    /// What the pseudo-channel did, for reports and tests.
    struct Counters {
        uint64_t bursts = 0;      ///< column commands (RD/WR)
        uint64_t row_hits = 0;    ///< bursts that found their row open
        uint64_t activates = 0;   ///< ACT commands
        uint64_t precharges = 0;  ///< explicit PRE commands (auto-precharges and PREA excluded)
        uint64_t refreshes = 0;   ///< REF commands
        /// Requests served as row-hit runs (a host-speed shortcut with no timing meaning; for
        /// tests that prove both paths are taken).
        uint64_t runs = 0;
        /// Of those, runs served in a gap-free stretch in closed form (also a host-speed
        /// shortcut, for tests).
        uint64_t paced_runs = 0;
        /// Stretches of whole granules after a head (access_granules(); a host-speed shortcut,
        /// for tests).
        uint64_t stretches = 0;
    };

    /// An idle pseudo-channel with every bank closed at tCK 0. `batch_runs` = false turns the
    /// row-hit run shortcut off (see access()), for tests that compare the two.
    explicit Hbm2PseudoChannel(const HbmConfig& cfg, bool batch_runs = true);
    /// Serves a request of `bursts` (all reads or all writes) that reaches the controller at tCK
    /// `arrive`, after every request passed before it; returns the tCK at which its last data
    /// beat has moved (the end of its last burst on the data bus).
    ///
    /// A *row-hit run* is served without the per-burst row logic, with identical results: the
    /// bursts share one bank index and row, their bank groups rotate (g0, g0 + 1, ... mod the
    /// group count, as consecutive addresses do), the page policy is open, each bank they
    /// touch has that row open, they fit in the queue and no refresh falls due before the last
    /// one is prepared. Then no burst activates, precharges or refreshes, so a burst is prepared
    /// at max(row cursor, its admission) and the row logic changes nothing else.
    uint64_t access(uint64_t arrive, std::span<const HbmColumnAccess> bursts, bool write);
    /// access() of `count` bursts at consecutive burst numbers of one bank's row, the first
    /// `first` (its bank group first): the form in which Hbm2Timing sends a granule's piece, so
    /// a row-hit run needs neither the bursts listed nor the pattern checked.
    uint64_t access_run(uint64_t arrive, const HbmColumnAccess& first, uint32_t count, bool write);
    /// A request of access_run()'s form.
    struct Run {
        uint64_t arrive;        ///< tCK it reaches the controller
        HbmColumnAccess first;  ///< its first burst
        uint32_t count;         ///< bursts
    };
    /// access_run() of each of `runs` in order; returns the latest end of data (0 if none).
    /// Consecutive row-hit runs of one bank row are served with the state held in registers.
    /// A run that opens its row is left in `runs` with its row-opening bursts removed.
    uint64_t access_runs(std::span<Run> runs, bool write);
    /// access_runs() of `src.size()` runs of `count` bursts each, run i at local burst numbers
    /// [src.burst(i), src.burst(i) + count), arriving at src.arrival(i): the whole granules a
    /// transfer sends to one pseudo-channel. `count` is a power of two no larger than a bank row
    /// of `map` and divides every src.burst(i), so no run crosses a bank row; the burst numbers
    /// grow, the arrivals do not decrease, src.latest(i) is no earlier than src.arrival(i) (a
    /// bound read instead of the arrival where it is early enough), and src.row_end(i) is the
    /// first run after i in another bank row. The runs of a bank row need not be adjacent: the
    /// timing does not depend on the column. Defined in hbm2.cpp, for Hbm2Timing.
    ///
    /// With the open page, G <= count <= Q and CCD_L <= G x step (step = max(CCD_S, BL/2); G
    /// bank groups, Q = queue_bursts) each bank row is served as a *head*, its first burst in
    /// each bank group (groups 0 .. G - 1: count is a multiple of G), burst by burst as serve()
    /// does, which opens the row where needed, then a *stretch* of the rest in closed form.
    /// Why the stretch equals serve() burst by burst, after a head with no refresh in it:
    ///  - every burst finds its row open and nothing opens, closes or refreshes a row, so the
    ///    row logic prepares it at max(cursor, its admission);
    ///  - its group last issued G bursts before it, at least (G - 1) steps before the previous
    ///    column, so CCD_L allows the previous column + step; so do its bank's ACT + RCD and the
    ///    turnaround, which bounded the head, and the data bus;
    ///  - a burst is admitted at max(arrival, slot + 1), the slot holding the column of the
    ///    burst Q before it, which for any burst of run j is at or before the burst before run
    ///    j (count <= Q); admission and the cursor are running maxima, so they stay at or
    ///    before the previous column (by induction from the head, whose cursor is an ACT + 1 or
    ///    a prepared cycle), and run j's first column is max(previous column + step, arrival_j),
    ///    the others one step apart. Where latest[j] <= previous column + step the arrival is
    ///    not read;
    ///  - after run j the cursor is max(cursor, arrival_j, its last burst's slot + 1). While
    ///    that is before the due cycle (surely so where run j's first column is) no refresh
    ///    falls due; where it is not, the stretch ends and the next G bursts are a head again,
    ///    in whose steps the refresh happens (a refresh among a head closes rows it opened, so
    ///    another head follows).
    /// At the end of a stretch, the queue ring's newest Q entries, each group's last column and
    /// its bank's PRE bound, the admission (by the last run's arrival and slot: both grow with
    /// the burst number) and the cursor follow from the columns.
    template <class Source>
    uint64_t access_granules(const Source& src, uint32_t count, const HbmAddressMap& map,
                             bool write);
    /// Counters since construction.
    const Counters& counters() const { return m_counters; }
    /// Banks of the pseudo-channel (bank_groups x banks).
    size_t banks() const { return m_banks.size(); }
    /// Row conflicts of bank `i` (group * banks + bank): bursts that found another row open.
    uint64_t bank_conflicts(size_t i) const { return m_banks.at(i).conflicts; }

private:
    using Tick = int64_t;
    static constexpr Tick kNever = -(int64_t(1) << 40);  ///< "long ago": no constraint

    struct Bank {
        int64_t open_row = -1;    ///< planned open row, -1 when closed (or closing)
        Tick act = kNever;        ///< last ACT
        Tick act_ready = 0;       ///< earliest next ACT (RC, RP, RFC)
        Tick pre_ready = kNever;  ///< earliest PRE of the open row (RAS, RTP, WR)
        Tick closed_at = kNever;  ///< last PRE or auto-precharge
        uint64_t conflicts = 0;   ///< bursts that found another row open (cost a PRE)
    };

    /// Performs the refresh that is due (PREA if a bank is open, then REF).
    void refresh();
    /// The controller's state while a request's bursts last, held in registers (so a burst
    /// does not wait for the previous one's stores).
    struct Regs {
        Tick admit, cursor, col, last_act, due;  ///< m_admit .. m_last_act; m_due (or never)
        /// The next column command's bound by CCD_S, the turnaround and the data bus: for the
        /// request's first burst max(last column + CCD_S, end of data - latency, turnaround),
        /// then the previous column + step (same direction; the turnaround bounded the first).
        Tick next;
        Tick step, pre_after;  ///< max(CCD_S, BL/2); a column command to its bank's PRE
        size_t qidx;           ///< m_queue_idx
        uint32_t act_idx;      ///< m_act_idx
        uint64_t bursts = 0, hits = 0, pres = 0;  ///< counted so far
    };
    /// The state for a request of `write` bursts.
    Regs load(bool write) const;
    /// Stores `r` after a request of `write` bursts; returns its end of data.
    Tick store(const Regs& r, bool write);
    /// One burst of a request (no auto-precharge): admission, row logic, column command.
    /// Returns false, having issued only the row commands before the due cycle, when a refresh
    /// falls due first: then refresh_first() and the same burst again.
    bool step(Regs& r, const HbmColumnAccess& req, Tick arrive);
    /// The refresh that fell due in step(), from its row cursor, last column command and
    /// admission so far; returns the row cursor after it.
    Tick refresh_first(Tick cursor, Tick last_col, Tick admit);
    /// access_granules()' closed form after a head: runs j .. end - 1 of one bank row of
    /// `bank`, the first from burst `off` on, up to the next refresh, from and into `r`.
    /// Advances j and off past the runs served.
    template <class Source>
    void serve_stretch(Regs& r, size_t& j, uint32_t& off, size_t end, uint32_t bank, uint32_t count,
                       const Source& src);
    /// After refresh(): performs at once the refreshes that fall due while the banks stay idle
    /// until a burst admitted at `admit` (long gaps between requests cost O(banks), not
    /// O(gap / REFI x banks)).
    void skip_idle_refreshes(Tick admit);
    /// The row-hit run shortcut (see access()): serves the longest prefix of `runs` that are
    /// row-hit runs of runs[0]'s bank row, sets `done` to the last one's end of data and returns
    /// how many it served; 0 (nothing changed) when the first does not qualify.
    size_t try_runs(std::span<const Run> runs, bool write, Tick& done);
    /// access_run() of `run` when try_runs() has declined it: its row-opening bursts burst by
    /// burst, the rest as a row-hit run where it qualifies.
    uint64_t serve_run(const Run& run, bool write);
    /// The per-burst path.
    uint64_t serve(uint64_t arrive, std::span<const HbmColumnAccess> bursts, bool write);
    Bank& bank(const HbmColumnAccess& b) { return m_banks[b.bank_group * m_bpg + b.bank]; }

    /// Runs longer than this, or more bank groups, take the per-burst path (try_runs keeps a
    /// bit and two times per group on the stack; a granule of the default board is 8 bursts).
    static constexpr uint32_t kMaxRun = 64;

    HbmTiming m_t;
    bool m_closed_page;
    bool m_batch_runs;
    uint32_t m_bpg;
    uint32_t m_groups;  ///< bank groups
    Tick m_bl2;         ///< tCK of data per burst (burst_length / 2, at least 1)
    std::vector<Bank> m_banks;
    std::vector<Tick> m_last_col_bg;
    std::vector<Tick> m_queue;  ///< column cycle of the last queue_bursts bursts (ring)
    size_t m_queue_idx = 0;     ///< m_queue slot of the next burst (bursts served, mod its size)
    std::array<Tick, 4> m_acts{kNever, kNever, kNever, kNever};  ///< last four ACTs (ring)
    uint32_t m_act_idx = 0;
    Tick m_last_act = kNever;
    Tick m_row_cursor = 0;  ///< first cycle the row logic may look at the next burst
    Tick m_admit = 0;       ///< admission cycle of the last burst
    Tick m_last_col = kNever;
    Tick m_last_rd = kNever;
    Tick m_last_wr = kNever;
    Tick m_data_end = 0;
    Tick m_due;  ///< next refresh due (tCK); unused when refi == 0
    Counters m_counters;
    std::vector<HbmColumnAccess> m_scratch;  ///< access_run's bursts on the per-burst path
    std::vector<Run> m_runs;                 ///< access_granules' runs on the general path
};

/// "hbm2": every pseudo-channel of a core's HBM stack as an Hbm2PseudoChannel behind the
/// HbmAddressMap. A request is split at granule boundaries; each piece is served by its
/// pseudo-channel and the request completes with its last piece. Core cycles map to HBM cycles
/// through picoseconds: arrival at core cycle c is the first tCK edge n with n x tck >= c x T
/// (T = the core period in ps), and completion at tCK n is core cycle ceil(n x tck / T).
class Hbm2Timing : public HbmTimingModel {
public:
    explicit Hbm2Timing(const BoardConfig& cfg);
    /// peak_bytes_per_cycle() of a stack of `cfg`.
    static double peak(const BoardConfig& cfg);
    uint64_t access(uint64_t arrive, uint64_t addr, uint32_t bytes, bool write) override;
    /// The transfer's pieces (runs of one bank's row, as access() cuts them) gathered per
    /// pseudo-channel, then each pseudo-channel's in order: the pseudo-channels share nothing,
    /// so this equals access() request by request, and a pseudo-channel's runs are served one
    /// after the other while its state is at hand.
    uint64_t access_rows(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                         uint64_t stride, uint32_t chunk, uint32_t port, bool write) override;
    double peak_bytes_per_cycle() const override { return m_peak; }
    /// The address map in use.
    const HbmAddressMap& address_map() const { return m_map; }
    /// Counters summed over every pseudo-channel.
    Hbm2PseudoChannel::Counters counters() const;
    /// Row conflicts of bank index `i`, summed over the pseudo-channels.
    uint64_t bank_conflicts(size_t i) const;
    /// Transfers that access_rows() served per pseudo-channel without cutting them by address
    /// (a host-speed shortcut with no timing meaning; for tests that prove it is taken).
    uint64_t whole_granule_transfers() const { return m_whole_granule_transfers; }
    /// Transfers of rows of whole granules that access_rows() served per pseudo-channel from
    /// a list of their granules (a host-speed shortcut with no timing meaning; for tests).
    uint64_t granule_list_transfers() const { return m_granule_list_transfers; }
    void register_stats(sim::StatGroup& group) override;
    /// register_stats() of the model `model()` returns when a statistic is read (a member of an
    /// HbmReplicaGroup reads the model that holds its state then).
    static void register_stats_of(sim::StatGroup& group, std::function<const Hbm2Timing&()> model);

private:
    /// Exact division by a constant through its reciprocal, for dividends below 2^kBits: each
    /// request converts two times between clocks, and a hardware division costs more than a
    /// piece's bookkeeping.
    class Divider {
    public:
        static constexpr uint32_t kBits = 48;  ///< dividends below 2^48 (78 hours of tCK)
        explicit Divider(uint64_t d);
        uint64_t divisor() const { return m_d; }
        /// floor(x / divisor()) for x < 2^kBits.
        uint64_t quotient(uint64_t x) const {
            return static_cast<uint64_t>(((unsigned __int128)x * m_magic) >> m_shift);
        }

    private:
        uint64_t m_d, m_magic;
        uint32_t m_shift;
    };
    /// ceil(x * m / d).
    static uint64_t mul_div_up(uint64_t x, uint64_t m, const Divider& d);

    HbmAddressMap m_map;
    uint64_t m_core_ps, m_tck_ps;
    Divider m_to_tck, m_to_core;  ///< by tck_ps, by the core period
    double m_peak;
    std::vector<Hbm2PseudoChannel> m_pcs;
    std::vector<HbmColumnAccess> m_scratch;  ///< bursts of a piece that spans two rows
    /// access_rows: runs per pseudo-channel, in request order.
    std::vector<std::vector<Hbm2PseudoChannel::Run>> m_runs;
    /// access_rows serves a pseudo-channel's runs once this many have gathered (a host-speed
    /// choice with no timing meaning: long enough for try_runs' stretches, short enough for L1).
    static constexpr size_t kRunBatch = 64;
    /// access_rows of whole granules: per group of P granules, the arrival of its last one.
    std::vector<uint64_t> m_latest;
    uint64_t m_whole_granule_transfers = 0;
    /// access_rows() of a transfer that is one contiguous range of whole granules, each inside
    /// one request; returns the latest end of data (tCK). See access_rows().
    uint64_t whole_granules(uint64_t start, uint64_t addr, uint64_t bytes, uint32_t chunk,
                            uint32_t port, bool write);
    /// A granule of a transfer, for one pseudo-channel: its local granule number and arrival.
    struct Granule {
        uint64_t local;   ///< local granule number (granule / pseudo-channels)
        uint64_t arrive;  ///< tCK its request reaches the controller
    };
    /// access_rows: per pseudo-channel, the granules of a transfer of rows of whole granules.
    std::vector<std::vector<Granule>> m_granules;
    uint64_t m_granule_list_transfers = 0;
    /// access_rows() of rows of whole granules, each inside one request (rows, stride, address
    /// and request cuts on granule boundaries); returns the latest end of data (tCK).
    uint64_t granule_lists(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                           uint64_t stride, uint32_t chunk, uint32_t port, bool write);
    /// access_rows' requests in issue order: each row of `rows` (`stride` apart from `addr`) cut
    /// into requests of at most `chunk` bytes, the port moving `port` bytes a cycle from core
    /// cycle `start`; calls piece(address, bytes, arrival in tCK) for each.
    template <class Piece>
    void for_each_request(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                          uint64_t stride, uint32_t chunk, uint32_t port, Piece&& piece) const;
};

}  // namespace tpu::hw
