// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/hbm2.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "hw/board_config.h"
#include "sim/stat_names.h"
#include "sim/stats.h"

namespace tpu::hw {

namespace {

/// Bytes one burst moves on one pseudo-channel: its share of the channel's bus times the beats.
uint32_t burst_bytes_of(const HbmConfig& c) {
    return c.bus_bits / c.pseudo_channels * c.burst_length / 8;
}

/// The largest argument, as a chain of two-operand maxima: GCC turns an initializer-list
/// std::max into a loop over a stack array, which costs more than the rest of a burst's steps.
template <class T, class... More>
T max_of(T a, More... more) {
    ((a = std::max(a, T(more))), ...);
    return a;
}

/// dst[i] = first + i x step for i < n, eight at a time where it can: GCC vectorises a loop of
/// a known count at -O2, not one of any count. The eight values advance by additions (a vector
/// multiplication of 64-bit integers costs several times an addition), the rest one by one.
void fill_steps(int64_t* dst, size_t n, int64_t first, int64_t step) {
    size_t i = 0;
    if (n >= 8) {
        int64_t v[8];
        for (size_t u = 0; u < 8; ++u) v[u] = first + int64_t(u) * step;
        const int64_t inc = 8 * step;
        for (; i + 8 <= n; i += 8)
            for (size_t u = 0; u < 8; ++u) {
                dst[i + u] = v[u];
                v[u] += inc;
            }
    }
    for (int64_t x = first + int64_t(i) * step; i < n; ++i, x += step) dst[i] = x;
}

/// The column commands of n <= q evenly spaced bursts into a queue ring of q slots from slot
/// `from` on: ring[(from + i) mod q] = first + i x step, in two straight pieces (no wrap test
/// per burst).
void fill_ring(int64_t* ring, size_t q, size_t from, size_t n, int64_t first, int64_t step) {
    const size_t n1 = std::min(n, q - from);
    fill_steps(ring + from, n1, first, step);
    fill_steps(ring, n - n1, first + int64_t(n1) * step, step);
}

}  // namespace

/// ceil(x * m / d) without overflow: a multiplication by d's reciprocal when x m + d - 1 is
/// below 2^48 (always, in practice: a division costs more than the rest of a piece's
/// bookkeeping), a 128-bit division otherwise.
uint64_t Hbm2Timing::mul_div_up(uint64_t x, uint64_t m, const Divider& d) {
    // The bound checked on the 128-bit product: testing x against 2^48 / m would divide.
    const unsigned __int128 y = (unsigned __int128)x * m + d.divisor() - 1;
    if (y < (unsigned __int128)1 << Divider::kBits) return d.quotient(uint64_t(y));
    return static_cast<uint64_t>(y / d.divisor());
}

Hbm2Timing::Divider::Divider(uint64_t d) : m_d(d) {
    // m = ceil(2^(48 + l) / d) with 2^l >= d: m d lies in [2^(48 + l), 2^(48 + l) + d - 1], so
    // (Granlund and Montgomery, "Division by invariant integers using multiplication", 4.2)
    // floor(x m / 2^(48 + l)) = floor(x / d) for every x < 2^48; x m < 2^98 fits 128 bits.
    const uint32_t l = static_cast<uint32_t>(std::bit_width(d - 1));
    m_shift = kBits + l;
    m_magic = static_cast<uint64_t>((((unsigned __int128)1 << m_shift) + d - 1) / d);
}

// ---- address map -------------------------------------------------------------------------------

HbmAddressMap::HbmAddressMap(const HbmConfig& cfg)
    : m_pcs(cfg.channels * cfg.pseudo_channels),
      m_channels(cfg.channels),
      m_interleave(cfg.interleave_bytes),
      m_burst_bytes(burst_bytes_of(cfg)),
      m_bursts_per_row(cfg.row_bytes / burst_bytes_of(cfg)),
      m_bank_groups(cfg.bank_groups),
      m_banks_per_group(cfg.banks_per_group),
      m_xor(cfg.address_hash == "xor"),
      m_sh_interleave(std::countr_zero(m_interleave)),
      m_sh_pcs(std::countr_zero(m_pcs)),
      m_sh_burst(std::countr_zero(m_burst_bytes)),
      m_sh_groups(std::countr_zero(m_bank_groups)),
      m_sh_cols(std::countr_zero(m_bursts_per_row)),
      m_sh_banks(std::countr_zero(m_banks_per_group)) {
    for (uint32_t v : {m_pcs, m_channels, m_interleave, m_burst_bytes, m_bursts_per_row,
                       m_bank_groups, m_banks_per_group})
        if (!std::has_single_bit(v))
            throw std::invalid_argument("HBM geometry must be powers of two");
}

// ---- one pseudo-channel
// --------------------------------------------------------------------------

Hbm2PseudoChannel::Hbm2PseudoChannel(const HbmConfig& cfg, bool batch_runs)
    : m_t(cfg.timing),
      m_closed_page(cfg.page_policy == "closed"),
      m_batch_runs(batch_runs),
      m_bpg(cfg.banks_per_group),
      m_groups(cfg.bank_groups),
      m_bl2(std::max<Tick>(1, cfg.burst_length / 2)),
      m_banks(size_t(cfg.bank_groups) * cfg.banks_per_group),
      m_last_col_bg(cfg.bank_groups, kNever),
      m_queue(cfg.queue_bursts, kNever),
      m_due(cfg.timing.refi) {}

void Hbm2PseudoChannel::refresh() {
    // The row logic stops at the due cycle; the controller waits until every prepared burst has
    // issued its column command (the cycle after the last one), precharges all open banks with
    // one PREA once each may close, and issues REF once every bank is idle.
    const Tick gate = std::max({m_due, m_row_cursor, m_last_col + 1});
    Tick prea = gate;
    bool any_open = false;
    for (const Bank& b : m_banks) {
        // A bank that auto-precharges after the gate is still open until then and holds PREA.
        prea = std::max(prea, b.closed_at);
        if (b.open_row >= 0) {
            any_open = true;
            prea = std::max(prea, b.pre_ready);
        }
    }
    Tick ref = gate;
    if (any_open) {
        for (Bank& b : m_banks) {
            if (b.open_row < 0) continue;
            b.open_row = -1;
            b.closed_at = prea;
            b.act_ready = std::max(b.act_ready, prea + Tick(m_t.rp));
        }
        ref = prea + 1;
    }
    for (const Bank& b : m_banks) ref = std::max(ref, b.act_ready);
    for (Bank& b : m_banks) b.act_ready = std::max(b.act_ready, ref + Tick(m_t.rfc));
    m_row_cursor = ref + 1;
    // The next refresh falls due REFI after this REF: a late refresh is not made up, so the
    // row logic always gets REFI - RFC cycles after a refresh and cannot starve.
    m_due = ref + m_t.refi;
    ++m_counters.refreshes;
}

void Hbm2PseudoChannel::skip_idle_refreshes(Tick admit) {
    // Right after a refresh every bank is closed, may activate RFC after the REF, and the row
    // cursor and the last column command are before the next due cycle. A burst admitted at
    // or after that cycle cannot act before it, so that refresh happens too, and finds the same
    // situation: its gate is its due cycle (cursor, columns and RP all earlier, nothing open),
    // and every bank's earliest ACT (RFC after the previous REF, RFC < REFI) is earlier too, so
    // it issues at its due cycle. So the n refreshes due at or before `admit` issue at
    // due, due + REFI, ..., and only the last one's state remains.
    if (m_t.refi == 0 || admit < m_due) return;
    const Tick n = (admit - m_due) / Tick(m_t.refi) + 1;
    const Tick ref = m_due + (n - 1) * Tick(m_t.refi);
    for (Bank& b : m_banks) b.act_ready = std::max(b.act_ready, ref + Tick(m_t.rfc));
    m_row_cursor = ref + 1;
    m_due = ref + m_t.refi;
    m_counters.refreshes += uint64_t(n);
}

size_t Hbm2PseudoChannel::try_runs(std::span<const Run> runs, bool write, Tick& done) {
    // Why this equals serve() burst by burst, run after run:
    // (a) every burst finds its row open (checked below) and nothing in the runs opens or closes
    //     a row, so prepare() takes its Hit branch each time unless a refresh falls due first;
    // (b) column commands issue in order, each at least CCD_S >= 1 after the previous one, and
    //     fill the queue ring in order, so the slots read from m_queue_idx on are non-decreasing
    //     (kNever where no burst was yet); with count <= queue_bursts they are all from bursts
    //     before the run. Admission and the row cursor are running maxima, so burst i is
    //     prepared at max(base, slot_i + 1) with base = max(arrive, admit, cursor): the last
    //     burst's is the largest, and if it is before the due cycle no refresh intervenes;
    // (c) in the column step the ACT time of each bank and the other direction's last command
    //     are constant, and the bus term m_data_end - lat is the previous column + BL/2.
    // The state lives in locals while the runs last and is stored once at the end.
    if (runs.empty() || !m_batch_runs || m_closed_page || m_groups > kMaxRun) return 0;
    const HbmColumnAccess& row = runs[0].first;
    const size_t q = m_queue.size();
    const uint32_t gmask = m_groups - 1;
    const Tick lat = write ? m_t.wl : m_t.cl;
    const Tick turn = write ? m_last_rd + Tick(m_t.rtw) : m_last_wr + m_t.wl + m_bl2 + m_t.wtr;
    // Per bank group: whether its bank has the row open, the bound its ACT and the turnaround
    // put on every column command, and the group's last column command.
    uint64_t open = 0;
    Tick fixed[kMaxRun], group_col[kMaxRun];
    for (uint32_t g = 0; g < m_groups; ++g) {
        const Bank& b = m_banks[g * m_bpg + row.bank];
        if (b.open_row != int64_t(row.row)) continue;
        open |= uint64_t(1) << g;
        fixed[g] = std::max(b.act + Tick(m_t.rcd), turn);
        group_col[g] = m_last_col_bg[g];
    }
    const uint64_t all = m_groups == 64 ? ~uint64_t(0) : (uint64_t(1) << m_groups) - 1;
    // From the second round of bank groups on, a burst's bank allowed it CCD_L after the same
    // group's previous column and its bank's fixed bound held for that one, which is at least
    // G - 1 steps back: with CCD_L <= G x step the burst issues one step after the previous.
    const Tick step = std::max(Tick(m_t.ccd_s), m_bl2);
    const bool paced = Tick(m_t.ccd_l) <= Tick(m_groups) * step;
    size_t qidx = m_queue_idx;
    Tick admit = m_admit, cursor = m_row_cursor, col = m_last_col, data_end = m_data_end;
    Tick* const ring = m_queue.data();
    uint64_t used = 0, bursts = 0;
    size_t served = 0;
    bool steady = false;      ///< the previous run covered every group, paced (see below)
    uint32_t next_group = 0;  ///< the group after the previous run's last burst
    for (size_t ri = 0; ri < runs.size(); ++ri) {
        // (0) A gap-free stretch. After a run that covered every bank group (steady), take the
        // longest stretch of runs of one count c >= G that continue the rotation in this bank
        // row and would each issue its first column one step after the previous column. Then
        // burst o of the stretch (o = 0 .. m c - 1) issues at col + (o + 1) step, and nothing
        // in the stretch needs more than a running maximum:
        //  - run i's base is max(cursor, admit, arrivals 1..i, slot_j + 1 for j < i), where
        //    slot_j is the column of burst n_j + c - 1 - Q, at most burst n_j - 1's (c <= Q),
        //    so slot_j + 1 <= run j's first column < run i's. So run i starts one step after
        //    the previous column iff max(cursor, admit, arrivals 1..i) <= col + ((i - 1) c + 1)
        //    step, checked run by run;
        //  - admission and the cursor are running maxima and the slots grow with the burst
        //    number, so the last run's admission is max(admit, arrivals, slot_m + 1), and if its
        //    cursor is before the due cycle no refresh falls due in the stretch (else the
        //    stretch is dropped and the runs go one by one below);
        //  - the ring holds the newest Q columns and each group's last column is among the
        //    last G bursts, all in closed form.
        if (steady && open == all && runs[ri].count >= m_groups && runs[ri].count <= q &&
            runs[ri].count <= kMaxRun) {
            const uint32_t c = runs[ri].count;
            size_t m = 0;
            uint32_t ng = next_group;
            Tick reach = std::max(admit, cursor), arr_max = kNever;
            for (size_t j = ri; j < runs.size(); ++j) {
                const Run& r = runs[j];
                if (r.count != c || r.first.bank_group != ng || r.first.bank != row.bank ||
                    r.first.row != row.row)
                    break;
                const Tick a = std::max(reach, Tick(r.arrive));
                if (a > col + Tick(m * c + 1) * step) break;
                reach = a;
                arr_max = std::max(arr_max, Tick(r.arrive));
                ng = (ng + c) & gmask;
                ++m;
            }
            const size_t total = m * c;
            Tick slot_last = kNever;  // the column of burst total - 1 - Q of the stretch
            if (total > q) {
                slot_last = col + Tick(total - q) * step;
            } else if (m > 0) {
                const size_t last = qidx + total - 1;
                slot_last = ring[last >= q ? last - q : last];
            }
            const Tick new_admit = std::max({admit, arr_max, slot_last + 1});
            const Tick new_cursor = std::max(cursor, new_admit);
            if (m > 0 && (m_t.refi == 0 || new_cursor < m_due)) {
                const Tick first_col = col + step;
                // The newest min(total, Q) bursts.
                const size_t o0 = total > q ? total - q : 0;
                fill_ring(ring, q, (qidx + o0) % q, total - o0, first_col + Tick(o0) * step, step);
                for (size_t o = total - m_groups; o < total; ++o)
                    group_col[(next_group + o) & gmask] = first_col + Tick(o) * step;
                qidx = (qidx + total) % q;
                col = first_col + Tick(total - 1) * step;
                data_end = col + lat + m_bl2;
                admit = new_admit;
                cursor = new_cursor;
                used |= all;
                bursts += total;
                served += m;
                m_counters.paced_runs += m;
                next_group = ng;
                ri += m - 1;
                continue;
            }
        }
        const Run& run = runs[ri];
        const uint32_t count = run.count, g0 = run.first.bank_group;
        if (run.first.bank != row.bank || run.first.row != row.row || count == 0 || count > q ||
            count > kMaxRun)
            break;
        // The groups the run touches: count of them from g0 on, wrapping.
        uint64_t touched = all;
        if (count < m_groups) {
            const uint64_t m = (uint64_t(1) << count) - 1;
            touched = g0 == 0 ? m : ((m << g0) | (m >> (m_groups - g0))) & all;
        }
        if ((touched & open) != touched) break;
        // (1) Admission and row logic, by (b).
        const Tick arrive = Tick(run.arrive);
        const size_t last = qidx + count - 1 < q ? qidx + count - 1 : qidx + count - 1 - q;
        const Tick base = std::max({arrive, admit, cursor});
        const Tick run_admit = std::max({arrive, admit, ring[last] + 1});
        const Tick run_cursor = std::max(cursor, run_admit);
        if (m_t.refi != 0 && run_cursor >= m_due) break;
        admit = run_admit;
        cursor = run_cursor;
        // (2) Column commands, in order; two-operand maxima (an initializer-list max is a loop
        // over a stack array here). The bus rule in column terms: the previous column +
        // max(CCD_S, BL/2) = step. Burst i is prepared at max(base, slot_i + 1), and slot_i
        // (burst i - Q's column) is at most the previous column, so only base counts, and only
        // for the first burst.
        if (steady && g0 == next_group) {
            // The previous run of this call covered every bank group and this one continues its
            // rotation, so each burst's group last issued G bursts before it, at least G - 1
            // steps before the previous column, and past its bank's fixed bound: with CCD_L <=
            // G x step every bank and the bus allow the next step, and the whole run follows in
            // closed form.
            col = std::max(col + step, base);
            const Tick first_col = col;
            fill_ring(ring, q, qidx, count, first_col, step);
            qidx = qidx + count >= q ? qidx + count - q : qidx + count;
            col = first_col + Tick(count - 1) * step;
            for (uint32_t i = count > m_groups ? count - m_groups : 0; i < count; ++i)
                group_col[(g0 + i) & gmask] = first_col + Tick(i) * step;
            data_end = col + lat + m_bl2;
            used |= touched;
            bursts += count;
            ++served;
            steady = count >= m_groups;
            next_group = (g0 + count) & gmask;
            continue;
        }
        col = std::max(std::max(col + Tick(m_t.ccd_s), data_end - lat), base) - step;
        uint32_t i = 0;
        for (; i < count && (i < m_groups || !paced); ++i) {
            const uint32_t g = (g0 + i) & gmask;
            col = std::max(col + step, std::max(fixed[g], group_col[g] + Tick(m_t.ccd_l)));
            group_col[g] = col;
            ring[qidx] = col;
            qidx = qidx + 1 == q ? 0 : qidx + 1;
        }
        for (; i < count; ++i) {
            col += step;
            group_col[(g0 + i) & gmask] = col;
            ring[qidx] = col;
            qidx = qidx + 1 == q ? 0 : qidx + 1;
        }
        data_end = col + lat + m_bl2;
        used |= touched;
        bursts += count;
        ++served;
        steady = paced && count >= m_groups;
        next_group = (g0 + count) & gmask;
    }
    if (served == 0) return 0;
    // (3) The state serve() leaves: pre_ready grows with the bank's last column command.
    for (uint32_t g = 0; g < m_groups; ++g) {
        if (!(used >> g & 1)) continue;
        const Tick c = group_col[g];
        m_last_col_bg[g] = c;
        Bank& b = m_banks[g * m_bpg + row.bank];
        b.pre_ready = std::max(b.pre_ready, write ? c + m_t.wl + m_bl2 + m_t.wr : c + m_t.rtp);
    }
    m_queue_idx = qidx;
    m_admit = admit;
    m_row_cursor = cursor;
    m_last_col = col;
    (write ? m_last_wr : m_last_rd) = col;
    m_data_end = data_end;
    m_counters.bursts += bursts;
    m_counters.row_hits += bursts;
    m_counters.runs += served;
    done = data_end;
    return served;
}

uint64_t Hbm2PseudoChannel::access_runs(std::span<Run> runs, bool write) {
    uint64_t done = 0;
    for (size_t i = 0; i < runs.size();) {
        Tick end;
        // A run whose first bank does not have its row open is not a row-hit run: try_runs
        // would decline it after its set-up, so skip the call.
        const Run& r = runs[i];
        const bool opens =
            m_banks[r.first.bank_group * m_bpg + r.first.bank].open_row != int64_t(r.first.row);
        if (const size_t n = opens ? 0 : try_runs(runs.subspan(i), write, end); n > 0) {
            done = std::max(done, uint64_t(end));
            i += n;
            continue;
        }
        // try_runs changed nothing: the run opens its row (or a refresh is due). As in
        // serve_run(), its first burst in each bank group goes burst by burst; the rest stays in
        // the list (head % groups == 0: the same first group), so the next try_runs() serves it
        // together with the runs after it.
        Run& run = runs[i];
        const uint32_t head = std::min(run.count, m_groups);
        if (m_closed_page || head == run.count || head > kMaxRun) {
            done = std::max(done, serve_run(run, write));
            ++i;
            continue;
        }
        HbmColumnAccess bursts[kMaxRun];
        for (uint32_t j = 0; j < head; ++j)
            bursts[j] = {(run.first.bank_group + j) & (m_groups - 1), run.first.bank,
                         run.first.row};
        done = std::max(done, serve(run.arrive, std::span(bursts, head), write));
        run.count -= head;
    }
    return done;
}

template <class Source>
uint64_t Hbm2PseudoChannel::access_granules(const Source& src, uint32_t count,
                                            const HbmAddressMap& map, bool write) {
    const size_t n_runs = src.size();
    // The stretches' closed form holds under these conditions (see the header); otherwise the
    // runs go as a list.
    if (!m_batch_runs || m_closed_page || count < m_groups || count > m_queue.size() ||
        Tick(m_t.ccd_l) > Tick(m_groups) * std::max(Tick(m_t.ccd_s), m_bl2)) {
        m_runs.clear();
        for (size_t i = 0; i < n_runs; ++i)
            m_runs.push_back({src.arrival(i), map.bank_of_burst(src.burst(i)), count});
        return access_runs(m_runs, write);
    }
    if (n_runs == 0) return 0;  // store() would set the last column of a direction
    Regs r = load(write);
    for (size_t i = 0; i < n_runs;) {
        // (1) The runs [i, end) of one bank row.
        const HbmColumnAccess at = map.bank_of_burst(src.burst(i));
        const size_t end = src.row_end(i);
        // (2) A head from burst `off` of run j, then a stretch to the end of the row or to the
        // next refresh, which the next head performs.
        size_t j = i;
        uint32_t off = 0;
        while (j < end) {
            // An arrival no later than the admission so far changes nothing: its bound will do.
            const Tick lj = Tick(src.latest(j));
            const Tick arrive = lj <= r.admit ? lj : Tick(src.arrival(j));
            bool refreshed = false;
            for (uint32_t g = 0; g < m_groups; ++g) {
                while (!step(r, {g, at.bank, at.row}, arrive)) {
                    r.cursor = refresh_first(r.cursor, r.col, r.admit);
                    r.due = m_due;
                    refreshed = true;
                }
            }
            off += m_groups;
            if (off == count) {
                ++j;
                off = 0;
            }
            // A refresh among the head closed the rows it had opened before it: another head.
            if (!refreshed) serve_stretch(r, j, off, end, at.bank, count, src);
        }
        i = end;
    }
    return uint64_t(store(r, write));
}

template <class Source>
void Hbm2PseudoChannel::serve_stretch(Regs& r, size_t& j, uint32_t& off, size_t end, uint32_t bank,
                                      uint32_t count, const Source& src) {
    if (r.cursor >= r.due) return;  // the next burst waits for the refresh
    const size_t q = m_queue.size();
    const Tick step = r.step, adv = Tick(count) * step, due = r.due;
    Tick* const ring = m_queue.data();
    // The columns so far are a piece of the stretch, bursts [piece_n, n) at piece_col + (t -
    // piece_n) step, and before it the queue ring, which gets a piece's entries (the newest Q)
    // only where a run starts later or the stretch ends.
    Tick col = r.col;
    uint64_t n = 0, piece_n = 0;
    Tick piece_col = col + step;
    size_t pos = r.qidx;                   // the ring slot of burst n
    auto slot_back = [&](uint64_t back) {  // of burst n - back, 1 <= back <= Q
        return pos >= back ? pos - size_t(back) : pos + q - size_t(back);
    };
    auto col_back = [&](uint64_t back) {
        return n >= piece_n + back ? piece_col + Tick(n - back - piece_n) * step
                                   : ring[slot_back(back)];
    };
    auto flush = [&] {
        const uint64_t lo = std::max(piece_n, n > q ? n - q : 0);
        if (lo < n)
            fill_ring(ring, q, slot_back(n - lo), n - lo, piece_col + Tick(lo - piece_n) * step,
                      step);
    };
    uint64_t runs = 0, paced = 0;
    size_t last = 0;  // the last run served
    while (j < end) {
        if (off == 0) {
            // A whole run whose bound is no later than the previous column + step starts there
            // whatever its arrival, and one whose first column is before the due cycle
            // refreshes nothing.
            size_t k = j;
            for (Tick f = col + step; k < end && f < due && Tick(src.latest(k)) <= f; f += adv) ++k;
            if (k > j) {
                const size_t m = k - j;
                col += Tick(m) * adv;
                n += m * count;
                for (pos += m * count; pos >= q;) pos -= q;  // a few times at most
                runs += m;
                paced += m;
                last = k - 1;
                j = k;
                continue;
            }
        }
        // A run by its arrival. The column bounds the cursor loosely: the exact bound is
        // max(arrival, the slot of the run's last burst + 1), burst n + len - 1 - Q's column.
        const uint32_t len = count - off;
        const Tick a = Tick(src.arrival(j));
        const Tick first = std::max(col + step, a);
        if (first >= due && std::max(a, col_back(q - len + 1) + 1) >= due) break;
        if (first == col + step) {
            ++paced;
        } else {
            flush();
            piece_n = n;
            piece_col = first;
        }
        col = first + Tick(len - 1) * step;
        n += len;
        pos = pos + len >= q ? pos + len - q : pos + len;
        ++runs;
        last = j++;
        off = 0;
    }
    if (n == 0) return;
    // The state after the stretch: the last burst's slot held burst n - 1 - Q's column.
    const Tick slot =
        n - 1 >= piece_n + q ? piece_col + Tick(n - 1 - q - piece_n) * step : ring[slot_back(1)];
    const Tick admit = std::max(r.admit, slot + 1);
    r.admit = std::max(admit, Tick(src.latest(last)) <= admit ? admit : Tick(src.arrival(last)));
    r.cursor = std::max(r.cursor, r.admit);
    // Each group's last column bounds its bank's PRE.
    for (uint64_t t = n - std::min<uint64_t>(n, m_groups); t < n; ++t) {
        const Tick c = col_back(n - t);
        const uint32_t g = uint32_t(t) & (m_groups - 1);  // the stretch starts at group 0
        m_last_col_bg[g] = c;
        Bank& b = m_banks[g * m_bpg + bank];
        b.pre_ready = std::max(b.pre_ready, c + r.pre_after);
    }
    flush();
    r.qidx = pos;
    r.col = col;
    r.next = col + step;
    r.bursts += n;
    r.hits += n;
    m_counters.runs += runs;
    m_counters.paced_runs += paced;
    ++m_counters.stretches;
}

uint64_t Hbm2PseudoChannel::access_run(uint64_t arrive, const HbmColumnAccess& first,
                                       uint32_t count, bool write) {
    Tick done;
    const Run run{arrive, first, count};
    if (try_runs({&run, 1}, write, done)) return uint64_t(done);
    return serve_run(run, write);
}

uint64_t Hbm2PseudoChannel::serve_run(const Run& run, bool write) {
    const uint64_t arrive = run.arrive;
    const HbmColumnAccess& first = run.first;
    const uint32_t count = run.count;
    Tick done;
    m_scratch.clear();
    for (uint32_t i = 0; i < count; ++i)
        m_scratch.push_back({(first.bank_group + i) & (m_groups - 1), first.bank, first.row});
    // A run that opens its row: once its first burst in each bank group is served, the rest
    // are row hits. Under the open page policy a request split in two with the same arrival is
    // served alike (only the closed policy looks ahead within a request), so the rest may
    // still take the shortcut.
    const uint32_t head = std::min(count, m_groups);
    if (m_closed_page || head == count) return serve(arrive, m_scratch, write);
    serve(arrive, std::span(m_scratch).first(head), write);
    const Run rest{arrive, first, count - head};  // head % groups == 0: the same first group
    if (try_runs({&rest, 1}, write, done)) return uint64_t(done);
    return serve(arrive, std::span(m_scratch).subspan(head), write);
}

uint64_t Hbm2PseudoChannel::access(uint64_t arrive, std::span<const HbmColumnAccess> bursts,
                                   bool write) {
    // A row-hit run given as a list (tests; other callers use access_run).
    bool run = !bursts.empty();
    for (size_t i = 1; i < bursts.size() && run; ++i)
        run = bursts[i].bank_group == ((bursts[0].bank_group + i) & (m_groups - 1)) &&
              bursts[i].bank == bursts[0].bank && bursts[i].row == bursts[0].row;
    if (run && bursts.size() <= kMaxRun)
        return access_run(arrive, bursts[0], uint32_t(bursts.size()), write);
    return serve(arrive, bursts, write);
}

[[gnu::always_inline]] inline Hbm2PseudoChannel::Regs Hbm2PseudoChannel::load(bool write) const {
    Regs r;
    r.admit = m_admit;
    r.cursor = m_row_cursor;
    r.col = m_last_col;
    r.last_act = m_last_act;
    r.due = m_t.refi != 0 ? m_due : std::numeric_limits<Tick>::max();
    r.qidx = m_queue_idx;
    r.act_idx = m_act_idx;
    r.step = std::max(Tick(m_t.ccd_s), m_bl2);
    r.pre_after = write ? m_t.wl + m_bl2 + m_t.wr : Tick(m_t.rtp);
    // The first column command waits for the other direction's last one, CCD_S and the data bus;
    // the later ones go the same way, so the previous column + max(CCD_S, BL/2) bounds them
    // (the turnaround bounded the first).
    const Tick turn = write ? m_last_rd + Tick(m_t.rtw) : m_last_wr + m_t.wl + m_bl2 + m_t.wtr;
    r.next = max_of(m_last_col + Tick(m_t.ccd_s), m_data_end - (write ? m_t.wl : m_t.cl), turn);
    return r;
}

[[gnu::always_inline]] inline Hbm2PseudoChannel::Tick Hbm2PseudoChannel::store(const Regs& r,
                                                                               bool write) {
    m_admit = r.admit;
    m_row_cursor = r.cursor;
    m_last_act = r.last_act;
    m_act_idx = r.act_idx;
    m_queue_idx = r.qidx;
    m_last_col = r.col;
    (write ? m_last_wr : m_last_rd) = r.col;
    m_data_end = r.col + (write ? m_t.wl : m_t.cl) + m_bl2;
    m_counters.bursts += r.bursts;
    m_counters.row_hits += r.hits;
    m_counters.activates += r.bursts - r.hits;
    m_counters.precharges += r.pres;
    return m_data_end;
}

[[gnu::always_inline]] inline bool Hbm2PseudoChannel::step(Regs& r, const HbmColumnAccess& req,
                                                           Tick arrive) {
    Bank& b = bank(req);
    // (1) Admission: in order, once the burst queue_bursts ahead has left the queue.
    const Tick a = max_of(arrive, r.admit, m_queue[r.qidx] + 1);
    r.admit = a;  // also when the burst waits for a refresh: skip_idle_refreshes() reads it
    // (2) Row logic: hit, or [PRE] ACT, one command per cycle from the cursor on; at the due
    // cycle the refresh comes first. A bank's times stay in registers: a value stored and
    // loaded again at once would wait for the store.
    Tick d = std::max(r.cursor, a);
    Tick ready, pre_ready;  // the row's bound on the column command; the bank's PRE bound
    if (b.open_row == int64_t(req.row)) {
        if (d >= r.due) return false;
        r.cursor = d;
        ready = std::max(d, b.act + Tick(m_t.rcd));
        pre_ready = b.pre_ready;
        ++r.hits;
    } else {
        Tick act_ready = b.act_ready;
        const bool pre = b.open_row >= 0;
        if (pre) {
            const Tick at = std::max(d, b.pre_ready);
            if (at >= r.due) return false;
            act_ready = std::max(act_ready, at + Tick(m_t.rp));
            b.closed_at = at;
            ++b.conflicts;
            ++r.pres;
            d = at + 1;  // the cursor after the PRE (at >= a)
        }
        const Tick act =
            max_of(d, act_ready, r.last_act + Tick(m_t.rrd), m_acts[r.act_idx] + Tick(m_t.faw));
        if (act >= r.due) {
            if (pre) {  // closed by the PRE
                b.open_row = -1;
                b.act_ready = act_ready;
                r.cursor = d;
            }
            return false;
        }
        b.open_row = int64_t(req.row);
        b.act = act;
        b.act_ready = act + m_t.rc;
        pre_ready = act + m_t.ras;
        r.last_act = act;
        m_acts[r.act_idx] = act;
        r.act_idx = (r.act_idx + 1) % 4;
        r.cursor = act + 1;
        ready = act + m_t.rcd;
    }
    // (3) Column command: in order, after RCD, CCD_S/CCD_L, the turnaround and the bus.
    r.col = max_of(ready, r.next, m_last_col_bg[req.bank_group] + Tick(m_t.ccd_l));
    r.next = r.col + r.step;
    m_last_col_bg[req.bank_group] = r.col;
    b.pre_ready = std::max(pre_ready, r.col + r.pre_after);
    m_queue[r.qidx] = r.col;
    r.qidx = r.qidx + 1 == m_queue.size() ? 0 : r.qidx + 1;
    ++r.bursts;
    return true;
}

Hbm2PseudoChannel::Tick Hbm2PseudoChannel::refresh_first(Tick cursor, Tick last_col, Tick admit) {
    // refresh() and skip_idle_refreshes() work on the stored state; `admit` is the waiting
    // burst's admission, which step() finds again.
    m_row_cursor = cursor;
    m_last_col = last_col;
    refresh();
    skip_idle_refreshes(admit);
    return m_row_cursor;
}

uint64_t Hbm2PseudoChannel::serve(uint64_t arrive, std::span<const HbmColumnAccess> bursts,
                                  bool write) {
    if (bursts.empty()) return arrive;
    Regs r = load(write);
    for (size_t i = 0; i < bursts.size(); ++i) {
        const HbmColumnAccess& req = bursts[i];
        while (!step(r, req, Tick(arrive))) {
            r.cursor = refresh_first(r.cursor, r.col, r.admit);
            r.due = m_due;
        }
        // (4) Closed page: the request's last access to this row auto-precharges the bank at
        // the first cycle it may.
        if (m_closed_page) {
            bool again = false;
            for (size_t j = i + 1; j < bursts.size() && !again; ++j)
                again = bursts[j].bank_group == req.bank_group && bursts[j].bank == req.bank &&
                        bursts[j].row == req.row;
            if (!again) {
                Bank& b = bank(req);
                b.open_row = -1;
                b.closed_at = b.pre_ready;
                b.act_ready = std::max(b.act_ready, b.pre_ready + Tick(m_t.rp));
            }
        }
    }
    return uint64_t(store(r, write));
}

// ---- the stack ---------------------------------------------------------------------------------

Hbm2Timing::Hbm2Timing(const BoardConfig& cfg)
    : m_map(cfg.hbm),
      m_core_ps(cfg.period_ps()),
      m_tck_ps(cfg.hbm.tck_ps),
      m_to_tck(m_tck_ps),
      m_to_core(m_core_ps) {
    const HbmConfig& h = cfg.hbm;
    m_peak = peak(cfg);
    m_pcs.reserve(m_map.pseudo_channels());
    for (uint32_t i = 0; i < m_map.pseudo_channels(); ++i) m_pcs.emplace_back(h);
    m_runs.resize(m_map.pseudo_channels());
    m_granules.resize(m_map.pseudo_channels());
}

double Hbm2Timing::peak(const BoardConfig& cfg) {
    const HbmAddressMap map(cfg.hbm);
    // Every pseudo-channel moves one burst per max(1, BL/2) tCK.
    const double bl2 = std::max(1u, cfg.hbm.burst_length / 2);
    return double(map.pseudo_channels()) * map.burst_bytes() / (bl2 * double(cfg.hbm.tck_ps)) *
           double(cfg.period_ps());
}

uint64_t Hbm2Timing::access(uint64_t arrive, uint64_t addr, uint32_t bytes, bool write) {
    if (bytes == 0) return arrive;
    // The first tCK edge at or after the arrival: ceil(arrive x T / tck).
    const uint64_t arrive_tck = mul_div_up(arrive, m_core_ps, m_to_tck);
    // Shifts and masks: burst and granule sizes are powers of two (checked by the map).
    const uint32_t sh_burst = std::countr_zero(m_map.burst_bytes());
    const uint64_t granule = m_map.interleave_bytes(), burst_mask = m_map.burst_bytes() - 1;
    uint64_t done_tck = arrive_tck;
    const uint64_t end = addr + bytes;
    for (uint64_t lo = addr; lo < end;) {
        const uint64_t hi = std::min(end, (lo | (granule - 1)) + 1);
        // Every burst the piece touches, in address order; bursts never cross a granule. Inside
        // a granule the pseudo-channel is fixed and the local burst numbers are consecutive:
        // bank groups rotate fastest, so while they stay in one bank and row (always, unless
        // a granule is larger than a row in every bank group) they are a run for access_run.
        const uint64_t first = lo & ~burst_mask;
        const HbmLocation l = m_map.decode(first);
        const uint64_t b0 = l.local >> sh_burst, count = (hi - first + burst_mask) >> sh_burst;
        const HbmColumnAccess last = m_map.bank_of_burst(b0 + count - 1);
        Hbm2PseudoChannel& pc = m_pcs[l.pseudo_channel];
        uint64_t done;
        if (last.bank == l.bank.bank && last.row == l.bank.row) {
            done = pc.access_run(arrive_tck, l.bank, static_cast<uint32_t>(count), write);
        } else {
            m_scratch.clear();
            for (uint64_t j = 0; j < count; ++j) m_scratch.push_back(m_map.bank_of_burst(b0 + j));
            done = pc.access(arrive_tck, m_scratch, write);
        }
        done_tck = std::max(done_tck, done);
        lo = hi;
    }
    return mul_div_up(done_tck, m_tck_ps, m_to_core);
}

template <class Piece>
void Hbm2Timing::for_each_request(uint64_t start, uint64_t rows, uint64_t row_bytes,
                                  uint64_t addr, uint64_t stride, uint32_t chunk, uint32_t port,
                                  Piece&& piece) const {
    uint64_t before = 0, arrive = start;
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t off = 0; off < row_bytes; off += chunk) {
            const uint64_t len = std::min<uint64_t>(chunk, row_bytes - off);
            piece(addr + r * stride + off, len, mul_div_up(arrive, m_core_ps, m_to_tck));
            before += len;
            // The next request's arrival: start + floor(before / port), without a division
            // while the port moves a chunk in a few cycles.
            if (len <= 4 * uint64_t(port)) {
                while ((arrive - start + 1) * port <= before) ++arrive;
            } else {
                arrive = start + before / port;
            }
        }
}

