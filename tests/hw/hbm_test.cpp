// SPDX-License-Identifier: Apache-2.0
// The fast HBM2 pseudo-channel (Hbm2PseudoChannel, busy-until) against the cycle-stepped command
// scheduler (hw/reference/hbm_ref.h): the same end of data for every request of random request
// streams (hits, misses, bank-group changes, reads and writes, gaps, refreshes, both page
// policies, random timings); plus hand-computed cases, the address map, the core-cycle mapping
// and config errors.
#include <gtest/gtest.h>

#include <set>

#include <algorithm>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "hw/board_config.h"
#include "hw/mem/hbm2.h"
#include "hw/reference/hbm_ref.h"
#include "tests/common/paths.h"

namespace tpu::hw {
namespace {

/// The default HBM with refresh off unless a test wants it.
HbmConfig no_refresh() {
    HbmConfig c;
    c.timing.refi = 0;
    return c;
}

HbmRefRequest req(uint64_t arrive, std::vector<HbmColumnAccess> bursts, bool write = false) {
    return {arrive, write, std::move(bursts)};
}

/// Runs `reqs` through the fast model and returns each request's end of data.
std::vector<uint64_t> fast(const HbmConfig& cfg, const std::vector<HbmRefRequest>& reqs) {
    Hbm2PseudoChannel pc(cfg);
    std::vector<uint64_t> done;
    for (const auto& r : reqs) done.push_back(pc.access(r.arrive, r.bursts, r.write));
    return done;
}

/// Runs `reqs` through both models, expects equal results and returns them.
std::vector<uint64_t> both(const HbmConfig& cfg, const std::vector<HbmRefRequest>& reqs) {
    HbmPseudoChannelRef ref(cfg);
    const auto want = ref.run(reqs);
    const auto got = fast(cfg, reqs);
    EXPECT_EQ(got, want);
    return got;
}

// ---- hand-computed cases (default timing: CL 13, RCD 13, RP 13, RAS 30, RC 43, BL/2 = 2) ----

TEST(Hbm2, FirstReadRowHitRowMiss) {
    const auto done = both(
        no_refresh(),
        {
            req(0, {{0, 0, 7}}),    // closed bank: ACT 0, RD 0 + RCD = 13, data 13 + CL = 26 .. 28
            req(100, {{0, 0, 7}}),  // row hit: RD at 100, data 113 .. 115
            req(200, {{0, 0, 9}}),  // miss: PRE 200, ACT 200 + RP = 213, RD 226, data .. 241
        });
    EXPECT_EQ(done, (std::vector<uint64_t>{28, 115, 241}));
}

TEST(Hbm2, PrechargeWaitsForRasAndRtp) {
    // ACT 0, RD 13 (.. 28); the miss at 20 may precharge at max(ACT + RAS, RD + RTP) = 30,
    // then ACT 43 (RP; RC from 0 is also 43), RD 56, data .. 71.
    EXPECT_EQ(both(no_refresh(), {req(0, {{0, 0, 1}}), req(20, {{0, 0, 2}})}),
              (std::vector<uint64_t>{28, 71}));
}

TEST(Hbm2, ClosedPageReopensTheRow) {
    HbmConfig c = no_refresh();
    c.page_policy = "closed";
    // The first read auto-precharges at max(0 + RAS, 13 + RTP) = 30; the second read of the same
    // row activates again at max(30 + RP, 0 + RC) = 43: RD 56, data .. 71.
    EXPECT_EQ(both(c, {req(0, {{0, 0, 1}}), req(20, {{0, 0, 1}})}),
              (std::vector<uint64_t>{28, 71}));
}

TEST(Hbm2, BankGroupsSetColumnSpacing) {
    const std::vector<HbmColumnAccess> open4 = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}};
    const auto done = both(
        no_refresh(),
        {
            // ACTs 0, 4, 8, 12 (RRD 4); RDs 13, 17, 21, 25; data .. 40.
            req(0, open4),
            // Alternating groups: RDs 100, 102, 104, 106 (CCD_S 2; CCD_L 4 from 100 allows 104).
            req(100, {{0, 0, 0}, {1, 0, 0}, {0, 0, 0}, {1, 0, 0}}),
            // One group: RDs 200, 204, 208 (CCD_L); data .. 223.
            req(200, {{2, 0, 0}, {2, 0, 0}, {2, 0, 0}}),
        });
    EXPECT_EQ(done, (std::vector<uint64_t>{40, 121, 223}));
}

TEST(Hbm2, ReadWriteTurnaround) {
    const auto done =
        both(no_refresh(),
             {
                 req(0, {{0, 0, 0}}),          // data .. 28
                 req(300, {{0, 0, 0}}, true),  // WR 300, data 304 .. 306
                 req(301, {{0, 0, 0}}),        // RD >= 300 + WL + 2 + WTR = 312, data .. 327
                 req(400, {{0, 0, 0}}),        // RD 400, data 413 .. 415
                 req(401, {{0, 0, 0}}, true),  // WR >= 400 + RTW = 408 and data >= 415: 411
             });
    EXPECT_EQ(done, (std::vector<uint64_t>{28, 306, 327, 415, 417}));
}

