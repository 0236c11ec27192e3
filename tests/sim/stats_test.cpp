// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/stats.h"

namespace tpu::sim {
namespace {

std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

TEST(Stats, HierarchyFindResetAndPaths) {
    StatGroup board("board");
    StatGroup core("core3", &board);
    StatGroup mxu("mxu0", &core);
    Counter& busy = mxu.add("busy_cycles", "cycles streaming", StatUnit::Cycles);
    Counter& top = board.add("cycles", "board cycles", StatUnit::Cycles);
    busy += 40;
    ++busy;
    top.set(99);
    EXPECT_EQ(mxu.path(), "board.core3.mxu0");
    EXPECT_EQ(board.path(), "board");
    ASSERT_NE(board.find("core3.mxu0.busy_cycles"), nullptr);
    EXPECT_EQ(board.find("core3.mxu0.busy_cycles"), &busy);
    EXPECT_EQ(board.find("core3.mxu0.busy_cycles")->value(), 41u);
    EXPECT_EQ(core.find("mxu0.busy_cycles"), &busy);  // relative to the group asked
    EXPECT_EQ(board.find("cycles"), &top);
    EXPECT_EQ(board.find("core3.nothing"), nullptr);
    EXPECT_EQ(board.find("core9.mxu0.busy_cycles"), nullptr);
    EXPECT_EQ(board.find("core3.mxu0"), nullptr);  // a group is not a counter
    EXPECT_EQ(board.find(""), nullptr);
    core.reset();  // ROI reset of a subtree leaves the rest alone
    EXPECT_EQ(busy.value(), 0u);
    EXPECT_EQ(top.value(), 99u);
    busy += 5;
    board.reset();
    EXPECT_EQ(busy.value(), 0u);
    EXPECT_EQ(top.value(), 0u);
}

TEST(Stats, AMirrorShowsAnotherTreesSnapshot) {
    // Over MPI a rank shows the values another rank sends for the cores it does not run.
    using namespace tpu::sim;
    auto fill = [](StatGroup& core, StatGroup& mxu, uint64_t& busy) {
        core.add("instructions", "issued", StatUnit::Count) += busy / 2;
        mxu.add("busy", "cycles", StatUnit::Cycles, busy);
        mxu.add_formula("util", "busy / 100", StatUnit::Ratio,
                        [&busy] { return double(busy) / 100.0; });
    };
    uint64_t theirs_busy = 42, mine_busy = 0;
    StatGroup theirs("board"), tcore("core0", &theirs), tmxu("mxu0", &tcore);
    StatGroup mine("board"), mcore("core0", &mine), mmxu("mxu0", &mcore);
    fill(tcore, tmxu, theirs_busy);
    fill(mcore, mmxu, mine_busy);
    std::vector<uint64_t> counters;
    std::vector<double> formulas;
    tcore.snapshot(counters, formulas);
    EXPECT_EQ(counters, (std::vector<uint64_t>{21, 42}));
    EXPECT_EQ(formulas, (std::vector<double>{0.42}));
    mcore.mirror(counters, formulas);
    std::ostringstream a, b;
    theirs.write_json(a);
    mine.write_json(b);
    EXPECT_EQ(a.str(), b.str());
    EXPECT_EQ(mine.find("core0.mxu0.busy")->value(), 42u);
    // A snapshot of another tree is refused.
    counters.push_back(1);
    EXPECT_THROW(mcore.mirror(counters, formulas), std::invalid_argument);
    // reset() forgets the mirror: the group counts its own block again.
    mine.reset();
    EXPECT_EQ(mine.find("core0.mxu0.busy")->value(), 0u);
}

TEST(Stats, CounterReferencesStayValidAsMoreAreAdded) {
    StatGroup g("g");
    Counter& first = g.add("c0", "first", StatUnit::Count);
    for (int i = 1; i < 1000; ++i) g.add("c" + std::to_string(i), "more", StatUnit::Count);
    first += 3;
    EXPECT_EQ(g.find("c0")->value(), 3u);
    EXPECT_EQ(&g.counters().front(), &first);
}

TEST(Stats, JsonHasValueUnitAndDescriptionAndFormulas) {
    StatGroup board("board");
    StatGroup core("core0", &board);
    StatGroup mxu("mxu0", &core);
    Counter& flops = core.add("flops", "2 x MACs", StatUnit::Flops);
    Counter& cycles = core.add("cycles", "cycles run", StatUnit::Cycles);
    mxu.add("busy_cycles", "streaming", StatUnit::Cycles).set(7);
    flops.set(1000);
    cycles.set(10);
    core.add_formula("flops_per_cycle", "flops / cycles", StatUnit::Ratio,
                     [&] { return double(flops.value()) / double(cycles.value()); });
    core.add_formula("bad", "0 / 0", StatUnit::Ratio,
                     [] { return std::numeric_limits<double>::quiet_NaN(); });
    // Large values must survive as integers, not doubles.
    board.add("big", "near 2^64", StatUnit::Bytes).set(18446744073709551000ull);
    std::stringstream ss;
    board.write_json(ss);
    const auto j = nlohmann::json::parse(ss.str());
    ASSERT_EQ(j.size(), 1u);
    EXPECT_EQ(j["board"]["counters"]["big"]["value"].get<uint64_t>(), 18446744073709551000ull);
    const auto& c = j["board"]["children"]["core0"]["counters"];
    EXPECT_EQ(c["flops"]["value"], 1000);
    EXPECT_EQ(c["flops"]["unit"], "flops");
    EXPECT_EQ(c["flops"]["desc"], "2 x MACs");
    EXPECT_EQ(c["cycles"]["unit"], "cycles");
    EXPECT_EQ(c["flops_per_cycle"]["value"], 100.0);
    EXPECT_EQ(c["flops_per_cycle"]["unit"], "ratio");
    EXPECT_EQ(c["flops_per_cycle"]["desc"], "flops / cycles");
    EXPECT_TRUE(c["bad"]["value"].is_null());  // JSON has no NaN
    const auto& m = j["board"]["children"]["core0"]["children"]["mxu0"];
    EXPECT_EQ(m["counters"]["busy_cycles"]["value"], 7);
    EXPECT_TRUE(m["children"].is_object() && m["children"].empty());

    // Registration order is kept, so files diff cleanly between runs.
    const auto ordered = nlohmann::ordered_json::parse(ss.str());
    std::vector<std::string> keys;
    for (const auto& [k, v] : ordered["board"]["children"]["core0"]["counters"].items())
        keys.push_back(k);
    EXPECT_EQ(keys, (std::vector<std::string>{"flops", "cycles", "flops_per_cycle", "bad"}));

    // Formulas are evaluated when written, not when registered.
    cycles.set(20);
    std::stringstream again;
    board.write_json(again);
    EXPECT_EQ(
        nlohmann::json::parse(
            again.str())["board"]["children"]["core0"]["counters"]["flops_per_cycle"]["value"],
        50.0);
}

TEST(Stats, CsvHasOneLinePerStatisticAndEscapes) {
    StatGroup g("g");
    StatGroup k("k", &g);
    g.add("n", "a, \"quoted\" description", StatUnit::Bytes).set(7);
    g.add("plain", "no specials", StatUnit::Count).set(1);
    k.add("t", "two\nlines", StatUnit::Seconds).set(2);
    k.add_formula("half", "n / 2", StatUnit::FlopsPerByte, [] { return 3.5; });
    std::stringstream csv;
    g.write_csv(csv);
    EXPECT_EQ(csv.str(),
              "path,name,value,unit,description\n"
              "g,n,7,bytes,\"a, \"\"quoted\"\" description\"\n"
              "g,plain,1,count,no specials\n"
              "g.k,t,2,seconds,\"two\nlines\"\n"
              "g.k,half,3.5,flops_per_byte,n / 2\n");
}

TEST(Stats, TextHasOneAlignedLinePerStatistic) {
    StatGroup g("g");
    StatGroup k("k", &g);
    g.add("n", "a, \"quoted\" description", StatUnit::Bytes).set(7);
    k.add("longer_name", "x", StatUnit::Cycles).set(123456);
    std::stringstream text;
    g.write_text(text);
    const auto lines = lines_of(text.str());
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0].rfind("g.n ", 0), 0u);
    EXPECT_NE(lines[0].find("# a, \"quoted\" description"), std::string::npos);
    EXPECT_EQ(lines[1].rfind("g.k.longer_name ", 0), 0u);
    // Values and units start in the same column on every line.
    EXPECT_EQ(lines[0].find("bytes"), lines[1].find("cycles"));
    EXPECT_EQ(lines[0].find(" 7 ") + 1, lines[1].find("123456 ") + 5);
}

