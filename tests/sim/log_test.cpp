// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/log.h"

namespace tpu::sim {
namespace {

TEST(Log, FormatsTimeLevelAndBlockAndFiltersByLevel) {
    std::vector<std::string> lines;
    set_log_sink([&](std::string_view l) { lines.emplace_back(l); });
    set_log_level(LogLevel::Info);
    TPU_LOG(Info, "board.core3.mxu0", "loaded {} bytes", 64);
    TPU_LOG(Debug, "board", "not shown {}", 1);
    TPU_LOG(Error, "driver", "bad {}", "thing");
    set_log_sink({});
    set_log_level(LogLevel::Warn);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0], "[           0 ns] info  board.core3.mxu0: loaded 64 bytes");
    EXPECT_EQ(lines[1], "[           0 ns] error driver: bad thing");
}

TEST(Log, DisabledLevelsDoNotFormat) {
    set_log_level(LogLevel::Warn);
    int evaluated = 0;
    auto costly = [&] { return ++evaluated; };
    TPU_LOG(Debug, "x", "{}", costly());
    EXPECT_EQ(evaluated, 0);
}

TEST(Log, ParsesLevelNames) {
    EXPECT_EQ(parse_log_level("debug"), LogLevel::Debug);
    EXPECT_EQ(parse_log_level("error"), LogLevel::Error);
    try {
        parse_log_level("loud");
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "unknown log level 'loud' (expected error, warn, info or debug)");
    }
}

}  // namespace
}  // namespace tpu::sim
