// SPDX-License-Identifier: Apache-2.0
#include "trainer/data_loader.h"

#include <numeric>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

namespace tpu::trainer {

std::vector<uint32_t> permutation(uint32_t count, uint64_t seed) {
    std::vector<uint32_t> p(count);
    std::iota(p.begin(), p.end(), 0u);
    std::mt19937_64 rng(seed);
    for (uint32_t i = count; i > 1; --i) {
        // Multiply-shift instead of std::uniform_int_distribution, whose output is
        // implementation-defined.
        const auto j = static_cast<uint32_t>((unsigned __int128)(rng()) * i >> 64);
        std::swap(p[i - 1], p[j]);
    }
    return p;
}

DistributedSampler::DistributedSampler(uint32_t count, uint32_t replicas, uint32_t rank,
                                       bool shuffle, uint32_t seed, bool drop_last)
    : m_count(count),
      m_replicas(replicas),
      m_rank(rank),
      m_seed(seed),
      m_shuffle(shuffle),
      m_drop_last(drop_last) {
    if (replicas == 0 || rank >= replicas)
        throw std::invalid_argument(
            fmt::format("Invalid rank {}, rank should be in the interval [0, {}]", rank,
                        int64_t(replicas) - 1));
    m_per_replica = drop_last ? count / replicas : (count + replicas - 1) / replicas;
}

std::vector<uint32_t> DistributedSampler::indices() const {
    std::vector<uint32_t> all;
    if (m_shuffle) {
        all = permutation(m_count, uint64_t(m_seed) + m_epoch);
    } else {
        all.resize(m_count);
        std::iota(all.begin(), all.end(), 0u);
    }
    const uint64_t total = uint64_t(m_per_replica) * m_replicas;
    if (total <= all.size()) {
        all.resize(total);
    } else {
        // Pad by wrapping around, as torch does, so every replica gets the same count.
        const size_t have = all.size();
        for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i % have]);
    }
    std::vector<uint32_t> mine;
    mine.reserve(m_per_replica);
    for (uint64_t i = m_rank; i < total; i += m_replicas) mine.push_back(all[i]);
    return mine;
}

}  // namespace tpu::trainer