uint64_t Hbm2Timing::access_rows(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                                 uint64_t stride, uint32_t chunk, uint32_t port, bool write) {
    if (rows == 0 || row_bytes == 0) return start;
    const uint32_t sh_burst = std::countr_zero(m_map.burst_bytes());
    const uint64_t granule = m_map.interleave_bytes(), burst_mask = m_map.burst_bytes() - 1;
    // One contiguous range of whole granules, each inside one request and one bank row (the
    // DMA's usual transfer): see whole_granules(). Back-to-back rows no longer than a chunk are
    // one request each, so the range's requests are all `request` bytes long as well.
    const uint64_t total = rows * row_bytes;
    const uint64_t request = rows > 1 && row_bytes < chunk ? row_bytes : chunk;
    if ((rows == 1 || (stride == row_bytes && row_bytes % request == 0)) && addr % granule == 0 &&
        total % granule == 0 && request % granule == 0 &&
        (granule >> sh_burst) <= m_map.bursts_per_bank_row()) {
        ++m_whole_granule_transfers;
        return std::max(
            start, mul_div_up(whole_granules(start, addr, total, static_cast<uint32_t>(request),
                                             port, write),
                              m_tck_ps, m_to_core));
    }
    // Rows of whole granules, apart or back to back, each granule inside one request: see
    // granule_lists().
    if (rows > 1 && stride >= row_bytes && addr % granule == 0 && stride % granule == 0 &&
        row_bytes % granule == 0 && (row_bytes <= chunk || chunk % granule == 0) &&
        (granule >> sh_burst) <= m_map.bursts_per_bank_row()) {
        ++m_granule_list_transfers;
        return std::max(start, mul_div_up(granule_lists(start, rows, row_bytes, addr, stride, chunk,
                                                        port, write),
                                          m_tck_ps, m_to_core));
    }
    // (1) Every request in order, cut as access() cuts it; a piece that crosses from one bank's
    // row into the next is cut there too: a request's bursts in two rows are served alike
    // as two requests with the same arrival (the closed page policy looks ahead only within
    // a row, and local burst numbers only grow, so no row comes back).
    uint64_t done_tck = 0;
    for_each_request(
        start, rows, row_bytes, addr, stride, chunk, port,
        [&](uint64_t lo0, uint64_t len, uint64_t arrive_tck) {
            done_tck = std::max(done_tck, arrive_tck);
            const uint64_t end = lo0 + len;
            for (uint64_t lo = lo0; lo < end;) {
                const uint64_t hi = std::min(end, (lo | (granule - 1)) + 1);
                const uint64_t first = lo & ~burst_mask;
                const HbmLocation l = m_map.decode(first);
                uint64_t b = l.local >> sh_burst;
                const uint64_t b_end = b + ((hi - first + burst_mask) >> sh_burst);
                std::vector<Hbm2PseudoChannel::Run>& runs = m_runs[l.pseudo_channel];
                HbmColumnAccess at = l.bank;
                for (;;) {
                    // Bursts up to the end of this bank's row (or of the piece).
                    const uint64_t row_end = m_map.next_row_burst(b);
                    const uint64_t n = std::min(b_end, row_end) - b;
                    runs.push_back({arrive_tck, at, static_cast<uint32_t>(n)});
                    b += n;
                    if (b == b_end) break;
                    at = m_map.bank_of_burst(b);
                }
                // A pseudo-channel's runs served in pieces are served as in one list
                // (access_runs() is access_run() of each in order), and a short list stays in
                // the L1 cache: gathered whole, a large strided transfer's lists miss it on
                // every store and load.
                if (runs.size() >= kRunBatch) {
                    done_tck = std::max(done_tck, m_pcs[l.pseudo_channel].access_runs(runs, write));
                    runs.clear();
                }
                lo = hi;
            }
        });
    // (2) Each pseudo-channel's runs in order.
    for (size_t p = 0; p < m_runs.size(); ++p) {
        std::vector<Hbm2PseudoChannel::Run>& runs = m_runs[p];
        if (runs.empty()) continue;
        done_tck = std::max(done_tck, m_pcs[p].access_runs(runs, write));
        runs.clear();
    }
    return std::max(start, mul_div_up(done_tck, m_tck_ps, m_to_core));
}

