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

/// A classification dataset: `count` examples of `features` fp32 values in [0, 1].
struct Dataset {
    uint32_t count = 0;           ///< examples
    uint32_t features = 0;        ///< values per example
    uint32_t classes = 0;         ///< labels are 0 .. classes-1
    std::vector<float> x;         ///< count x features, row-major
    std::vector<uint8_t> labels;  ///< count
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
/// Examples [first, first + count) of `d` (a train/test split of one synthetic dataset).
Dataset subset(const Dataset& d, uint32_t first, uint32_t count);

}  // namespace tpu::trainer
