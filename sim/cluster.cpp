// SPDX-License-Identifier: Apache-2.0
#include "sim/cluster.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "sim/file_io.h"

namespace tpu::sim {
namespace {

/// What init() found. Written once by init() on the main thread, read-only afterwards.
struct ClusterState {
    bool init_called = false;
    bool active = false;  ///< MPI is initialised and not yet finalised
    bool owned = false;   ///< init() initialised MPI, so finalize() must finalise it
    int rank = 0;
    int size = 1;
};
ClusterState g_cluster;

/// True if an MPI launcher started this process: Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE,
/// PMIx launchers PMIX_RANK, and PMI-1/2 launchers (Slurm's srun, MPICH's hydra) PMI_SIZE.
bool launched_by_mpi() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
           std::getenv("PMI_SIZE") != nullptr;
}

/// Aborts the job naming the failed call and MPI's reason. init() sets MPI_ERRORS_RETURN so that
/// every MPI error ends here and Cluster::abort stays the one way the job is killed.
void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char reason[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    if (MPI_Error_string(rc, reason, &len) != MPI_SUCCESS)
        std::snprintf(reason, sizeof reason, "error %d", rc);
    Cluster::abort(fmt::format("{} failed: {}", call, reason));
}

/// The communicator of every collective. A collective after finalize() would be undefined
/// behaviour inside MPI; here it is an error naming the call.
MPI_Comm world(const char* call) {
    if (!g_cluster.active) Cluster::abort(fmt::format("{} after Cluster::finalize()", call));
    return MPI_COMM_WORLD;
}

/// `n` as an MPI count; callers keep every count under the call limit, which is below INT_MAX.
int count_of(size_t n) {
    return static_cast<int>(n);
}

/// Call limits above INT_MAX would overflow MPI's int counts; 0 would never make progress.
size_t clamp_call_bytes(size_t max_call_bytes) {
    return std::clamp<size_t>(max_call_bytes, 1, std::numeric_limits<int>::max());
}

/// Every rank's `v` combined by `op` (the identity alone).
uint64_t allreduce(uint64_t v, MPI_Op op, const char* call) {
    if (!Cluster::distributed()) return v;
    uint64_t out = 0;
    check(MPI_Allreduce(&v, &out, 1, MPI_UINT64_T, op, world(call)), call);
    return out;
}

}  // namespace

void Cluster::init(int* argc, char*** argv) {
    if (g_cluster.init_called) return;
    g_cluster.init_called = true;
    if (!launched_by_mpi()) return;
    int already = 0;
    MPI_Initialized(&already);
    // SystemC's threads are coroutines on the main thread, so SERIALIZED (or even FUNNELED)
    // covers every call the simulator makes; MULTIPLE would make Open MPI lock on every call.
    int provided = MPI_THREAD_SINGLE;
    if (already == 0) {
        // No error handler exists yet: a failing MPI_Init_thread aborts inside MPI.
        MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
        g_cluster.owned = true;
    } else {
        MPI_Query_thread(&provided);
    }
    g_cluster.active = true;
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &g_cluster.rank), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &g_cluster.size), "MPI_Comm_size");
    if (provided < MPI_THREAD_FUNNELED)
        abort(
            fmt::format("MPI provides thread level {}; tpusim needs MPI_THREAD_FUNNELED ({}) or "
                        "more",
                        provided, MPI_THREAD_FUNNELED));
}

void Cluster::finalize() {
    if (!g_cluster.active) return;
    g_cluster.active = false;
    if (g_cluster.owned) MPI_Finalize();
}

int Cluster::rank() {
    return g_cluster.rank;
}

int Cluster::size() {
    return g_cluster.size;
}

std::vector<uint8_t> Cluster::allgather(std::span<const uint8_t> mine, std::vector<size_t>* sizes) {
    return detail::cluster_allgather(mine, sizes, detail::kClusterMaxCallBytes);
}

std::vector<std::vector<uint8_t>> Cluster::alltoallv(const std::vector<std::vector<uint8_t>>& to) {
    return detail::cluster_alltoallv(to, detail::kClusterMaxCallBytes);
}

void Cluster::broadcast(int root, std::span<uint8_t> data) {
    detail::cluster_broadcast(root, data, detail::kClusterMaxCallBytes);
}