uint64_t Hbm2Timing::whole_granules(uint64_t start, uint64_t addr, uint64_t bytes, uint32_t chunk,
                                    uint32_t port, bool write) {
    // Why this equals the general path of access_rows(): rows of a contiguous transfer whose
    // length is a multiple of the chunk follow each other without a short request between
    // them, so request k covers bytes [k chunk, (k + 1) chunk) of the range and arrives at
    // start + floor(k chunk / port), as there. Every granule lies inside one request (chunk
    // and addr are multiples of the granule) and inside one bank row (its bursts start at a
    // multiple of their count, a power of two no larger than a bank row), so the general path
    // sends each granule as one run of all its bursts from its first local burst. A
    // pseudo-channel p gets one granule of each group of P consecutive ones: local granule k
    // is granule granule_of(p, k), and increasing k is increasing address, which is request
    // order. So the runs each pseudo-channel receives are the same, in the same order, and the
    // pseudo-channels share nothing; only the cutting by address and the decoding are skipped.
    const uint32_t sh_granule = std::countr_zero(m_map.interleave_bytes());
    const uint32_t sh_pcs = std::countr_zero(m_map.pseudo_channels());
    const uint32_t sh_run = sh_granule - std::countr_zero(m_map.burst_bytes());
    const uint64_t g_lo = addr >> sh_granule, granules = bytes >> sh_granule,
                   g_hi = g_lo + granules;
    // (1) The arrival (tCK) of granule g_lo + d: that of its request, as the general path
    // computes it.
    const bool chunk_pow2 = std::has_single_bit(chunk), port_pow2 = std::has_single_bit(port);
    const uint32_t sh_chunk = std::countr_zero(chunk), sh_port = std::countr_zero(port);
    const auto arrival_of = [&](uint64_t d) {
        const uint64_t at = d << sh_granule;
        const uint64_t before = chunk_pow2 ? at >> sh_chunk << sh_chunk : at / chunk * chunk;
        return mul_div_up(start + (port_pow2 ? before >> sh_port : before / port), m_core_ps,
                          m_to_tck);
    };
    // (2) Per group of P granules (local granule k of every pseudo-channel), the arrival of its
    // last one in the range: no earlier than any of the group's, and read in place of them
    // where it is early enough.
    const uint64_t k_lo = g_lo >> sh_pcs, k_hi = (g_hi - 1) >> sh_pcs;
    m_latest.resize(k_hi - k_lo + 1);
    for (uint64_t k = k_lo; k <= k_hi; ++k)
        m_latest[k - k_lo] = arrival_of(std::min(g_hi - 1, ((k + 1) << sh_pcs) - 1) - g_lo);
    // (3) Each pseudo-channel's granules in order of their local number.
    const uint32_t count = uint32_t(1) << sh_run;
    uint64_t done_tck = m_latest.back();
    for (uint32_t p = 0; p < m_pcs.size(); ++p) {
        // Only the first and the last group of P granules may lack this pseudo-channel's.
        const uint64_t ka = m_map.granule_of(p, k_lo) < g_lo ? k_lo + 1 : k_lo;
        const uint64_t kb = m_map.granule_of(p, k_hi) >= g_hi ? k_hi : k_hi + 1;
        if (ka >= kb) continue;
        // Local granules ka .. kb - 1, adjacent: a bank row holds row_runs of them.
        struct Source {
            const Hbm2Timing& t;
            const decltype(arrival_of)& arrive_at;
            const uint64_t* lat;
            uint64_t ka, g_lo, n, row_runs;
            uint32_t p, sh_run;
            size_t size() const { return n; }
            uint64_t burst(size_t i) const { return (ka + i) << sh_run; }
            uint64_t latest(size_t i) const { return lat[i]; }
            uint64_t arrival(size_t i) const {
                return arrive_at(t.m_map.granule_of(p, ka + i) - g_lo);
            }
            size_t row_end(size_t i) const {
                return std::min<size_t>(n, i + row_runs - ((ka + i) & (row_runs - 1)));
            }
        };
        const Source src{*this, arrival_of, m_latest.data() + (ka - k_lo),         ka,
                         g_lo,  kb - ka,    m_map.bursts_per_bank_row() >> sh_run, p,
                         sh_run};
        done_tck = std::max(done_tck, m_pcs[p].access_granules(src, count, m_map, write));
    }
    return done_tck;
}

