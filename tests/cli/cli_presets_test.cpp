// SPDX-License-Identifier: Apache-2.0
// The presets of other TPU generations (configs/presets.md) through the commands: values
// bit-exact against the host references on each board, and timing-only runs with the same
// cycles.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"
#include "tests/common/paths.h"

namespace {

using tpu::test::shell_quote;
using tpu::test::tpusim_json;

std::string preset(const std::string& name) {
    return " --config " + shell_quote(tpu::test::source_dir() + "/configs/" + name + ".json");
}

TEST(CliPresets, GemmAndOpsAreBitExactOnEveryGeneration) {
    // Ragged shapes over two cores: a partial 256 x 256 tile on v6e, one MXU on v2.
    for (const char* board : {"v2-8", "v4-8", "v5e-8", "v6e-8"}) {
        SCOPED_TRACE(board);
        const auto g =
            tpusim_json("gemm --m 300 --k 500 --n 700 --cores 0-1 --check" + preset(board));
        EXPECT_TRUE(g["bitexact"].get<bool>());
        const auto c = tpusim_json(
            "op conv2d --batch 2 --height 9 --width 7 --cin 130 --cout 20 --kernel 3 --stride 2 "
            "--pad 1 --cores 0-1 --check" +
            preset(board));
        EXPECT_TRUE(c["bitexact"].get<bool>());
        // The all-reduce over the board's network, bit-exact against the reference of the
        // schedule the planner takes (for 80 KB per core the torus's bound is the lower one on
        // the tori: 3-D on v4-8, 2-D on v2, v5e and v6e).
        const auto a = tpusim_json("op allreduce --elements 20000 --check" + preset(board));
        EXPECT_TRUE(a["bitexact"].get<bool>());
    }
}

TEST(CliPresets, EveryPresetRunsTheGemmAndATimingOnlyResNet50) {
    for (const char* board : {"v2-8", "v3-8", "v4-8", "v5e-8", "v6e-8", "v3-2048"}) {
        SCOPED_TRACE(board);
        EXPECT_TRUE(
            tpusim_json("op gemm --m 256 --k 384 --n 512 --check" + preset(board))["bitexact"]
                .get<bool>());
        const auto r = tpusim_json("model resnet50 --set sim.functional=false" + preset(board));
        EXPECT_GT(r["cycles"].get<uint64_t>(), 0u);
    }
}

TEST(CliPresets, TimingOnlyCyclesEqualFunctionalOnes) {
    // A v6e board holds no values without the arithmetic, and its cycles do not change.
    const std::string gemm = "gemm --m 512 --k 768 --n 1024 --cores 0-3" + preset("v6e-8");
    EXPECT_EQ(tpusim_json(gemm)["cycles"],
              tpusim_json(gemm + " --set sim.functional=false")["cycles"]);
    const std::string model = "model mlp --batch 64 --cores all --train-step" + preset("v4-8");
    EXPECT_EQ(tpusim_json(model)["cycles"],
              tpusim_json(model + " --set sim.functional=false")["cycles"]);
}

}  // namespace
