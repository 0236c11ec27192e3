// SPDX-License-Identifier: Apache-2.0
// Cluster's collectives between real ranks: ctest runs this binary under mpirun with 2 and with
// 4 ranks (tests/CMakeLists.txt). Every rank runs every test in the same order, so the
// collectives pair up; EXPECT (not ASSERT) keeps a failing rank on the same sequence of calls.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "sim/cluster.h"

namespace tpu::sim {
namespace {

/// Rank r's bytes: `n` bytes that differ between ranks and between positions.
std::vector<uint8_t> bytes_of(int r, size_t n) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = uint8_t(r * 37 + i * 11 + i / 256);
    return v;
}

/// Call limits for the chunked paths: 1 byte (a round per byte and rank), sizes that split the
/// pieces unevenly, less than one byte per rank, and the default (one call).
const size_t kCallLimits[] = {1, 2, 3, 7, 64, 1000, detail::kClusterMaxCallBytes};

TEST(ClusterRanks, RankAndSizeAreTheLaunchers) {
    // Open MPI's mpirun says what it started; the Cluster must agree.
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    ASSERT_NE(size, nullptr);
    ASSERT_NE(rank, nullptr);
    EXPECT_EQ(Cluster::size(), std::atoi(size));
    EXPECT_EQ(Cluster::rank(), std::atoi(rank));
    EXPECT_TRUE(Cluster::distributed());
    EXPECT_EQ(Cluster::allreduce_sum(1), uint64_t(Cluster::size()));
    EXPECT_EQ(Cluster::allreduce_sum(Cluster::rank()),
              uint64_t(Cluster::size()) * (Cluster::size() - 1) / 2);
}

TEST(ClusterRanks, AllgatherOfUnequalSizesIsInRankOrder) {
    // Rank r gives 5r bytes: rank 0 gives none.
    const int n = Cluster::size();
    std::vector<uint8_t> expected;
    std::vector<size_t> expected_sizes;
    for (int r = 0; r < n; ++r) {
        const auto b = bytes_of(r, 5 * r);
        expected.insert(expected.end(), b.begin(), b.end());
        expected_sizes.push_back(b.size());
    }
    const auto mine = bytes_of(Cluster::rank(), 5 * Cluster::rank());
    std::vector<size_t> sizes;
    EXPECT_EQ(Cluster::allgather(mine, &sizes), expected);
    EXPECT_EQ(sizes, expected_sizes);
    EXPECT_EQ(Cluster::allgather(mine), expected);
    for (size_t limit : kCallLimits) {
        SCOPED_TRACE(limit);
        sizes.clear();
        EXPECT_EQ(detail::cluster_allgather(mine, &sizes, limit), expected);
        EXPECT_EQ(sizes, expected_sizes);
    }
}

TEST(ClusterRanks, AllgatherWhereOneRankOutlastsTheOthers) {
    // The last rank gives 1000 bytes, rank 1 none, the others 3: with a small call limit most
    // rounds carry the last rank's bytes alone.
    const int n = Cluster::size();
    auto size_of = [n](int r) -> size_t { return r == n - 1 ? 1000 : r == 1 ? 0 : 3; };
    std::vector<uint8_t> expected;
    for (int r = 0; r < n; ++r) {
        const auto b = bytes_of(r, size_of(r));
        expected.insert(expected.end(), b.begin(), b.end());
    }
    const auto mine = bytes_of(Cluster::rank(), size_of(Cluster::rank()));
    for (size_t limit : kCallLimits) {
        SCOPED_TRACE(limit);
        std::vector<size_t> sizes;
        EXPECT_EQ(detail::cluster_allgather(mine, &sizes, limit), expected);
        ASSERT_EQ(sizes.size(), size_t(n));
        for (int r = 0; r < n; ++r) EXPECT_EQ(sizes[r], size_of(r));
    }
}

TEST(ClusterRanks, AllgatherOfNothing) {
    std::vector<size_t> sizes;
    for (size_t limit : kCallLimits) {
        EXPECT_TRUE(detail::cluster_allgather({}, &sizes, limit).empty());
        EXPECT_EQ(sizes, std::vector<size_t>(Cluster::size(), 0));
    }
}

TEST(ClusterRanks, AllgatherOfMegabytesInRounds) {
    // 3 MiB + r bytes per rank through a 1 MiB call limit: several rounds of real-sized pieces.
    const size_t base = 3u << 20;
    const auto mine = bytes_of(Cluster::rank(), base + Cluster::rank());
    const auto all = detail::cluster_allgather(mine, nullptr, 1u << 20);
    size_t at = 0;
    for (int r = 0; r < Cluster::size(); ++r) {
        const auto b = bytes_of(r, base + r);
        ASSERT_LE(at + b.size(), all.size());
        EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + at)) << "rank " << r;
        at += b.size();
    }
    EXPECT_EQ(at, all.size());
}