uint64_t Hbm2Timing::granule_lists(uint64_t start, uint64_t rows, uint64_t row_bytes, uint64_t addr,
                                   uint64_t stride, uint32_t chunk, uint32_t port, bool write) {
    // Why this equals the general path of access_rows(): every granule lies inside one request
    // and one bank row, so the general path sends each as one run of all its bursts from its
    // first local burst, at its request's arrival. The rows do not overlap and follow each other
    // in address (stride >= row_bytes), so request order is address order, and a
    // pseudo-channel's granules in request order are in the order of their local numbers
    // (granule / P): the lists below are the runs the general path gives each pseudo-channel,
    // and access_granules() serves a list as access_runs() does.
    const uint32_t sh_granule = std::countr_zero(m_map.interleave_bytes());
    const uint32_t sh_pcs = std::countr_zero(m_map.pseudo_channels());
    const uint32_t sh_run = sh_granule - std::countr_zero(m_map.burst_bytes());
    for (auto& l : m_granules) l.clear();
    uint64_t done_tck = 0;
    for_each_request(start, rows, row_bytes, addr, stride, chunk, port,
                     [&](uint64_t lo, uint64_t len, uint64_t arrive_tck) {
                         done_tck = std::max(done_tck, arrive_tck);
                         const uint64_t g0 = lo >> sh_granule;
                         for (uint64_t g = g0, g_end = g0 + (len >> sh_granule); g < g_end; ++g)
                             m_granules[m_map.pseudo_channel_of_granule(g)].push_back(
                                 {g >> sh_pcs, arrive_tck});
                     });
    const uint32_t count = uint32_t(1) << sh_run;
    const uint64_t row_runs = m_map.bursts_per_bank_row() >> sh_run;
    struct Source {
        const Granule* g;
        size_t n;
        uint64_t row_mask;  ///< ~(row_runs - 1): a bank row's local granules
        uint32_t sh_run;
        size_t size() const { return n; }
        uint64_t burst(size_t i) const { return g[i].local << sh_run; }
        uint64_t latest(size_t i) const { return g[i].arrive; }
        uint64_t arrival(size_t i) const { return g[i].arrive; }
        size_t row_end(size_t i) const {
            const uint64_t row = g[i].local & row_mask;
            size_t k = i + 1;
            while (k < n && (g[k].local & row_mask) == row) ++k;
            return k;
        }
    };
    for (size_t p = 0; p < m_granules.size(); ++p) {
        const std::vector<Granule>& l = m_granules[p];
        if (l.empty()) continue;
        const Source src{l.data(), l.size(), ~(row_runs - 1), sh_run};
        done_tck = std::max(done_tck, m_pcs[p].access_granules(src, count, m_map, write));
    }
    return done_tck;
}

