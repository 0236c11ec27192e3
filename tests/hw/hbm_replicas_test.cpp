// SPDX-License-Identifier: Apache-2.0
// HbmReplicaGroup (hw/mem/hbm_replicas.h) against one Hbm2Timing per member: members that pass
// the same requests for a while, then their own, at random relative speeds, some idle or
// stopping early, return the same completion for every request and end with the same
// statistics; the shared path and the leave path are both taken.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "hw/board_config.h"
#include "hw/mem/hbm2.h"
#include "hw/mem/hbm_replicas.h"
#include "sim/stats.h"

namespace tpu::hw {
namespace {

using Request = HbmReplicaGroup::Request;

struct Pick {
    std::mt19937 rng;
    uint64_t operator()(uint64_t hi) { return std::uniform_int_distribution<uint64_t>(0, hi)(rng); }
};

/// A request arriving `gap` or fewer cycles after `t`: a DMA transfer (contiguous, strided or
/// rows shorter than a chunk) or a lone access, as the DMA engine and the ICI pass them.
Request random_request(Pick& pick, uint64_t& t) {
    t += pick(3) == 0 ? pick(2000) : pick(40);
    const bool write = pick(2) == 0;
    if (pick(4) == 0) return {t, 1, 1 + pick(4095), pick(8 << 20), 0, 0, 0, write, true};
    const uint64_t rows = 1 + pick(pick(1) ? 3 : 40), row_bytes = 256 * (1 + pick(15));
    const uint64_t stride = pick(1) ? row_bytes : row_bytes + 256 * pick(20) + pick(1) * pick(64);
    return {t,  rows,  row_bytes, pick(1) ? 256 * pick(32768) : pick(8 << 20), stride, 512,
            64, write, false};
}

std::vector<uint64_t> stat_values(HbmTimingModel& m) {
    sim::StatGroup g("hbm");
    m.register_stats(g);
    std::vector<uint64_t> counters;
    std::vector<double> formulas;
    g.snapshot(counters, formulas);
    for (const double f : formulas) counters.push_back(static_cast<uint64_t>(f * 1e12));
    return counters;
}

/// Member k passes `shared` up to its `split[k]`, then requests of its own, `length[k]` in all.
struct Plan {
    std::vector<Request> shared;
    std::vector<size_t> split, length;
};

/// Runs `plan` through a group (members called in random order) and through one model per
/// member; returns the group's counters.
HbmReplicaGroup::Counters expect_same_as_own_models(const BoardConfig& cfg, const Plan& plan,
                                                    Pick& pick, const std::string& what) {
    const size_t members = plan.split.size();
    HbmReplicaGroup group(cfg, static_cast<uint32_t>(members));
    std::vector<std::unique_ptr<HbmTimingModel>> views;
    std::vector<std::unique_ptr<Hbm2Timing>> alone;
    std::vector<std::vector<Request>> streams(members);
    for (size_t k = 0; k < members; ++k) {
        views.push_back(group.member(static_cast<uint32_t>(k)));
        alone.push_back(std::make_unique<Hbm2Timing>(cfg));
        uint64_t t = 0;
        for (size_t i = 0; i < plan.length[k]; ++i) {
            if (i < plan.split[k]) {
                streams[k].push_back(plan.shared[i]);
                t = plan.shared[i].start;
            } else {
                streams[k].push_back(random_request(pick, t));
            }
        }
    }
    std::vector<size_t> at(members, 0);
    for (;;) {
        std::vector<size_t> ready;
        for (size_t k = 0; k < members; ++k)
            if (at[k] < streams[k].size()) ready.push_back(k);
        if (ready.empty()) break;
        // Members run at random relative speeds: one may be far ahead of another.
        const size_t k = ready[pick(ready.size() - 1)];
        for (uint64_t n = 1 + pick(pick(7) ? 3 : 300); n > 0 && at[k] < streams[k].size(); --n) {
            const Request& q = streams[k][at[k]++];
            EXPECT_EQ(q.apply(*views[k]), q.apply(*alone[k]))
                << what << ": member " << k << " request " << at[k];
        }
    }
    for (size_t k = 0; k < members; ++k)
        EXPECT_EQ(stat_values(*views[k]), stat_values(*alone[k])) << what << ": member " << k;
    return group.counters();
}

BoardConfig varied(uint32_t seed) {
    BoardConfig cfg;
    if (seed % 3 == 0) cfg.hbm.page_policy = "closed";
    if (seed % 4 == 1) cfg.hbm.timing.refi = 700;
    if (seed % 5 == 2) cfg.hbm.interleave_bytes = 1024;
    return cfg;
}

TEST(HbmReplicas, MembersThatSplitAtRandomEqualTheirOwnModels) {
    uint64_t replayed = 0, own = 0, diverged = 0;
    for (uint32_t seed = 1; seed <= 30; ++seed) {
        Pick pick{std::mt19937(seed)};
        const BoardConfig cfg = varied(seed);
        Plan plan;
        const size_t n = 300 + pick(5000);  // past the log's trim length (4096) now and then
        uint64_t t = 0;
        for (size_t i = 0; i < n; ++i) plan.shared.push_back(random_request(pick, t));
        // One member that never leaves, one that leaves at once, one idle, one that stops
        // early, the others at random points.
        const size_t members = 3 + pick(6);
        for (size_t k = 0; k < members; ++k) {
            size_t split = pick(n), length = split + pick(300);
            if (k == 0) split = length = n;
            if (k == 1) split = 0;
            if (k == 2) split = length = 0;
            if (k == 3) length = split = pick(n);
            plan.split.push_back(split);
            plan.length.push_back(length);
        }
        const auto c = expect_same_as_own_models(cfg, plan, pick, fmt::format("seed {}", seed));
        replayed += c.replayed;
        own += c.own;
        diverged += c.diverged;
    }
    // Both paths are taken: requests answered from the log, members served alone.
    EXPECT_GT(replayed, own);
    EXPECT_GT(own, 0u);
    EXPECT_GT(diverged, 30u);
}

TEST(HbmReplicas, MembersInStepAreServedOnce) {
    Pick pick{std::mt19937(7)};
    Plan plan;
    uint64_t t = 0;
    for (size_t i = 0; i < 9000; ++i) plan.shared.push_back(random_request(pick, t));
    plan.split.assign(8, plan.shared.size());
    plan.length.assign(8, plan.shared.size());
    const auto c = expect_same_as_own_models(BoardConfig{}, plan, pick, "in step");
    EXPECT_EQ(c.served, 9000u);
    EXPECT_EQ(c.replayed, 7u * 9000u);
    EXPECT_EQ(c.own, 0u);
    EXPECT_EQ(c.diverged, 0u);
}

TEST(HbmReplicas, MembersThatPartAtOneIndexEqualTheirOwnModels) {
    // A collective parts every member at once: the first to leave replays the log, the others
    // copy its state at that index.
    for (uint32_t seed = 1; seed <= 4; ++seed) {
        Pick pick{std::mt19937(100 + seed)};
        Plan plan;
        uint64_t t = 0;
        for (size_t i = 0; i < 3000; ++i) plan.shared.push_back(random_request(pick, t));
        plan.split.assign(6, 3000);
        plan.length.assign(6, 3400);
        const auto c =
            expect_same_as_own_models(varied(seed), plan, pick, fmt::format("seed {}", seed));
        // The member that reaches index 3000 first goes on with the front model; the other
        // five leave.
        EXPECT_EQ(c.diverged, 5u);
        EXPECT_EQ(c.served + c.replayed, 6u * 3000u + 400u);
        EXPECT_EQ(c.own, 5u * 400u);
    }
}

TEST(HbmReplicas, AnIdleMemberLeavesRatherThanHoldTheLog) {
    // One core works, the others are idle (a single-core kernel on the board): past the log's
    // bound the idle members take their own (initial) state, so the log stops growing, and
    // their statistics stay those of an idle stack.
    const BoardConfig cfg;
    HbmReplicaGroup group(cfg, 4);
    auto busy = group.member(0), idle = group.member(1);
    Hbm2Timing alone(cfg);
    uint64_t t = 0;
    for (size_t i = 0; i < (size_t(1) << 18) + 10; ++i) {
        const Request q{t += 4, 1, 64, 64 * (i % 100000), 0, 0, 0, false, true};
        ASSERT_EQ(q.apply(*busy), q.apply(alone));
    }
    EXPECT_EQ(group.counters().diverged, 3u);
    EXPECT_FALSE(group.in_step(1));
    EXPECT_TRUE(group.in_step(0));
    Hbm2Timing fresh(cfg);
    EXPECT_EQ(stat_values(*idle), stat_values(fresh));
    EXPECT_EQ(stat_values(*busy), stat_values(alone));
}

TEST(HbmReplicas, NoSuchMemberIsAnError) {
    HbmReplicaGroup group(BoardConfig{}, 2);
    EXPECT_THROW(group.member(2), std::out_of_range);
}

}  // namespace
}  // namespace tpu::hw
