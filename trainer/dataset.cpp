// SPDX-License-Identifier: Apache-2.0
#include "trainer/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include <fmt/format.h>
#include <zlib.h>

#include "sim/file_io.h"

namespace tpu::trainer {
namespace {

constexpr uint64_t kMaxInflated = 1ull << 30;

std::vector<uint8_t> gunzip(std::span<const uint8_t> in, std::string_view name) {
    z_stream z{};
    // 16 + MAX_WBITS: expect a gzip header and trailer.
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        throw DataError(fmt::format("{}: cannot start gzip decoding", name));
    std::vector<uint8_t> out;
    z.next_in = const_cast<Bytef*>(in.data());
    z.avail_in = static_cast<uInt>(in.size());
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
        if (out.size() >= kMaxInflated) {
            inflateEnd(&z);
            throw DataError(fmt::format("{}: inflates to more than {} bytes", name, kMaxInflated));
        }
        const size_t old = out.size();
        out.resize(old + (1 << 20));
        z.next_out = out.data() + old;
        z.avail_out = 1 << 20;
        rc = inflate(&z, Z_NO_FLUSH);
        out.resize(old + (1 << 20) - z.avail_out);
        if (rc == Z_STREAM_END) break;
        if (rc != Z_OK || (z.avail_in == 0 && z.avail_out != 0)) {
            const std::string why = rc == Z_OK || rc == Z_BUF_ERROR ? "truncated gzip data"
                                                                    : (z.msg ? z.msg : "bad data");
            const uint64_t at = z.total_in;
            inflateEnd(&z);
            throw DataError(fmt::format("{}: corrupt gzip stream at byte {}: {}", name, at, why));
        }
    }
    inflateEnd(&z);
    return out;
}

uint32_t be32(const uint8_t* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

}  // namespace

IdxArray decode_idx(std::span<const uint8_t> bytes, std::string_view name) {
    std::vector<uint8_t> inflated;
    if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) {
        inflated = gunzip(bytes, name);
        bytes = inflated;
    }
    if (bytes.size() < 4)
        throw DataError(
            fmt::format("{}: {} bytes is too short for an IDX header", name, bytes.size()));
    if (bytes[0] != 0 || bytes[1] != 0)
        throw DataError(fmt::format("{}: not an IDX file (magic {:02x} {:02x}, expected 00 00)",
                                    name, bytes[0], bytes[1]));
    if (bytes[2] != 0x08)
        throw DataError(
            fmt::format("{}: IDX element type 0x{:02x} is not supported (only 0x08, "
                        "unsigned bytes)",
                        name, bytes[2]));
    const uint32_t ndims = bytes[3];
    if (ndims == 0 || ndims > 4)
        throw DataError(fmt::format("{}: {} dimensions (expected 1 to 4)", name, ndims));
    if (bytes.size() < 4 + 4ull * ndims)
        throw DataError(fmt::format("{}: header of {} dimensions is truncated", name, ndims));
    IdxArray a;
    uint64_t total = 1;
    for (uint32_t d = 0; d < ndims; ++d) {
        a.dims.push_back(be32(&bytes[4 + 4 * d]));
        total *= a.dims.back();
        if (total > kMaxInflated)
            throw DataError(
                fmt::format("{}: dimensions describe more than {} bytes", name, kMaxInflated));
    }
    const uint64_t have = bytes.size() - 4 - 4ull * ndims;
    if (have != total)
        throw DataError(fmt::format("{}: dimensions {} need {} bytes of data, the file has {}",
                                    name, fmt::join(a.dims, "x"), total, have));
    a.data.assign(bytes.begin() + 4 + 4 * ndims, bytes.end());
    return a;
}

IdxArray read_idx(const std::string& path) {
    std::string text;
    try {
        text = sim::read_input_file(path);
    } catch (const sim::InputFileError& e) {
        throw DataError(e.what());
    }
    const std::vector<uint8_t> bytes(text.begin(), text.end());
    return decode_idx(bytes, path);
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
    const std::string prefix = dir + (train ? "/train" : "/t10k");
    const IdxArray images = read_idx(prefix + "-images-idx3-ubyte.gz");
    const IdxArray labels = read_idx(prefix + "-labels-idx1-ubyte.gz");
    if (images.dims.size() != 3 || labels.dims.size() != 1)
        throw DataError(
            fmt::format("{}-*: expected images N x H x W and labels N, got {} and {} "
                        "dimensions",
                        prefix, images.dims.size(), labels.dims.size()));
    if (images.dims[0] != labels.dims[0])
        throw DataError(
            fmt::format("{}-*: {} images but {} labels", prefix, images.dims[0], labels.dims[0]));
    Dataset d;
    d.count = images.dims[0];
    d.features = images.dims[1] * images.dims[2];
    d.classes = 10;
    d.x.resize(images.data.size());
    std::transform(images.data.begin(), images.data.end(), d.x.begin(),
                   [](uint8_t p) { return float(p) / 255.0f; });
    d.labels = labels.data;
    for (size_t i = 0; i < d.labels.size(); ++i)
        if (d.labels[i] >= d.classes)
            throw DataError(
                fmt::format("{}-labels-idx1-ubyte.gz: label {} of example {} is not "
                            "a class 0-9",
                            prefix, d.labels[i], i));
    return d;
}