uint64_t Hbm2Timing::bank_conflicts(size_t i) const {
    uint64_t sum = 0;
    for (const auto& pc : m_pcs) sum += pc.bank_conflicts(i);
    return sum;
}

void Hbm2Timing::register_stats(sim::StatGroup& g) {
    register_stats_of(g, [this]() -> const Hbm2Timing& { return *this; });
}

void Hbm2Timing::register_stats_of(sim::StatGroup& g, std::function<const Hbm2Timing&()> model) {
    namespace n = sim::stat_names;
    using sim::StatUnit;
    using C = Hbm2PseudoChannel::Counters;
    auto sum = [model](uint64_t C::*field) {
        return [model, field] { return model().counters().*field; };
    };
    g.add(std::string(n::kBursts), "column commands (RD/WR), all pseudo-channels", StatUnit::Count,
          sum(&C::bursts));
    g.add(std::string(n::kRowHits), "bursts that found their row open", StatUnit::Count,
          sum(&C::row_hits));
    g.add(std::string(n::kRowMisses), "bursts that needed an activate first", StatUnit::Count,
          [model] {
              const C c = model().counters();
              return c.bursts - c.row_hits;
          });
    g.add(std::string(n::kActivates), "ACT commands", StatUnit::Count, sum(&C::activates));
    g.add(std::string(n::kRowConflicts),
          "bursts that found another row open in their bank (explicit PRE commands)",
          StatUnit::Count, sum(&C::precharges));
    g.add(std::string(n::kRefreshes), "REF commands", StatUnit::Count, sum(&C::refreshes));
    g.add_formula("row_hit_rate", "row_hits / bursts", StatUnit::Ratio, [model] {
        const C c = model().counters();
        return c.bursts ? double(c.row_hits) / double(c.bursts) : 0.0;
    });
    // Per bank index, summed over pseudo-channels: the address hash spreads a stream over
    // banks, and one hot bank shows up here.
    const std::vector<Hbm2PseudoChannel>& pcs = model().m_pcs;
    const size_t banks = pcs.empty() ? 0 : pcs.front().banks();
    for (size_t i = 0; i < banks; ++i)
        g.add(fmt::format("bank{}_conflicts", i),
              fmt::format("row conflicts in bank {} (group x banks + bank) over all "
                          "pseudo-channels",
                          i),
              StatUnit::Count, [model, i] { return model().bank_conflicts(i); });
}

Hbm2PseudoChannel::Counters Hbm2Timing::counters() const {
    Hbm2PseudoChannel::Counters sum;
    for (const auto& pc : m_pcs) {
        const auto& c = pc.counters();
        sum.bursts += c.bursts;
        sum.row_hits += c.row_hits;
        sum.activates += c.activates;
        sum.precharges += c.precharges;
        sum.refreshes += c.refreshes;
        sum.runs += c.runs;
        sum.paced_runs += c.paced_runs;
        sum.stretches += c.stretches;
    }
    return sum;
}

}  // namespace tpu::hw