TEST(Hbm2, FourActivateWindow) {
    HbmConfig c = no_refresh();
    c.timing.faw = 20;
    // ACTs 0, 4, 8, 12 (RRD), the fifth at 0 + FAW = 20; its RD at 33 (the others at 13, 17,
    // 21, 25), data .. 48.
    EXPECT_EQ(both(c, {req(0, {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {0, 1, 0}})}),
              (std::vector<uint64_t>{48}));
}

TEST(Hbm2, RefreshClosesBanksAndBlocksActivates) {
    HbmConfig c;  // refresh every 3434 tCK, RFC 229
    // Read at 0 opens the row (data .. 28). The next read arrives at 3500, after refresh 1 fell
    // due at 3434: PREA 3434, REF 3434 + RP = 3447, ACT 3447 + RFC = 3676, RD 3689, data .. 3704.
    EXPECT_EQ(both(c, {req(0, {{0, 0, 0}}), req(3500, {{0, 0, 0}})}),
              (std::vector<uint64_t>{28, 3704}));
    // A request waiting for its row when the refresh falls due waits for the refresh too; banks
    // already closed need no PREA: REF 3434, ACT 3663, RD 3676, data .. 3691.
    EXPECT_EQ(both(c, {req(3434, {{1, 2, 3}})}), (std::vector<uint64_t>{3691}));
}

TEST(Hbm2, LongIdleGapsRefreshEveryInterval) {
    HbmConfig c;
    // Refresh 1 closes the open row (PREA 3434, REF 3447); each next one falls due REFI after
    // the previous REF: REF 3447 + 3434 k. The 1000th, at 3447 + 999 x 3434 = 3434013, holds the
    // banks until 3434242, so a read arriving at 3434100 activates then: RD 3434255, .. 3434270.
    Hbm2PseudoChannel pc(c);
    const std::vector<HbmColumnAccess> b = {{0, 0, 0}};
    EXPECT_EQ(pc.access(0, b, false), 28u);
    EXPECT_EQ(pc.access(3434100, b, false), 3434270u);
    EXPECT_EQ(pc.counters().refreshes, 1000u);
}

TEST(Hbm2, QueueBoundsTheLookahead) {
    HbmConfig c = no_refresh();
    c.queue_bursts = 1;
    // With one queue entry the second burst (other bank) enters only after the first issued its
    // RD at 13, so its ACT is at 14 instead of 4: RD 27, data .. 42 (instead of 32).
    EXPECT_EQ(both(c, {req(0, {{0, 0, 0}, {1, 0, 0}})}), (std::vector<uint64_t>{42}));
    c.queue_bursts = 2;
    EXPECT_EQ(both(c, {req(0, {{0, 0, 0}, {1, 0, 0}})}), (std::vector<uint64_t>{32}));
}

// ---- random streams: fast == reference ----

struct StreamShape {
    uint32_t groups, banks, rows;  ///< how many of each the stream touches
    double write_p;                ///< share of write requests
    uint32_t max_bursts;           ///< bursts per request: 1 .. max_bursts
    uint32_t max_gap;              ///< tCK between arrivals: 0 .. max_gap (sometimes 20x)
};

std::vector<HbmRefRequest> random_stream(std::mt19937& rng, const StreamShape& s, size_t n) {
    auto pick = [&](uint32_t hi) { return std::uniform_int_distribution<uint32_t>(0, hi)(rng); };
    std::vector<HbmRefRequest> reqs;
    uint64_t t = 0;
    for (size_t i = 0; i < n; ++i) {
        HbmRefRequest r;
        t += pick(s.max_gap) * (pick(19) == 0 ? 20 : 1);
        r.arrive = t;
        r.write = std::bernoulli_distribution(s.write_p)(rng);
        const uint32_t nb = 1 + pick(s.max_bursts - 1);
        // Mostly a run through one bank's row set, sometimes scattered bursts.
        const bool scattered = pick(3) == 0;
        const uint32_t bank = pick(s.banks - 1);
        const uint64_t row = pick(s.rows - 1);
        uint32_t group = pick(s.groups - 1);
        for (uint32_t j = 0; j < nb; ++j) {
            if (scattered)
                r.bursts.push_back({pick(s.groups - 1), pick(s.banks - 1), pick(s.rows - 1)});
            else
                r.bursts.push_back({group, bank, row});
            group = (group + 1) % s.groups;
        }
        reqs.push_back(std::move(r));
    }
    return reqs;
}

/// Random timing parameters (each 1 .. 24, refresh sometimes off) on a small geometry.
HbmConfig random_config(std::mt19937& rng) {
    auto pick = [&](uint32_t lo, uint32_t hi) {
        return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    };
    HbmConfig c;
    HbmTiming& t = c.timing;
    for (uint32_t* f : {&t.cl, &t.rcd, &t.rp, &t.ras, &t.rc, &t.ccd_s, &t.ccd_l, &t.rrd, &t.faw,
                        &t.wl, &t.wr, &t.rtp, &t.wtr, &t.rtw})
        *f = pick(1, 24);
    t.rfc = pick(1, 120);
    t.refi = pick(0, 3) == 0 ? 0 : t.rfc + pick(1, 600);
    c.burst_length = 1u << pick(0, 3);
    c.bank_groups = 1u << pick(0, 2);
    c.banks_per_group = 1u << pick(0, 2);
    c.queue_bursts = pick(0, 2) == 0 ? pick(1, 4) : pick(5, 64);
    c.page_policy = pick(0, 1) ? "open" : "closed";
    return c;
}

