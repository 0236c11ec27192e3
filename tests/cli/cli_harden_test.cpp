// SPDX-License-Identifier: Apache-2.0
// Issue #30's input classes at the command line: sizes checked in 64 bits before anything is
// allocated, negative numbers, bounded inputs, `-`, options that do not apply, Lightning's
// words, and no raw sentinel or nan in what a user reads. Each test names its class.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"

namespace tpu::test {
namespace {

/// A CSV of `tpusim validate` with the header and one row per line of `rows`.
std::string csv(const std::string& name, const std::string& rows) {
    const std::string path = tmp(name);
    std::ofstream(path, std::ios::binary) << "workload,params,real_cycles,clock_mhz,cores,source\n"
                                          << rows;
    return path;
}

/// Runs `tpusim ARGS` with the address space capped at 3 GiB, so a command that allocated the
/// gigabytes its sizes describe would fail with "out of host memory" (exit 1), not exit 2 with
/// the check's message. A board still opens: its memories fall back to pages allocated on first
/// write when the cap refuses their reservation. AddressSanitizer reserves terabytes of shadow
/// memory at start, so the sanitizer build runs the command uncapped (the messages are checked
/// all the same).
CliResult capped(const std::string& args) {
#ifdef __SANITIZE_ADDRESS__
    const std::string cap;
#else
    const std::string cap = "ulimit -v 3145728; ";
#endif
    return run_command(cap + shell_quote(tpusim_exe()) + " " + args);
}

/// Expects exit code 2 and `message` in stderr, without "nan" or a raw sentinel.
void expect_refused(const CliResult& r, const std::string& args, const std::string& message) {
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("nan"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("18446744073709551615"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
}

TEST(CliHarden, ShapesAreCheckedIn64Bits) {
    // Class 1: 65537 x 65537 heads wrapped to 131073 in 32 bits and ran; a pad of 2^31 doubled
    // to 0 and `--check` said bit-exact; a huge stride leaked an assembler error; 2^31 x 2^31
    // values wrapped to "alloc: 0 bytes requested".
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"op attention --batch 65537 --heads 65537 --seq 1 --dhead 1 --json",
         "--batch 65537 x --heads 65537 x --seq 1 x --dhead 1: each core's Q, K, V, O "
         "(4295098369 rows"},
        {"op conv2d --batch 1 --height 3 --width 3 --cin 1 --cout 1 --kernel 3 --pad 2147483648 "
         "--check",
         "conv2d: the padded input (over 4294967296 bytes)"},
        {"op conv2d --batch 1 --height 3 --width 3 --cin 1 --cout 1 --kernel 3 --stride "
         "4294967295",
         "exceeds the 4 GiB a kernel addresses"},
        {"op softmax --rows 2147483648 --cols 2147483648",
         "--rows 2147483648 x --cols 2147483648: each core's input and output (2147483648 rows "
         "of 2147483648 fp32 values each) is over 16 EiB, more than the 4.0 GiB of HBM a core's "
         "kernels address"},
    };
    for (const auto& [args, message] : cases) {
        const CliResult r = capped(args);
        expect_refused(r, args, message);
        EXPECT_EQ(r.err.find(".s:"), std::string::npos) << r.err;  // no assembler error
    }
    // A validate row of the same attention shape names the file, line and fields.
    const std::string path = csv("attn.csv",
                                 "attention,heads=65537 seq=1 dhead=1 batch=65537,"
                                 "10,940,1,x\n");
    expect_refused(capped("validate --data " + shell_quote(path)), "validate attention",
                   path +
                       ":2: batch=65537 x heads=65537 x seq=1 x dhead=1: each core's Q, K, V, "
                       "O (4295098369 rows");
}

TEST(CliHarden, SizesAreCheckedBeforeAnyAllocation) {
    // Class 3: these touched 16 GB of host memory (or printed std::bad_alloc) before failing.
    // Under a 3 GiB address-space cap, exit 2 with the check's words shows nothing of that
    // size was allocated first.
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"op gemm --m 65536 --k 65536 --n 1",
         "--m 65536 x --k 65536 x --n 1: the largest core's share of A, W and C (bf16, split "
         "over 1 core) is 8.0 GiB"},
        {"op conv2d --batch 4000000000 --height 28 --width 28 --cin 1 --cout 1 --kernel 3",
         "conv2d: the padded input"},
        {"model gpt --seq 4294967295", "--seq 4294967295 x --hidden 128: a tensor of"},
        {"model mlp --batch 4294967295",
         "--batch 4294967295: each core's 4294967295 examples (794 fp32 input and label values "
         "each) is"},
    };
    for (const auto& [args, message] : cases) expect_refused(capped(args), args, message);
    const std::string path = csv("huge.csv", "gemm,M=999999999 K=999999999 N=1,10,940,1,x\n");
    expect_refused(capped("validate --data " + shell_quote(path)), "validate gemm",
                   path +
                       ":2: M=999999999 x K=999999999 x N=1: the largest core's share of A, "
                       "W and C");
}

