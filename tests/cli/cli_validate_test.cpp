// SPDX-License-Identifier: Apache-2.0
// tpusim validate: the shipped real-TPU CSV against the board, and every bad-input path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"
#include "tests/common/paths.h"

namespace {

using tpu::test::shell_quote;
using tpu::test::tmp;
using tpu::test::tpusim;

constexpr const char* kHeader = "workload,params,real_cycles,clock_mhz,cores,source\n";

std::string csv(const std::string& name, const std::string& body) {
    const std::string path = tmp(name);
    std::ofstream(path) << body;
    return path;
}

TEST(CliValidate, ShippedCsvEveryRowWithTheGemmCommandsCycles) {
    const auto r = tpusim("validate --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    // The whole public TPU v3 column of PyTorchSim (validation/README.md): 22 rows.
    ASSERT_EQ(j["rows"].size(), 22u);
    double abs_sum = 0;
    size_t simulated = 0;
    for (const auto& row : j["rows"]) {
        ASSERT_TRUE(row.contains("workload") && row.contains("params") &&
                    row.contains("sim_cycles") && row.contains("real_cycles") &&
                    row.contains("error"));
        if (row["workload"] == "conv2d") {
            // The same cycles as `tpusim op conv2d` on core 0 (a fresh board each).
            const std::string p = row["params"];
            int b = 0, h = 0, w = 0, ci = 0, co = 0, k = 0, st = 0, pad = 0;
            ASSERT_EQ(std::sscanf(p.c_str(), "B=%d H=%d W=%d Cin=%d Cout=%d k=%d stride=%d pad=%d",
                                  &b, &h, &w, &ci, &co, &k, &st, &pad),
                      8)
                << p;
            const auto c = tpusim(fmt::format(
                "op conv2d --batch {} --height {} --width {} --cin {} --cout {} --kernel {} "
                "--stride {} --pad {} --cores 0 --json --set sim.functional=false",
                b, h, w, ci, co, k, st, pad));
            ASSERT_EQ(c.code, 0) << c.err;
            EXPECT_EQ(row["sim_cycles"], nlohmann::json::parse(c.out)["cycles"]) << p;
            abs_sum += std::abs(row["error"].get<double>());
            ++simulated;
            continue;
        }
        if (row["workload"] != "gemm") {
            // The other kinds against their commands: CliValidate.OpAndModelRowsMeasureWhat...
            abs_sum += std::abs(row["error"].get<double>());
            ++simulated;
            continue;
        }
        // Each row runs on a fresh board: the same cycles as `tpusim gemm` on core 0.
        const std::string p = row["params"];
        int m = 0, k = 0, n = 0;
        ASSERT_EQ(std::sscanf(p.c_str(), "M=%d K=%d N=%d", &m, &k, &n), 3) << p;
        const auto g =
            tpusim("gemm --m " + std::to_string(m) + " --k " + std::to_string(k) + " --n " +
                   std::to_string(n) + " --cores 0-0 --json --set sim.functional=false");
        ASSERT_EQ(g.code, 0) << g.err;
        EXPECT_EQ(row["sim_cycles"], nlohmann::json::parse(g.out)["cycles"]) << p;
        const double err = row["sim_cycles"].get<double>() / row["real_cycles"].get<double>() - 1;
        EXPECT_DOUBLE_EQ(row["error"].get<double>(), err) << p;
        abs_sum += std::abs(err);
        ++simulated;
    }
    EXPECT_EQ(simulated, 22u);
    EXPECT_DOUBLE_EQ(j["mae"].get<double>(), abs_sum / double(simulated));

    const auto text = tpusim("validate");
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_NE(text.out.find("M=2048 K=2048 N=2048"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("B=64 H=28 W=28 Cin=128 Cout=128 k=3 stride=1 pad=1 NHWC"),
              std::string::npos)
        << text.out;
    EXPECT_NE(text.out.find("mean absolute error"), std::string::npos) << text.out;
}

TEST(CliValidate, RealCyclesAtAnotherClockCompareDurations) {
    // 3101 cycles at 470 MHz last as long as 6202 cycles of the 940 MHz board.
    const auto path =
        csv("clock.csv", std::string(kHeader) + "gemm,M=256 K=256 N=256,3101,470,1,x\n");
    const auto r = tpusim("validate --json --data " + shell_quote(path));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto row = nlohmann::json::parse(r.out)["rows"][0];
    EXPECT_DOUBLE_EQ(row["error"].get<double>(), row["sim_cycles"].get<double>() / 6202.0 - 1);
}

TEST(CliValidate, ARowMayNameItsBoard) {
    // The seventh column runs a row on a preset of configs/ (or a JSON file): here a v5e-8 and a
    // v6e-8 GEMM beside one on the command's own board, each as `tpusim gemm` on that board.
    const auto path = csv("boards.csv",
                          "workload,params,real_cycles,clock_mhz,cores,source,config\n"
                          "gemm,M=512 K=512 N=512,9000,1500,1,x,v5e-8\n"
                          "gemm,M=512 K=512 N=512,9000,1750,1,x,v6e-8\n"
                          "gemm,M=512 K=512 N=512,9000,940,1,x,\n");
    const auto r = tpusim("validate --json --data " + shell_quote(path));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto rows = nlohmann::json::parse(r.out)["rows"];
    ASSERT_EQ(rows.size(), 3u);
    const char* boards[] = {"v5e-8", "v6e-8", nullptr};
    for (size_t i = 0; i < 3; ++i) {
        const std::string config =
            boards[i] ? " --config " +
                            shell_quote(tpu::test::source_dir() + "/configs/" + boards[i] + ".json")
                      : "";
        const auto g = tpusim(
            "gemm --m 512 --k 512 --n 512 --cores 0-0 --json "
            "--set sim.functional=false" +
            config);
        ASSERT_EQ(g.code, 0) << g.err;
        EXPECT_EQ(rows[i]["sim_cycles"], nlohmann::json::parse(g.out)["cycles"]) << i;
        EXPECT_EQ(rows[i].contains("config"), boards[i] != nullptr);
    }
    const auto bad = tpusim("validate --data " +
                            shell_quote(csv("noboard.csv",
                                            "workload,params,real_cycles,clock_mhz,cores,source,"
                                            "config\ngemm,M=1 K=1 N=1,10,940,1,x,v9-8\n")));
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find(":2: config 'v9-8': no preset v9-8 in "), std::string::npos) << bad.err;
}

TEST(CliValidate, OpAndModelRowsMeasureWhatTheCommandsReport) {
    // Each kind's row against the command that runs the same workload on the same cores.
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"layernorm,rows=300 cols=200", "op layernorm --rows 300 --cols 200 --cores 0-1"},
        {"softmax,rows=50 cols=1000", "op softmax --rows 50 --cols 1000 --cores 0-1"},
        {"attention,heads=3 seq=70 dhead=40 batch=2 causal",
         "op attention --heads 3 --seq 70 --dhead 40 --batch 2 --causal --cores 0-1"},
        // ReLU by default: PyTorchSim's EncoderBlock, what the public rows measured.
        {"bert-block,hidden=64 seq=40 heads=4 ffn=96",
         "model bert-block --hidden 64 --seq 40 --heads 4 --ffn 96 --activation relu --cores "
         "0-1"},
        {"resnet18,batch=2 image=32", "model resnet18 --batch 2 --image 32 --cores 0-1"},
        {"bert-block,hidden=64 seq=40 heads=4 ffn=96 gelu",
         "model bert-block --hidden 64 --seq 40 --heads 4 --ffn 96 --cores 0-1"},
    };
    std::string body = kHeader;
    for (const auto& [row, cmd] : rows) body += row + ",1000,940,2,test\n";
    const auto r = tpusim("validate --json --data " + shell_quote(csv("kinds.csv", body)));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["rows"].size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
        // A model row runs as one compiled step, its third, when the whole step is generated
        // for the device, else eagerly (--engine auto); op rows have no engine.
        std::string engine;
        if (j["rows"][i].contains("engine")) {
            const std::string e = j["rows"][i]["engine"];
            engine = e == "compiled" ? " --engine compiled --steps 3" : "";
            EXPECT_TRUE(e == "compiled" || e.rfind("eager", 0) == 0) << e;
        }
        const auto c = tpusim(rows[i].second + engine + " --set sim.functional=false --json");
        ASSERT_EQ(c.code, 0) << c.err;
        EXPECT_EQ(j["rows"][i]["sim_cycles"], nlohmann::json::parse(c.out)["cycles"])
            << rows[i].first << engine;
    }
    EXPECT_EQ(j["rows"][3]["engine"], "compiled") << "the small BERT block generates whole";
    EXPECT_EQ(j["rows"][4]["engine"], "compiled") << "the small ResNet-18 generates whole";
    EXPECT_NE(j["rows"][3]["sim_cycles"], j["rows"][5]["sim_cycles"])
        << "ReLU and GELU are different programs";
    const auto both = tpusim("validate --data " +
                             shell_quote(csv("twoacts.csv", std::string(kHeader) +
                                                                "bert-block,hidden=64 seq=40 "
                                                                "heads=4 relu gelu,10,940,1,x\n")));
    EXPECT_EQ(both.code, 2);
    EXPECT_NE(both.err.find("line 2: bert-block: tags gelu and relu name two activations"),
              std::string::npos)
        << both.err;
    // A key the kind does not take is named, with what it does take.
    const auto bad = tpusim(
        "validate --data " +
        shell_quote(csv("badkey.csv", std::string(kHeader) + "attention,heads=2 seq=8 dhead=4 "
                                                             "depth=3,10,940,1,x\n")));
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find("key 'depth' is not a attention parameter (takes heads= seq= dhead=, "
                           "optionally batch= and causal)"),
              std::string::npos)
        << bad.err;
}

