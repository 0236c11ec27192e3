// SPDX-License-Identifier: Apache-2.0
// tpusim asm, disasm and run end to end: exit codes, messages, --json, --load/--dump, traces.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace {

using tpu::test::slurp;
using tpu::test::tmp;
using Result = tpu::test::CliResult;
using tpu::test::tpusim;

std::string fmt_row(const std::string& head, uint64_t v, const std::string& tail) {
    return head + std::to_string(v) + tail;
}

std::string example(const std::string& name) {
    return tpu::test::source_dir() + "/isa/examples/" + name;
}

TEST(CliAsm, AssembleDisassembleRoundTrip) {
    const Result a = tpusim("asm " + example("gemm512.s") + " -o " + tmp("g.bin") + " --json");
    ASSERT_EQ(a.code, 0) << a.err;
    const auto j = nlohmann::json::parse(a.out);
    EXPECT_EQ(j["instructions"], 41);
    const Result d = tpusim("disasm " + tmp("g.bin"));
    ASSERT_EQ(d.code, 0) << d.err;
    std::ofstream(tmp("g2.s")) << d.out;
    ASSERT_EQ(tpusim("asm " + tmp("g2.s") + " -o " + tmp("g2.bin")).code, 0);
    EXPECT_EQ(slurp(tmp("g.bin")), slurp(tmp("g2.bin")));
}

TEST(CliAsm, ErrorsNameTheLocationAndExitTwo) {
    std::ofstream(tmp("bad.s")) << "nop\n  mxu.mn 0\n";
    const Result r = tpusim("asm " + tmp("bad.s"));
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, tmp("bad.s") +
                         ":2:3: error: unknown instruction 'mxu.mn'; did you mean "
                         "'mxu.mm'?\n");
    const Result missing = tpusim("asm /nonexistent.s");
    EXPECT_EQ(missing.code, 2);
    EXPECT_EQ(missing.err,
              "tpusim: error: cannot open '/nonexistent.s': No such file or directory\n");
    std::ofstream(tmp("junk.bin")) << "TPUPROG1xx";
    const Result junk = tpusim("disasm " + tmp("junk.bin"));
    EXPECT_EQ(junk.code, 2);
    EXPECT_EQ(junk.err, "tpusim: error: " + tmp("junk.bin") +
                            ": program image is 10 bytes, shorter than its 16-byte header\n");
}

TEST(CliRun, LoadRunDumpIsBitExact) {
    // A = I (bf16 1.0 = 0x3f80 on the diagonal) so C = W exactly.
    std::vector<uint16_t> a(128 * 128, 0), w(128 * 128);
    for (int i = 0; i < 128; ++i) a[i * 128 + i] = 0x3f80;
    std::mt19937 rng(5);
    for (auto& x : w) x = static_cast<uint16_t>(0x3c00 + rng() % 0x800);  // finite bf16
    std::ofstream(tmp("a.bin"), std::ios::binary)
        .write(reinterpret_cast<char*>(a.data()), a.size() * 2);
    std::ofstream(tmp("w.bin"), std::ios::binary)
        .write(reinterpret_cast<char*>(w.data()), w.size() * 2);
    // The cycles below are derived for the simple HBM model (Board.Matmul128ExampleIs...):
    // 722 cycles of launch prologue, 978 of kernel, then 611 of completion.
    const Result r =
        tpusim("run " + example("matmul128.s") + " --load 0:0x0=" + tmp("a.bin") +
               " --load 0:hbm:0x8000=" + tmp("w.bin") + " --dump 0:0x10000:65536=" + tmp("c.bin") +
               " --json --set hbm.model=simple");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["cycles"], 722 + 978 + 611);
    EXPECT_EQ(j["cores"][0]["id"], 0);
    EXPECT_EQ(j["cores"][0]["cycles"], 722 + 978);
    std::vector<float> c(128 * 128);
    std::ifstream(tmp("c.bin"), std::ios::binary)
        .read(reinterpret_cast<char*>(c.data()), c.size() * 4);
    for (size_t i = 0; i < c.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &c[i], 4);
        ASSERT_EQ(bits, uint32_t(w[i]) << 16) << i;
    }
}