TEST(CliHarden, NegativeNumbersAreRefused) {
    // Class 4: -5 real cycles read as 2^64 - 5 (and -100.0% with exit 0), cores -1 as 2^64 - 1,
    // --trace-steps -1:3 wrote an empty trace.
    const std::string real = csv("neg.csv", "gemm,M=128 K=128 N=128,-5,940,1,x\n");
    expect_refused(tpusim("validate --data " + shell_quote(real)), "real_cycles -5",
                   real + ":2: real_cycles '-5' is not a positive integer");
    const std::string cores = csv("negcores.csv", "gemm,M=128 K=128 N=128,10,940,-1,x\n");
    expect_refused(tpusim("validate --data " + shell_quote(cores)), "cores -1",
                   cores + ":2: cores '-1' is not a positive integer");
    const std::string trace = tmp("neg-trace.json");
    const CliResult steps =
        tpusim("train --data synthetic --no-progress --trace " + trace + " --trace-steps -1:3");
    expect_refused(steps, "--trace-steps -1:3",
                   "--trace-steps '-1:3': expected FIRST:COUNT with COUNT >= 1");
    EXPECT_FALSE(std::filesystem::exists(trace));
    expect_refused(tpusim("op conv2d --pad -1"), "--pad -1",
                   "--pad: expected a whole number >= 0, got '-1'");
    expect_refused(tpusim("gemm --seed -1"), "--seed -1",
                   "--seed: expected a whole number >= 0, got '-1'");
    expect_refused(tpusim("train --batch-size -8"), "--batch-size -8",
                   "--batch-size: expected a whole number >= 0, got '-8'");
}

TEST(CliHarden, EndlessInputsEndAtTheirBound) {
    // Class 5: /dev/zero as any input grew until the process was killed. Each input has its
    // natural bound: the room in the memory, a config's or a CSV's size, a kernel file's,
    // a checkpoint's declared layout, a corpus, a trace.
    const std::string k = tmp("halt.s");
    std::ofstream(k) << "halt\n";
    const std::string ckpt = tmp("h.ckpt");
    const std::string small =
        "train --data synthetic --synthetic-count 64 --hidden 8 --no-progress ";
    ASSERT_EQ(tpusim(small + "--checkpoint " + ckpt).code, 0);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"run " + k + " --load 0:vmem:0=/dev/zero",
         "--load /dev/zero: more than 16777216 bytes at 0x0 do not fit in"},
        {"validate --data /dev/zero", "cannot read '/dev/zero': longer than 64 MiB"},
        {"gemm --config /dev/zero", "cannot read '/dev/zero': longer than 16 MiB"},
        {"run /dev/zero", "kernel: cannot read '/dev/zero': longer than 64 MiB"},
        {"asm /dev/zero -o " + tmp("z.bin"), "cannot read '/dev/zero': longer than 64 MiB"},
        {"disasm /dev/zero", "cannot read '/dev/zero': longer than 64 MiB"},
        {"train --model gpt --text-file /dev/zero --no-progress",
         "cannot read '/dev/zero': longer than 256 MiB (the most this input may hold)"},
        {small + "--resume /dev/zero", "checkpoint: cannot read '/dev/zero': longer than"},
        {"report /dev/zero -o " + tmp("z.html"), "cannot read '/dev/zero': longer than 256 MiB"},
    };
    for (const auto& [args, message] : cases) expect_refused(tpusim(args), args, message);
}

TEST(CliHarden, DeeplyNestedConfigIsRefused) {
    // Class 6: a 450 KB config of nested objects needed about 6 GB. Under a 3 GiB cap it is
    // refused with the key path it got to.
    const std::string path = tmp("deep.json");
    {
        std::ofstream f(path);
        for (int i = 0; i < 75000; ++i) f << "{\"a\":";
        f << "1" << std::string(75000, '}');
    }
    expect_refused(capped("config --config " + shell_quote(path)), "deep config",
                   path +
                       ": key 'a.a.a.a': nested 5 levels deep; no config value is nested "
                       "more than 4");
}

