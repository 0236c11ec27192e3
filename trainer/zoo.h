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
    /// bert-block: the feed-forward activation (GELU, BERT's; ReLU, PyTorchSim's EncoderBlock).
    FfnActivation activation = FfnActivation::Gelu;
    /// False: the inputs hold no values (a timing-only board uploads none), only their shape
    /// and labels.
    bool values = true;
};

/// A zoo model and inputs for it.
struct ZooModel {
    std::unique_ptr<Module> module;  ///< the network
    std::string description;         ///< its shape, one line
    /// `examples` random examples: inputs and a label per output row, so that a training step
    /// has a loss (softmax cross-entropy of the outputs, or of bert-block's head).
    Dataset input;
};

/// The labels of bert-block's training step: a token-classification head (Linear hidden ->
/// 9, as BertForTokenClassification) over the block's output, one label per token, the 9 BIO
/// tags of CoNLL-2003 named entities (O, B-/I-PER, ORG, LOC, MISC). Inference runs the block
/// alone.
inline constexpr uint32_t kBertTokenLabels = 9;

/// A zoo entry: its name, what it is, and the size options it takes.
struct ZooEntry {
    std::string_view name;                ///< e.g. "bert-block"
    std::string_view help;                ///< one line
    std::vector<std::string_view> sizes;  ///< ZooOptions fields it reads ("image", "hidden"...)
};
/// Every model of the zoo, in the order `tpusim model --help` lists them.
const std::vector<ZooEntry>& zoo_models();

/// fp32 values one example uploads to a core (inputs and one-hot labels) for model `name`
/// with `options` (defaults filled in), in 64 bits and saturated: what a tool checks against
/// the board before make_zoo_model allocates `examples` of them. 0 for an unknown model.
uint64_t zoo_example_values(std::string_view name, const ZooOptions& options, bool train_step);

/// The checks make_zoo_model makes before it allocates anything: a known model, at least one
/// example, sizes that fit together (hidden a multiple of heads, vocab <= 256, an image of at
/// least 32 pixels) and weights that fit the 4 GiB a core's kernels address; throws
/// std::invalid_argument naming the option.
void check_zoo_options(std::string_view name, const ZooOptions& options, uint32_t examples);

/// Builds model `name` with `examples` random input examples, for inference or (with
/// `train_step`) a training step; throws std::invalid_argument naming the model or the size
/// at fault.
ZooModel make_zoo_model(std::string_view name, const ZooOptions& options, uint32_t examples,
                        bool train_step = false);

}  // namespace tpu::trainer