void Cluster::broadcast(int root, std::vector<uint8_t>& data) {
    if (!distributed()) return;
    uint64_t n = data.size();
    check(MPI_Bcast(&n, 1, MPI_UINT64_T, root, world("MPI_Bcast")), "MPI_Bcast");
    if (rank() != root) data.resize(n);
    broadcast(root, std::span<uint8_t>(data));
}

uint64_t Cluster::allreduce_min(uint64_t v) {
    return allreduce(v, MPI_MIN, "MPI_Allreduce(MPI_MIN)");
}

uint64_t Cluster::allreduce_max(uint64_t v) {
    return allreduce(v, MPI_MAX, "MPI_Allreduce(MPI_MAX)");
}

uint64_t Cluster::allreduce_sum(uint64_t v) {
    return allreduce(v, MPI_SUM, "MPI_Allreduce(MPI_SUM)");
}

void Cluster::barrier() {
    if (distributed()) check(MPI_Barrier(world("MPI_Barrier")), "MPI_Barrier");
}

void Cluster::abort(const std::string& message, int code) {
    // What the run printed so far comes before the message, and neither MPI_Abort nor _Exit
    // flushes stdio buffers.
    std::cout.flush();
    std::fflush(stdout);
    if (distributed())
        fmt::print(stderr, "tpusim: rank {} of {}: {}\n", rank(), size(), message);
    else
        fmt::print(stderr, "tpusim: {}\n", message);
    std::fflush(stderr);
    // Neither MPI_Abort nor _Exit runs the destructors that remove temporary output files; the
    // other ranks remove theirs when mpirun's SIGTERM reaches them (sim/interrupt.h).
    remove_temporary_files();
    // MPI_Abort even under `mpirun -np 1`: a rank that exits without MPI_Finalize is itself
    // reported as an error by mpirun, with a less helpful message.
    if (g_cluster.active) MPI_Abort(MPI_COMM_WORLD, code);
    // _Exit, not exit: abort may be called from a SystemC thread in the middle of a simulation,
    // where running static destructors could crash and hide the message's exit code.
    std::_Exit(code);
}