TEST(CliHarden, ARunThatTrainsNothingReportsNoLoss) {
    // Class 8: --max-steps 0 reported "final_loss":0.0, and resuming a finished run printed
    // "final training loss 0.0000". Lightning trains nothing and says which limit it met.
    const std::string base =
        "train --data synthetic --synthetic-count 256 --batch-size 8 --limit-train-batches 2 "
        "--limit-test-batches 1 --hidden 16 --no-progress";
    const CliResult none = tpusim(base + " --max-steps 0 --json");
    ASSERT_EQ(none.code, 0) << none.err;
    const auto j = nlohmann::json::parse(none.out);
    EXPECT_TRUE(j["final_loss"].is_null()) << none.out;
    EXPECT_EQ(j["stopped"], "`Trainer.fit` stopped: `max_steps=0` reached.");
    EXPECT_EQ(j["steps"], 0);
    const std::string ckpt = tmp("done.ckpt");
    ASSERT_EQ(tpusim(base + " --checkpoint " + ckpt).code, 0);
    const CliResult resumed = tpusim(base + " --resume " + ckpt);
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("`Trainer.fit` stopped: `max_epochs=1` reached. No training loss; "
                               "test accuracy "),
              std::string::npos)
        << resumed.out;
    EXPECT_EQ(resumed.out.find("final training loss"), std::string::npos) << resumed.out;
}

TEST(CliHarden, DashIsStdoutOrRefused) {
    // Class 10: `--metrics-report -` with --json was dropped without a word; `--stats -` and
    // `--trace -` wrote files named '-' (and '-.config.json'). `-` is stdout for
    // --metrics-report alone, and refused where it would mix with the result or a file.
    const std::string dir = fresh_dir(tmp("dash"));
    const std::string in_dir = "cd " + shell_quote(dir) + " && " + shell_quote(tpusim_exe());
    const std::string train =
        " train --data synthetic --synthetic-count 64 --hidden 8 --no-progress";
    expect_refused(run_command(in_dir + train + " --metrics-report - --json"),
                   "--metrics-report - --json",
                   "--metrics-report - and --json both write to stdout; name a file for the "
                   "report");
    const CliResult report = run_command(in_dir + train + " --metrics-report -");
    EXPECT_EQ(report.code, 0) << report.err;
    EXPECT_NE(report.out.find("Counter: MarkStep"), std::string::npos);
    for (const char* flag : {"--stats", "--trace"})
        expect_refused(run_command(in_dir + " gemm --m 128 --k 128 --n 128 " + flag + " -"), flag,
                       std::string(flag) +
                           ": cannot write '-': standard output is not an output "
                           "file here");
    EXPECT_EQ(listing(dir), std::set<std::string>{});
    // /dev/stdout is a device, written in place.
    const CliResult stats = tpusim("gemm --m 128 --k 128 --n 128 --json --stats /dev/stdout");
    EXPECT_EQ(stats.code, 0) << stats.err;
    EXPECT_NE(stats.out.find("\"board\""), std::string::npos) << stats.out.substr(0, 300);
}

TEST(CliHarden, ModelRefusesOptionsThatDoNotApply) {
    // Class 11: `model mlp --hidden 5 --image 99` ran the MLP; `model gpt --layers 0` meant 2.
    expect_refused(tpusim("model mlp --hidden 5 --image 99"), "mlp --hidden --image",
                   "--image does not apply to model mlp (it has no size options)");
    expect_refused(tpusim("model mlp --hidden 5"), "mlp --hidden",
                   "--hidden does not apply to model mlp (it has no size options)");
    expect_refused(tpusim("model resnet18 --seq 8"), "resnet18 --seq",
                   "--seq does not apply to model resnet18 (it takes --image)");
    expect_refused(tpusim("model bert-block --layers 2"), "bert-block --layers",
                   "--layers does not apply to model bert-block (it takes --hidden, --heads, "
                   "--seq, --ffn)");
    expect_refused(tpusim("model gpt --layers 0"), "gpt --layers 0",
                   "--layers: expected a whole number >= 1, got '0'");
}