TEST(CliRun, TimingOnlyModeGivesIdenticalCycles) {
    const Result on = tpusim("run " + example("gemm512.s") + " --cores 0-7 --json");
    const Result off =
        tpusim("run " + example("gemm512.s") + " --cores 0-7 --json --set sim.functional=false");
    ASSERT_EQ(on.code, 0) << on.err;
    ASSERT_EQ(off.code, 0) << off.err;
    auto a = nlohmann::json::parse(on.out), b = nlohmann::json::parse(off.out);
    EXPECT_EQ(a["cores"].size(), 8u);
    EXPECT_EQ(a["cycles"], b["cycles"]);
    EXPECT_EQ(a["cores"], b["cores"]);
}

TEST(CliRun, TraceAndStatsAreWrittenAndDeterministic) {
    for (const char* name : {"t1", "t2"}) {
        const Result r = tpusim("run " + example("vpu_chain.s") + " --trace " + tmp(name) +
                                ".json --stats " + tmp(name) + ".stats.json");
        ASSERT_EQ(r.code, 0) << r.err;
    }
    EXPECT_EQ(slurp(tmp("t1.json")), slurp(tmp("t2.json")));
    EXPECT_EQ(slurp(tmp("t1.stats.json")), slurp(tmp("t2.stats.json")));
    const auto trace = nlohmann::json::parse(slurp(tmp("t1.json")));
    int x = 0;
    for (const auto& e : trace["traceEvents"]) {
        ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid"));
        if (e["ph"] == "X") {
            ++x;
            EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e["args"].contains("begin_cycle"));
        }
    }
    // 1 DMA in, 4 VPU ops, 1 DMA out, the launch on host/kernels, and its four phases (doorbell,
    // imem_fetch, first_instr, completion) on the launch tracks.
    EXPECT_EQ(x, 11);
    const auto stats = nlohmann::json::parse(slurp(tmp("t1.stats.json")));
    EXPECT_EQ(stats["board"]["children"]["core0"]["children"]["vpu"]["counters"]["ops"]["value"],
              4);
    EXPECT_TRUE(std::filesystem::exists(tmp("t1.stats.json") + ".config.json"));
}

