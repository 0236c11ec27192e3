// SPDX-License-Identifier: Apache-2.0
// Tier (a): pure logic, no SystemC kernel. Renders the HTML report from a small hand-written trace
// and stats and checks the page's structure and numbers.
#include "traces/report.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/paths.h"
#include "tests/common/scratch.h"

namespace tpu::traces {
namespace {

using nlohmann::json;

/// Occurrences of `needle` in `hay`.
size_t count(const std::string& hay, const std::string& needle) {
    size_t n = 0;
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
    return n;
}

json meta(const char* kind, int pid, int tid, const char* name) {
    return {{"ph", "M"}, {"name", kind}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

/// At 1000 MHz a microsecond is 1000 cycles, so ts = cycle / 1000.
json span(int pid, int tid, const char* name, uint64_t begin, uint64_t end, uint64_t bytes = 0) {
    json args = {{"begin_cycle", begin}, {"end_cycle", end}, {"pc", 0}};
    if (bytes) args["bytes"] = bytes;
    return {{"ph", "X"},   {"name", name},      {"pid", pid},
            {"tid", tid},  {"ts", begin / 1e3}, {"dur", double(end - begin) / 1e3},
            {"args", args}};
}

json sample(int pid, const char* name, uint64_t cycle, double v) {
    return {{"ph", "C"}, {"name", name},      {"pid", pid},
            {"tid", 0},  {"ts", cycle / 1e3}, {"args", {{"value", v}}}};
}

/// Two cores and the host, 1000 MHz. core0: DMA in 1000-2000 (64 KiB), MXU 2000-4000, DMA out
/// 4000-5000 (32 KiB). core1: DMA in 1000-3000 (128 KiB), weight load 2500-3500 under a matmul
/// 3000-5000. The trace says it covers cycles [begin, end): by default the whole run of stats()
/// (5500 cycles); end 0 writes no window, as a trace from another tool.
std::string trace(uint64_t begin = 0, uint64_t end = 5500) {
    json ev = json::array();
    ev.push_back(meta("process_name", 0, 0, "host"));
    ev.push_back(meta("thread_name", 0, 1, "runtime"));
    ev.push_back(meta("process_name", 1, 0, "core0"));
    ev.push_back(meta("thread_name", 1, 3, "dma"));
    ev.push_back(meta("thread_name", 1, 6, "mxu0"));
    ev.push_back(meta("process_name", 2, 0, "core1"));
    ev.push_back(meta("thread_name", 2, 9, "dma"));
    ev.push_back(meta("thread_name", 2, 12, "mxu0"));
    ev.push_back(
        {{"ph", "X"},
         {"name", "write"},
         {"pid", 0},
         {"tid", 1},
         {"ts", 0.0},
         {"dur", 0.5},
         {"args", {{"begin_cycle", 0}, {"end_cycle", 500}, {"bytes", 4096}, {"core", 0}}}});
    ev.push_back(span(1, 3, "dma.hv", 1000, 2000, 65536));
    ev.push_back(span(1, 6, "mxu.mm", 2000, 4000));
    ev.push_back(span(1, 3, "dma.vh", 4000, 5000, 32768));
    ev.push_back(span(2, 9, "dma.hv", 1000, 3000, 131072));
    ev.push_back(span(2, 12, "mxu.mm", 3000, 5000));
    ev.push_back(span(2, 12, "mxu.lw", 2500, 3500));  // overlaps the matmul: queued
    // Windows of 1024 cycles; the tracer ends each track with a 0 sample.
    ev.push_back(sample(1, "mxu_utilization", 1024, 0.0));
    ev.push_back(sample(1, "mxu_utilization", 2048, 0.5));
    ev.push_back(sample(1, "mxu_utilization", 4096, 0.0));
    ev.push_back(sample(1, "hbm_gbps", 1024, 60.0));
    ev.push_back(sample(1, "hbm_gbps", 2048, 0.0));
    ev.push_back(sample(2, "mxu_utilization", 3072, 0.25));
    ev.push_back(sample(2, "mxu_utilization", 5120, 0.0));
    json doc = {{"displayTimeUnit", "ns"}, {"traceEvents", ev}};
    if (end) doc["otherData"] = {{"window", {{"begin_cycle", begin}, {"end_cycle", end}}}};
    return doc.dump();
}

std::string stats(double core0_mxu_flops = 67108864) {
    auto c = [](double v, const char* unit) {
        return json{{"value", v}, {"unit", unit}, {"desc", "-"}};
    };
    // The blocks' groups: the core's own counters, its DMA and one group per MXU.
    auto core = [&](double insts, double rd, double wr, const json& mxus) {
        json units = {
            {"dma",
             {{"counters",
               {{"hbm_read_bytes", c(rd, "bytes")}, {"hbm_write_bytes", c(wr, "bytes")}}}}}};
        for (size_t i = 0; i < mxus.size(); ++i)
            units["mxu" + std::to_string(i)] = {
                {"counters", {{"flops", c(mxus[i].get<double>(), "flops")}}}};
        return json{{"counters", {{"instructions", c(insts, "count")}}}, {"children", units}};
    };
    json board = {{"counters", {{"cycles", c(5500, "cycles")}}},
                  {"children",
                   {{"core0", core(7, 65536, 32768, json::array({core0_mxu_flops, 0.0}))},
                    {"core1", core(5, 131072, 0, json::array({33554432.0}))}}}};
    return json{{"board", board}}.dump();
}

/// 65.536 TFLOP/s (2 x 2 x 128 x 128 x 1 GHz) and 512 GB/s (16 x 16 B x 2 / 1 ns) per core.
std::string config() {
    return json{{"clock_mhz", 1000.0},
                {"core", {{"mxus", 2}, {"mxu_rows", 128}, {"mxu_cols", 128}}},
                {"hbm", {{"channels", 16}, {"bus_bits", 128}, {"tck_ps", 1000}}}}
        .dump();
}

TEST(ReportTest, PageHasOneChartPerCoreAndTheRoofline) {
    const std::string html = render_report(trace(), stats(), "gemm <test>", config());
    EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
    EXPECT_NE(html.find("<title>gemm &lt;test&gt;</title>"), std::string::npos);
    EXPECT_EQ(count(html, "<svg"), 6u);  // 2 utilisation + 2 HBM + power + roofline
    EXPECT_EQ(count(html, "class=\"chart power\""), 1u);
    EXPECT_EQ(count(html, "class=\"chart util\""), 2u);
    EXPECT_EQ(count(html, "class=\"chart hbm\""), 2u);
    EXPECT_NE(html.find("class=\"chart util\" data-core=\"core0\""), std::string::npos);
    EXPECT_NE(html.find("class=\"chart util\" data-core=\"core1\""), std::string::npos);
    EXPECT_EQ(count(html, "class=\"chart roofline\""), 1u);
    EXPECT_EQ(count(html, "<polyline class=\"roof\""), 1u);
    EXPECT_EQ(count(html, "<circle class=\"point\""), 2u);
    EXPECT_NE(html.find("<circle class=\"point\" data-core=\"core0\""), std::string::npos);
    EXPECT_NE(html.find("<circle class=\"point\" data-core=\"core1\""), std::string::npos);
    // core1 has utilisation samples but no hbm_gbps ones.
    EXPECT_EQ(count(html, ">no samples<"), 1u);
    EXPECT_EQ(count(html, "<path class=\"line\""), 4u);  // 3 counters + the power
}

TEST(ReportTest, SummaryNumbersComeFromStatsAndConfig) {
    const std::string html = render_report(trace(), stats(), "t", config());
    EXPECT_NE(html.find("<tr><th>cores</th><td>2</td></tr>"), std::string::npos);
    // Board cycles 5500 at 1000 MHz.
    EXPECT_NE(html.find("<td>5,500 = 5.500 us</td>"), std::string::npos);
    // Core activity: cycles 1000 to 5000.
    EXPECT_NE(html.find("<td>4,000 cycles = 4.000 us</td>"), std::string::npos);
    EXPECT_NE(html.find("<tr><th>instructions</th><td>12</td></tr>"), std::string::npos);
    // 64 Ki + 32 Ki + 128 Ki bytes.
    EXPECT_NE(html.find("<td>229,376 (229.38 kB)</td>"), std::string::npos);
    // 64 Mi + 32 Mi FLOPs.
    EXPECT_NE(html.find("<td>100,663,296 (100.66 MFLOP)</td>"), std::string::npos);
    // 100663296 / (2 x 32768 PEs x 2 cores x 4000 cycles) = 0.192 -> 19.2%.
    EXPECT_NE(html.find("<td>19.2%</td></tr>"), std::string::npos);
    EXPECT_NE(html.find("1000.0 MHz (config)"), std::string::npos);
    EXPECT_NE(html.find("peak 65.5 TFLOP/s"), std::string::npos);
    EXPECT_NE(html.find("HBM 512.0 GB/s"), std::string::npos);
    EXPECT_NE(html.find("1 writes (4.10 kB), 0 reads (0 B)"), std::string::npos);
    // Per-unit busy: core0 DMA 2000 of 4000 cycles; core1's MXU is busy 2500-5000 (the union),
    // though its events sum to 3000.
    EXPECT_NE(html.find("<td title=\"busy 2,000 cycles; events sum to 2,000 cycles\">50.0%"),
              std::string::npos);
    EXPECT_NE(html.find("<td title=\"busy 2,500 cycles; events sum to 3,000 cycles\">62.5%"),
              std::string::npos);
    // core0's roofline row: 67108864 / 98304 = 682.67 FLOP/B; 67108864 / 4 us = 16.78 TFLOP/s.
    EXPECT_NE(html.find("<td>682.67</td><td>16.78</td><td>65.54</td><td>25.6%</td><td>compute"),
              std::string::npos);
}

/// Every percentage on the page, as numbers.
std::vector<double> percentages(const std::string& html) {
    std::vector<double> out;
    for (size_t at = html.find('%'); at != std::string::npos; at = html.find('%', at + 1)) {
        size_t b = at;
        while (b > 0 &&
               (std::isdigit(static_cast<unsigned char>(html[b - 1])) || html[b - 1] == '.'))
            --b;
        if (b < at) out.push_back(std::stod(html.substr(b, at - b)));
    }
    return out;
}

TEST(ReportTest, AWindowedTraceIsNeverDividedIntoTheWholeRunsCounters) {
    // The README tour's case: the trace covers cycles 1000-5000 of the run and the stats count
    // the whole run, here 100x the MXU work core0 does in the window. Dividing the stats' FLOPs
    // by the window's cycles printed utilisation above 100%; the per-core figures are the
    // trace's own (as in TraceOnlyUsesDefaultsAndTraceCounts), the stats keep the board total.
    const std::string html = render_report(trace(1000, 5000), stats(6710886400.0), "t", config());
    EXPECT_NE(html.find("<tr><th>trace window</th><td>cycles 1,000 to 5,000 (the stats count "
                        "the whole run"),
              std::string::npos)
        << html;
    EXPECT_NE(html.find("<td>5,500 = 5.500 us</td>"), std::string::npos);
    EXPECT_EQ(html.find("6,710,886,400"), std::string::npos);
    EXPECT_NE(html.find("<tr><th>MXU FLOPs (estimated from mxu_utilization)</th><td>100,663,296"),
              std::string::npos);
    EXPECT_NE(html.find("<tr><th>instructions (unit events in the trace)</th><td>6</td>"),
              std::string::npos);
    const std::vector<double> pcts = percentages(html);
    ASSERT_FALSE(pcts.empty());
    for (double p : pcts) EXPECT_LE(p, 100.0);
    // A trace without a window (another tool's) is not combined with stats either.
    const std::string foreign = render_report(trace(0, 0), stats(6710886400.0), "t", config());
    EXPECT_EQ(foreign.find("6,710,886,400"), std::string::npos);
    for (double p : percentages(foreign)) EXPECT_LE(p, 100.0);
}

TEST(ReportTest, NoFigureIsShownAboveItsPeak) {
    // Stats and trace of the same run whose counters claim more than the hardware can do (an
    // inconsistent input): utilisation stops at 100% and TFLOP/s at the 65.54 peak.
    const std::string html = render_report(trace(), stats(6710886400.0), "t", config());
    for (double p : percentages(html)) EXPECT_LE(p, 100.0);
    EXPECT_NE(html.find("<td>100.0%</td><td>65.54</td>"), std::string::npos);
    EXPECT_NE(html.find("<tr><th>MXU utilisation over the core activity</th><td>100.0%"),
              std::string::npos);
}

TEST(ReportTest, TraceOnlyUsesDefaultsAndTraceCounts) {
    const std::string html = render_report(trace(), "", "t");
    // No config: the clock comes from the events (begin_cycle / ts), the roof from the defaults.
    EXPECT_NE(html.find("1000.0 MHz (from the trace)"), std::string::npos);
    EXPECT_NE(html.find("peak 61.6 TFLOP/s"), std::string::npos);
    EXPECT_NE(html.find("HBM 450.7 GB/s"), std::string::npos);
    // Bytes from the DMA events, instructions = X events on cores (3 + 3).
    EXPECT_NE(html.find("<tr><th>HBM bytes (DMA events in the trace)</th><td>229,376"),
              std::string::npos);
    EXPECT_NE(html.find("<tr><th>instructions (unit events in the trace)</th><td>6</td>"),
              std::string::npos);
    // FLOPs from the utilisation step function: core0 0.5 x 2048 cycles, core1 0.25 x 2048;
    // x 2 x 32768 PEs = 67108864 + 33554432.
    EXPECT_NE(html.find("<td>100,663,296 (100.66 MFLOP)</td>"), std::string::npos);
    EXPECT_EQ(count(html, "<circle class=\"point\""), 2u);
}

TEST(ReportTest, PageIsSelfContained) {
    std::string html = render_report(trace(), stats(), "t", config());
    const std::string ns = "http://www.w3.org/2000/svg";
    EXPECT_EQ(count(html, "xmlns=\"" + ns + "\""), 6u);
    for (size_t at = html.find(ns); at != std::string::npos; at = html.find(ns))
        html.erase(at, ns.size());
    EXPECT_EQ(html.find("http"), std::string::npos);
    EXPECT_EQ(html.find("<script"), std::string::npos);
    EXPECT_EQ(html.find("<link"), std::string::npos);
    EXPECT_EQ(html.find("@import"), std::string::npos);
    EXPECT_EQ(html.find("url("), std::string::npos);
}

TEST(ReportTest, OutputIsDeterministic) {
    EXPECT_EQ(render_report(trace(), stats(), "t", config()),
              render_report(trace(), stats(), "t", config()));
    EXPECT_EQ(render_report(trace(), "", "t"), render_report(trace(), "", "t"));
}

/// The message of the ReportError that rendering throws.
std::string error_of(const std::string& tr, const std::string& st = "",
                     const std::string& cfg = "") {
    try {
        render_report(tr, st, "t", cfg);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "no error";
}

TEST(ReportTest, ErrorsNameTheInputAndTheProblem) {
    EXPECT_EQ(error_of("{\"traceEvents\": [1,"), "trace: truncated JSON (ends after 19 bytes)");
    EXPECT_EQ(error_of("{\"traceEvents\": [1,]}"), "trace: malformed JSON at byte 20");
    EXPECT_EQ(error_of(" \n"), "trace: empty, not JSON");
    EXPECT_EQ(error_of("{\"board\": {}}"), "trace: not a Chrome trace (no \"traceEvents\" array)");
    EXPECT_EQ(error_of("{\"traceEvents\": {}}"),
              "trace: not a Chrome trace (no \"traceEvents\" array)");
    EXPECT_EQ(error_of("{\"traceEvents\": [{\"ph\": \"X\"}, 3]}"),
              "trace: event 1 is not an object");
    EXPECT_EQ(error_of("{\"traceEvents\": []}"),
              "trace: no core processes (\"core0\", \"core1\", ...) in the trace");
    EXPECT_EQ(error_of(trace(), "{\"board\" 1}"), "stats: malformed JSON at byte 10");
    EXPECT_EQ(error_of(trace(), trace()), "stats: not a tpusim stats file (no \"board\" object)");
    EXPECT_EQ(error_of(trace(), stats(), "[]"), "config: not a board config (not an object)");
    EXPECT_EQ(error_of(trace(), stats(), "{,}"), "config: malformed JSON at byte 2");
    // ReportError carries the input so the CLI can name the file instead.
    try {
        render_report(trace(), "nope", "t");
        FAIL() << "no error";
    } catch (const ReportError& e) {
        EXPECT_EQ(e.input(), ReportError::Input::Stats);
        EXPECT_EQ(e.problem(), "malformed JSON at byte 2");
    }
}

TEST(ReportTest, HeadlessChromiumRendersTheSvg) {
    const std::string chromium = "/usr/bin/chromium";
    if (!std::filesystem::exists(chromium))
        GTEST_SKIP() << "Debian's chromium is not installed (" << chromium
                     << "); the page's DOM is not checked in a browser";
    const std::filesystem::path page = test::scratch("report_test.html");
    std::ofstream(page) << render_report(trace(), stats(), "t", config());
    const std::string cmd = chromium + " --headless --disable-gpu --no-sandbox --dump-dom file://" +
                            page.string() + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string dom;
    std::array<char, 4096> buf{};
    for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) dom.append(buf.data(), n);
    EXPECT_EQ(pclose(p), 0);
    EXPECT_EQ(count(dom, "<svg"), 6u);
    EXPECT_EQ(count(dom, "<circle class=\"point\""), 2u);
    EXPECT_EQ(count(dom, "<polyline class=\"roof\""), 1u);
}

TEST(ReportTest, ShowsHbmRowsAndIciLinksFromTheBlocksGroups) {
    json doc = json::parse(stats());
    auto c = [](double v) { return json{{"value", v}, {"unit", "count"}, {"desc", "-"}}; };
    doc["board"]["children"]["core0"]["children"]["hbm"] = {{"counters",
                                                             {{"bursts", c(32)},
                                                              {"row_hits", c(24)},
                                                              {"row_misses", c(8)},
                                                              {"bank3_conflicts", c(5)}}}};
    json links = json::object();
    links["core0+x"]["counters"] = {{"bytes", c(4096)}, {"utilization", c(0.25)}};
    links["core1+x"]["counters"] = {{"bytes", c(0)}, {"utilization", c(0)}};
    doc["board"]["children"]["ici"]["children"] = links;
    const std::string html = render_report(trace(), doc.dump(), "t", config());
    EXPECT_NE(html.find("<th>bursts</th><th>row_hits</th><th>row_misses</th>"), std::string::npos)
        << html;
    EXPECT_NE(html.find("<td>core0</td><td>32</td><td>24</td><td>8</td><td>bank3_conflicts (5)"),
              std::string::npos);
    EXPECT_NE(html.find("<td>core0+x</td><td>4,096</td><td>25.0%</td>"), std::string::npos) << html;
    EXPECT_EQ(html.find("core1+x"), std::string::npos);  // idle links are left out
}

TEST(ReportTest, TheTracesOwnConfigGivesTheClockAndTheRoof) {
    // tpusim writes the effective config into otherData.config: no config file, no guessing.
    json doc = json::parse(trace());
    doc["otherData"]["config"] = json::parse(config());
    const std::string html = render_report(doc.dump(), stats(), "t", "");
    EXPECT_NE(html.find("1000.0 MHz (config)"), std::string::npos) << html;
}

/// stats() with a `result` group (tpusim train's), an `energy` group and a kernel per role.
std::string stats_with_result(double batch_rows, double host_syncs, double shape_changes) {
    json doc = json::parse(stats());
    auto c = [](double v, const char* unit, const char* desc = "-") {
        return json{{"value", v}, {"unit", unit}, {"desc", desc}};
    };
    doc["board"]["children"]["result"]["counters"] = {
        {"cycles", c(4000, "cycles", "device cycles of the 4 training steps")},
        {"steps", c(4, "count")},
        {"wall_cycles_estimate", c(40000, "cycles")},
        {"batch_rows", c(batch_rows, "count")},
        {"host_syncs", c(host_syncs, "count")},
        {"log_every_n_steps", c(1, "count")},
        {"compiled_steps", c(1 + shape_changes, "count")},
        {"shape_changes", c(shape_changes, "count")},
        {"compile_cycles_estimate", c(100, "cycles")},
        {"cpu_fallbacks", c(2, "count")},
        {"ops", c(80, "count")}};
    auto kernel = [&](double cycles) {
        return json{
            {"counters", {{"cycles", c(cycles, "cycles")}, {"energy_j", c(0.5, "joules")}}}};
    };
    doc["board"]["children"]["kernels"]["children"] = {
        {"matmul", kernel(1000)}, {"adam", kernel(1200)}, {"allreduce_hbm", kernel(300)}};
    doc["board"]["children"]["energy"] = {
        {"counters",
         {{"total_j", c(2.5, "joules")},
          {"average_power_w", c(454.5, "watts")},
          {"idle_power_w", c(492, "watts")},
          {"outside_kernels_j", c(1.0, "joules")}}},
        {"children",
         {{"mxu", {{"counters", {{"energy_j", c(1.5, "joules")}}}}},
          {"other", {{"counters", {{"energy_j", c(1.0, "joules")}}}}}}}};
    return doc.dump();
}

TEST(ReportTest, TheResultIsLabelledAndTheWholeRunToo) {
    const std::string html = render_report(trace(), stats_with_result(128, 1, 0), "t", config());
    // 4000 cycles at 1000 MHz = 4 ms, 1 ms per step; the estimate's wall clock 40 ms.
    EXPECT_NE(html.find("<tr><th>result: device time</th><td>4,000 cycles = 0.004 ms (0.001 ms "
                        "per step)<br><small>device cycles of the 4 training steps</small>"),
              std::string::npos)
        << html;
    EXPECT_NE(html.find("<tr><th>result: wall clock (estimate)</th><td>40,000 cycles = 0.040 ms"),
              std::string::npos);
    EXPECT_NE(html.find("<tr><th>whole run: total cycles (board, from stats)</th><td>5,500 = "),
              std::string::npos);
}

TEST(ReportTest, AdviceNamesTheNumberBehindEachItem) {
    // 16 rows per device, the loss read every step, one shape change, two fallbacks, host-bound
    // (40,000 wall cycles for 4,000 of device time), Adam 1,200 cycles against 1,000 of matmul.
    const std::string html = render_report(trace(), stats_with_result(16, 4, 1), "t", config());
    EXPECT_NE(html.find("<div class=\"advice\">"), std::string::npos);
    for (const char* item :
         {"<b>Small batch:</b> 16 examples per device stream 16 rows through each 128x128",
          "<b>Optimizer:</b> 1,200 cycles, 48.0% of all kernel cycles, against 1,000 cycles",
          "<b>Host syncs:</b> the loss was read back 4 times in 4 steps (log_every_n_steps=1)",
          "<b>Changing shapes:</b> 1 training step(s)", "<b>Host-bound steps:</b>",
          "is 10.0x their device time", "<b>CPU fallbacks:</b> 2 ops ran on the CPU"})
        EXPECT_NE(html.find(item), std::string::npos) << item;
    // The all-reduce's 300 cycles are neither half the matmuls' nor a quarter of the kernels'.
    EXPECT_EQ(html.find("<b>Gradient all-reduce:</b>"), std::string::npos);
    // Nothing to say: no advice box.
    json quiet = json::parse(stats_with_result(128, 0, 0));
    quiet["board"]["children"]["result"]["counters"]["wall_cycles_estimate"]["value"] = 5000;
    quiet["board"]["children"]["result"]["counters"]["cpu_fallbacks"]["value"] = 0;
    quiet["board"]["children"]["kernels"]["children"]["adam"]["counters"]["cycles"]["value"] = 10;
    EXPECT_EQ(render_report(trace(), quiet.dump(), "t", config()).find("class=\"advice\""),
              std::string::npos);
}

TEST(ReportTest, OnlyTheCoresThatRanAreShown) {
    // The stats of an 8-core board where only core0 and core1 ran: six idle cores are counted,
    // not drawn.
    json doc = json::parse(stats());
    for (int i = 2; i < 8; ++i)
        doc["board"]["children"]["core" + std::to_string(i)] = {
            {"counters", {{"instructions", {{"value", 0}, {"unit", "count"}, {"desc", "-"}}}}}};
    const std::string html = render_report(trace(), doc.dump(), "t", config());
    EXPECT_NE(html.find("<tr><th>cores</th><td>2 (6 idle cores not shown)</td></tr>"),
              std::string::npos)
        << html;
    EXPECT_EQ(html.find("data-core=\"core2\""), std::string::npos);
    EXPECT_EQ(count(html, "class=\"chart util\""), 2u);
}

TEST(ReportTest, LayersComeFromTheHostLayersTrack) {
    json doc = json::parse(trace());
    auto& ev = doc["traceEvents"];
    ev.push_back(meta("thread_name", 0, 20, "layers"));
    ev.push_back(meta("thread_name", 0, 21, "model"));
    auto layer = [&](const char* name, const char* kind, uint64_t b, uint64_t e) {
        json x = span(0, 20, name, b, e);
        x["args"]["kind"] = kind;
        ev.push_back(x);
    };
    layer("fc1", "linear", 1000, 3000);
    layer("relu", "relu", 3000, 3500);
    layer("fc1", "linear", 4000, 5000);  // its backward
    ev.push_back(span(0, 21, "inference", 1000, 5000));
    const std::string html = render_report(doc.dump(), "", "t", config());
    EXPECT_NE(html.find("<h2>Layers</h2>"), std::string::npos);
    // fc1: two spans, 2000 + 1000 cycles of the 4000-cycle inference.
    EXPECT_NE(html.find("<tr><td>fc1</td><td>linear</td><td>2</td><td>3,000</td><td>3.000 us</td>"
                        "<td>75.0%</td></tr>"),
              std::string::npos)
        << html;
    EXPECT_NE(html.find("<tr><td>relu</td><td>relu</td><td>1</td><td>500</td>"), std::string::npos);
    EXPECT_NE(html.find("<tr><th>result: inference (trace)</th><td>4,000 cycles = 0.004 ms"),
              std::string::npos);
}

TEST(ReportTest, PowerIsEstimatedOverTheTraceAndFromTheStats) {
    const std::string html = render_report(trace(), stats_with_result(128, 0, 0), "t", config());
    EXPECT_NE(html.find("<h2>Power and energy (estimate)</h2>"), std::string::npos);
    EXPECT_NE(html.find("<tr><th>energy of the whole run (stats)</th><td>2.5 J</td></tr>"),
              std::string::npos)
        << html;
    // The default board's static power, 4 chips x 123.0 W, whatever the trace did.
    EXPECT_NE(html.find("<tr><th>idle board (static power)</th><td>492.0 W = 123.0 W per chip"),
              std::string::npos);
    EXPECT_NE(html.find("<tr><th>peak power (1024-cycle windows)</th>"), std::string::npos);
    EXPECT_NE(html.find("<tr><td>mxu</td><td>1.5 J</td><td>60.0%</td></tr>"), std::string::npos);
    EXPECT_NE(html.find("<td>0.5 J</td></tr>"), std::string::npos);  // a kernel's energy
}

/// Runs `tpusim ARGS` (the built executable beside the tests) and returns its exit code.
int run_tpusim(const std::string& args) {
    const std::string cmd = test::tpusim_exe() + " " + args + " >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0 ? 0 : 1;
}

/// Every number with a unit of its kind on a page: "12.5%", "170.2 W".
std::vector<double> numbers_before(const std::string& text, const std::string& unit) {
    std::vector<double> out;
    for (size_t at = text.find(unit); at != std::string::npos; at = text.find(unit, at + 1)) {
        size_t b = at;
        while (b > 0 &&
               (std::isdigit(static_cast<unsigned char>(text[b - 1])) || text[b - 1] == '.'))
            --b;
        if (b < at) out.push_back(std::stod(text.substr(b, at - b)));
    }
    return out;
}

TEST(ReportTest, TheDemosReportRendersInHeadlessChromiumWithEverySection) {
    const std::string chromium = "/usr/bin/chromium";
    if (!std::filesystem::exists(chromium))
        GTEST_SKIP() << "Debian's chromium is not installed (" << chromium << ")";
    // The demo's job on fewer steps: two steps traced, the stats of the whole run, the report
    // of both.
    const std::string trace = test::scratch("demo_trace.json"),
                      st = test::scratch("demo_stats.json"),
                      page = test::scratch("demo_report.html"), png = test::scratch("demo.png");
    ASSERT_EQ(run_tpusim("train --model mlp --data synthetic --devices 8 --precision bf16-mixed "
                         "--epochs 1 --limit-train-batches 6 --limit-test-batches 2 --no-progress "
                         "--trace-steps 2:2 --trace " +
                         trace + " --stats " + st),
              0);
    ASSERT_EQ(run_tpusim("report " + trace + " --stats " + st + " -o " + page), 0);
    // The page as the browser builds it.
    const std::string cmd = chromium + " --headless --disable-gpu --no-sandbox --dump-dom file://" +
                            page + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string dom;
    std::array<char, 4096> buf{};
    for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) dom.append(buf.data(), n);
    EXPECT_EQ(pclose(p), 0);
    for (const char* section :
         {"<h2>Summary</h2>", "<h2>Advice</h2>", "<h2>MXU utilisation over time</h2>",
          "<h2>HBM bandwidth over time</h2>", "<h2>Power and energy (estimate)</h2>",
          "<h2>Unit busy time</h2>", "<h2>Kernels</h2>", "<h2>HBM rows and ICI links</h2>",
          "<h2>Roofline</h2>", "result: device time", "result: wall clock (estimate)",
          "whole run: total cycles", "<b>Small batch:</b>", "class=\"chart power\""})
        EXPECT_NE(dom.find(section), std::string::npos) << section;
    EXPECT_EQ(count(dom, "class=\"chart util\""), 8u);
    // No impossible numbers: no share above 100%, no power above the chip's 450 W TDP per
    // chip, nothing negative or not a number.
    for (double v : numbers_before(dom, "%")) EXPECT_LE(v, 100.0);
    for (double v : numbers_before(dom, " W per chip")) {
        EXPECT_GT(v, 0.0);
        EXPECT_LE(v, 450.0);
    }
    EXPECT_EQ(dom.find("nan"), std::string::npos);
    EXPECT_EQ(dom.find("inf "), std::string::npos);
    EXPECT_EQ(dom.find(">-0"), std::string::npos);
    // The screenshot: the page renders to a full-page image that is not blank.
    const std::string shot = chromium +
                             " --headless --disable-gpu --no-sandbox --hide-scrollbars "
                             "--window-size=1300,4000 --screenshot=" +
                             png + " file://" + page + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(shot.c_str()), 0);
    const std::string image = test::slurp(png);
    ASSERT_GT(image.size(), 24u);
    EXPECT_EQ(image.substr(1, 3), "PNG");
    // Width and height from the IHDR chunk (big-endian at bytes 16 and 20).
    auto be32 = [&](size_t at) {
        return (uint32_t(uint8_t(image[at])) << 24) | (uint32_t(uint8_t(image[at + 1])) << 16) |
               (uint32_t(uint8_t(image[at + 2])) << 8) | uint32_t(uint8_t(image[at + 3]));
    };
    EXPECT_EQ(be32(16), 1300u);
    EXPECT_EQ(be32(20), 4000u);
    // A blank page compresses to a few kilobytes; charts and tables do not.
    EXPECT_GT(image.size(), 100'000u);
}

}  // namespace
}  // namespace tpu::traces
