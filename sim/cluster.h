// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

// No MPI header here: tpu_sim links MPI privately, so nothing that includes this file needs
// MPI's include paths or sees its macros.
namespace tpu::sim {

/// The processes that share one simulation: the MPI ranks when the process was started by
/// mpirun, else a cluster of one (MPI is then never initialised).
class Cluster {
public:
    /// Initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED) if and only if the environment
    /// says an MPI launcher started this process (Open MPI: OMPI_COMM_WORLD_SIZE; also
    /// PMIX_RANK / PMI_SIZE), else does nothing. Safe to call once from main; later calls are
    /// no-ops.
    static void init(int* argc, char*** argv);
    /// Finalises MPI if init() started it (call before a normal exit).
    static void finalize();
    /// This process's rank: 0 in a cluster of one.
    static int rank();
    /// The number of ranks: 1 in a cluster of one.
    static int size();
    /// True when more than one process shares the simulation.
    static bool distributed() { return size() > 1; }
    /// Every rank's bytes concatenated in rank order (MPI_Allgatherv); `sizes`, if given, gets
    /// each rank's byte count. In a cluster of one: a copy of `mine`.
    static std::vector<uint8_t> allgather(std::span<const uint8_t> mine,
                                          std::vector<size_t>* sizes = nullptr);
    /// Personalised exchange (MPI_Alltoallv): `to[r]` goes to rank r only, and the result's
    /// element r is what rank r sent to this one. `to` has one entry per rank. In a cluster of
    /// one: `to[0]`.
    static std::vector<std::vector<uint8_t>> alltoallv(const std::vector<std::vector<uint8_t>>& to);
    /// Root's bytes into every rank's `data` (all ranks pass the same size). No-op alone.
    static void broadcast(int root, std::span<uint8_t> data);
    /// Broadcast of a byte vector whose size only the root knows (size first, then bytes).
    static void broadcast(int root, std::vector<uint8_t>& data);
    /// The smallest of every rank's `v`.
    static uint64_t allreduce_min(uint64_t v);
    /// The largest of every rank's `v`.
    static uint64_t allreduce_max(uint64_t v);
    /// The sum of every rank's `v` (modulo 2^64).
    static uint64_t allreduce_sum(uint64_t v);
    /// Returns once every rank has called it.
    static void barrier();
    /// Prints "tpusim: rank R of N: <message>" to stderr, removes this rank's temporary output
    /// files and aborts every rank (MPI_Abort with `code`); alone it just exits with `code`
    /// after printing "tpusim: <message>".
    [[noreturn]] static void abort(const std::string& message, int code = 2);
};

namespace detail {
/// The most bytes one MPI call moves by default. MPI counts and displacements are `int`, so a
/// call must stay under INT_MAX bytes; 1 GiB keeps payloads of hundreds of MiB in one call.
inline constexpr size_t kClusterMaxCallBytes = size_t{1} << 30;
/// Cluster::allgather with at most `max_call_bytes` (>= 1) moved by one MPI call: a larger
/// gather runs in rounds through a staging buffer. A parameter so tests can force many rounds.
std::vector<uint8_t> cluster_allgather(std::span<const uint8_t> mine, std::vector<size_t>* sizes,
                                       size_t max_call_bytes);
/// Cluster::alltoallv with at most `max_call_bytes` (>= 1) sent by one rank in one MPI call: a
/// larger exchange runs in rounds through staging buffers.
std::vector<std::vector<uint8_t>> cluster_alltoallv(const std::vector<std::vector<uint8_t>>& to,
                                                    size_t max_call_bytes);
/// Cluster::broadcast in pieces of at most `max_call_bytes` (>= 1).
void cluster_broadcast(int root, std::span<uint8_t> data, size_t max_call_bytes);
}  // namespace detail

}  // namespace tpu::sim
