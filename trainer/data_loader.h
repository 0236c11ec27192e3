// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/dataset.h"

namespace tpu::trainer {

/// Batches of a Dataset, as torch.utils.data.DataLoader: `batch_size` examples per batch (per
/// device under a Trainer), optionally shuffled, the short last batch kept or dropped.
struct DataLoader {
    const Dataset* dataset = nullptr;  ///< the examples (not owned)
    uint32_t batch_size = 32;          ///< examples per batch (per device)
    bool shuffle = false;              ///< reshuffle every epoch
    bool drop_last = false;            ///< drop a short last batch (keeps shapes fixed)
    uint32_t seed = 0;                 ///< shuffle seed
};

/// torch.utils.data.DistributedSampler: replica `rank` of `replicas` gets every replicas-th
/// index of a per-epoch permutation (seed + epoch) of the dataset, padded by wrapping around
/// so that every replica gets the same count (or, with drop_last, truncated).
class DistributedSampler {
public:
    DistributedSampler(uint32_t count, uint32_t replicas, uint32_t rank, bool shuffle,
                       uint32_t seed, bool drop_last);
    /// Selects the epoch's permutation.
    void set_epoch(uint32_t epoch) { m_epoch = epoch; }
    /// This replica's indices for the current epoch.
    std::vector<uint32_t> indices() const;
    /// How many indices every replica gets.
    uint32_t per_replica() const { return m_per_replica; }

private:
    uint32_t m_count, m_replicas, m_rank, m_seed, m_per_replica, m_epoch = 0;
    bool m_shuffle, m_drop_last;
};

/// The permutation of 0..count-1 for `seed` (Fisher-Yates on mt19937_64, platform independent).
std::vector<uint32_t> permutation(uint32_t count, uint64_t seed);

}  // namespace tpu::trainer
