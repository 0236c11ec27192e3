// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "sim/stats.h"

namespace tpu::sim {
namespace {

TEST(Stats, HierarchyFindResetAndPaths) {
    StatGroup board("board");
    StatGroup core("core3", &board);
    StatGroup mxu("mxu0", &core);
    Counter& busy = mxu.add("busy_cycles", "cycles streaming", StatUnit::Cycles);
    busy += 40;
    ++busy;
    EXPECT_EQ(mxu.path(), "board.core3.mxu0");
    ASSERT_NE(board.find("core3.mxu0.busy_cycles"), nullptr);
    EXPECT_EQ(board.find("core3.mxu0.busy_cycles")->value(), 41u);
    EXPECT_EQ(board.find("core3.nothing"), nullptr);
    EXPECT_EQ(board.find("core9.mxu0.busy_cycles"), nullptr);
    board.reset();
    EXPECT_EQ(busy.value(), 0u);
}

TEST(Stats, JsonHasValueUnitAndDescriptionAndFormulas) {
    StatGroup board("board");
    StatGroup core("core0", &board);
    Counter& flops = core.add("flops", "2 x MACs", StatUnit::Flops);
    Counter& cycles = core.add("cycles", "cycles run", StatUnit::Cycles);
    flops.set(1000);
    cycles.set(10);
    core.add_formula("flops_per_cycle", "flops / cycles", StatUnit::Ratio,
                     [&] { return double(flops.value()) / double(cycles.value()); });
    std::stringstream ss;
    board.write_json(ss);
    const auto j = nlohmann::json::parse(ss.str());
    const auto& c = j["board"]["children"]["core0"]["counters"];
    EXPECT_EQ(c["flops"]["value"], 1000);
    EXPECT_EQ(c["flops"]["unit"], "flops");
    EXPECT_EQ(c["flops"]["desc"], "2 x MACs");
    EXPECT_EQ(c["flops_per_cycle"]["value"], 100.0);
    EXPECT_EQ(c["flops_per_cycle"]["unit"], "ratio");
}

TEST(Stats, CsvEscapesAndTextAligns) {
    StatGroup g("g");
    g.add("n", "a, \"quoted\" description", StatUnit::Bytes).set(7);
    std::stringstream csv, text;
    g.write_csv(csv);
    EXPECT_EQ(csv.str(),
              "path,name,value,unit,description\ng,n,7,bytes,\"a, \"\"quoted\"\" description\"\n");
    g.write_text(text);
    EXPECT_NE(text.str().find("g.n"), std::string::npos);
    EXPECT_NE(text.str().find("# a, \"quoted\" description"), std::string::npos);
}

TEST(Stats, ChildDestroyedBeforeParentUnregisters) {
    StatGroup root("root");
    {
        StatGroup child("child", &root);
        EXPECT_EQ(root.children().size(), 1u);
    }
    EXPECT_TRUE(root.children().empty());
    EXPECT_EQ(unit_name(StatUnit::BytesPerSecond), "bytes_per_second");
}

}  // namespace
}  // namespace tpu::sim