TEST(CliGemm, ChecksBitExactAndIsDeterministic) {
    for (const char* name : {"g1", "g2"}) {
        const Result r = tpusim("gemm --m 200 --k 129 --n 130 --cores 0-2 --check --json --trace " +
                                tmp(name) + ".json --stats " + tmp(name) + ".stats.json");
        ASSERT_EQ(r.code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out);
        EXPECT_EQ(j["bitexact"], true);
        EXPECT_LT(j["rel_error"].get<double>(), 1e-2);
        EXPECT_GT(j["mxu_utilization"].get<double>(), 0.0);
    }
    EXPECT_EQ(slurp(tmp("g1.json")), slurp(tmp("g2.json")));
    // Counter tracks: MXU utilisation within [0, 1], HBM GB/s within the 450 GB/s peak.
    int mxu = 0, hbm = 0;
    const auto trace = nlohmann::json::parse(slurp(tmp("g1.json")));
    for (const auto& e : trace["traceEvents"]) {
        if (e["ph"] != "C") continue;
        const double v = e["args"]["value"];
        if (e["name"] == "mxu_utilization") {
            ++mxu;
            EXPECT_LE(v, 1.0 + 1e-9);
        }
        if (e["name"] == "hbm_gbps") {
            ++hbm;
            EXPECT_LE(v, 451.0);
        }
        EXPECT_GE(v, 0.0);
    }
    EXPECT_GT(mxu, 0);
    EXPECT_GT(hbm, 0);
    EXPECT_EQ(slurp(tmp("g1.stats.json")), slurp(tmp("g2.stats.json")));
    const Result bad = tpusim("gemm --m 8 --k 8 --n 8 --precision fp16");
    EXPECT_EQ(bad.code, 2);
    EXPECT_EQ(bad.err,
              "tpusim: error: --precision: unknown precision 'fp16' (expected bf16, "
              "fp32-3pass or fp32-6pass)\n");
    const Result nine = tpusim("gemm --m 8 --k 8 --n 8 --num-cores 9");
    EXPECT_EQ(nine.code, 2);
    EXPECT_EQ(nine.err, "tpusim: error: --num-cores 9: the board has 8 cores\n");
    // --cores means a list of cores everywhere, as in run: core 3, not three cores.
    const Result three = tpusim("gemm --m 8 --k 8 --n 8 --cores 3 --json");
    ASSERT_EQ(three.code, 0) << three.err;
    EXPECT_EQ(nlohmann::json::parse(three.out)["cores"], 1);
    struct Case {
        std::string args, err;
    };
    for (const Case& c : std::vector<Case>{
             {"--cores ''", "tpusim: error: --cores: bad core list '': '' is not a core number\n"},
             {"--m 0",
              "--m: expected a whole number >= 1, got '0'\nRun with --help for more "
              "information.\n"},
             {"--num-cores 0",
              "--num-cores: expected a whole number >= 1, got '0'\nRun with "
              "--help for more information.\n"},
             {"--cores 1 --num-cores 2",
              "--cores excludes --num-cores\nRun with --help for more information.\n"},
             {"--check --set sim.functional=false",
              "tpusim: error: --check needs computed results, but sim.functional=false (the "
              "timing-only mode) skips the arithmetic\n"}}) {
        const Result r = tpusim("gemm --m 8 --k 8 --n 8 " + c.args);
        EXPECT_EQ(r.code, 2) << c.args;
        EXPECT_EQ(r.err, c.err) << c.args;
    }
}

TEST(CliRun, BadInputsAreClearErrors) {
    struct Case {
        std::string args;
        int code;
        std::string err;
    };
    const std::string k = example("matmul128.s");
    for (const Case& c : std::vector<Case>{
             {"run " + k + " --cores 0-8", 2,
              "tpusim: error: --cores: bad core list '0-8': core 8 does not exist (the board has "
              "cores 0-7)\n"},
             {"run " + k + " --load 0:0x0", 2,
              "tpusim: error: '0:0x0': expected CORES[:hbm|:vmem]:ADDR=FILE\n"},
             {"run " + k + " --load 0:ram:0=/dev/null", 2,
              "tpusim: error: '0:ram:0=/dev/null': memory 'ram' must be hbm or vmem\n"},
             {"run " + k + " --load 0:0=/nonexistent", 2,
              "tpusim: error: --load: cannot open '/nonexistent': No such file or directory\n"},
             {"run " + k + " --dump 0:0x10000:0=/tmp/x", 2,
              "tpusim: error: --dump /tmp/x: 0 bytes at 0x10000 are not inside core0.hbm "
              "(17179869184 bytes)\n"},
             {"run /nonexistent.s", 2,
              "tpusim: error: kernel: cannot open '/nonexistent.s': No such file or directory\n"},
             {"run " + k + " --set core.mxus=0", 2,
              "tpusim: error: core.mxus must be >= 1 (got 0)\n"},
             {"run " + k + " --trace-window 5:1", 2,
              "tpusim: error: --trace-units and --trace-window need --trace FILE\n"},
         }) {
        const Result r = tpusim(c.args);
        EXPECT_EQ(r.code, c.code) << c.args;
        EXPECT_EQ(r.err, c.err) << c.args;
    }
}