namespace detail {

std::vector<uint8_t> cluster_allgather(std::span<const uint8_t> mine, std::vector<size_t>* sizes,
                                       size_t max_call_bytes) {
    const int n = Cluster::size();
    if (n == 1) {
        if (sizes) *sizes = {mine.size()};
        return {mine.begin(), mine.end()};
    }
    max_call_bytes = clamp_call_bytes(max_call_bytes);
    // (1) Every rank's byte count, so each rank can size the result and place every piece.
    std::vector<uint64_t> counts(n);
    const uint64_t own = mine.size();
    check(MPI_Allgather(&own, 1, MPI_UINT64_T, counts.data(), 1, MPI_UINT64_T,
                        world("MPI_Allgather")),
          "MPI_Allgather");
    std::vector<size_t> offsets(n + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
    const size_t total = offsets[n];
    if (sizes) sizes->assign(counts.begin(), counts.end());
    std::vector<uint8_t> all(total);
    std::vector<int> call_counts(n);
    std::vector<int> displs(n);

    // (2) The common case: everything fits in one call, straight into the result.
    if (total <= max_call_bytes) {
        for (int r = 0; r < n; ++r) {
            call_counts[r] = count_of(counts[r]);
            displs[r] = count_of(offsets[r]);
        }
        check(MPI_Allgatherv(mine.data(), count_of(own), MPI_BYTE, all.data(), call_counts.data(),
                             displs.data(), MPI_BYTE, world("MPI_Allgatherv")),
              "MPI_Allgatherv");
        return all;
    }

    // (3) Rounds: each rank sends up to `piece` bytes of its own per round. The pieces of a round
    // are adjacent in a staging buffer (their places in the result can be more than INT_MAX
    // bytes apart, beyond what int displacements reach) and are copied into place after it.
    const size_t piece = std::max<size_t>(1, max_call_bytes / n);
    const uint64_t largest = *std::max_element(counts.begin(), counts.end());
    std::vector<uint8_t> staging(std::min(total, piece * n));
    const int me = Cluster::rank();
    for (uint64_t start = 0; start < largest; start += piece) {
        int at = 0;
        for (int r = 0; r < n; ++r) {
            call_counts[r] = counts[r] > start ? count_of(std::min(piece, counts[r] - start)) : 0;
            displs[r] = at;
            at += call_counts[r];
        }
        const uint8_t* send = call_counts[me] > 0 ? mine.data() + start : mine.data();
        check(MPI_Allgatherv(send, call_counts[me], MPI_BYTE, staging.data(), call_counts.data(),
                             displs.data(), MPI_BYTE, world("MPI_Allgatherv")),
              "MPI_Allgatherv");
        for (int r = 0; r < n; ++r)
            if (call_counts[r] > 0)
                std::memcpy(all.data() + offsets[r] + start, staging.data() + displs[r],
                            call_counts[r]);
    }
    return all;
}

std::vector<std::vector<uint8_t>> cluster_alltoallv(const std::vector<std::vector<uint8_t>>& to,
                                                    size_t max_call_bytes) {
    const int n = Cluster::size(), me = Cluster::rank();
    if (to.size() != size_t(n))
        Cluster::abort(fmt::format("alltoallv: {} messages for {} ranks", to.size(), n));
    if (n == 1) return {to[0]};
    max_call_bytes = clamp_call_bytes(max_call_bytes);
    // (1) Every pair's byte count, on every rank (one allgather of n counts per rank), so each
    // rank knows what it receives and how many rounds the whole exchange needs. A rank's
    // message to itself stays out of MPI.
    std::vector<uint64_t> send_sizes(n), matrix(size_t(n) * n);
    for (int r = 0; r < n; ++r) send_sizes[r] = r == me ? 0 : to[r].size();
    check(MPI_Allgather(send_sizes.data(), n, MPI_UINT64_T, matrix.data(), n, MPI_UINT64_T,
                        world("MPI_Allgather")),
          "MPI_Allgather");
    std::vector<uint64_t> recv_sizes(n);
    for (int r = 0; r < n; ++r) recv_sizes[r] = matrix[size_t(r) * n + me];
    std::vector<std::vector<uint8_t>> from(n);
    for (int r = 0; r < n; ++r) from[r].resize(recv_sizes[r]);
    from[me] = to[me];
    // (2) Rounds: each pair moves at most `piece` bytes per call, so a rank's bytes in one call
    // (n pieces) stay under the limit and every count and displacement fits an int. Every rank
    // runs as many rounds as the largest pair of the whole exchange needs.
    const size_t piece = std::max<size_t>(1, max_call_bytes / n);
    const uint64_t largest = *std::max_element(matrix.begin(), matrix.end());
    std::vector<int> scounts(n), sdispls(n), rcounts(n), rdispls(n);
    std::vector<uint8_t> sbuf, rbuf;
    for (uint64_t start = 0; start < largest; start += piece) {
        int sat = 0, rat = 0;
        for (int r = 0; r < n; ++r) {
            scounts[r] =
                send_sizes[r] > start ? count_of(std::min(piece, send_sizes[r] - start)) : 0;
            rcounts[r] =
                recv_sizes[r] > start ? count_of(std::min(piece, recv_sizes[r] - start)) : 0;
            sdispls[r] = sat;
            rdispls[r] = rat;
            sat += scounts[r];
            rat += rcounts[r];
        }
        sbuf.resize(size_t(sat));
        rbuf.resize(size_t(rat));
        for (int r = 0; r < n; ++r)
            if (scounts[r] > 0)
                std::memcpy(sbuf.data() + sdispls[r], to[r].data() + start, size_t(scounts[r]));
        check(MPI_Alltoallv(sbuf.data(), scounts.data(), sdispls.data(), MPI_BYTE, rbuf.data(),
                            rcounts.data(), rdispls.data(), MPI_BYTE, world("MPI_Alltoallv")),
              "MPI_Alltoallv");
        for (int r = 0; r < n; ++r)
            if (rcounts[r] > 0)
                std::memcpy(from[r].data() + start, rbuf.data() + rdispls[r], size_t(rcounts[r]));
    }
    return from;
}

void cluster_broadcast(int root, std::span<uint8_t> data, size_t max_call_bytes) {
    if (!Cluster::distributed()) return;
    max_call_bytes = clamp_call_bytes(max_call_bytes);
    for (size_t pos = 0; pos < data.size(); pos += max_call_bytes) {
        const size_t n = std::min(max_call_bytes, data.size() - pos);
        check(MPI_Bcast(data.data() + pos, count_of(n), MPI_BYTE, root, world("MPI_Bcast")),
              "MPI_Bcast");
    }
}

}  // namespace detail
}  // namespace tpu::sim
