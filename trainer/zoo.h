// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/dataset.h"
#include "trainer/module.h"

/// The model zoo of `tpusim model`: the workloads architects study, with deterministic weights
/// and random inputs from a seed.
namespace tpu::trainer {

/// Sizes of a zoo model; 0 takes the model's default.
struct ZooOptions {
    uint32_t image = 0;   ///< resnet: input height = width (224)
    uint32_t hidden = 0;  ///< bert-block (768), gpt (128)
    uint32_t heads = 0;   ///< bert-block (12), gpt (4)
    uint32_t seq = 0;     ///< bert-block (512), gpt (64)
    uint32_t ffn = 0;     ///< bert-block and gpt: feed-forward width (4 x hidden)
    uint32_t layers = 0;  ///< gpt: transformer blocks (2)
    uint32_t vocab = 0;   ///< gpt: tokens (86)
    uint32_t seed = 0;    ///< weights and inputs
};

/// A zoo model and inputs for it.
struct ZooModel {
    std::unique_ptr<Module> module;  ///< the network
    std::string description;         ///< its shape, one line
    /// `examples` random examples: inputs and a label per output row, so that --train-step has
    /// a loss (softmax cross-entropy of the outputs).
    Dataset input;
};

/// A zoo entry: its name and what it is.
struct ZooEntry {
    std::string_view name;  ///< e.g. "bert-block"
    std::string_view help;  ///< one line
};
/// Every model of the zoo, in the order `tpusim model --help` lists them.
const std::vector<ZooEntry>& zoo_models();

/// Builds model `name` with `examples` random input examples; throws std::invalid_argument
/// naming the model or the size at fault.
ZooModel make_zoo_model(std::string_view name, const ZooOptions& options, uint32_t examples);

}  // namespace tpu::trainer