Dataset synthetic(uint32_t count, uint32_t features, uint32_t classes, uint32_t seed,
                  float spread) {
    if (!(spread > 0.0f && spread <= 1.0f))
        throw DataError(fmt::format("synthetic dataset: spread {} is not in (0, 1]", spread));
    if (count == 0 || features == 0 || classes < 2)
        throw DataError(
            fmt::format("synthetic dataset: {} examples of {} features in {} classes "
                        "(need at least 1, 1 and 2)",
                        count, features, classes));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.2f, 0.8f);
    std::normal_distribution<float> noise(0.0f, 0.1f);
    std::vector<float> centres(size_t(classes) * features);
    // Centres pulled towards 0.5 bring the blobs within reach of each other's noise.
    for (auto& c : centres) c = spread == 1.0f ? u(rng) : 0.5f + spread * (u(rng) - 0.5f);
    Dataset d{count, features, classes, std::vector<float>(size_t(count) * features),
              std::vector<uint8_t>(count)};
    for (uint32_t i = 0; i < count; ++i) {
        const uint32_t c = rng() % classes;
        d.labels[i] = static_cast<uint8_t>(c);
        for (uint32_t f = 0; f < features; ++f)
            d.x[size_t(i) * features + f] =
                std::clamp(centres[size_t(c) * features + f] + noise(rng), 0.0f, 1.0f);
    }
    return d;
}

Dataset token_windows(std::vector<uint8_t> tokens, uint32_t vocab, uint32_t context,
                      uint32_t stride) {
    if (vocab == 0 || context == 0 || stride == 0)
        throw DataError(
            fmt::format("token windows: vocabulary {}, context {} and stride {} must "
                        "all be at least 1",
                        vocab, context, stride));
    if (tokens.size() < uint64_t(context) + 1)
        throw DataError(
            fmt::format("token windows: {} tokens are fewer than one window of "
                        "context {} + 1",
                        tokens.size(), context));
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] >= vocab)
            throw DataError(
                fmt::format("token windows: token {} at position {} is outside the "
                            "vocabulary of {}",
                            tokens[i], i, vocab));
    Dataset d;
    const uint64_t windows = (tokens.size() - context - 1) / stride + 1;
    if (windows > UINT32_MAX)
        throw DataError(fmt::format("token windows: {} windows are too many", windows));
    d.count = uint32_t(windows);
    d.features = d.classes = vocab;
    d.context = context;
    d.stride = stride;
    d.tokens = std::move(tokens);
    return d;
}

Dataset subset(const Dataset& d, uint32_t first, uint32_t count) {
    if (d.context)
        throw DataError("subset of token windows: build the windows of the sub-stream instead");
    if (uint64_t(first) + count > d.count || count == 0)
        throw DataError(
            fmt::format("subset of {} examples from {} of a dataset of {}", count, first, d.count));
    Dataset s{count, d.features, d.classes, {}, {}, d.rows};
    const int64_t n = int64_t(d.rows) * d.features;
    s.x.assign(d.x.begin() + first * n, d.x.begin() + (first + count) * n);
    s.labels.assign(d.labels.begin() + int64_t(first) * d.rows,
                    d.labels.begin() + int64_t(first + count) * d.rows);
    return s;
}

void normalize(Dataset& d, float mean, float stddev) {
    if (!(stddev > 0.0f))
        throw DataError(fmt::format("normalize: standard deviation {} is not positive", stddev));
    const float inv = 1.0f / stddev;
    for (float& v : d.x) v = (v - mean) * inv;
}

std::pair<float, float> value_stats(const Dataset& d) {
    double sum = 0, sq = 0;
    for (float v : d.x) {
        sum += v;
        sq += double(v) * v;
    }
    const double n = double(std::max<size_t>(1, d.x.size())), mean = sum / n;
    return {float(mean), float(std::sqrt(std::max(0.0, sq / n - mean * mean)))};
}

}  // namespace tpu::trainer