TEST(CliRun, AKernelThatNeverHaltsCannotHangTheSimulator) {
    std::ofstream(tmp("inf.s")) << "loop: jmp loop\n";
    // Without launch costs the core starts at cycle 0, so the limit trips at cycle 1001.
    const Result r =
        tpusim("run " + tmp("inf.s") + " --set sim.max_cycles=1000 --set sim.launch_costs=false");
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "tpusim: " + tmp("inf.s") +
                         ": device fault on core 0 at pc 0 (jmp 0) in sequencer, cycle 1001: the "
                         "launch ran past sim.max_cycles = 1000 cycles without halting\n");
}

TEST(CliRun, BadExampleKernelsShowTheirReports) {
    const Result race = tpusim("run " + example("bad/race.s") + " --set sim.race_detector=true");
    EXPECT_EQ(race.code, 1);
    EXPECT_NE(race.err.find("data race on core 0 VMEM [0x0, 0x8000)"), std::string::npos)
        << race.err;
    // Without the detector the same kernel runs (and reads whatever the DMA has written).
    EXPECT_EQ(tpusim("run " + example("bad/race.s")).code, 0);
    const Result dead =
        tpusim("run " + example("bad/deadlock.s") + " --cores 0,1 --set sim.launch_costs=false");
    EXPECT_EQ(dead.code, 1);
    EXPECT_EQ(dead.err, "tpusim: " + example("bad/deadlock.s") +
                            ": deadlock at cycle 2: every running core waits on a flag that "
                            "nothing can raise\n  core 0: running at cycle 2, pc 2 (wait f1, 1); "
                            "all flags 0\n  core 1: running at cycle 2, pc 2 (wait f1, 1); all "
                            "flags 0\n");
}

TEST(CliRun, IciRaceAndIciOutsideTheLaunchNameTheRightCore) {
    // Core 0 writes core 1's VMEM over ICI while core 1 reads the same bytes without waiting on
    // the arrival flag: a race on core 1's VMEM, and core 1 is the one that must wait.
    std::ofstream(tmp("icirace.s")) << "coreid s1\nbne s1, 0, rx\n"
                                       "ici.v 1, [0x1000], [0], 256, f3\nhalt\n"
                                       "rx: li s2, 0\nspin: add s2, s2, 1\nblt s2, 100, spin\n"
                                       "v.adds [0x2000], [0x1000], 1.0, 64\nwait f3, 1\nhalt\n";
    const Result race =
        tpusim("run " + tmp("icirace.s") + " --cores 0,1 --set sim.race_detector=true");
    EXPECT_EQ(race.code, 1);
    EXPECT_EQ(race.out, "");
    EXPECT_NE(race.err.find("data race on core 1 VMEM [0x1000, 0x1100)"), std::string::npos)
        << race.err;
    EXPECT_NE(race.err.find("core 1 must wait on f3 (raised on arrival of core 0 pc 2's "
                            "transfer) before its pc 7\n"),
              std::string::npos)
        << race.err;
    // Core 1 exists but is not launched: the transfer is a device fault naming it.
    const Result out = tpusim("run " + tmp("icirace.s") + " --cores 0");
    EXPECT_EQ(out.code, 1);
    EXPECT_NE(out.err.find("in ici, cycle"), std::string::npos) << out.err;
    EXPECT_NE(out.err.find(": core 1 is not in this launch (cores 0)"), std::string::npos)
        << out.err;
}

TEST(CliRun, TwoCoresFaultingAtOnceKeepStdoutClean) {
    // Both cores fault in the same delta cycle. When a fault called sc_stop(), SystemC's warning
    // about the second call (W545) went to stdout, into the --json output.
    std::ofstream(tmp("fault2.s")) << "li s1, 0x100000\nv.exp [s1], [0], 8\nhalt\n";
    const Result f = tpusim("run " + tmp("fault2.s") + " --cores 0,1 --json --config " +
                            tpu::test::source_dir() + "/configs/tiny.json");
    EXPECT_EQ(f.code, 1);
    EXPECT_EQ(f.out, "");
    EXPECT_EQ(f.err.find("W545"), std::string::npos) << f.err;
    EXPECT_EQ(f.err.rfind("tpusim: " + tmp("fault2.s") + ": device fault on core 0 at pc 1", 0), 0u)
        << f.err;
}

