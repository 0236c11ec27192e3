// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

/// Datasets for the trainer: IDX files (Fashion-MNIST, gzip or not) and a synthetic default.
namespace tpu::trainer {

/// A missing, unreadable or malformed data file; the message names the file and the problem.
class DataError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// An IDX array of unsigned bytes (type 0x08): dimensions and row-major data.
struct IdxArray {
    std::vector<uint32_t> dims;  ///< e.g. {60000, 28, 28}
    std::vector<uint8_t> data;   ///< product(dims) bytes
};

/// Decodes IDX bytes, inflating them first when they start with the gzip magic. `name` only
/// names the source in errors. Inflated data is capped at 1 GiB.
IdxArray decode_idx(std::span<const uint8_t> bytes, std::string_view name);
/// Reads and decodes an IDX file (.gz or not).
IdxArray read_idx(const std::string& path);

/// A classification dataset: `count` examples of `rows` rows of `features` fp32 values, one
/// label per row (an image is one row of H x W x C values, NHWC; a sequence of vectors is
/// `rows` rows); or, for language modelling, `count` windows of a token stream (see
/// token_windows()).
struct Dataset {
    uint32_t count = 0;           ///< examples
    uint32_t features = 0;        ///< values per example row
    uint32_t classes = 0;         ///< labels are 0 .. classes-1
    std::vector<float> x;         ///< count x rows x features, row-major (empty for windows)
    std::vector<uint8_t> labels;  ///< count x rows (empty for token windows)
    uint32_t rows = 1;            ///< rows per example (token windows: see context)
    /// Token windows: example e is the `context` tokens from e x stride, each a row of one-hot
    /// inputs (features = classes = vocabulary size) labelled with the token that follows it.
    /// 0 for a classification dataset.
    uint32_t context = 0;
    uint32_t stride = 0;               ///< tokens between the starts of two windows
    std::vector<uint8_t> tokens = {};  ///< the token stream of the windows
    /// Rows an example contributes to a batch: `context` for token windows, else `rows`.
    uint32_t rows_per_example() const { return context ? context : rows; }
    /// The label of row `row` of example `e`.
    uint8_t label(uint32_t e, uint32_t row) const {
        return context ? tokens[uint64_t(e) * stride + row + 1] : labels[uint64_t(e) * rows + row];
    }
};

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr std::string_view kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
/// Fashion-MNIST's train (60000) or test (10000) split from `dir`, pixels scaled to [0, 1].
/// Images and labels must agree in count; labels must be < 10.
Dataset load_fashion_mnist(const std::string& dir, bool train);
/// A deterministic synthetic dataset: each class is a Gaussian blob (sigma 0.1, clamped to
/// [0, 1]) around its own centre, drawn uniformly from [0.2, 0.8] per feature and then pulled
/// towards 0.5 by `spread`. At 1 the blobs are far apart and any model separates them in a few
/// steps; small values make the classes overlap, so learning takes many steps and stops short
/// of 100%.
Dataset synthetic(uint32_t count, uint32_t features, uint32_t classes, uint32_t seed,
                  float spread = 1.0f);
/// x = (x - mean) / stddev for every value, as torchvision's Normalize does (mean and stddev of
/// the training split, so the test split is scaled the same way).
void normalize(Dataset& d, float mean, float stddev);
/// Mean and standard deviation of all values of `d` (in double, returned as float).
std::pair<float, float> value_stats(const Dataset& d);
/// The windows of `context` + 1 tokens of `tokens` (values < vocab) starting every `stride`
/// tokens, as a Dataset whose example rows predict the next token (a character-level language
/// model's training set with stride 1, every position once per window start; its validation set
/// with stride = context, every token predicted once). Throws DataError when the stream is
/// shorter than one window, a token is out of range, or a size is 0.
Dataset token_windows(std::vector<uint8_t> tokens, uint32_t vocab, uint32_t context,
                      uint32_t stride);
/// Examples [first, first + count) of `d` (a train/test split of one synthetic dataset).
Dataset subset(const Dataset& d, uint32_t first, uint32_t count);

}  // namespace tpu::trainer