void expect_equal_streams(const HbmConfig& c, const std::vector<HbmRefRequest>& reqs,
                          const std::string& what) {
    HbmPseudoChannelRef ref(c);
    std::vector<uint64_t> want;
    ASSERT_NO_THROW(want = ref.run(reqs)) << what;
    const auto got = fast(c, reqs);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << what << ": request " << i << " (arrive " << reqs[i].arrive
                                   << ", " << reqs[i].bursts.size() << " bursts)";
}

TEST(Hbm2Property, DefaultTimingRandomStreams) {
    for (const char* policy : {"open", "closed"}) {
        for (uint32_t seed = 1; seed <= 12; ++seed) {
            std::mt19937 rng(seed);
            HbmConfig c;
            c.page_policy = policy;
            c.timing.refi = seed % 3 == 0 ? 0 : 600;  // frequent refreshes exercise the corners
            c.timing.rfc = 60;
            c.queue_bursts = seed % 4 == 0 ? 2 : 32;
            const StreamShape shape{4, 2 + seed % 3,       1 + seed % 4, 0.1 * (seed % 5),
                                    8, seed % 2 ? 4u : 40u};
            expect_equal_streams(c, random_stream(rng, shape, 400),
                                 std::string(policy) + " seed " + std::to_string(seed));
        }
    }
}

// The timing sets of the non-v3 presets (hbm.generation, hw/mem/hbm_generation.cpp) at their
// clocks, on their geometries: HBM2 at 853 ps (v4-8), HBM2E at 625 ps (v5e-8) and HBM3's BL8
// at 312 ps (v6e-8).
TEST(Hbm2Property, PresetTimingSetsRandomStreams) {
    for (const char* preset : {"v4-8", "v5e-8", "v6e-8"}) {
        const BoardConfig b =
            BoardConfig::load(test::source_dir() + "/configs/" + preset + ".json", {});
        ASSERT_NE(b.hbm.generation, "custom") << preset;
        for (const char* policy : {"open", "closed"}) {
            for (uint32_t seed = 1; seed <= 6; ++seed) {
                std::mt19937 rng(seed);
                HbmConfig c = b.hbm;
                c.page_policy = policy;
                const StreamShape shape{
                    c.bank_groups,      2 + seed % 3, 1 + seed % 4, 0.1 * (seed % 5), 8,
                    seed % 2 ? 4u : 40u};
                expect_equal_streams(c, random_stream(rng, shape, 400),
                                     fmt::format("{} {} seed {}", preset, policy, seed));
            }
        }
    }
}

TEST(Hbm2Property, RandomTimingRandomStreams) {
    for (uint32_t seed = 100; seed < 700; ++seed) {
        std::mt19937 rng(seed);
        const HbmConfig c = random_config(rng);
        StreamShape shape{};
        shape.groups = c.bank_groups;
        shape.banks = c.banks_per_group;
        shape.rows = 1 + (seed / 3) % 4;
        shape.write_p = 0.25 * (seed / 12 % 4);
        shape.max_bursts = 1 + seed % 9;
        shape.max_gap = seed % 3 == 0 ? 60 : 6;
        expect_equal_streams(c, random_stream(rng, shape, 200), "seed " + std::to_string(seed));
    }
}

// The row-hit run shortcut against the per-burst path and the reference: the same end of data
// for every request and the same counters, on streams where both paths are taken.
TEST(Hbm2Property, RowHitRunsEqualThePerBurstPath) {
    uint64_t runs = 0, requests = 0;
    for (uint32_t seed = 1000; seed < 1300; ++seed) {
        std::mt19937 rng(seed);
        HbmConfig c = seed % 2 ? random_config(rng) : HbmConfig{};
        if (seed % 4 == 0) c.page_policy = "open";
        if (seed % 2 == 0) c.timing.refi = seed % 3 == 0 ? 0 : 700;
        StreamShape shape{};
        shape.groups = c.bank_groups;
        shape.banks = c.banks_per_group;
        shape.rows = 1 + seed % 3;
        shape.write_p = 0.2 * (seed % 4);
        shape.max_bursts = 1 + seed % 12;
        shape.max_gap = seed % 3 == 0 ? 40 : 3;
        const auto reqs = random_stream(rng, shape, 300);
        Hbm2PseudoChannel batched(c), per_burst(c, false);
        std::vector<uint64_t> a, b;
        for (const auto& r : reqs) {
            a.push_back(batched.access(r.arrive, r.bursts, r.write));
            b.push_back(per_burst.access(r.arrive, r.bursts, r.write));
        }
        ASSERT_EQ(a, b) << "seed " << seed;
        HbmPseudoChannelRef ref(c);
        ASSERT_EQ(a, ref.run(reqs)) << "seed " << seed;
        const auto& x = batched.counters();
        const auto& y = per_burst.counters();
        EXPECT_EQ(
            std::vector<uint64_t>({x.bursts, x.row_hits, x.activates, x.precharges, x.refreshes}),
            std::vector<uint64_t>({y.bursts, y.row_hits, y.activates, y.precharges, y.refreshes}))
            << "seed " << seed;
        EXPECT_EQ(y.runs, 0u);
        runs += x.runs;
        requests += reqs.size();
    }
    // Coverage: both paths serve a good share of the requests.
    EXPECT_GT(runs, requests / 5);
    EXPECT_LT(runs, requests * 4 / 5);
}