TEST(CliRun, DeviceFaultAndDeadlockExitOne) {
    std::ofstream(tmp("fault.s")) << "li s1, 0x100000\nv.exp [s1], [0], 8\nhalt\n";
    const Result f = tpusim("run " + tmp("fault.s") + " --config " + tpu::test::source_dir() +
                            "/configs/tiny.json");
    EXPECT_EQ(f.code, 1);
    EXPECT_EQ(f.err, "tpusim: " + tmp("fault.s") +
                         ": device fault on core 0 at pc 1 (v.exp [s1], [0], 8) in vpu, cycle 1: "
                         "VMEM write of 32 bytes at 0x100000 is outside core0.vmem (1048576 "
                         "bytes)\n");
    std::ofstream(tmp("dead.s")) << "wait f1, 1\nhalt\n";
    const Result d = tpusim("run " + tmp("dead.s") + " --cores 0,1 --config " +
                            tpu::test::source_dir() + "/configs/tiny.json");
    EXPECT_EQ(d.code, 1);
    EXPECT_NE(d.err.find("deadlock at cycle 0: every running core waits on a flag that nothing "
                         "can raise\n  core 0: running at cycle 0, pc 0 (wait f1, 1)"),
              std::string::npos)
        << d.err;
}

TEST(CliRun, BadRequestsAreFaultsNamingTheProblem) {
    // DMA is byte-granular (a misaligned row only costs extra HBM bursts); the VPU, the MXU and
    // scalar memory need their element alignment. Every bad request names unit and address.
    struct Case {
        std::string kernel, err;
    };
    const std::vector<Case> cases = {
        {"dma.hv [0], [0], 0, 64, 64, 64, f1\nhalt\n",
         "pc 0 (dma.hv [0], [0], 0, 64, 64, 64, f1) in dma, cycle 0: zero-length transfer (0 "
         "rows of 64 bytes)"},
        {"li s1, 0x4000000\ndma.vh [s1], [0], 1, 64, 64, 64, f1\nhalt\n",
         "pc 1 (dma.vh [s1], [0], 1, 64, 64, 64, f1) in dma, cycle 1: HBM write of 64 bytes at "
         "0x4000000 is outside core0.hbm (67108864 bytes)"},
        {"v.add [0], [2], [64], 8\nhalt\n",
         "pc 0 (v.add [0], [2], [64], 8) in vpu, cycle 0: VMEM read at 0x2 is not 4-byte "
         "aligned"},
        {"mxu.lw 0, [1], 8, 8, f1\nhalt\n",
         "pc 0 (mxu.lw 0, [1], 8, 8, f1) in mxu0, cycle 0: weight read at 0x1 is not 2-byte "
         "aligned"},
        {"li s1, 6\nlw s2, [s1]\nhalt\n",
         "pc 1 (lw s2, [s1]) in sequencer, cycle 1: scalar memory read at 0x6 is not 4-byte "
         "aligned"},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string file = tmp("bad" + std::to_string(i) + ".s");
        std::ofstream(file) << cases[i].kernel;
        const Result r =
            tpusim("run " + file + " --config " + tpu::test::source_dir() + "/configs/tiny.json");
        EXPECT_EQ(r.code, 1) << cases[i].kernel;
        EXPECT_EQ(r.err, "tpusim: " + file + ": device fault on core 0 at " + cases[i].err + "\n")
            << cases[i].kernel;
    }
}

