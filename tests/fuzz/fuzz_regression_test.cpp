// SPDX-License-Identifier: Apache-2.0
// Replays every kept fuzz input (seeds and fixed crashers) through the fuzz entry points in
// the normal test suite, so a regression shows up without clang or libFuzzer.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tests/common/paths.h"

int tpu_fuzz_asm(const uint8_t* data, size_t size);
int tpu_fuzz_decode(const uint8_t* data, size_t size);
int tpu_fuzz_config(const uint8_t* data, size_t size);
int tpu_fuzz_idx(const uint8_t* data, size_t size);

namespace {

int replay(const char* target, int (*entry)(const uint8_t*, size_t)) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(tpu::test::source_dir()) / "tests/fuzz/corpus" / target;
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        std::ifstream in(e.path(), std::ios::binary);
        const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
        SCOPED_TRACE(e.path().string());
        entry(bytes.data(), bytes.size());
        ++n;
    }
    return n;
}

}  // namespace

TEST(FuzzRegression, Assembler) {
    EXPECT_GT(replay("asm", tpu_fuzz_asm), 0);
}
TEST(FuzzRegression, Decoder) {
    EXPECT_GT(replay("decode", tpu_fuzz_decode), 0);
}
TEST(FuzzRegression, ConfigLoader) {
    EXPECT_GT(replay("config", tpu_fuzz_config), 0);
}
TEST(FuzzRegression, IdxReader) {
    EXPECT_GT(replay("idx", tpu_fuzz_idx), 0);
}