// The stack sends each granule's piece as a run; with granules larger than a row in every bank
// group a piece spans banks and takes the listed path. Either way the stack equals pseudo-
// channels fed burst by burst through the address map, for random requests, and its clock
// conversions (by reciprocal) equal the divisions written out here.
TEST(Hbm2Property, StackEqualsPerBurstPseudoChannels) {
    for (uint32_t seed = 1; seed <= 40; ++seed) {
        std::mt19937 rng(seed);
        auto pick = [&](uint64_t hi) {
            return std::uniform_int_distribution<uint64_t>(0, hi)(rng);
        };
        BoardConfig cfg;
        if (seed % 2) {
            cfg.hbm.interleave_bytes = 8192;  // 2 x (4 groups x 1 KiB rows): pieces span banks
            cfg.hbm.timing.refi = 900;
        }
        if (seed % 3 == 0) cfg.hbm.address_hash = "none";
        // Clock ratios on both sides of 1 for the conversions between core cycles and tCK.
        cfg.hbm.tck_ps = 500 + 97 * seed;
        Hbm2Timing stack(cfg);
        const HbmAddressMap& map = stack.address_map();
        std::vector<Hbm2PseudoChannel> pcs(map.pseudo_channels(),
                                           Hbm2PseudoChannel(cfg.hbm, false));
        const uint64_t T = cfg.period_ps(), tck = cfg.hbm.tck_ps, burst = map.burst_bytes();
        uint64_t t = 0;
        for (int i = 0; i < 400; ++i) {
            t += pick(3) == 0 ? pick(400) : pick(2);
            // Sequential runs, strided rows and random addresses in 4 MiB.
            const uint64_t addr = pick(3) == 0 ? pick(4 << 20) : (uint64_t(i) * 512 + pick(64));
            const auto bytes = static_cast<uint32_t>(1 + pick(2047));
            const bool write = pick(4) == 0;
            const uint64_t got = stack.access(t, addr, bytes, write);
            // The same request piece by piece (granules), burst by burst.
            const uint64_t arrive = (t * T + tck - 1) / tck;
            uint64_t done = arrive;
            const uint64_t g = map.interleave_bytes();
            ASSERT_LT(t * T, uint64_t(1) << 48);  // the reciprocal's range, not the fallback
            for (uint64_t lo = addr; lo < addr + bytes;) {
                const uint64_t hi = std::min(addr + bytes, (lo / g + 1) * g);
                std::vector<HbmColumnAccess> bursts;
                const HbmLocation l = map.decode(lo / burst * burst);
                const uint64_t b0 = l.local / burst;
                for (uint64_t j = 0; j < (hi - lo / burst * burst + burst - 1) / burst; ++j)
                    bursts.push_back(map.bank_of_burst(b0 + j));
                done = std::max(done, pcs[l.pseudo_channel].access(arrive, bursts, write));
                lo = hi;
            }
            ASSERT_EQ(got, (done * tck + T - 1) / T) << "seed " << seed << " request " << i;
        }
        EXPECT_GT(stack.counters().runs, 0u) << "seed " << seed;
    }
}

// A DMA transfer through access_rows (its pieces gathered per pseudo-channel, consecutive row
// hits served together) equals access() request by request, on random 2-D transfers mixed
// with single requests (as ICI writes come between transfers), in both page policies, with
// refreshes, small queues and granules that span banks.
/// Uniform integers in [0, hi] from one seeded stream.
struct Pick {
    std::mt19937 rng;
    uint64_t operator()(uint64_t hi) { return std::uniform_int_distribution<uint64_t>(0, hi)(rng); }
};

/// The HBM variants the transfer property tests cycle through by seed: closed pages, another
/// granule (`granule` when seed % 3 == 0), frequent refresh, short queues, no address hash.
BoardConfig varied_hbm(uint32_t seed, uint32_t granule, Pick& pick) {
    BoardConfig cfg;
    if (seed % 5 == 0) cfg.hbm.page_policy = "closed";
    if (seed % 3 == 0) cfg.hbm.interleave_bytes = granule;
    if (seed % 4 == 1) cfg.hbm.timing.refi = 700;
    if (seed % 7 == 0) cfg.hbm.queue_bursts = 1 + uint32_t(pick(12));
    if (seed % 6 == 0) cfg.hbm.address_hash = "none";
    return cfg;
}

/// Both models issued the same commands (the shortcut only changes how they are computed).
void expect_same_commands(const Hbm2PseudoChannel::Counters& x,
                          const Hbm2PseudoChannel::Counters& y, uint32_t seed) {
    EXPECT_EQ(std::vector<uint64_t>({x.bursts, x.row_hits, x.activates, x.precharges, x.refreshes}),
              std::vector<uint64_t>({y.bursts, y.row_hits, y.activates, y.precharges, y.refreshes}))
        << "seed " << seed;
}

/// The next event of a random stream: `t` advances by a short or a long gap and `write` is
/// drawn; one time in `one_in`, a lone request (as an ICI write between transfers) of random
/// address and size goes to both models, which must agree, and the result is true.
bool lone_request(Hbm2Timing& batched, Hbm2Timing& one_by_one, Pick& pick, uint64_t one_in,
                  uint64_t& t, bool& write) {
    t += pick(1) ? pick(30) : pick(3000);
    write = pick(3) == 0;
    if (pick(one_in - 1) != 0) return false;
    const uint64_t addr = pick(8 << 20);
    const auto bytes = static_cast<uint32_t>(1 + pick(1023));
    EXPECT_EQ(batched.access(t, addr, bytes, write), one_by_one.access(t, addr, bytes, write));
    return true;
}

