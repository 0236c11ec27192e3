// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/common/paths.h"
#include "trainer/dataset.h"
#include "trainer/text_corpus.h"

namespace tpu::trainer {
namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const DataError& e) {
        return e.what();
    }
    return "";
}

// The figures for Debian's license texts: 237 320 characters over 86 symbols, unigram
// entropy about 3.21 nats (ln 86 = 4.45 would be no knowledge at all).
TEST(TextCorpus, DebianLicenseTextsAreTheDocumentedCorpus) {
    if (!fs::is_directory(kLicenseDir)) GTEST_SKIP() << kLicenseDir << " is missing";
    const auto files = text_files_in(std::string(kLicenseDir));
    for (const auto& f : files) EXPECT_FALSE(fs::is_symlink(f)) << f;
    EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));
    const TextCorpus c = load_text_corpus(files, 65);
    EXPECT_EQ(c.chars, 237320u);
    EXPECT_EQ(c.vocab.size(), 86u);
    EXPECT_EQ(c.train.size() + c.val.size(), c.chars);
    EXPECT_NEAR(c.unigram_entropy(), 3.21, 0.005);
    // 57 whole blocks and a partial one: blocks 9, 19, 29, 39 and 49 are validation.
    EXPECT_EQ(c.val.size(), 5u * kTextBlockBytes);
}

TEST(TextCorpus, EveryTenthBlockIsValidationAndTokensIndexTheSortedVocabulary) {
    const std::string dir = test::fresh_dir(test::binary_dir() + "/text_corpus_split");
    // 12 blocks: block b is filled with the letter 'a' + b, so each split's letters show which
    // blocks it took. The text spans two files, cut inside block 5.
    std::string text;
    for (uint32_t b = 0; b < 12; ++b) text += std::string(kTextBlockBytes, char('a' + b));
    write(dir + "/one", text.substr(0, 5 * kTextBlockBytes + 100));
    write(dir + "/two", text.substr(5 * kTextBlockBytes + 100));
    const TextCorpus c = load_text_corpus(text_files_in(dir), 65);
    ASSERT_EQ(c.vocab.size(), 12u);
    EXPECT_EQ(c.vocab.front(), 'a');
    EXPECT_EQ(c.vocab.back(), 'l');
    ASSERT_EQ(c.val.size(), kTextBlockBytes);
    EXPECT_TRUE(std::all_of(c.val.begin(), c.val.end(), [](uint8_t t) { return t == 9; }));
    ASSERT_EQ(c.train.size(), 11u * kTextBlockBytes);
    EXPECT_EQ(c.train[9 * kTextBlockBytes], 10);  // block 10 follows block 8 in training text
    EXPECT_EQ(c.train[9 * kTextBlockBytes - 1], 8);
    // 12 equally frequent letters.
    EXPECT_NEAR(c.unigram_entropy(), std::log(12.0), 1e-12);
}

TEST(TextCorpus, BadInputNamesTheFileOrTheShortfall) {
    const std::string dir = test::fresh_dir(test::binary_dir() + "/text_corpus_bad");
    EXPECT_NE(error_of([&] { text_files_in(dir); }).find("holds no regular file"),
              std::string::npos);
    EXPECT_NE(error_of([&] { text_files_in(dir + "/nope"); }).find("cannot list"),
              std::string::npos);
    write(dir + "/short", std::string(1000, 'x'));
    const std::string e = error_of([&] { load_text_corpus({dir + "/short"}, 65); });
    EXPECT_NE(e.find("short: 1000 characters give 1000 training and 0 validation"),
              std::string::npos)
        << e;
    const std::string missing = error_of([&] { load_text_corpus({dir + "/missing"}, 65); });
    EXPECT_NE(missing.find("missing"), std::string::npos) << missing;
    EXPECT_NE(error_of([&] { load_text_corpus({dir}, 65); }).find("directory"), std::string::npos);
    // A symlink is not listed (its target's text would count twice).
    fs::create_symlink(dir + "/short", dir + "/link");
    EXPECT_EQ(text_files_in(dir), std::vector<std::string>{dir + "/short"});
}

}  // namespace
}  // namespace tpu::trainer
