// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <systemc>

#include "sim/log.h"

namespace tpu::sim {
namespace {

/// Captures log lines and restores the default sink and level afterwards.
class Log : public ::testing::Test {
protected:
    void SetUp() override {
        set_log_sink([this](std::string_view l) { lines.emplace_back(l); });
    }
    void TearDown() override {
        set_log_sink({});
        set_log_level(LogLevel::Warn);
    }
    std::vector<std::string> lines;
};

TEST_F(Log, FormatsTimeLevelAndBlockAndFiltersByLevel) {
    set_log_level(LogLevel::Info);
    TPU_LOG(Info, "board.core3.mxu0", "loaded {} bytes", 64);
    TPU_LOG(Debug, "board", "not shown {}", 1);
    TPU_LOG(Warn, "board.core0.dma", "slow");
    TPU_LOG(Error, "driver", "bad {}", "thing");
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[0], "[           0 ns] info  board.core3.mxu0: loaded 64 bytes");
    EXPECT_EQ(lines[1], "[           0 ns] warn  board.core0.dma: slow");
    EXPECT_EQ(lines[2], "[           0 ns] error driver: bad thing");
}

TEST_F(Log, EachLevelShowsItselfAndMoreSevere) {
    for (LogLevel threshold : {LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug}) {
        lines.clear();
        set_log_level(threshold);
        EXPECT_EQ(log_level(), threshold);
        TPU_LOG(Error, "b", "e");
        TPU_LOG(Warn, "b", "w");
        TPU_LOG(Info, "b", "i");
        TPU_LOG(Debug, "b", "d");
        EXPECT_EQ(lines.size(), static_cast<size_t>(threshold) + 1) << log_level_name(threshold);
    }
}

TEST_F(Log, ShowsCycleWhenKnown) {
    set_log_level(LogLevel::Debug);
    TPU_LOG_AT(Debug, "board.core0.seq", 1160, "pc {}", 3);
    log_at(LogLevel::Info, "x", 0, "zero");
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0], "[           0 ns @ cycle 1160] debug board.core0.seq: pc 3");
    EXPECT_EQ(lines[1], "[           0 ns @ cycle 0] info  x: zero");
}

/// Logs from a SystemC process so the line carries the simulated time: at 12345 ns, then
/// 0.5 ns later. A method, as every process of the simulator is.
struct Talker : sc_core::sc_module {
    SC_HAS_PROCESS(Talker);
    explicit Talker(sc_core::sc_module_name n) : sc_core::sc_module(n) { SC_METHOD(run); }
    int step = 0;
    void run() {
        switch (step++) {
            case 0:
                next_trigger(12345, sc_core::SC_NS);
                break;
            case 1:
                TPU_LOG(Info, name(), "at {}", "t1");
                next_trigger(sc_core::sc_time(0.5, sc_core::SC_NS));
                break;
            default:
                TPU_LOG(Info, name(), "rounded");
        }
    }
};

TEST_F(Log, UsesSimulatedTime) {
    set_log_level(LogLevel::Info);
    Talker talker("talker");
    sc_core::sc_start();
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0], "[       12345 ns] info  talker: at t1");
    EXPECT_EQ(lines[1], "[       12346 ns] info  talker: rounded");  // 12345.5 ns, to nearest
}

TEST_F(Log, DisabledLevelsDoNotEvaluateArguments) {
    set_log_level(LogLevel::Warn);
    int evaluated = 0;
    auto costly = [&] { return ++evaluated; };
    TPU_LOG(Debug, "x", "{}", costly());
    TPU_LOG(Info, "x", "{}", costly());
    TPU_LOG_AT(Debug, "x", 1, "{}", costly());
    EXPECT_EQ(evaluated, 0);
    EXPECT_TRUE(lines.empty());
    TPU_LOG(Warn, "x", "{}", costly());
    EXPECT_EQ(evaluated, 1);
}

TEST(LogLevels, ParseAndNameRoundTrip) {
    for (LogLevel l : {LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug})
        EXPECT_EQ(parse_log_level(log_level_name(l)), l);
    EXPECT_EQ(parse_log_level("debug"), LogLevel::Debug);
    EXPECT_EQ(parse_log_level("error"), LogLevel::Error);
    EXPECT_THROW(parse_log_level("Info"), std::invalid_argument);  // names are exact
    EXPECT_THROW(parse_log_level(""), std::invalid_argument);
    try {
        parse_log_level("loud");
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "unknown log level 'loud' (expected error, warn, info or debug)");
    }
}

TEST(LogLevels, DefaultIsWarnAndStderrIsTheDefaultSink) {
    EXPECT_EQ(log_level(), LogLevel::Warn);
    ::testing::internal::CaptureStderr();
    TPU_LOG(Warn, "board", "to stderr {}", 1);
    TPU_LOG(Info, "board", "hidden");
    // The time depends on what ran before in this process; the rest of the line does not.
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.front(), '[');
    EXPECT_TRUE(err.ends_with(" ns] warn  board: to stderr 1\n")) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1);
}

}  // namespace
}  // namespace tpu::sim