TEST(Hbm2Property, TransfersEqualTheirRequestsOneByOne) {
    uint64_t runs = 0, bursts = 0;
    for (uint32_t seed = 1; seed <= 60; ++seed) {
        Pick pick{std::mt19937(seed)};
        const BoardConfig cfg = varied_hbm(seed, 8192, pick);
        Hbm2Timing batched(cfg), one_by_one(cfg);
        uint64_t t = 0;
        for (int i = 0; i < 60; ++i) {
            bool write = false;
            if (lone_request(batched, one_by_one, pick, 5, t, write)) continue;
            const uint64_t rows = 1 + pick(pick(1) ? 3 : 64), row_bytes = 1 + pick(4095);
            const uint64_t stride = pick(1) ? row_bytes : row_bytes + pick(3) * 256 + pick(64);
            const uint64_t addr = pick(1) ? pick(16) * 4096 : pick(4 << 20);
            const auto chunk = static_cast<uint32_t>(pick(1) ? 512 : 32 + pick(2000));
            const auto port = static_cast<uint32_t>(pick(1) ? 512 : 1 + pick(700));
            const uint64_t got =
                batched.access_rows(t, rows, row_bytes, addr, stride, chunk, port, write);
            const uint64_t want = one_by_one.HbmTimingModel::access_rows(
                t, rows, row_bytes, addr, stride, chunk, port, write);
            ASSERT_EQ(got, want) << "seed " << seed << " transfer " << i;
        }
        const auto x = batched.counters();
        expect_same_commands(x, one_by_one.counters(), seed);
        runs += x.runs;
        bursts += x.bursts;
    }
    EXPECT_GT(runs, bursts / 64);  // the shortcut serves a good share
}

// Contiguous transfers of whole granules (the DMA's usual shape), which access_rows serves per
// pseudo-channel without cutting them by address, equal access() request by request: random
// granule-aligned ranges (some shorter than a group of pseudo-channels, some over many rows,
// some of rows shorter than a chunk), chunks of one or more granules, any port, both hashes and
// page policies, refreshes, small queues, granules that span banks, with lone requests and general
// transfers in between.
TEST(Hbm2Property, WholeGranuleTransfersEqualTheirRequestsOneByOne) {
    uint64_t whole = 0, transfers = 0, runs = 0, paced = 0, short_rows = 0;
    for (uint32_t seed = 1; seed <= 60; ++seed) {
        Pick pick{std::mt19937(seed)};
        const BoardConfig cfg = varied_hbm(seed, seed % 2 ? 8192 : 64, pick);
        const uint64_t g = cfg.hbm.interleave_bytes;
        Hbm2Timing batched(cfg), one_by_one(cfg);
        uint64_t t = 0;
        for (int i = 0; i < 40; ++i) {
            bool write = false;
            if (lone_request(batched, one_by_one, pick, 6, t, write)) continue;
            const auto chunk = static_cast<uint32_t>(g * (pick(1) ? 2 : 1 + pick(5)));
            const uint64_t rows = pick(1) ? 1 : 1 + pick(40);
            // Rows of several chunks, or (with rows back to back) of whole granules shorter than
            // a chunk: one request per row.
            const uint64_t row_bytes = rows == 1 ? g * (1 + pick(pick(1) ? 20 : 600))
                                       : chunk > g && pick(2) == 0 ? g * (1 + pick(chunk / g - 2))
                                                                   : chunk * (1 + pick(8));
            // Mostly contiguous; a strided one now and then takes the general path.
            const uint64_t stride = pick(6) ? row_bytes : row_bytes + g * (1 + pick(3));
            const uint64_t addr = g * pick((16 << 20) / g);
            const auto port = static_cast<uint32_t>(pick(1) ? 512 : 1 + pick(700));
            const uint64_t before = batched.whole_granule_transfers();
            const uint64_t got =
                batched.access_rows(t, rows, row_bytes, addr, stride, chunk, port, write);
            const uint64_t want = one_by_one.HbmTimingModel::access_rows(
                t, rows, row_bytes, addr, stride, chunk, port, write);
            ASSERT_EQ(got, want) << "seed " << seed << " transfer " << i;
            whole += batched.whole_granule_transfers() - before;
            if (rows > 1 && row_bytes < chunk && stride == row_bytes)
                short_rows += batched.whole_granule_transfers() - before;
            ++transfers;
            if (pick(1)) t = got;  // the next one after this one, or overlapping it
        }
        const auto x = batched.counters();
        expect_same_commands(x, one_by_one.counters(), seed);
        runs += x.runs;
        paced += x.paced_runs;
    }
    // Both paths are taken: most transfers are whole granules, some are not; many row-hit runs
    // are served in gap-free stretches, others one by one.
    EXPECT_GT(whole, transfers / 2);
    EXPECT_LT(whole, transfers);
    EXPECT_GT(paced, runs / 4);
    EXPECT_LT(paced, runs);
    EXPECT_GT(short_rows, 0u);  // rows shorter than a chunk, one request each, served whole
}

