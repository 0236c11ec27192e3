// SPDX-License-Identifier: Apache-2.0
#include "hw/reference/hbm_ref.h"

#include <algorithm>
#include <deque>
#include <stdexcept>

namespace tpu::hw {

namespace {

/// "No such command yet": far enough in the past to satisfy every spacing rule.
constexpr int64_t kNone = -(int64_t(1) << 40);

/// One burst of a request, flattened, with what the controller knows about it.
struct Burst {
    size_t req = 0;         ///< index of its request
    uint64_t arrive = 0;    ///< tCK its request arrived
    uint32_t bank = 0;      ///< flat bank
    uint32_t group = 0;     ///< bank group
    uint64_t row = 0;       ///< row
    bool write = false;     ///< WR instead of RD
    bool auto_pre = false;  ///< closed page: the request's last access to this row
    bool last = false;      ///< last burst of its request
};

/// One bank's state as the hardware holds it.
struct Bank {
    bool open = false;         ///< a row is open (activated, not yet precharged)
    uint64_t row = 0;          ///< the open row
    bool closing = false;      ///< a prepared burst will auto-precharge it
    bool armed = false;        ///< that burst's column command has issued
    int64_t last_act = kNone;  ///< cycle of the last ACT
    int64_t last_pre = kNone;  ///< cycle of the last precharge (PRE, PREA or auto)
    int64_t last_rd = kNone;   ///< cycle of the last RD
    int64_t last_wr = kNone;   ///< cycle of the last WR
};

}  // namespace

HbmPseudoChannelRef::HbmPseudoChannelRef(const HbmConfig& cfg) : m_cfg(cfg) {}

std::vector<uint64_t> HbmPseudoChannelRef::run(const std::vector<HbmRefRequest>& reqs) {
    const HbmTiming& T = m_cfg.timing;
    const int64_t bl2 = std::max<int64_t>(1, m_cfg.burst_length / 2);
    const bool closed_page = m_cfg.page_policy == "closed";
    const size_t queue = m_cfg.queue_bursts;
    m_log.clear();

    // Flatten the requests into bursts and mark the auto-precharging ones.
    std::vector<Burst> bursts;
    uint64_t last_arrival = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        const auto& r = reqs[i];
        if (r.bursts.empty()) throw std::logic_error("HbmPseudoChannelRef: request without bursts");
        last_arrival = std::max(last_arrival, r.arrive);
        for (size_t j = 0; j < r.bursts.size(); ++j) {
            const auto& a = r.bursts[j];
            Burst b;
            b.req = i;
            b.arrive = r.arrive;
            b.group = a.bank_group;
            b.bank = a.bank_group * m_cfg.banks_per_group + a.bank;
            b.row = a.row;
            b.write = r.write;
            b.last = j + 1 == r.bursts.size();
            b.auto_pre = closed_page;
            for (size_t k = j + 1; k < r.bursts.size(); ++k)
                if (r.bursts[k].bank_group == a.bank_group && r.bursts[k].bank == a.bank &&
                    r.bursts[k].row == a.row)
                    b.auto_pre = false;
            bursts.push_back(b);
        }
    }

    std::vector<Bank> banks(size_t(m_cfg.bank_groups) * m_cfg.banks_per_group);
    std::vector<int64_t> last_col_group(m_cfg.bank_groups, kNone);
    std::deque<int64_t> acts;  // cycles of recent ACTs, for RRD and FAW
    int64_t last_col = kNone, last_rd = kNone, last_wr = kNone, data_end = 0;
    int64_t refresh_until = 0;  // banks may not activate before this (REF + RFC)
    int64_t due = T.refi;
    size_t admitted = 0, prepared = 0, issued = 0;  // bursts [0, admitted) queued, etc.
    std::vector<uint64_t> done(reqs.size(), 0);