TEST(Stats, ChildrenRegisterAndUnregister) {
    StatGroup root("root");
    {
        StatGroup child("child", &root);
        ASSERT_EQ(root.children().size(), 1u);
        EXPECT_EQ(root.children()[0], &child);
        EXPECT_EQ(child.path(), "root.child");
    }
    EXPECT_TRUE(root.children().empty());
    std::stringstream ss;
    root.write_json(ss);
    EXPECT_TRUE(nlohmann::json::parse(ss.str())["root"]["children"].empty());

    // A parent destroyed first leaves its children as roots instead of dangling.
    auto parent = std::make_unique<StatGroup>("parent", &root);
    StatGroup orphan("orphan", parent.get());
    parent.reset();
    EXPECT_EQ(orphan.path(), "orphan");
    EXPECT_TRUE(root.children().empty());
}

TEST(Stats, RejectsDuplicateAndDottedNames) {
    StatGroup g("g");
    g.add("x", "", StatUnit::Count);
    EXPECT_THROW(g.add("x", "", StatUnit::Count), std::invalid_argument);
    EXPECT_THROW(g.add_formula("x", "", StatUnit::Ratio, [] { return 0.0; }),
                 std::invalid_argument);
    EXPECT_THROW(g.add("a.b", "", StatUnit::Count), std::invalid_argument);
    EXPECT_THROW(g.add("", "", StatUnit::Count), std::invalid_argument);
    StatGroup c("c", &g);
    try {
        StatGroup twin("c", &g);
        ADD_FAILURE() << "duplicate sibling accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "stats: group 'g.c' already exists");
    }
    EXPECT_EQ(g.children().size(), 1u);  // the failed twin did not register
    EXPECT_THROW(StatGroup("x.y", &g), std::invalid_argument);
}

