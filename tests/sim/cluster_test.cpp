// SPDX-License-Identifier: Apache-2.0
// A cluster of one: the process was not started by an MPI launcher, so MPI is never initialised
// and every collective is the identity. The ranks of a real cluster are tested under mpirun by
// tests/mpi/cluster_mpi_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "sim/cluster.h"

namespace tpu::sim {
namespace {

/// Cluster::init as main calls it, with any launcher variables of the environment removed (each
/// test runs in its own process, so this touches no other test).
void init_alone() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) unsetenv(v);
    int argc = 1;
    char name[] = "cluster_test";
    char* args[] = {name, nullptr};
    char** argv = args;
    Cluster::init(&argc, &argv);
    Cluster::init(&argc, &argv);  // later calls are no-ops
    EXPECT_EQ(argc, 1);
}

std::vector<uint8_t> iota_bytes(size_t n) {
    std::vector<uint8_t> v(n);
    std::iota(v.begin(), v.end(), uint8_t{7});
    return v;
}

TEST(Cluster, AloneIsRankZeroOfOne) {
    EXPECT_EQ(Cluster::rank(), 0);  // also before init()
    EXPECT_EQ(Cluster::size(), 1);
    init_alone();
    EXPECT_EQ(Cluster::rank(), 0);
    EXPECT_EQ(Cluster::size(), 1);
    EXPECT_FALSE(Cluster::distributed());
    Cluster::barrier();
    Cluster::finalize();
    Cluster::finalize();
}

TEST(Cluster, AloneAllgatherReturnsItsOwnBytes) {
    init_alone();
    const std::vector<uint8_t> mine = iota_bytes(1000);
    std::vector<size_t> sizes{9, 9, 9};
    EXPECT_EQ(Cluster::allgather(mine, &sizes), mine);
    EXPECT_EQ(sizes, std::vector<size_t>{1000});
    EXPECT_EQ(Cluster::allgather(mine), mine);
    EXPECT_TRUE(Cluster::allgather({}, &sizes).empty());
    EXPECT_EQ(sizes, std::vector<size_t>{0});
    // The chunked path is never entered alone, whatever the call limit.
    EXPECT_EQ(detail::cluster_allgather(mine, &sizes, 1), mine);
    EXPECT_EQ(sizes, std::vector<size_t>{1000});
}

TEST(Cluster, AloneBroadcastLeavesTheBytes) {
    init_alone();
    std::vector<uint8_t> data = iota_bytes(300);
    const std::vector<uint8_t> before = data;
    Cluster::broadcast(0, std::span<uint8_t>(data));
    EXPECT_EQ(data, before);
    Cluster::broadcast(0, data);
    EXPECT_EQ(data, before);
    detail::cluster_broadcast(0, data, 1);
    EXPECT_EQ(data, before);
    std::vector<uint8_t> empty;
    Cluster::broadcast(0, empty);
    EXPECT_TRUE(empty.empty());
}

TEST(Cluster, AloneReductionsReturnTheValue) {
    init_alone();
    for (uint64_t v : {uint64_t{0}, uint64_t{42}, uint64_t{1} << 40, UINT64_MAX}) {
        EXPECT_EQ(Cluster::allreduce_min(v), v);
        EXPECT_EQ(Cluster::allreduce_max(v), v);
        EXPECT_EQ(Cluster::allreduce_sum(v), v);
    }
}

TEST(Cluster, AloneAbortPrintsTheMessageAndExitsWithTheCode) {
    init_alone();
    EXPECT_EXIT(Cluster::abort("no board to simulate", 3), ::testing::ExitedWithCode(3),
                "^tpusim: no board to simulate\n$");
    EXPECT_EXIT(Cluster::abort("default code"), ::testing::ExitedWithCode(2),
                "^tpusim: default code\n$");
}

}  // namespace
}  // namespace tpu::sim