    // PRE may close `k` at `t`: RAS after its ACT, RTP after a RD, write recovery after a WR.
    auto may_precharge = [&](const Bank& k, int64_t t) {
        return t - k.last_act >= T.ras && t - k.last_rd >= T.rtp &&
               t - k.last_wr >= T.wl + bl2 + T.wr;
    };
    auto precharge = [&](Bank& k, int64_t t) {
        k.open = k.closing = k.armed = false;
        k.last_pre = t;
    };
    // The bank is idle enough for ACT or REF: RP after its precharge, RC after its ACT, and no
    // refresh in progress.
    auto idle = [&](const Bank& k, int64_t t) {
        return !k.open && t - k.last_pre >= T.rp && t - k.last_act >= T.rc && t >= refresh_until;
    };
    auto may_activate = [&](const Bank& k, int64_t t) {
        if (!idle(k, t)) return false;
        if (!acts.empty() && t - acts.back() < T.rrd) return false;
        int in_window = 0;
        for (const int64_t a : acts) in_window += t - a < T.faw;
        return in_window < 4;
    };
    // An older prepared burst still has to issue its column command to flat bank `b`.
    auto column_pending = [&](uint32_t b) {
        for (size_t i = issued; i < prepared; ++i)
            if (bursts[i].bank == b) return true;
        return false;
    };
    auto prepare = [&](const Burst& b) {
        if (b.auto_pre) banks[b.bank].closing = true;
        ++prepared;
    };

    const uint64_t limit = last_arrival + 100'000 + bursts.size() * 1'000;
    size_t finished = 0;
    for (int64_t t = 0; finished < reqs.size(); ++t) {
        if (uint64_t(t) > limit) throw std::logic_error("HbmPseudoChannelRef: run did not finish");

        // (1) Admission.
        while (admitted < bursts.size() && bursts[admitted].arrive <= uint64_t(t) &&
               admitted - issued < queue)
            ++admitted;

        // (2) Armed auto-precharges.
        for (Bank& k : banks)
            if (k.armed && may_precharge(k, t)) precharge(k, t);

        // (3) Row logic.
        if (T.refi != 0 && t >= due) {
            const bool all_issued = issued == prepared;
            const bool any_open =
                std::any_of(banks.begin(), banks.end(), [](const Bank& k) { return k.open; });
            if (all_issued && any_open) {
                bool ok = true;
                for (const Bank& k : banks) ok = ok && (!k.open || may_precharge(k, t));
                if (ok) {
                    for (Bank& k : banks)
                        if (k.open) precharge(k, t);
                    m_log.push_back({HbmRefCommand::Op::PreAll, uint64_t(t), 0});
                }
            } else if (all_issued) {
                bool ok = true;
                for (const Bank& k : banks) ok = ok && idle(k, t);
                if (ok) {
                    refresh_until = t + T.rfc;
                    due = t + T.refi;
                    m_log.push_back({HbmRefCommand::Op::Ref, uint64_t(t), 0});
                }
            }
        } else {
            while (prepared < admitted) {
                const Burst& b = bursts[prepared];
                Bank& k = banks[b.bank];
                if (k.open && !k.closing && k.row == b.row) {
                    prepare(b);  // row hit: no command, look at the next burst
                    continue;
                }
                if (k.open && !k.closing && !column_pending(b.bank) && may_precharge(k, t)) {
                    precharge(k, t);
                    m_log.push_back({HbmRefCommand::Op::Pre, uint64_t(t), b.bank});
                } else if (!k.open && may_activate(k, t)) {
                    k.open = true;
                    k.row = b.row;
                    k.last_act = t;
                    acts.push_back(t);
                    if (acts.size() > 4) acts.pop_front();
                    m_log.push_back({HbmRefCommand::Op::Act, uint64_t(t), b.bank});
                    prepare(b);
                }
                break;  // a command went out, or the head burst has to wait
            }
        }

        // (4) Column logic.
        if (issued < prepared) {
            const Burst& b = bursts[issued];
            Bank& k = banks[b.bank];
            bool ok = t - k.last_act >= T.rcd && t - last_col >= T.ccd_s &&
                      t - last_col_group[b.group] >= T.ccd_l;
            const int64_t lat = b.write ? T.wl : T.cl;
            if (b.write)
                ok = ok && t - last_rd >= T.rtw;
            else
                ok = ok && t - last_wr >= T.wl + bl2 + T.wtr;
            ok = ok && t + lat >= data_end;  // the data bus carries bursts in order
            if (ok) {
                last_col = last_col_group[b.group] = t;
                (b.write ? last_wr : last_rd) = t;
                (b.write ? k.last_wr : k.last_rd) = t;
                data_end = t + lat + bl2;
                if (b.auto_pre) k.armed = true;
                m_log.push_back(
                    {b.write ? HbmRefCommand::Op::Wr : HbmRefCommand::Op::Rd, uint64_t(t), b.bank});
                if (b.last) {
                    done[b.req] = uint64_t(data_end);
                    ++finished;
                }
                ++issued;
            }
        }
    }
    return done;
}

}  // namespace tpu::hw