TEST(ClusterRanks, AlltoallvGivesEachRankOnlyItsOwnMessage) {
    // Rank s sends rank d 7s + 3d + (s == d) bytes, each a pattern of (s * 16 + d): rank 0's
    // message to itself is 1 byte, most pairs differ in size, and some carry hundreds of bytes
    // through the small call limits in many rounds.
    const int n = Cluster::size(), me = Cluster::rank();
    auto size_of = [](int s, int d) -> size_t { return 7 * s + 3 * d + (s == d) + 100 * (d == 1); };
    std::vector<std::vector<uint8_t>> to(n);
    for (int d = 0; d < n; ++d) to[d] = bytes_of(me * 16 + d, size_of(me, d));
    for (size_t limit : kCallLimits) {
        SCOPED_TRACE(limit);
        const auto from = detail::cluster_alltoallv(to, limit);
        ASSERT_EQ(from.size(), size_t(n));
        for (int s = 0; s < n; ++s) EXPECT_EQ(from[s], bytes_of(s * 16 + me, size_of(s, me)));
    }
    EXPECT_EQ(Cluster::alltoallv(to)[me], to[me]);
}

TEST(ClusterRanks, BroadcastFromEveryRoot) {
    for (int root = 0; root < Cluster::size(); ++root) {
        for (size_t limit : kCallLimits) {
            SCOPED_TRACE(testing::Message() << "root " << root << " limit " << limit);
            auto data = bytes_of(Cluster::rank(), 777);
            detail::cluster_broadcast(root, data, limit);
            EXPECT_EQ(data, bytes_of(root, 777));
        }
        auto data = bytes_of(Cluster::rank(), 4096);
        Cluster::broadcast(root, std::span<uint8_t>(data));
        EXPECT_EQ(data, bytes_of(root, 4096));
    }
}

TEST(ClusterRanks, BroadcastOfAVectorSizedOnlyAtTheRoot) {
    const int me = Cluster::rank();
    for (int root : {Cluster::size() - 1, 0}) {
        SCOPED_TRACE(testing::Message() << "root " << root);
        // Rank 0 starts empty, the other ranks larger than the root's: all end with its bytes.
        std::vector<uint8_t> data =
            me == root ? bytes_of(root, 12345) : bytes_of(me, me == 0 ? 0 : 40000);
        Cluster::broadcast(root, data);
        EXPECT_EQ(data, bytes_of(root, 12345));
        // An empty vector at the root empties everyone's.
        data = me == root ? std::vector<uint8_t>{} : bytes_of(me, 10);
        Cluster::broadcast(root, data);
        EXPECT_TRUE(data.empty());
    }
}

TEST(ClusterRanks, ReductionsOverSixtyFourBits) {
    const uint64_t n = Cluster::size();
    const uint64_t r = Cluster::rank();
    // Values above 2^32 catch a reduction done in 32 bits.
    EXPECT_EQ(Cluster::allreduce_min((r + 5) << 40), uint64_t{5} << 40);
    EXPECT_EQ(Cluster::allreduce_max((r + 5) << 40), (n + 4) << 40);
    EXPECT_EQ(Cluster::allreduce_sum((r + 1) << 40), (n * (n + 1) / 2) << 40);
    EXPECT_EQ(Cluster::allreduce_max(UINT64_MAX - r), UINT64_MAX);
    EXPECT_EQ(Cluster::allreduce_min(UINT64_MAX - r), UINT64_MAX - (n - 1));
    // Unsigned: the sum wraps modulo 2^64 instead of failing.
    EXPECT_EQ(Cluster::allreduce_sum(r == 0 ? UINT64_MAX : 1), n - 2);
    Cluster::barrier();
}

/// Ranks other than 0 print only their failures, each naming the rank, so the log of a passing
/// run is rank 0's alone.
class RankFailurePrinter : public testing::EmptyTestEventListener {
    // The name is kept from OnTestStart: UnitTest::current_test_info() would take the lock that
    // gtest holds while it reports a part result, and deadlock.
    void OnTestStart(const testing::TestInfo& test) override {
        m_test = std::string(test.test_suite_name()) + "." + test.name();
    }
    void OnTestPartResult(const testing::TestPartResult& result) override {
        if (!result.failed()) return;
        std::fprintf(stderr, "rank %d: %s failed at %s:%d\n%s\n", Cluster::rank(), m_test.c_str(),
                     result.file_name() ? result.file_name() : "?", result.line_number(),
                     result.summary());
    }
    std::string m_test;
};

}  // namespace
}  // namespace tpu::sim

// SystemC (linked through tpu::sim) owns main() and calls sc_main, which it declares extern "C".
extern "C" int sc_main(int argc, char* argv[]) {
    using tpu::sim::Cluster;
    Cluster::init(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (Cluster::rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new tpu::sim::RankFailurePrinter);
    }
    // Every rank reports the worst result, so rank 0's exit code covers the whole cluster.
    const int rc = int(Cluster::allreduce_max(uint64_t(RUN_ALL_TESTS() != 0)));
    Cluster::finalize();
    return rc;
}
