// SPDX-License-Identifier: Apache-2.0
#include "trainer/text_corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "sim/file_io.h"
#include "trainer/dataset.h"

namespace tpu::trainer {

double TextCorpus::unigram_entropy() const {
    std::array<uint64_t, 256> count{};
    for (const uint8_t t : train) ++count[t];
    for (const uint8_t t : val) ++count[t];
    const double n = double(train.size() + val.size());
    double h = 0;
    for (const uint64_t c : count)
        if (c) h -= double(c) / n * std::log(double(c) / n);
    return h;
}

std::vector<std::string> text_files_in(const std::string& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) throw DataError(fmt::format("cannot list '{}': {}", dir, ec.message()));
    std::vector<std::string> files;
    for (const auto& e : it) {
        // symlink_status: a link to another license would count its text twice.
        if (fs::is_regular_file(e.symlink_status())) files.push_back(e.path().string());
    }
    if (files.empty()) throw DataError(fmt::format("'{}' holds no regular file", dir));
    std::sort(files.begin(), files.end());
    return files;
}

TextCorpus load_text_corpus(const std::vector<std::string>& files, uint32_t min_chars) {
    if (files.empty()) throw DataError("no text file given");
    std::string text;
    for (const std::string& f : files) {
        try {
            // One bound for the whole corpus: what is left of it bounds each file.
            text += sim::read_input_file(f, kMaxCorpusBytes - text.size());
        } catch (const sim::InputFileError& e) {
            throw DataError(e.what());
        }
    }
    TextCorpus c;
    c.chars = text.size();
    std::array<bool, 256> seen{};
    for (const char ch : text) seen[uint8_t(ch)] = true;
    std::array<uint8_t, 256> token{};
    for (uint32_t b = 0; b < 256; ++b)
        if (seen[b]) {
            token[b] = uint8_t(c.vocab.size());
            c.vocab.push_back(uint8_t(b));
        }
    for (uint64_t i = 0; i < text.size(); ++i) {
        const bool val = (i / kTextBlockBytes) % kTextValEvery == kTextValEvery - 1;
        (val ? c.val : c.train).push_back(token[uint8_t(text[i])]);
    }
    if (c.train.size() < min_chars || c.val.size() < min_chars)
        throw DataError(fmt::format(
            "{}: {} characters give {} training and {} validation characters (every {}th "
            "block of {} bytes is validation); each split needs at least {}, a window of "
            "context + 1",
            files.size() == 1 ? files[0] : fmt::format("{} files", files.size()), c.chars,
            c.train.size(), c.val.size(), kTextValEvery, kTextBlockBytes, min_chars));
    return c;
}

}  // namespace tpu::trainer
