// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <zlib.h>

#include "trainer/dataset.h"

namespace tpu::trainer {
namespace {

std::vector<uint8_t> idx(std::vector<uint32_t> dims, uint8_t type = 0x08, int extra = 0) {
    std::vector<uint8_t> b{0, 0, type, static_cast<uint8_t>(dims.size())};
    uint64_t n = 1;
    for (uint32_t d : dims) {
        for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
        n *= d;
    }
    for (uint64_t i = 0; i < n + extra; ++i) b.push_back(static_cast<uint8_t>(i));
    return b;
}

std::string error_of(const std::vector<uint8_t>& b) {
    try {
        decode_idx(b, "t.idx");
    } catch (const DataError& e) {
        return e.what();
    }
    return "no error";
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& raw) {
    z_stream z{};
    deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    std::vector<uint8_t> out(raw.size() + 1024);
    z.next_in = const_cast<Bytef*>(raw.data());
    z.avail_in = static_cast<uInt>(raw.size());
    z.next_out = out.data();
    z.avail_out = static_cast<uInt>(out.size());
    deflate(&z, Z_FINISH);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

TEST(Idx, DecodesRawAndGzip) {
    const auto raw = idx({2, 3, 4});
    const IdxArray a = decode_idx(raw, "t.idx");
    EXPECT_EQ(a.dims, (std::vector<uint32_t>{2, 3, 4}));
    ASSERT_EQ(a.data.size(), 24u);
    EXPECT_EQ(a.data[23], 23);
    const IdxArray g = decode_idx(gzip(raw), "t.idx.gz");
    EXPECT_EQ(g.dims, a.dims);
    EXPECT_EQ(g.data, a.data);
}

TEST(Idx, MalformedFilesNameTheProblem) {
    EXPECT_EQ(error_of({0, 0}), "t.idx: 2 bytes is too short for an IDX header");
    EXPECT_EQ(error_of({1, 2, 8, 1, 0, 0, 0, 0}),
              "t.idx: not an IDX file (magic 01 02, expected 00 00)");
    EXPECT_EQ(error_of(idx({4}, 0x0D)),
              "t.idx: IDX element type 0x0d is not supported (only 0x08, unsigned bytes)");
    EXPECT_EQ(error_of({0, 0, 8, 0}), "t.idx: 0 dimensions (expected 1 to 4)");
    EXPECT_EQ(error_of({0, 0, 8, 2, 0, 0, 0, 1}), "t.idx: header of 2 dimensions is truncated");
    EXPECT_EQ(error_of(idx({2, 3}, 0x08, 1)),
              "t.idx: dimensions 2x3 need 6 bytes of data, the file has 7");
    EXPECT_EQ(error_of({0, 0, 8, 2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}),
              "t.idx: dimensions describe more than 1073741824 bytes");
    auto gz = gzip(idx({100}));
    gz.resize(gz.size() / 2);
    EXPECT_EQ(error_of(gz).rfind("t.idx: corrupt gzip stream at byte", 0), 0u) << error_of(gz);
    try {
        read_idx("/nonexistent/train.gz");
        ADD_FAILURE();
    } catch (const DataError& e) {
        EXPECT_STREQ(e.what(), "cannot open '/nonexistent/train.gz': No such file or directory");
    }
}

TEST(Datasets, FashionMnistFromTheDebianPackage) {
    if (!std::filesystem::exists(std::string(kFashionMnistDir)))
        GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    const Dataset test = load_fashion_mnist(std::string(kFashionMnistDir), false);
    EXPECT_EQ(test.count, 10000u);
    EXPECT_EQ(test.features, 784u);
    EXPECT_EQ(test.x.size(), 10000u * 784u);
    std::vector<int> per_class(10);
    for (uint8_t l : test.labels) ++per_class[l];
    for (int n : per_class) EXPECT_EQ(n, 1000);  // the test split is balanced
    EXPECT_GE(*std::min_element(test.x.begin(), test.x.end()), 0.0f);
    EXPECT_LE(*std::max_element(test.x.begin(), test.x.end()), 1.0f);
}

TEST(Datasets, MissingDirectoryIsAClearError) {
    try {
        load_fashion_mnist("/nonexistent", true);
        ADD_FAILURE();
    } catch (const DataError& e) {
        EXPECT_STREQ(e.what(),
                     "cannot open '/nonexistent/train-images-idx3-ubyte.gz': No such file or "
                     "directory");
    }
}

TEST(Datasets, SyntheticIsDeterministic) {
    const Dataset a = synthetic(100, 8, 3, 7), b = synthetic(100, 8, 3, 7),
                  c = synthetic(100, 8, 3, 8);
    EXPECT_EQ(a.x, b.x);
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_NE(a.x, c.x);
    EXPECT_THROW(synthetic(10, 8, 1, 0), DataError);
}

TEST(TokenWindows, WindowsStartEveryStrideAndLabelTheNextToken) {
    // 10 tokens, context 3: windows start at 0, 2, 4 (the one at 6 ends at 9 and its last row
    // would need token 10 as a label).
    std::vector<uint8_t> tokens{0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
    const Dataset d = token_windows(tokens, 5, 3, 2);
    EXPECT_EQ(d.count, 4u);  // starts 0, 2, 4, 6: the last reads tokens 6..9
    EXPECT_EQ(d.rows_per_example(), 3u);
    EXPECT_EQ(d.features, 5u);
    EXPECT_EQ(d.classes, 5u);
    EXPECT_EQ(d.label(0, 0), 1);
    EXPECT_EQ(d.label(1, 2), 0);  // window 1 starts at token 2: rows 2, 3, 4 predict 3, 4, 0
    EXPECT_EQ(d.label(3, 2), 4);  // the last window's last label is the last token
    EXPECT_EQ(token_windows(tokens, 5, 9, 1).count, 1u);
    const Dataset classes = synthetic(4, 2, 2, 1);
    EXPECT_EQ(classes.rows_per_example(), 1u);
    EXPECT_EQ(classes.label(3, 0), classes.labels[3]);
}

TEST(Dataset, ExamplesOfSeveralRowsKeepOneLabelPerRow) {
    // 3 examples of 2 rows of 2 features; subset keeps rows and labels together.
    Dataset d{3, 2, 4, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {0, 1, 2, 3, 0, 1}, 2};
    EXPECT_EQ(d.rows_per_example(), 2u);
    EXPECT_EQ(d.label(1, 1), 3);
    const Dataset s = subset(d, 1, 2);
    EXPECT_EQ(s.rows, 2u);
    EXPECT_EQ(s.x, (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
    EXPECT_EQ(s.labels, (std::vector<uint8_t>{2, 3, 0, 1}));
    EXPECT_EQ(s.label(1, 0), 0);
}

TEST(TokenWindows, BadSizesAndTokensAreNamed) {
    auto err = [](std::vector<uint8_t> t, uint32_t vocab, uint32_t context, uint32_t stride) {
        try {
            token_windows(std::move(t), vocab, context, stride);
        } catch (const DataError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(err({0, 1, 2}, 3, 3, 1),
              "token windows: 3 tokens are fewer than one window of context 3 + 1");
    EXPECT_EQ(err({0, 1, 7, 1}, 3, 2, 1),
              "token windows: token 7 at position 2 is outside the vocabulary of 3");
    EXPECT_EQ(err({0, 1, 2}, 3, 0, 1),
              "token windows: vocabulary 3, context 0 and stride 1 must all be at least 1");
}

}  // namespace
}  // namespace tpu::trainer
