// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

/// A character-level text corpus for language-model training (`tpusim train --model gpt`).
namespace tpu::trainer {

/// Where every Debian system keeps the license texts that make up the default corpus.
inline constexpr std::string_view kLicenseDir = "/usr/share/common-licenses";
/// Bytes per block of the train/validation split.
inline constexpr uint32_t kTextBlockBytes = 4096;
/// Every tenth block (blocks 9, 19, 29, ... counting from 0) is validation.
inline constexpr uint32_t kTextValEvery = 10;
/// The most text load_text_corpus reads, over all its files (a thousand times the default
/// corpus): windows are counted in 32 bits and each is a batch row of one-hot floats, and an
/// endless file (/dev/zero) must be an error, not a process that grows until it is killed.
inline constexpr uint64_t kMaxCorpusBytes = uint64_t(256) << 20;

/// The bytes of some text files as token ids over the vocabulary of the bytes that occur, split
/// into training and validation text by blocks.
struct TextCorpus {
    std::vector<uint8_t> vocab;  ///< the distinct bytes, ascending; a byte's token is its index
    std::vector<uint8_t> train;  ///< tokens of the training blocks, in file order
    std::vector<uint8_t> val;    ///< tokens of the validation blocks, in file order
    uint64_t chars = 0;          ///< bytes read in all
    /// The unigram entropy of the whole text in nats per character: the loss of a model that
    /// knows only the character frequencies.
    double unigram_entropy() const;
};

/// The regular files of `dir` in name order (symlinks, such as GPL -> GPL-3, and
/// subdirectories are skipped, so no text counts twice); throws DataError when `dir` cannot be
/// listed or holds no regular file.
std::vector<std::string> text_files_in(const std::string& dir);

/// Reads `files` in order and concatenates them (no separator); the text is cut into blocks of
/// kTextBlockBytes and every kTextValEvery-th block goes to validation. Throws DataError naming
/// the file when one cannot be read, and when the text is too short to give both splits
/// `min_chars` tokens (a training window needs context + 1).
TextCorpus load_text_corpus(const std::vector<std::string>& files, uint32_t min_chars);

}  // namespace tpu::trainer
