// SPDX-License-Identifier: Apache-2.0
// tpusim op KIND: conv2d checked bit-exactly, timing-only cycles, the gemm alias, bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"
#include "tests/common/paths.h"

namespace {

using tpu::test::shell_quote;
using tpu::test::tmp;
using tpu::test::tpusim;
using tpu::test::tpusim_json;

const std::string kOddConv =
    "op conv2d --batch 3 --height 9 --width 7 --cin 130 --cout 20 --kernel 3 --stride 2 --pad 1";

TEST(CliOp, Conv2dCheckIsBitExactOnOneAndEightCores) {
    for (const char* cores : {"0", "0-7"}) {
        const auto j = tpusim_json(kOddConv + " --check --cores " + cores);
        EXPECT_EQ(j["op"], "conv2d");
        EXPECT_EQ(j["kernel"], 3);
        EXPECT_EQ(j["cores"], std::string(cores) == "0" ? 1 : 8);
        EXPECT_TRUE(j["bitexact"].get<bool>()) << cores;
        // bf16 operands: errors of a few parts in a thousand of the largest output, never 0.
        EXPECT_GT(j["max_rel_error"].get<double>(), 0.0);
        EXPECT_LT(j["max_rel_error"].get<double>(), 1e-2);
        // 3 x 5 x 4 outputs x 9 taps x 130 x 20.
        EXPECT_EQ(j["macs"], 3 * 5 * 4 * 9 * 130 * 20);
    }
    const auto text = tpusim(kOddConv + " --check");
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_NE(text.out.find("check: bit-exact vs reference: yes"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("MXU utilisation"), std::string::npos) << text.out;
}

TEST(CliOp, TimingOnlyModeGivesTheSameCycles) {
    for (const std::string& shape :
         {kOddConv + " --cores 0-7", std::string("op conv2d --batch 8 --height 14 --width 14 "
                                                 "--cin 64 --cout 64 --kernel 1 --cores 0")}) {
        const auto on = tpusim_json(shape);
        const auto off = tpusim_json(shape + " --set sim.functional=false");
        EXPECT_EQ(on["cycles"], off["cycles"]) << shape;
        EXPECT_EQ(on["hbm_bytes"], off["hbm_bytes"]) << shape;
    }
}

// Odd shapes: rows that do not split evenly over 8 cores, columns and sequence lengths that
// are not multiples of 128, heads whose width is not a power of two, the causal mask.
const std::vector<std::string> kRowOps = {
    "op layernorm --rows 37 --cols 300",
    "op softmax --rows 21 --cols 1000",
    "op attention --batch 3 --heads 3 --seq 70 --dhead 40 --causal",
    "op attention --batch 1 --heads 2 --seq 130 --dhead 64",
};

// Attention is PyTorchSim's graph compiled (k q^T / sqrt(d), softmax over the keys, v^T p):
// the scores, the max, the exponentials' sum, and v^T p with the normalize computed as it loads
// the scores (compiler/README.md, "The attention's softmax in the values dot"); bit-exact with
// the evaluator on one and two cores. The library's fused kernel stays one flag away, and runs
// what the compiled graph does not cover (a causal mask), saying why.
TEST(CliOp, AttentionRunsPyTorchSimsGraphCompiledOrTheLibraryKernel) {
    const std::string shape = "op attention --batch 2 --heads 3 --seq 128 --dhead 64";
    for (const char* cores : {"0", "0-1"}) {
        const auto j = tpusim_json(shape + " --check --cores " + cores);
        EXPECT_TRUE(j["bitexact"].get<bool>()) << cores;
        EXPECT_NE(j["plan"].get<std::string>().find(
                      "one program of 3 fusions (output input output), 1 launch"),
                  std::string::npos)
            << j["plan"];
    }
    const auto lib = tpusim_json(shape + " --engine library --check");
    EXPECT_TRUE(lib["bitexact"].get<bool>());
    EXPECT_EQ(lib["plan"].get<std::string>().find("compiled"), std::string::npos) << lib["plan"];
    const auto causal = tpusim_json(shape + " --causal");
    EXPECT_NE(causal["plan"].get<std::string>().find(
                  "(the library's fused kernel: a causal mask is not part of the compiled "
                  "attention graph)"),
              std::string::npos)
        << causal["plan"];
    EXPECT_NE(tpusim(shape + " --causal --engine compiled").code, 0);
}

// Rows that fill T(8,128) tiles: the op is the one-op program PyTorch/XLA compiles (compiler/
// README.md, "Code generation"), bit-exact with the compiler's host evaluator, one launch.
// Layer norm is batch norm's Sum[X] and Sum[X^2] in one pass, two tiny vector fusions and the
// normalize; softmax the max, the exp and its sum, and the divide.
TEST(CliOp, LayerNormAndSoftmaxOfWholeTilesRunAsOneCompiledProgram) {
    const std::vector<std::pair<std::string, std::string>> ops = {
        {"op layernorm --rows 32 --cols 256",
         "one program of 4 fusions (input loop loop loop), 1 launch"},
        {"op softmax --rows 16 --cols 384",
         "one program of 3 fusions (input input loop), 1 launch"},
    };
    for (const auto& [shape, plan] : ops)
        for (const char* cores : {"0", "0-1"}) {
            const auto j = tpusim_json(shape + " --check --cores " + cores);
            EXPECT_TRUE(j["bitexact"].get<bool>()) << shape << " on " << cores;
            EXPECT_LT(j["max_rel_error"].get<double>(), 1e-5) << shape;
            EXPECT_NE(j["plan"].get<std::string>().find(plan), std::string::npos) << j["plan"];
            const auto off =
                tpusim_json(shape + " --cores " + cores + " --set sim.functional=false");
            EXPECT_EQ(j["cycles"], off["cycles"]) << shape;
        }
    // Padded tiles compile too (21 rows of 1000 values: a padded band, a padded lane chunk).
    const auto padded = tpusim_json(kRowOps[1] + " --check");
    EXPECT_TRUE(padded["bitexact"].get<bool>());
    EXPECT_NE(padded["plan"].get<std::string>().find(
                  "one program of 3 fusions (input input loop), 1 launch"),
              std::string::npos)
        << padded["plan"];
    // A band of 8 rows of 70 000 values does not fit VMEM twice: the hand-written kernel runs,
    // and says why.
    const auto j = tpusim_json("op softmax --rows 8 --cols 70000");
    EXPECT_NE(j["plan"].get<std::string>().find(
                  "hand-written kernel: fusion.0: a band of 8 x 70016 values in VMEM"),
              std::string::npos)
        << j["plan"];
}

TEST(CliOp, RowOpsAndAttentionAreBitExactOnOneAndEightCores) {
    for (const std::string& shape : kRowOps)
        for (const char* cores : {"0", "0-7"}) {
            const auto j = tpusim_json(shape + " --check --cores " + cores);
            EXPECT_TRUE(j["bitexact"].get<bool>()) << shape << " on " << cores;
            EXPECT_LT(j["max_rel_error"].get<double>(), 1e-2) << shape;
            EXPECT_GT(j["cycles"].get<uint64_t>(), 0u);
            EXPECT_GT(j["hbm_bytes"].get<uint64_t>(), 0u);
        }
    // 3 sequences over 8 cores: one per core (padded shares), 3 heads x 2 x 70 x 70 x 40 MACs
    // each.
    const auto j = tpusim_json(kRowOps[2] + " --cores 0-7");
    EXPECT_EQ(j["macs"], 8 * 3 * 2 * 70 * 70 * 40);
    EXPECT_GT(j["mxu_utilization"].get<double>(), 0.0);
    EXPECT_EQ(j["causal"], true);
}

TEST(CliOp, RowOpsAndAttentionTakeTheSameCyclesWithoutArithmetic) {
    for (const std::string& shape : kRowOps) {
        const auto on = tpusim_json(shape + " --cores 0-1");
        const auto off = tpusim_json(shape + " --cores 0-1 --set sim.functional=false");
        EXPECT_EQ(on["cycles"], off["cycles"]) << shape;
        EXPECT_EQ(on["hbm_bytes"], off["hbm_bytes"]) << shape;
    }
}

TEST(CliOp, AllReduceIsBitExactOnEveryReplicaAndNamesItsFormula) {
    // 100 000 values (not a multiple of the pieces) over 3 cores and over all 8.
    for (const char* cores : {"2,5,6", "all"}) {
        const auto j =
            tpusim_json(std::string("op allreduce --elements 100000 --check --cores ") + cores);
        EXPECT_TRUE(j["bitexact"].get<bool>()) << cores;
        EXPECT_LT(j["max_rel_error"].get<double>(), 1e-5) << cores;
        EXPECT_EQ(j["result_fnv1a"].get<std::string>().size(), 16u);
        EXPECT_NE(j["plan"].get<std::string>().find("simulated / formula"), std::string::npos);
        EXPECT_GT(j["hbm_bytes"].get<uint64_t>(), 0u);
        // The digest is of the result alone: the same inputs give it without --check.
        const auto again =
            tpusim_json(std::string("op allreduce --elements 100000 --cores ") + cores);
        EXPECT_EQ(again["result_fnv1a"], j["result_fnv1a"]);
        EXPECT_EQ(again["cycles"], j["cycles"]);
    }
}

TEST(CliOp, GemmIsTheGemmCommand) {
    const std::string shape = "--m 100 --k 300 --n 200 --cores 0-1 --set sim.functional=false";
    const auto op = tpusim_json("op gemm " + shape);
    const auto gemm = tpusim_json("gemm " + shape);
    EXPECT_EQ(op["cycles"], gemm["cycles"]);
    EXPECT_EQ(op["split"], gemm["split"]);
}

TEST(CliOp, StatsNameTheKernel) {
    const std::string stats = tmp("op-stats.json");
    const auto r = tpusim(kOddConv + " --stats " + shell_quote(stats));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(tpu::test::slurp(stats));
    EXPECT_TRUE(j.dump().find("\"conv2d\"") != std::string::npos);
    std::filesystem::remove(stats);
}

TEST(CliOp, BadInputIsAnErrorNamingTheFlag) {
    struct Case {
        std::string args, message;
    };
    const std::vector<Case> cases = {
        {"op conv3d",
         "op: unknown KIND 'conv3d' (kinds: conv2d, layernorm, softmax, attention, allreduce, "
         "gemm)"},
        {"op", "op: name a KIND (conv2d, layernorm, softmax, attention, allreduce, gemm)"},
        {"op softmax --rows 0", "--rows: expected a whole number >= 1, got '0'"},
        {"op layernorm --cols -3", "--cols"},
        {"op attention --seq 0", "--seq: expected a whole number >= 1, got '0'"},
        {"op attention --dhead x", "--dhead"},
        {"op conv2d --batch 0", "--batch: expected a whole number >= 1, got '0'"},
        {"op conv2d --cout 0", "--cout: expected a whole number >= 1, got '0'"},
        {"op conv2d --height 4 --width 4 --kernel 7 --pad 1",
         "--kernel 7 is larger than the padded input: --height 4 and --width 4 plus 2 x --pad 1 "
         "give 6x6"},
        {"op conv2d --cores 9", "--cores"},
        {"op conv2d --check --set sim.functional=false", "--check needs computed results"},
    };
    for (const Case& c : cases) {
        const auto r = tpusim(c.args);
        EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    }
}

}  // namespace