// Whole-granule transfers on random timings and geometries (bank groups, banks, rows, bursts,
// granules, queue depths, frequent refreshes): each pseudo-channel's granules, served per bank
// row as a head of one burst per bank group and the rest in closed form up to the row's end or
// the next refresh, equal access() request by request, with the same commands. Transfers of up
// to hundreds of granules cross many bank rows, back to back or after gaps, at ports above and
// below the HBM's bandwidth (runs that start one step after the previous column, and runs that
// wait for their arrival).
TEST(Hbm2Property, WholeGranuleStreamsOnRandomTimings) {
    uint64_t whole = 0, transfers = 0, stretches = 0, refreshes = 0;
    for (uint32_t seed = 1; seed <= 150; ++seed) {
        Pick pick{std::mt19937(seed)};
        BoardConfig cfg;
        HbmConfig& h = cfg.hbm;
        if (seed % 4 == 0) {
            h.timing.refi = seed % 8 == 0 ? 0 : 700;
        } else {
            h = random_config(pick.rng);
            h.page_policy = seed % 10 == 1 ? "closed" : "open";
        }
        h.row_bytes = 256u << pick(3);
        h.interleave_bytes = 64u << pick(3);
        if (pick(1)) h.queue_bursts = 8 + uint32_t(pick(56));
        ASSERT_NO_THROW(cfg.validate()) << "seed " << seed;
        const uint64_t g = h.interleave_bytes;
        Hbm2Timing batched(cfg), one_by_one(cfg);
        uint64_t t = 0;
        for (int i = 0; i < 30; ++i) {
            bool write = false;
            if (lone_request(batched, one_by_one, pick, 8, t, write)) continue;
            const auto chunk = static_cast<uint32_t>(g * (1 + pick(3)));
            const uint64_t bytes = chunk * (1 + pick(pick(1) ? 8 : 160));
            const uint64_t addr = g * pick((8 << 20) / g);
            const auto port = static_cast<uint32_t>(pick(1) ? 512 : 1 + pick(300));
            const uint64_t before = batched.whole_granule_transfers();
            const uint64_t got = batched.access_rows(t, 1, bytes, addr, bytes, chunk, port, write);
            const uint64_t want = one_by_one.HbmTimingModel::access_rows(t, 1, bytes, addr, bytes,
                                                                         chunk, port, write);
            ASSERT_EQ(got, want) << "seed " << seed << " transfer " << i;
            whole += batched.whole_granule_transfers() - before;
            ++transfers;
            if (pick(1)) t = got;
        }
        const auto x = batched.counters();
        expect_same_commands(x, one_by_one.counters(), seed);
        stretches += x.stretches;
        refreshes += x.refreshes;
    }
    // Every transfer is whole granules; many take the stream (others the general path: closed
    // pages, granules of fewer bursts than bank groups or more than the queue), with refreshes.
    EXPECT_EQ(whole, transfers);
    EXPECT_GT(stretches, transfers * 2);
    EXPECT_GT(refreshes, transfers);
}

// Rows of whole granules apart or back to back (a strided DMA: an image's channel slice, a
// filter's rows), which access_rows serves per pseudo-channel from a list of their granules, equal
// access() request by request, with the same commands and row conflicts in every bank: random
// granule-aligned rows, strides from back to back to many granules apart, chunks of one or more
// granules and rows shorter than a chunk (one request each, any chunk), any port, both hashes and
// page policies, random timings and geometries (bank groups, banks, rows, queue depths, frequent
// refreshes), granules of fewer bursts than bank groups and granules that span banks (the general
// path), with lone requests in between.
TEST(Hbm2Property, RowsOfWholeGranulesEqualTheirRequestsOneByOne) {
    uint64_t listed = 0, transfers = 0, stretches = 0, paced = 0, runs = 0, refreshes = 0;
    for (uint32_t seed = 1; seed <= 120; ++seed) {
        Pick pick{std::mt19937(seed)};
        BoardConfig cfg = varied_hbm(seed, seed % 2 ? 8192 : 64, pick);
        HbmConfig& h = cfg.hbm;
        if (seed % 4 == 2) {
            const std::string page = h.page_policy;
            h = random_config(pick.rng);
            h.page_policy = page;
            h.row_bytes = 256u << pick(3);
            h.interleave_bytes = 64u << pick(3);
            if (pick(1)) h.queue_bursts = 8 + uint32_t(pick(56));
        }
        ASSERT_NO_THROW(cfg.validate()) << "seed " << seed;
        const uint64_t g = h.interleave_bytes;
        Hbm2Timing batched(cfg), one_by_one(cfg);
        uint64_t t = 0;
        for (int i = 0; i < 40; ++i) {
            bool write = false;
            if (lone_request(batched, one_by_one, pick, 8, t, write)) continue;
            const auto chunk = static_cast<uint32_t>(pick(3) ? g * (1 + pick(3)) : 32 + pick(2000));
            const uint64_t rows = 2 + pick(pick(1) ? 6 : 80);
            // Rows shorter than a chunk (one request each, whatever the chunk), or of several
            // granules cut into chunks.
            const uint64_t row_bytes = chunk >= g && pick(1) ? g * (1 + pick(chunk / g - 1))
                                                             : g * (1 + pick(pick(1) ? 4 : 40));
            const uint64_t stride =
                pick(3) == 0 ? row_bytes : row_bytes + g * (1 + pick(pick(1) ? 3 : 40));
            const uint64_t addr = g * pick((16 << 20) / g);
            const auto port = static_cast<uint32_t>(pick(1) ? 512 : 1 + pick(700));
            const uint64_t before = batched.granule_list_transfers();
            const uint64_t got =
                batched.access_rows(t, rows, row_bytes, addr, stride, chunk, port, write);
            const uint64_t want = one_by_one.HbmTimingModel::access_rows(
                t, rows, row_bytes, addr, stride, chunk, port, write);
            ASSERT_EQ(got, want) << "seed " << seed << " transfer " << i;
            listed += batched.granule_list_transfers() - before;
            ++transfers;
            if (pick(1)) t = got;  // the next one after this one, or overlapping it
        }
        const auto x = batched.counters();
        expect_same_commands(x, one_by_one.counters(), seed);
        const size_t banks = size_t(h.bank_groups) * h.banks_per_group;
        for (size_t b = 0; b < banks; ++b)
            EXPECT_EQ(batched.bank_conflicts(b), one_by_one.bank_conflicts(b))
                << "seed " << seed << " bank " << b;
        stretches += x.stretches;
        paced += x.paced_runs;
        runs += x.runs;
        refreshes += x.refreshes;
    }
    // Most transfers are served from granule lists (the others: rows not cut on granules,
    // granules that span banks), most of them in stretches, with refreshes among them; runs
    // are served both one step after the previous column and at their arrival.
    EXPECT_GT(listed, transfers / 2);
    EXPECT_LT(listed, transfers);
    EXPECT_GT(stretches, listed);
    EXPECT_GT(refreshes, transfers);
    EXPECT_GT(paced, runs / 8);
    EXPECT_LT(paced, runs);
}

