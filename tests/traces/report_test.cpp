// SPDX-License-Identifier: Apache-2.0
// Tier (a): pure logic, no SystemC kernel. Renders the HTML report from a small hand-written trace
// and stats and checks the page's structure and numbers.
#include "traces/report.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
    EXPECT_EQ(count(html, "<svg"), 5u);  // 2 utilisation + 2 HBM + roofline
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
    EXPECT_EQ(count(html, "<path class=\"line\""), 3u);
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
    EXPECT_EQ(count(html, "xmlns=\"" + ns + "\""), 5u);
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
    EXPECT_EQ(count(dom, "<svg"), 5u);
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

}  // namespace
}  // namespace tpu::traces