TEST(CliStats, RunNamesItsKernelAfterTheFile) {
    const Result r = tpusim("run " + example("vpu_chain.s") + " --stats " + tmp("k.stats.json"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto s = nlohmann::json::parse(slurp(tmp("k.stats.json")))["board"]["children"];
    const auto& k = s["kernels"]["children"]["vpu_chain"]["counters"];
    const auto& c = s["core0"]["children"]["dma"]["counters"];
    EXPECT_EQ(k["launches"]["value"], 1);
    EXPECT_EQ(k["launches"]["unit"], "count");
    EXPECT_EQ(k["instructions"]["value"], s["core0"]["counters"]["instructions"]["value"]);
    // 4 VPU ops over 8192 values, no MXU work.
    EXPECT_EQ(k["vpu_flops"]["value"], 4 * 8192);
    EXPECT_EQ(k["flops"]["value"], 4 * 8192);
    EXPECT_EQ(k["flops"]["unit"], "flops");
    EXPECT_EQ(k["hbm_read_bytes"]["value"], c["hbm_read_bytes"]["value"]);
    EXPECT_EQ(k["hbm_write_bytes"]["value"], c["hbm_write_bytes"]["value"]);
    // 32768 FLOPs over 32 KiB in + 32 KiB out.
    EXPECT_EQ(k["arithmetic_intensity"]["value"], 0.5);
    EXPECT_EQ(k["arithmetic_intensity"]["unit"], "flops_per_byte");
    EXPECT_EQ(k["mxu_utilization"]["value"], 0.0);
    // One core: the launch lasts from the doorbell to its halt, plus the completion (650 ns =
    // 611 cycles at 940 MHz).
    EXPECT_EQ(k["cycles"]["value"], k["core_cycles"]["value"].get<uint64_t>() + 611);
}

TEST(CliStats, GemmKernelCountsTheMxuWorkOfThePaddedShape) {
    const Result r = tpusim(
        "gemm --m 200 --k 129 --n 130 --cores 0-2 --precision fp32-3pass "
        "--json --stats " +
        tmp("gk.stats.json"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const auto s = nlohmann::json::parse(slurp(tmp("gk.stats.json")))["board"]["children"];
    const auto& k = s["kernels"]["children"]["gemm"]["counters"];
    EXPECT_EQ(k["launches"]["value"], 1);
    EXPECT_EQ(k["cycles"]["value"], j["cycles"]);
    // K and N are zero-padded to 256 in HBM and the MXUs multiply the padding too:
    // 2 x M x Kp x Np x passes = 2 x 200 x 256 x 256 x 3.
    EXPECT_EQ(k["mxu_flops"]["value"], 2ull * 200 * 256 * 256 * 3);
    uint64_t mxu = 0, vpu = 0, rd = 0, wr = 0, ici = 0;
    for (const char* core : {"core0", "core1", "core2"}) {
        const auto& u = s[core]["children"];
        auto v = [&](const char* unit, const char* key) {
            return u[unit]["counters"][key]["value"].get<uint64_t>();
        };
        mxu += v("mxu0", "flops") + v("mxu1", "flops");
        vpu += v("vpu", "flops");
        rd += v("dma", "hbm_read_bytes");
        wr += v("dma", "hbm_write_bytes");
        ici += v("ici", "bytes");
    }
    EXPECT_EQ(k["mxu_flops"]["value"], mxu);
    EXPECT_EQ(k["flops"]["value"], mxu + vpu);
    EXPECT_EQ(k["hbm_read_bytes"]["value"], rd);
    EXPECT_EQ(k["hbm_write_bytes"]["value"], wr);
    EXPECT_EQ(k["ici_bytes"]["value"], ici);
    EXPECT_DOUBLE_EQ(k["arithmetic_intensity"]["value"].get<double>(),
                     double(mxu + vpu) / double(rd + wr));
    // Launch cycles x 3 cores x 2 MXUs x 128 x 128 PEs.
    EXPECT_DOUBLE_EQ(k["mxu_utilization"]["value"].get<double>(),
                     double(mxu / 2) / (j["cycles"].get<double>() * 3 * 2 * 128 * 128));
    // The same rows in a CSV stats file.
    ASSERT_EQ(tpusim("gemm --m 200 --k 129 --n 130 --cores 0-2 --precision fp32-3pass --stats " +
                     tmp("gk.csv"))
                  .code,
              0);
    EXPECT_NE(slurp(tmp("gk.csv"))
                  .find(fmt_row("board.kernels.gemm,mxu_flops,", mxu,
                                ",flops,2 x MXU multiply-accumulates\n")),
              std::string::npos);
}

TEST(CliStats, ReportShowsEachKernelAndPlacesItOnTheRoofline) {
    ASSERT_EQ(tpusim("gemm --m 256 --k 256 --n 256 --num-cores 2 --trace " + tmp("rk.json") +
                     " --stats " + tmp("rk.stats.json"))
                  .code,
              0);
    const Result r = tpusim("report " + tmp("rk.json") + " --stats " + tmp("rk.stats.json") +
                            " -o " + tmp("rk.html"));
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string html = slurp(tmp("rk.html"));
    EXPECT_NE(html.find("<h2>Kernels</h2>"), std::string::npos);
    EXPECT_NE(html.find("<table class=\"kernels\">"), std::string::npos);
    EXPECT_NE(html.find("class=\"kpoint\" data-kernel=\"gemm\""), std::string::npos);
    EXPECT_NE(html.find("kernel gemm</td>"), std::string::npos);
}

TEST(CliStats, ReportOfATraceWindowNeverMixesScopesOrExceedsAPeak) {
    // The README tour's case: the trace covers a window, the stats the whole run. Dividing the
    // run's FLOPs by the window's cycles printed 401% MXU utilisation. The window is the middle
    // half of the kernel (after the host's input writes), taken from a full trace.
    const std::string gemm = "gemm --m 512 --k 512 --n 512 --num-cores 2 --trace ";
    ASSERT_EQ(tpusim(gemm + tmp("rf.json")).code, 0);
    uint64_t lo = UINT64_MAX, hi = 0;
    const auto full = nlohmann::json::parse(slurp(tmp("rf.json")));
    for (const auto& e : full["traceEvents"])
        if (e["ph"] == "X" && e["name"] == "mxu.mm") {
            lo = std::min<uint64_t>(lo, e["args"]["begin_cycle"]);
            hi = std::max<uint64_t>(hi, e["args"]["end_cycle"]);
        }
    ASSERT_LT(lo, hi);
    const uint64_t b = lo + (hi - lo) / 4, e = lo + 3 * (hi - lo) / 4;
    ASSERT_EQ(tpusim(gemm + tmp("rw.json") + " --trace-window " + std::to_string(b) + ":" +
                     std::to_string(e) + " --stats " + tmp("rw.stats.json"))
                  .code,
              0);
    const auto window = nlohmann::json::parse(slurp(tmp("rw.json")))["otherData"]["window"];
    EXPECT_EQ(window["begin_cycle"], b);
    EXPECT_EQ(window["end_cycle"], e);
    const Result r = tpusim("report " + tmp("rw.json") + " --stats " + tmp("rw.stats.json") +
                            " -o " + tmp("rw.html"));
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string html = slurp(tmp("rw.html"));
    EXPECT_NE(html.find("<tr><th>trace window</th>"), std::string::npos);
    EXPECT_NE(html.find("(the stats count the whole run"), std::string::npos);
    size_t checked = 0;
    for (size_t at = html.find("%<"); at != std::string::npos; at = html.find("%<", at + 1)) {
        size_t b = at;
        while (b > 0 &&
               (std::isdigit(static_cast<unsigned char>(html[b - 1])) || html[b - 1] == '.'))
            --b;
        if (b == at) continue;
        EXPECT_LE(std::stod(html.substr(b, at - b)), 100.0) << html.substr(b, 80);
        ++checked;
    }
    EXPECT_GT(checked, 3u);
}

}  // namespace