// ---- the whole stack: address map and core cycles ----

TEST(Hbm2Timing, AddressMap) {
    HbmConfig plain;
    plain.address_hash = "none";
    const HbmAddressMap m(plain);
    // 32 B bursts; 256 B granules over 32 pseudo-channels; bank group, column, bank, row.
    EXPECT_EQ(m.burst_bytes(), 32u);
    auto at = [&](uint64_t a) {
        const auto l = m.decode(a);
        return std::vector<uint64_t>{l.pseudo_channel, l.bank.bank_group, l.column, l.bank.bank,
                                     l.bank.row};
    };
    EXPECT_EQ(at(0), (std::vector<uint64_t>{0, 0, 0, 0, 0}));
    EXPECT_EQ(at(32 + 5), (std::vector<uint64_t>{0, 1, 0, 0, 0}));
    EXPECT_EQ(at(128), (std::vector<uint64_t>{0, 0, 1, 0, 0}));
    EXPECT_EQ(at(256), (std::vector<uint64_t>{1, 0, 0, 0, 0}));
    EXPECT_EQ(at(31 * 256), (std::vector<uint64_t>{31, 0, 0, 0, 0}));
    EXPECT_EQ(m.decode(17 * 256).channel, 1u);
    EXPECT_EQ(at(32 * 256), (std::vector<uint64_t>{0, 0, 2, 0, 0}));  // local 256: burst 8
    // local 4 KiB = 4 bank groups x 1 KiB rows: the next bank; 16 KiB: the next row.
    EXPECT_EQ(at(32 * 4096), (std::vector<uint64_t>{0, 0, 0, 1, 0}));
    EXPECT_EQ(at(32 * 16384 + 3 * 32), (std::vector<uint64_t>{0, 3, 0, 0, 1}));
}

TEST(Hbm2Timing, XorAddressMapIsOneToOneAndSpreadsStrides) {
    const HbmAddressMap m(HbmConfig{});
    ASSERT_EQ(HbmConfig{}.address_hash, "xor");
    // One-to-one: 64 K granules (16 MiB) land on distinct (pseudo-channel, local) pairs, and
    // every pseudo-channel gets the same share.
    std::set<std::pair<uint32_t, uint64_t>> seen;
    std::vector<int> per_pc(32, 0);
    for (uint64_t g = 0; g < 65536; ++g) {
        const auto l = m.decode(g * 256 + 17);
        EXPECT_EQ(l.local % 256, 17u);
        seen.emplace(l.pseudo_channel, l.local);
        ++per_pc[l.pseudo_channel];
    }
    EXPECT_EQ(seen.size(), 65536u);
    EXPECT_EQ(std::count(per_pc.begin(), per_pc.end(), 2048), 32);
    // A 2 KiB stride (rows of a 1024-column bf16 matrix) visits every pseudo-channel, where plain
    // modulo interleaving would use only 4 of 32.
    std::set<uint32_t> pcs;
    for (uint64_t r = 0; r < 128; ++r) pcs.insert(m.decode(r * 2048).pseudo_channel);
    EXPECT_EQ(pcs.size(), 32u);
}