TEST(CliValidate, BadFilesAreErrorsNamingTheLine) {
    struct Case {
        std::string name, body, message;
    };
    const std::string h = kHeader;
    const std::vector<Case> cases = {
        {"header.csv", "workload,params\n", ":1: the header must be 'workload,params,"},
        {"kind.csv", h + "gemmm,M=1 K=1 N=1,10,940,1,x\n",
         ":2: unknown workload 'gemmm' (known: attention, bert-block, conv2d, gemm, layernorm, "
         "resnet18, resnet50, softmax)"},
        {"missing.csv", h + "gemm,M=1 K=1,10,940,1,x\n", ":2: gemm needs parameter N="},
        {"twice.csv", h + "gemm,M=1 M=2 K=1 N=1,10,940,1,x\n", ":2: parameter M appears twice"},
        {"key.csv", h + "gemm,M=1 K=1 N=1 Q=3,10,940,1,x\n", ":2: key 'Q' is not a gemm parameter"},
        {"value.csv", h + "gemm,M=0 K=1 N=1,10,940,1,x\n",
         "line 2: parameter M=0 is not a positive integer"},
        {"pad.csv", h + "conv2d,B=1 H=4 W=4 Cin=1 Cout=1 k=3 stride=1 pad=x NHWC,10,940,1,x\n",
         "line 2: parameter pad=x is not a non-negative integer"},
        {"conv.csv", h + "conv2d,B=1 H=2 W=2 Cin=1 Cout=1 k=5 stride=1 pad=1 NHWC,10,940,1,x\n",
         "line 2: conv2d: kernel 5 is larger than the padded input 4x4"},
        {"real.csv", h + "gemm,M=1 K=1 N=1,ten,940,1,x\n",
         ":2: real_cycles 'ten' is not a positive integer"},
        {"clock.csv", h + "gemm,M=1 K=1 N=1,10,-5,1,x\n",
         ":2: clock_mhz '-5' is not a positive number"},
        {"cores.csv", h + "gemm,M=1 K=1 N=1,10,940,9,x\n",
         ":2: the row uses 9 cores; the board has 8"},
        {"fields.csv", h + "gemm,M=1 K=1 N=1,10,940\n", ":2: 4 fields, expected 6"},
        {"source.csv", h + "gemm,M=1 K=1 N=1,10,940,1,\n",
         ":2: the source of the measurement is missing"},
        {"quote.csv", h + "gemm,M=1 K=1 N=1,10,940,1,\"open\n",
         "line 2: a quoted field is not closed"},
        {"empty.csv", "", ": the file is empty"},
        {"norows.csv", h, ": no rows after the header"},
    };
    for (const Case& c : cases) {
        const auto path = csv(c.name, c.body);
        const auto r = tpusim("validate --data " + shell_quote(path));
        EXPECT_EQ(r.code, 2) << c.name << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
        EXPECT_EQ(r.out, "") << c.name;
    }
    const auto dir = tpusim("validate --data " + shell_quote(::testing::TempDir()));
    EXPECT_EQ(dir.code, 2);
    EXPECT_NE(dir.err.find("is a directory"), std::string::npos) << dir.err;
    const auto none = tpusim("validate --data " + shell_quote(tmp("absent.csv")));
    EXPECT_EQ(none.code, 2);
    EXPECT_NE(none.err.find("cannot open the file"), std::string::npos) << none.err;
}

}  // namespace