TEST(CliHarden, MessagesHaveNoRawSentinelOrNan) {
    // Class 12. --num-nodes 0 printed CLI11's 309-digit range.
    const CliResult nodes = tpusim("train --num-nodes 0");
    expect_refused(nodes, "--num-nodes 0", "--num-nodes: expected a whole number >= 1, got '0'");
    EXPECT_LT(nodes.err.size(), 200u) << nodes.err;
    // A NUL in a CSV cut the message short; every validate error names the file.
    const std::string nul = tmp("nul.csv");
    std::ofstream(nul, std::ios::binary) << "workload,params,real_cycles,clock_mhz,cores,source\n"
                                         << std::string("gemm,M=1\0 K=1 N=1,10,940,1,x\n", 30);
    expect_refused(tpusim("validate --data " + shell_quote(nul)), "NUL",
                   nul + ":2: byte 0x00 at column 9: a CSV row is text");
    const std::string zero = csv("zero.csv", "gemm,M=0 K=1 N=1,10,940,1,x\n");
    expect_refused(tpusim("validate --data " + shell_quote(zero)), "M=0",
                   zero + ": line 2: parameter M=0 is not a positive integer below 1e9");
    // One core has nothing to all-reduce with (the bound's ratio was 0 / 0 = -nan) ...
    expect_refused(tpusim("op allreduce --cores 3 --elements 1024"), "allreduce --cores 3",
                   "--cores: an all-reduce needs at least two cores; core 3 alone has nothing to "
                   "reduce with");
    // ... and the default is every core.
    const auto all = tpusim_json("op allreduce --elements 1024");
    EXPECT_EQ(all["cores"], 8);
    EXPECT_EQ(all["plan"].get<std::string>().find("nan"), std::string::npos) << all["plan"];
}

TEST(CliHarden, BertBlockTrainStepWorks) {
    // Class 13: the block's 512 x 768 output met 512 x 256 labels. A training step puts a
    // token-classification head (hidden -> 9 labels) on the block; inference stays the block.
    const std::string bert = "model bert-block --hidden 64 --heads 4 --seq 40 --ffn 96";
    const auto step = tpusim_json(bert + " --train-step");
    EXPECT_EQ(step["mode"], "train-step");
    EXPECT_EQ(step["description"],
              "BERT encoder block: hidden 64, 4 heads, seq 40, ffn 96, token-classification head "
              "(9 labels)");
    bool head = false;
    for (const auto& l : step["layers"]) head |= l["name"] == "classifier";
    EXPECT_TRUE(head) << step["layers"].dump();
    const auto infer = tpusim_json(bert);
    EXPECT_EQ(infer["description"], "BERT encoder block: hidden 64, 4 heads, seq 40, ffn 96");
    for (const auto& l : infer["layers"]) EXPECT_NE(l["name"], "classifier");
    EXPECT_GT(step["cycles"].get<uint64_t>(), infer["cycles"].get<uint64_t>());
}

TEST(CliHarden, LightningsOlderWordsRunWithItsWarnings) {
    // Item 5: Lightning 1.x's precision=16 and tpu_cores, Lightning 2's 16-mixed and bf16 run
    // (as bf16-mixed and as devices), each with the warning its Lightning gives; 16-true is
    // refused. trainer/README.md names the versions.
    const std::string base =
        "train --data synthetic --synthetic-count 64 --hidden 8 --no-progress --json";
    struct Case {
        std::string args, warning, precision;
        int devices;
    };
    const std::vector<Case> cases = {
        {"--precision 16",
         "warning: You passed `Trainer(accelerator='tpu', precision=16)` but AMP is not "
         "supported with TPUs. Using `precision='bf16'` instead.\n",
         "bf16-mixed", 8},
        {"--precision 16-mixed",
         "warning: You passed `Trainer(accelerator='tpu', precision='16-mixed')` but AMP with "
         "fp16 is not supported on TPUs. Using `precision='bf16-mixed'` instead.\n",
         "bf16-mixed", 8},
        {"--precision bf16",
         "warning: `precision=bf16` is supported for historical reasons but its usage is "
         "discouraged. Please set your precision to bf16-mixed instead!\n",
         "bf16-mixed", 8},
        {"--tpu-cores 1",
         "warning: Setting `Trainer(tpu_cores=1)` is deprecated in v1.7 and will be removed in "
         "v2.0. Please use `Trainer(accelerator='tpu', devices=1)` instead.\n",
         "bf16-mixed", 1},
        {"--tpu-cores '[5]' --devices 8",
         "warning: Setting `Trainer(tpu_cores=[5])` is deprecated in v1.7 and will be removed in "
         "v2.0. Please use `Trainer(accelerator='tpu', devices=[5])` instead.\nwarning: The flag "
         "`devices=8` will be ignored, instead the device specific number [5] will be used\n",
         "bf16-mixed", 1},
    };
    for (const Case& c : cases) {
        const CliResult r = tpusim(base + " " + c.args);
        ASSERT_EQ(r.code, 0) << c.args << ": " << r.err;
        EXPECT_EQ(r.err, c.warning) << c.args;
        const auto j = nlohmann::json::parse(r.out);
        EXPECT_EQ(j["precision"], c.precision) << c.args;
        EXPECT_EQ(j["devices"], c.devices) << c.args;
    }
    expect_refused(tpusim(base + " --precision 16-true"), "16-true", "fp16 is not modelled");
}

}  // namespace
}  // namespace tpu::test
