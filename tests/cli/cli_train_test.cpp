// SPDX-License-Identifier: Apache-2.0
// tpusim train end to end: Lightning's errors, --json, determinism, Fashion-MNIST accuracy.
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace tpu::test {
namespace {

/// A small run without data and model choices.
const std::string kBase =
    "train --synthetic-count 256 --batch-size 8 --limit-train-batches 4 --limit-test-batches 2 "
    "--no-progress";
/// A small synthetic run: 8 cores, 4 steps of 8 rows per device.
const std::string kSmall = kBase + " --data synthetic --hidden 32";

TEST(CliTrain, LightningDeviceAndPrecisionErrors) {
    struct Case {
        std::string args, err;
    };
    const std::vector<Case> cases = {
        {"--devices 9",
         "tpusim: error: `devices` can only be 'auto', 1, 8 or [<0-7>] for TPUs. Got 9\n"},
        {"--devices 2",
         "tpusim: error: `devices` can only be 'auto', 1, 8 or [<0-7>] for TPUs. Got 2\n"},
        {"--devices '[8]'",
         "tpusim: error: `devices` can only be 'auto', 1, 8 or [<0-7>] for TPUs. Got [8]\n"},
        {"--devices 1,2",
         "tpusim: error: `devices` can only be 'auto', 1, 8 or [<0-7>] for TPUs. Got [1, 2]\n"},
        {"--devices gpu",
         "tpusim: error: --devices: Could not parse the selected TPU devices: 'gpu'\n"},
        // 16-mixed and bf16, refused here before issue #30, now run as bf16-mixed with
        // Lightning's warnings (CliHarden.LightningsOlderWordsRunWithItsWarnings).
        {"--precision 64-true",
         "tpusim: error: `precision='64-true'` is not supported in XLA. `precision` must be "
         "one of: ('32-true', 'bf16-mixed', 'bf16-true').\n"},
        {"--precision 16-true",
         "tpusim: error: `precision='16-true'`: fp16 is not modelled (the MXU multiplies bf16); "
         "use 'bf16-true' or 'bf16-mixed'\n"},
        {"--data mnist",
         "tpusim: error: --data 'mnist': expected fashion-mnist, synthetic, text or "
         "auto\n"},
        {"--data fashion-mnist --data-dir /nonexistent",
         "tpusim: error: cannot open '/nonexistent/train-images-idx3-ubyte.gz': No such file or "
         "directory\n"},
        {"--trace-steps 5",
         "tpusim: error: --trace-steps '5': expected FIRST:COUNT with COUNT "
         ">= 1, e.g. 100:2\n"},
        {"--data synthetic --hidden 32,0",
         "tpusim: error: --hidden: '0' is not a layer width (1-65536)\n"},
        {"--optimizer lamb", "tpusim: error: --optimizer 'lamb': expected adam or sgd\n"},
        {"--model resnet", "tpusim: error: --model 'resnet': the models are: mlp, cnn, gpt\n"},
        {"--data text",
         "tpusim: error: --data 'text' does not suit --model mlp: text data is "
         "for --model gpt\n"},
        {"--model gpt --data synthetic",
         "tpusim: error: --data 'synthetic' does not suit --model gpt: a GPT trains on --data "
         "text\n"},
        {"--model gpt --data text --text-file /nonexistent",
         "tpusim: error: cannot open '/nonexistent': No such file or directory\n"},
        {"--model gpt --data text --hidden 32,16",
         "tpusim: error: --hidden '32,16': a GPT has one width\n"},
        {"--model gpt --data text --hidden 30 --heads 4",
         "tpusim: error: embed_dim must be divisible by num_heads (embed_dim 30, num_heads 4)\n"},
        {"--max-steps -3",
         "tpusim: error: --max-steps -3: expected a number of steps >= 0, or -1 for no limit\n"},
    };
    for (const Case& c : cases) {
        // Cases that choose --data or --hidden themselves start from the bare run.
        const bool own = c.args.find("--data") != std::string::npos ||
                         c.args.find("--hidden") != std::string::npos;
        const CliResult r = tpusim((own ? kBase : kSmall) + " " + c.args);
        EXPECT_EQ(r.code, 2) << c.args;
        EXPECT_EQ(r.err, c.err) << c.args;
    }
}

TEST(CliTrain, BadNumbersAreRefusedNamingTheFlag) {
    // PyTorch's optimizers raise ValueError for these; training on would reach a NaN loss.
    const std::string base =
        "train --synthetic-count 256 --batch-size 8 --no-progress --data synthetic --hidden 32";
    struct Case {
        std::string args, err;
    };
    const std::vector<Case> cases = {
        {"--lr nan", "tpusim: error: --lr: Invalid learning rate: nan\n"},
        {"--lr -0.1", "tpusim: error: --lr: Invalid learning rate: -0.1\n"},
        {"--optimizer sgd --momentum nan",
         "tpusim: error: --momentum: Invalid momentum value: nan\n"},
        {"--limit-train-batches 0",
         "tpusim: error: --limit-train-batches 0: expected a number of batches >= 1, or -1 for "
         "all\n"},
        {"--limit-train-batches -5",
         "tpusim: error: --limit-train-batches -5: expected a number of batches >= 1, or -1 for "
         "all\n"},
        {"--limit-test-batches 0",
         "tpusim: error: --limit-test-batches 0: expected a number of batches >= 1, or -1 for "
         "all\n"},
        {"--synthetic-count 0",
         "--synthetic-count: expected a whole number >= 1, got '0'\nRun with --help for more "
         "information.\n"},
    };
    for (const Case& c : cases) {
        const CliResult r = tpusim(base + " " + c.args);
        EXPECT_EQ(r.code, 2) << c.args;
        EXPECT_EQ(r.err, c.err) << c.args;
    }
}

TEST(CliTrain, SyntheticDataIsNotLearnedInAFewSteps) {
    // The classes overlap: 16 steps (a quarter of the default epoch) leave the model well
    // short of 100%, which well-separated blobs reached in that many steps.
    const CliResult r =
        tpusim("train --data synthetic --no-progress --limit-train-batches 16 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_LT(j["test_accuracy"].get<double>(), 0.8) << r.out;
    EXPECT_GT(j["test_accuracy"].get<double>(), 0.15) << r.out;  // but learning has started
    EXPECT_GT(j["test_loss"].get<double>(), 1.0) << r.out;
}

TEST(CliTrain, JsonResultAndDeviceChoices) {
    for (const char* devices : {"auto", "1", "'[5]'"}) {
        const CliResult r = tpusim(kSmall + " --json --devices " + devices);
        ASSERT_EQ(r.code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out);
        for (const char* key :
             {"test_accuracy", "final_loss", "steps", "simulated_seconds", "host_seconds"})
            EXPECT_TRUE(j.contains(key)) << key << " in " << r.out;
        EXPECT_EQ(j["steps"], 4);
        EXPECT_EQ(j["devices"], std::string(devices) == "auto" ? 8 : 1);
        EXPECT_GT(j["simulated_seconds"].get<double>(), 0.0);
        EXPECT_GT(j["final_loss"].get<double>(), 0.0);
        EXPECT_GE(j["test_accuracy"].get<double>(), 0.0);
    }
}

TEST(CliTrain, GptLearnsATextAndReportsValidationLossPerCharacter) {
    // A text of 12 blocks that repeats one sentence: a 1-layer GPT learns it quickly, so the
    // validation loss falls far below the unigram entropy a frequency table would reach.
    const std::string text_path = tmp("gpt.txt");
    {
        std::ofstream f(text_path);
        while (f.tellp() < 12 * 4096) f << "the quick brown fox jumps over the lazy dog. ";
    }
    const std::string cmd =
        "train --model gpt --text-file " + text_path +
        " --layers 1 --hidden 32 --heads 2 --context 16 --batch-size 4 --max-steps 60 "
        "--log-every-n-steps 20 --lr 3e-3 --no-progress --json";
    const CliResult r = tpusim(cmd);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["model"], "gpt");
    EXPECT_EQ(j["steps"], 60);
    EXPECT_EQ(j["vocab"], 28);  // the pangram's 26 letters, space and full stop
    ASSERT_EQ(j["loss_curve"].size(), 3u);
    EXPECT_EQ(j["loss_curve"][2][0], 60);
    EXPECT_LT(j["loss_curve"][2][1].get<double>(), j["loss_curve"][0][1].get<double>());
    EXPECT_LT(j["val_loss"].get<double>(), 0.5 * j["unigram_entropy"].get<double>());
    // The validation split (block 9) is tiled by windows of the context, each with the next
    // character as its last label: (4096 - 17) / 16 + 1 windows.
    EXPECT_EQ(j["val_characters"], ((4096 - 17) / 16 + 1) * 16);
    // The default corpus: Debian's license texts.
    const CliResult d = tpusim(
        "train --model gpt --layers 1 --hidden 32 --heads 2 --context 16 --batch-size 2 "
        "--max-steps 1 --limit-test-batches 1 --no-progress --json");
    ASSERT_EQ(d.code, 0) << d.err;
    const auto dj = nlohmann::json::parse(d.out);
    EXPECT_EQ(dj["vocab"], 86);
    EXPECT_NEAR(dj["unigram_entropy"].get<double>(), 3.21, 0.005);
}

TEST(CliTrain, MetricsReportCheckpointAndResume) {
    const std::string ckpt = tmp("m.ckpt"), report = tmp("metrics.txt");
    CliResult r = tpusim(kSmall + " --checkpoint " + ckpt + " --metrics-report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(std::filesystem::exists(ckpt));
    const std::string rep = slurp(report);
    for (const char* key : {"Metric: ExecuteTime", "Counter: MarkStep\n  Value: 4\n",
                            "Counter: UncachedCompile", "Analysis:"})
        EXPECT_NE(rep.find(key), std::string::npos) << key << "\n" << rep;
    // --epochs is Lightning's max_epochs, the total: the checkpoint holds epoch 1 of 1 already.
    r = tpusim(kSmall + " --resume " + ckpt + " --json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["steps"], 4);
    r = tpusim(kSmall + " --resume " + ckpt + " --epochs 2 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    // Resumed at global step 4 after epoch 1: one more epoch of four steps.
    EXPECT_EQ(nlohmann::json::parse(r.out)["steps"], 8);
    r = tpusim(kBase + " --data synthetic --hidden 16 --resume " + ckpt);
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "tpusim: error: checkpoint '" + ckpt +
                         "': parameter 0 is layer_1.weight 784 x 32, the module has "
                         "layer_1.weight 784 x 16\n");
}

TEST(CliTrain, SameCommandGivesByteIdenticalTraceAndStats) {
    std::string traces[2], stats[2];
    for (int i = 0; i < 2; ++i) {
        const std::string t = tmp("t" + std::to_string(i) + ".json"),
                          s = tmp("s" + std::to_string(i) + ".json");
        const CliResult r = tpusim(kSmall + " --trace " + t + " --stats " + s);
        ASSERT_EQ(r.code, 0) << r.err;
        traces[i] = slurp(t);
        stats[i] = slurp(s);
    }
    EXPECT_GT(traces[0].size(), 1000u);
    EXPECT_TRUE(traces[0] == traces[1]) << "traces differ";
    EXPECT_TRUE(stats[0] == stats[1]) << "stats differ";
    EXPECT_NE(traces[0].find("\"train_step\""), std::string::npos);
}

TEST(CliTrain, FashionMnistOneEpochOnEightCoresReaches85Percent) {
    // The demo's run: MLP 784-512-256-10, 8 cores x 16 examples, bf16-mixed, Adam 1e-3. About
    // four minutes on one host core, so the sanitizer run leaves it out (tpusim, ASAN_EXCLUDED).
    if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
        GTEST_SKIP() << "the Debian package dataset-fashion-mnist is not installed";
    const CliResult r = tpusim(
        "train --data fashion-mnist --devices 8 --precision bf16-mixed "
        "--epochs 1 --no-progress --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_GE(j["test_accuracy"].get<double>(), 0.85) << r.out;
    EXPECT_EQ(j["steps"], 469);  // 7500 examples per core in batches of 16
    EXPECT_EQ(j["test_examples"], 10000);
    EXPECT_EQ(j["recompile_warnings"], 1);  // the short last batch (12 rows)
    std::printf("Fashion-MNIST 1 epoch: accuracy %.4f, %.3f host s per step\n",
                j["test_accuracy"].get<double>(), j["host_seconds_per_step"].get<double>());
}

TEST(CliTrain, CnnOnFashionMnistOneEpochOnEightCoresReaches87Percent) {
    // The recipe: conv32-pool-conv64-pool-fc128-fc10, 8 cores x 16, bf16-mixed, Adam
    // 1e-3, one epoch; PyTorch on CPU reaches 87.6% with it. Minutes of host time, so the
    // sanitizer run leaves it out (tpusim, ASAN_EXCLUDED).
    if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
        GTEST_SKIP() << "the Debian package dataset-fashion-mnist is not installed";
    const CliResult r = tpusim(
        "train --model cnn --data fashion-mnist --devices 8 --precision bf16-mixed --epochs 1 "
        "--no-progress --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_GE(j["test_accuracy"].get<double>(), 0.87) << r.out;
    EXPECT_EQ(j["steps"], 469);
    EXPECT_EQ(j["test_examples"], 10000);
    std::printf("CNN Fashion-MNIST 1 epoch: accuracy %.4f, %.3f host s per step\n",
                j["test_accuracy"].get<double>(), j["host_seconds_per_step"].get<double>());
}

}  // namespace
}  // namespace tpu::test
