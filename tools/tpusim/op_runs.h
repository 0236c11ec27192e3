// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/device.h"
#include "driver/kernels/attention.h"
#include "driver/program_cache.h"
#include "trainer/graph.h"
#include "trainer/zoo.h"

/// Single ops and zoo models as `tpusim op`, `tpusim model` and `tpusim validate` run them, so
/// a validation row measures exactly what the command reports.
namespace tpu::cli {

/// What one run of an op reports.
struct OpRun {
    nlohmann::ordered_json params;  ///< the kind's sizes, as given
    driver::Event event;            ///< the op's launches, merged
    uint64_t macs = 0;              ///< useful multiply-accumulates
    double mxu_utilization = 0;     ///< macs over the cores' MXU peak for the op's cycles
    uint64_t hbm_bytes = 0;         ///< bytes the op's DMAs moved between HBM and VMEM
    std::string plan;               ///< the tiling, one line
    // --check: the device against the bit-exact host reference, and the reference against fp64.
    bool bitexact = false;     ///< device result == host reference, bit for bit
    double max_abs_error = 0;  ///< max |device - fp64|
    double max_rel_error = 0;  ///< max_abs_error / max |fp64|
    std::string digest;        ///< FNV-1a of the device result's bytes (ops that compute one)
};

/// Fills the --check fields from the device result, the bit-exact reference and fp64.
void compare(OpRun& r, const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<double>& exact);

/// Layer normalisation of `rows_total` x `cols` random values (random gain and bias), the rows
/// data-parallel over `cores` in even, padded shares; `check` compares with the references.
OpRun run_layernorm(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                    bool check, uint32_t seed);
/// Softmax over each of `rows_total` rows of `cols` random values, as run_layernorm.
OpRun run_softmax(driver::Device& dev, driver::ProgramCache& cache,
                  const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                  bool check, uint32_t seed);
/// Attention of `shape` (shape.batch sequences in all, data-parallel over `cores`).
OpRun run_attention(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const driver::AttentionShape& shape,
                    bool check, uint32_t seed);

/// What one run of a zoo model reports.
struct ModelRun {
    std::string description;                    ///< the model's shape
    uint64_t cycles = 0;                        ///< the forward pass, or the training step
    uint64_t begin_cycle = 0;                   ///< board cycle the measured span began
    double host_seconds = 0;                    ///< host time of the same span
    std::vector<trainer::LayerProfile> layers;  ///< per-layer work, in first-use order
};

/// One inference (the forward pass, no transfers) or one training step of zoo model `name`
/// on `batch` examples, data-parallel over `cores`. Bad options throw InputError.
ModelRun run_model(driver::Device& dev, const std::string& name, const trainer::ZooOptions& options,
                   uint32_t batch, const std::vector<uint32_t>& cores, bool train_step,
                   const std::string& precision);

}  // namespace tpu::cli
