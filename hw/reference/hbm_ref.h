// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "hw/mem/hbm2.h"

/// Cycle-stepped command scheduler of one HBM pseudo-channel, used only by tests to prove
/// Hbm2PseudoChannel exact. It walks tCK by tCK and issues a command only when a check of every
/// command issued so far allows it; it never computes a future cycle.
namespace tpu::hw {

/// One request to the reference pseudo-channel.
struct HbmRefRequest {
    uint64_t arrive = 0;                  ///< tCK it reaches the controller
    bool write = false;                   ///< WR bursts instead of RD
    std::vector<HbmColumnAccess> bursts;  ///< its column accesses, in order (at least one)
};

/// A command the reference issued (for failure messages and tests).
struct HbmRefCommand {
    /// Which command.
    enum class Op { Act, Pre, PreAll, Ref, Rd, Wr };
    Op op = Op::Act;     ///< the command
    uint64_t cycle = 0;  ///< tCK it issued
    uint32_t bank = 0;   ///< flat bank (bank_group x banks_per_group + bank); 0 for PREA/REF
};

/// Hardware modelled (hw/README.md, "HBM"), one tCK at a time; in each cycle:
/// 1. admission: arrived bursts enter the controller's queue in order while it holds fewer than
///    `queue_bursts` bursts that have not issued their column command;
/// 2. armed auto-precharges fire in every bank that may precharge now;
/// 3. row logic (at most one row command): when a refresh is due it waits for every prepared
///    burst's column command, closes open banks with PREA and issues REF; otherwise it prepares
///    queued bursts in order: a row hit is prepared at once (and the next burst looked at), a miss
///    needs PRE (when the bank is free) and ACT;
/// 4. column logic: the oldest prepared burst issues RD/WR (with auto-precharge under the closed
///    page policy if it is the request's last access to its row) when every constraint holds.
class HbmPseudoChannelRef {
public:
    /// An idle pseudo-channel of `cfg`'s geometry, timing and page policy.
    explicit HbmPseudoChannelRef(const HbmConfig& cfg);
    /// Serves `reqs` (in order) and returns each request's end of data in tCK. Throws
    /// std::logic_error if a request has no bursts or the run does not finish.
    std::vector<uint64_t> run(const std::vector<HbmRefRequest>& reqs);
    /// Every command issued by the last run, in issue order.
    const std::vector<HbmRefCommand>& commands() const { return m_log; }

private:
    HbmConfig m_cfg;
    std::vector<HbmRefCommand> m_log;
};

}  // namespace tpu::hw