TEST(Stats, UnitNames) {
    const std::vector<std::pair<StatUnit, std::string_view>> expected = {
        {StatUnit::Count, "count"},
        {StatUnit::Cycles, "cycles"},
        {StatUnit::Bytes, "bytes"},
        {StatUnit::Flops, "flops"},
        {StatUnit::Ratio, "ratio"},
        {StatUnit::Seconds, "seconds"},
        {StatUnit::BytesPerSecond, "bytes_per_second"},
        {StatUnit::FlopsPerByte, "flops_per_byte"},
    };
    for (const auto& [unit, name] : expected) EXPECT_EQ(unit_name(unit), name);
}

TEST(Stats, AViewReadsTheBlocksIntegerAndResetsToARegionOfInterest) {
    uint64_t hot = 5;  // what a block increments on its hot path
    StatGroup root("board");
    StatGroup unit("dma", &root);
    const Counter& c = unit.add("ops", "DMA instructions", StatUnit::Count, hot);
    hot += 3;
    EXPECT_EQ(c.value(), 8u);
    root.reset();  // region of interest starts: the view keeps 8 as its base
    hot += 2;
    EXPECT_EQ(c.value(), 2u);
    EXPECT_EQ(root.find("dma.ops"), &c);
}

}  // namespace
}  // namespace tpu::sim
