// SPDX-License-Identifier: Apache-2.0
// IciNetwork: hand-derived link timing, statistics and errors, and random transfer streams on
// rings and 2-D and 3-D tori against the cycle-stepped IciRef (hw/README.md, "ICI network").
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>

#include <fmt/format.h>

#include "hw/ici/ici_network.h"
#include "hw/reference/ici_ref.h"

namespace tpu::hw {
namespace {

/// The default board (8 cores on a ring, 940 MHz, 80 GB/s, 1 us per hop) with overrides.
IciNetwork network(const std::vector<std::string>& overrides = {}) {
    return IciNetwork(BoardConfig::load("", overrides));
}

// On the default board a link moves 80e9 / 940e6 = 85.1 B per cycle, so 4 KiB take
// ceil(48.13) = 49 cycles, and a hop is ceil(1000 ns x 0.94) = 940 cycles.
constexpr uint64_t kSer4K = 49, kHop = 940;

// Link ids: core * 6 + {+x, -x, +y, -y, +z, -z}; on the ring -x is counter-clockwise.
constexpr uint32_t kLink(uint32_t core, uint32_t dir) {
    return core * IciNetwork::kDirs + dir;
}
constexpr uint32_t kMinusX(uint32_t core) {
    return kLink(core, 1);
}

TEST(IciNetwork, DefaultBoardFigures) {
    const IciNetwork net = network();
    EXPECT_EQ(net.ser_cycles(4096), kSer4K);
    EXPECT_EQ(net.hop_cycles(), kHop);
    EXPECT_EQ(net.route(0, 5), (std::vector<uint32_t>{kMinusX(0), kMinusX(7), kMinusX(6)}));
    // A tie goes clockwise.
    EXPECT_EQ(net.route(0, 4),
              (std::vector<uint32_t>{kLink(0, 0), kLink(1, 0), kLink(2, 0), kLink(3, 0)}));
    EXPECT_TRUE(net.has_link(kMinusX(3)));
    EXPECT_FALSE(net.has_link(kLink(3, 2)));  // a ring has no y links
    EXPECT_FALSE(net.has_link(kLink(3, 4)));  // nor z links
    EXPECT_EQ(IciNetwork::link_name(kMinusX(7)), "core7-x");
    EXPECT_EQ(net.link_target(kMinusX(0)), 7u);  // wraps around
    EXPECT_EQ(net.link_target(kLink(7, 0)), 0u);
}

// The example of issue 13 (the same cycles as Board.IciTransferFitsTheIdleGapBeforeAnother):
// core 0 starts 4 KiB to core 5 at cycle 4 over 0 -> 7 -> 6 -> 5, so link 7 -> 6 is promised
// [4 + 940, 4 + 940 + 49) = [944, 993). Core 7 starts 4 KiB to core 6 at 105: [105, 154) is idle,
// so it arrives at 105 + 940 + 49 = 1094 as it does alone (a single busy-until value per link
// made it wait for 993 and arrive at 1982).
TEST(IciNetwork, LaterTransferUsesTheIdleGapBeforeAnEarlierPromise) {
    IciNetwork net = network();
    std::vector<IciHop> hops;
    const IciArrival a = net.transfer(0, 5, 4, 4096, &hops);
    // t = 4; each link s = t, t = s + 940: 4, 944, 1884; arrival 1884 + 940 + 49 = 2873.
    EXPECT_EQ(a.last, 2873u);
    EXPECT_EQ(a.first, 2873u - kSer4K);
    ASSERT_EQ(hops.size(), 3u);
    EXPECT_EQ(hops[1].link, kMinusX(7));
    EXPECT_EQ(hops[1].begin, 944u);
    EXPECT_EQ(hops[1].end, 993u);
    EXPECT_EQ(net.transfer(7, 6, 105, 4096).last, 1094u);
    IciNetwork alone = network();
    EXPECT_EQ(alone.transfer(7, 6, 105, 4096).last, 1094u);
}

TEST(IciNetwork, ATransferThatDoesNotFitTheGapWaitsForTheLink) {
    IciNetwork net = network();
    net.transfer(0, 5, 4, 4096);  // link 7 -> 6 promised [944, 993)
    // 71400 B take ceil(838.95) = 839 cycles: [105, 944) ends where the promise begins.
    EXPECT_EQ(net.ser_cycles(71400), 839u);
    EXPECT_EQ(net.transfer(7, 6, 105, 71400).last, 105 + kHop + 839);
    // 71450 B take 840 cycles: [1049, ...) would overlap [105, 944) and [944, 993): it takes
    // the link at 993, after both, and arrives at 993 + 940 + 840.
    EXPECT_EQ(net.ser_cycles(71450), 840u);
    EXPECT_EQ(net.transfer(7, 6, 105, 71450).last, 993 + kHop + 840);
    const IciLinkStats& s = net.link_stats(kMinusX(7));
    EXPECT_EQ(s.transfers, 3u);
    EXPECT_EQ(s.bytes, 4096u + 71400 + 71450);
    EXPECT_EQ(s.busy_cycles, kSer4K + 839 + 840);
    EXPECT_EQ(s.queue_cycles, 993u - 105);  // only the last one waited
    EXPECT_EQ(net.link_stats(kMinusX(0)).transfers, 1u);
    EXPECT_EQ(net.link_stats(kMinusX(5)).transfers, 0u);
}

TEST(IciNetwork, StoreAndForwardBuffersEveryPacket) {
    IciNetwork net = network({"ici.switching=store-and-forward"});
    // Each link: s = t, t = s + 940 + 49: 4, 993, 1982; arrival 1982 + 989 = 2971.
    EXPECT_EQ(net.transfer(0, 5, 4, 4096).last, 2971u);
    // One hop is the same either way: 105 + 940 + 49.
    EXPECT_EQ(net.transfer(7, 6, 105, 4096).last, 1094u);
}

TEST(IciNetwork, TorusRoutesXThenYAndLocalCopiesUseNoLink) {
    IciNetwork net = network({"chips=8", "ici.topology=torus2d"});
    EXPECT_EQ(net.torus_x(), 4u);
    // 0 -> 10 on a 4 x 4 torus: +x, +x (0 -> 1 -> 2), then +y, +y (2 -> 6 -> 10).
    EXPECT_EQ(net.route(0, 10),
              (std::vector<uint32_t>{kLink(0, 0), kLink(1, 0), kLink(2, 2), kLink(6, 2)}));
    // 0 -> 12: y the short way round, -y.
    EXPECT_EQ(net.route(0, 12), (std::vector<uint32_t>{kLink(0, 3)}));
    EXPECT_FALSE(net.has_link(kLink(5, 4)));  // a 2-D torus has no z links
    EXPECT_EQ(net.transfer(0, 10, 3, 4096).last, 3 + 4 * kHop + kSer4K);
    EXPECT_EQ(net.transfer(3, 3, 7, 4096).last, 7 + kSer4K);
    EXPECT_EQ(net.message(0, 10, 3), 3 + 4 * kHop);
}

// A 3-D torus 4 x 2 x 3 (24 cores, core = (z x 2 + y) x 4 + x): x, then y, then z, each the
// short way round. 1 = (1, 0, 0) -> 22 = (2, 1, 2): +x (1 -> 2); y from 0 to 1 of 2 ties, so +y
// (2 -> 6); z from 0 to 2 of 3 is one step back, -z (6 -> 6 + 2 x 8 = 22).
TEST(IciNetwork, Torus3dRoutesXThenYThenZ) {
    IciNetwork net = network({"chips=24", "cores_per_chip=1", "chips_per_host=24",
                              "ici.topology=torus3d", "ici.torus_x=4", "ici.torus_y=2"});
    EXPECT_EQ(net.shape().x, 4u);
    EXPECT_EQ(net.shape().y, 2u);
    EXPECT_EQ(net.shape().z, 3u);
    EXPECT_EQ(net.route(1, 22), (std::vector<uint32_t>{kLink(1, 0), kLink(2, 2), kLink(6, 5)}));
    EXPECT_TRUE(net.has_link(kLink(6, 5)));
    EXPECT_EQ(IciNetwork::link_name(kLink(6, 5)), "core6-z");
    EXPECT_EQ(net.link_target(kLink(6, 5)), 22u);  // z 0 -> 2 of 3, wrapping
    EXPECT_EQ(net.link_target(kLink(22, 4)), 6u);
    EXPECT_EQ(net.link_target(kLink(7, 0)), 4u);  // x 3 -> 0
    EXPECT_EQ(net.link_target(kLink(7, 3)), 3u);  // y 1 -> 0
    // Three hops: 5 + 3 x 940 + 49.
    EXPECT_EQ(net.transfer(1, 22, 5, 4096).last, 5 + 3 * kHop + kSer4K);
    // A cube by default: 27 cores are 3 x 3 x 3.
    const IciNetwork cube =
        network({"chips=27", "cores_per_chip=1", "chips_per_host=27", "ici.topology=torus3d"});
    EXPECT_EQ(cube.shape().x * 10 + cube.shape().y, 33u);
    EXPECT_EQ(cube.shape().z, 3u);
}

TEST(IciNetwork, RetiringOldPromisesChangesNothing) {
    IciNetwork a = network(), b = network();
    for (uint64_t i = 0; i < 50; ++i) {
        a.transfer(i % 8, (i * 3 + 1) % 8, i * 20, 1000 + i * 37);
        b.transfer(i % 8, (i * 3 + 1) % 8, i * 20, 1000 + i * 37);
        b.retire(i * 20);
    }
    EXPECT_EQ(a.transfer(1, 6, 1000, 9000).last, b.transfer(1, 6, 1000, 9000).last);
}

TEST(IciNetwork, BadInputIsAClearError) {
    IciNetwork net = network();
    EXPECT_THROW(
        {
            try {
                net.transfer(0, 8, 0, 64);
            } catch (const std::invalid_argument& e) {
                EXPECT_STREQ(e.what(), "ICI: core 8 does not exist (the network has cores 0-7)");
                throw;
            }
        },
        std::invalid_argument);
    EXPECT_THROW(net.transfer(0, 1, 0, 0), std::invalid_argument);
    EXPECT_THROW(net.route(9, 0), std::invalid_argument);
    EXPECT_THROW(IciRef({.cores = 6, .width = 4}), std::invalid_argument);
}

// ---- random streams against the cycle-stepped reference ----

struct Coverage {
    uint64_t transfers = 0;
    uint64_t queued = 0;     ///< transfers that waited for some link
    uint64_t gap_fills = 0;  ///< link reservations before an earlier transfer's on that link
    uint64_t multi_hop = 0;  ///< transfers over more than one link
};

/// One random stream: `cores` cores `width` wide, transfers started in non-decreasing issue
/// order (as the cores do), each no earlier than its issue; both models must agree.
void expect_equal_stream(std::mt19937& rng, uint32_t cores, uint32_t width, bool torus,
                         Coverage& cov, const std::string& what, uint32_t height = 0) {
    const uint32_t hop_ns = std::uniform_int_distribution<uint32_t>(0, 9)(rng) == 0
                                ? 1000
                                : std::uniform_int_distribution<uint32_t>(0, 40)(rng);
    const double gbps[] = {80.0, 47.0, 9.4, 150.0, 3.3};
    const bool cut_through = rng() % 3 != 0;
    std::vector<std::string> set = {
        // One chip per core and one host for them all: any core count is a valid board.
        fmt::format("chips={}", cores),
        "cores_per_chip=1",
        fmt::format("chips_per_host={}", cores),
        fmt::format("ici.hop_latency_ns={}", hop_ns),
        fmt::format("ici.link_gb_per_s={}", gbps[rng() % 5]),
        fmt::format("ici.switching={}", cut_through ? "cut-through" : "store-and-forward")};
    if (torus) {
        set.push_back(height ? "ici.topology=torus3d" : "ici.topology=torus2d");
        set.push_back(fmt::format("ici.torus_x={}", width));
        if (height) set.push_back(fmt::format("ici.torus_y={}", height));
    }
    IciNetwork net = network(set);
    ASSERT_EQ(net.torus_x(), width);
    IciRef ref({.cores = cores,
                .width = width,
                .height = height,
                .hop_cycles = net.hop_cycles(),
                .bytes_per_cycle = net.bytes_per_cycle(),
                .cut_through = cut_through});
    const uint32_t n = std::uniform_int_distribution<uint32_t>(1, 40)(rng);
    const uint32_t max_gap = rng() % 2 ? 4 : 200;
    const uint32_t max_bytes = rng() % 3 == 0 ? 64 : 6000;
    std::vector<IciRefTransfer> in;
    std::vector<uint64_t> fast;
    std::map<uint32_t, uint64_t> latest_end;  // per link: latest promise so far
    uint64_t issue = std::uniform_int_distribution<uint64_t>(0, 50)(rng);
    for (uint32_t i = 0; i < n; ++i) {
        issue += std::uniform_int_distribution<uint32_t>(0, max_gap)(rng);
        IciRefTransfer t;
        t.src = rng() % cores;
        t.dst = rng() % cores;
        t.start = issue + rng() % 4;
        t.bytes = std::uniform_int_distribution<uint64_t>(1, max_bytes)(rng);
        std::vector<IciHop> hops;
        fast.push_back(net.transfer(t.src, t.dst, t.start, t.bytes, &hops).last);
        if (rng() % 4 == 0) net.retire(issue);  // no later transfer starts before its issue
        in.push_back(t);
        ++cov.transfers;
        cov.multi_hop += hops.size() > 1;
        bool queued = false;
        uint64_t t_in = t.start;
        for (const IciHop& h : hops) {
            queued |= h.begin > t_in;
            uint64_t& end = latest_end[h.link];
            if (h.end < end) ++cov.gap_fills;
            end = std::max(end, h.end);
            t_in = h.begin + net.hop_cycles() + (cut_through ? 0 : net.ser_cycles(t.bytes));
        }
        cov.queued += queued;
    }
    const std::vector<uint64_t> slow = ref.run(in);
    ASSERT_EQ(slow.size(), fast.size()) << what;
    for (size_t i = 0; i < fast.size(); ++i)
        ASSERT_EQ(fast[i], slow[i]) << what << ", transfer " << i << ": " << in[i].src << " -> "
                                    << in[i].dst << ", " << in[i].bytes << " B at " << in[i].start;
}

TEST(IciProperty, RingRandomStreams) {
    Coverage cov;
    for (uint32_t seed = 1; seed <= 500; ++seed) {
        std::mt19937 rng(seed);
        const uint32_t cores = std::uniform_int_distribution<uint32_t>(2, 12)(rng);
        expect_equal_stream(rng, cores, cores, false, cov, "ring seed " + std::to_string(seed));
        if (HasFatalFailure()) return;
    }
    // The streams really contend: transfers wait for links and slip into earlier gaps.
    EXPECT_GT(cov.queued, cov.transfers / 10);
    EXPECT_GT(cov.gap_fills, 200u);
    EXPECT_GT(cov.multi_hop, cov.transfers / 3);
}

TEST(IciProperty, TorusRandomStreams) {
    Coverage cov;
    for (uint32_t seed = 1; seed <= 500; ++seed) {
        std::mt19937 rng(seed + 10000);
        const uint32_t width = std::uniform_int_distribution<uint32_t>(1, 5)(rng);
        const uint32_t height = std::uniform_int_distribution<uint32_t>(width == 1 ? 2 : 1, 4)(rng);
        expect_equal_stream(rng, width * height, width, true, cov,
                            fmt::format("torus {}x{} seed {}", width, height, seed));
        if (HasFatalFailure()) return;
    }
    EXPECT_GT(cov.queued, cov.transfers / 10);
    EXPECT_GT(cov.gap_fills, 200u);
    EXPECT_GT(cov.multi_hop, cov.transfers / 3);
}

TEST(IciProperty, Torus3dRandomStreams) {
    Coverage cov;
    for (uint32_t seed = 1; seed <= 300; ++seed) {
        std::mt19937 rng(seed + 20000);
        const uint32_t x = std::uniform_int_distribution<uint32_t>(1, 4)(rng);
        const uint32_t y = std::uniform_int_distribution<uint32_t>(1, 3)(rng);
        const uint32_t z = std::uniform_int_distribution<uint32_t>(x * y == 1 ? 2 : 1, 3)(rng);
        expect_equal_stream(rng, x * y * z, x, true, cov,
                            fmt::format("torus {}x{}x{} seed {}", x, y, z, seed), y);
        if (HasFatalFailure()) return;
    }
    EXPECT_GT(cov.queued, cov.transfers / 10);
    EXPECT_GT(cov.gap_fills, 100u);
    EXPECT_GT(cov.multi_hop, cov.transfers / 3);
}

}  // namespace
}  // namespace tpu::hw