TEST(Hbm2Timing, CoreCycles) {
    BoardConfig cfg;
    ASSERT_EQ(cfg.hbm.model, "hbm2");
    auto model = make_hbm_timing(cfg);
    ASSERT_NE(dynamic_cast<Hbm2Timing*>(model.get()), nullptr);
    // 64 B at 0: bank groups 0 and 1 of pseudo-channel 0. ACT 0 and 4, RD 13 and 17, data ends
    // at tCK 32 = 36352 ps; the core (1064 ps) sees it at ceil(34.17) = 35.
    EXPECT_EQ(model->access(0, 0, 64, false), 35u);
    // Core cycle 10 = 10640 ps arrives at tCK ceil(9.37) = 10 on pseudo-channel 1 (fresh):
    // data ends at tCK 42 = 47712 ps = core cycle ceil(44.84) = 45.
    EXPECT_EQ(model->access(10, 256, 64, false), 45u);
    // 512 B at 128 splits into 128 B on pseudo-channel 0, 256 B on 1 and 128 B on 2. On a fresh
    // stack the 256 B piece ends last: ACTs 0, 4, 8, 12 (RRD); RDs 13, 17, 21, 25 (RCD), then
    // 27, 29, 31, 33 (CCD_S); data ends at tCK 48 = 54528 ps = core cycle ceil(51.25) = 52.
    Hbm2Timing fresh(cfg);
    EXPECT_EQ(fresh.access(0, 128, 512, false), 52u);
    EXPECT_EQ(fresh.counters().bursts, 16u);
    EXPECT_NEAR(fresh.peak_bytes_per_cycle(), 32 * 32 / (2 * 1136.0) * 1064, 1e-9);
}

TEST(Hbm2Timing, WholeGranulesAcrossABankRow) {
    // One pseudo-channel of 2 bank groups x 2 banks, 32 B bursts, 64 B rows and granules: a
    // granule is a run of 2 bursts (groups 0, 1) and a bank row 4 bursts; queue of 4 bursts.
    BoardConfig cfg;
    HbmConfig& h = cfg.hbm;
    h.channels = 1;
    h.pseudo_channels = 1;
    h.bus_bits = 64;
    h.bank_groups = 2;
    h.banks_per_group = 2;
    h.row_bytes = 64;
    h.interleave_bytes = 64;
    h.queue_bursts = 4;
    h.timing.refi = 0;
    ASSERT_NO_THROW(cfg.validate());
    Hbm2Timing stack(cfg), one_by_one(cfg);
    // 256 B in 64 B requests at 64 B per core cycle: request k at core cycle k, tCK ceil(k x
    // 1064 / 1136) = 0, 1, 2, 3; bank 0 row 0 (bursts 0-3), then bank 1 row 0 (bursts 4-7).
    // Head of bank 0: ACT g0 0, RD 13 (RCD); ACT g1 4 (RRD), RD 17. Run 1 from 17 + 2: RD 19,
    // 21. Head of bank 1: burst 4 enters after burst 0's RD (queue of 4): ACT 14, RD 27; burst
    // 5 after burst 1's: ACT 18, RD 31. Run 3: RD 33, 35; data until 35 + CL 13 + 2 = tCK 50 =
    // core cycle ceil(50 x 1136 / 1064) = 54.
    EXPECT_EQ(stack.access_rows(0, 1, 256, 0, 256, 64, 64, false), 54u);
    EXPECT_EQ(one_by_one.HbmTimingModel::access_rows(0, 1, 256, 0, 256, 64, 64, false), 54u);
    EXPECT_EQ(stack.whole_granule_transfers(), 1u);
    const auto c = stack.counters();
    EXPECT_EQ(std::vector<uint64_t>({c.bursts, c.row_hits, c.activates, c.stretches}),
              std::vector<uint64_t>({8, 4, 4, 2}));
    expect_same_commands(c, one_by_one.counters(), 0);
}

TEST(Hbm2Timing, StreamingReachesNinetyPercent) {
    BoardConfig cfg;
    Hbm2Timing m(cfg);
    // 8 MiB in 512 B requests, one per core cycle (the DMA engine's 512 B/cycle port).
    const uint64_t bytes = 8u << 20;
    uint64_t done = 0;
    for (uint64_t a = 0; a < bytes; a += 512)
        done = std::max(done, m.access(a / 512, a, 512, false));
    const double eff = double(bytes) / double(done) / m.peak_bytes_per_cycle();
    EXPECT_GT(eff, 0.90);
    EXPECT_LT(eff, 1.0);
}

// ---- errors ----

TEST(Hbm2Errors, ConfigRules) {
    auto error_of = [](const std::vector<std::string>& sets) -> std::string {
        try {
            BoardConfig::load("", sets);
        } catch (const std::exception& e) {
            return e.what();
        }
        return "no error";
    };
    EXPECT_EQ(error_of({"hbm.model=hbm2"}), "no error");
    EXPECT_EQ(error_of({"hbm.timing.refi=229"}),
              "hbm.timing.refi: 229 must be 0 or more than rfc (229)");
    EXPECT_EQ(error_of({"hbm.timing.refi=0"}), "no error");
    EXPECT_EQ(error_of({"hbm.burst_length=16", "hbm.interleave_bytes=64"}),
              "hbm.interleave_bytes: 64 is smaller than one burst (128 bytes = bus_bits / "
              "pseudo_channels x burst_length / 8)");
    EXPECT_EQ(error_of({"hbm.burst_length=64", "hbm.interleave_bytes=1024", "hbm.row_bytes=256"}),
              "hbm.row_bytes: 256 is smaller than one burst (512 bytes)");
}

TEST(Hbm2Errors, ReferenceRejectsEmptyRequest) {
    HbmPseudoChannelRef ref(no_refresh());
    EXPECT_THROW(ref.run({req(0, {})}), std::logic_error);
}

}  // namespace
}  // namespace tpu::hw
