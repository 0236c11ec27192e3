// SPDX-License-Identifier: Apache-2.0
// Files given to tpusim: every output goes through one writer (devices in place, symlinks kept,
// regular files replaced atomically, write errors fatal) and directories are refused as inputs.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <string>

#include "tests/cli/cli_runner.h"

namespace tpu::test {
namespace {

namespace fs = std::filesystem;

std::string example(const std::string& name) {
    return source_dir() + "/isa/examples/" + name;
}

/// A small synthetic training run (well under a second).
const std::string kTrain =
    "train --no-progress --data synthetic --hidden 32 --synthetic-count 256 --batch-size 8 "
    "--limit-train-batches 2 --limit-test-batches 1";

bool is_char_device(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

TEST(CliFiles, DevicesAreWrittenInPlace) {
    // As root, a rename onto /dev/null would replace the device with a regular file.
    ASSERT_TRUE(is_char_device("/dev/null"));
    const std::string k = example("gemm512.s");
    for (const std::string& args :
         {"asm " + k + " -o /dev/null", "run " + k + " --stats /dev/null --trace /dev/null",
          "run " + k + " --dump 0:0x0:64=/dev/null", kTrain + " --checkpoint /dev/null",
          kTrain + " --metrics-report /dev/null"}) {
        const CliResult r = tpusim(args);
        EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
        EXPECT_TRUE(is_char_device("/dev/null")) << args;
    }
    // The stats file's config companion is written only beside a regular file.
    EXPECT_FALSE(fs::exists("/dev/null.config.json"));
}

TEST(CliFiles, AFifoIsWrittenInPlace) {
    const std::string d = fresh_dir(tmp("fifo"));
    ASSERT_EQ(::mkfifo((d + "/pipe").c_str(), 0600), 0);
    // The reader is bounded, so a writer that never opens the FIFO cannot hang the test.
    const CliResult r = run_command("timeout 120 cat " + shell_quote(d + "/pipe") + " > " +
                                    shell_quote(d + "/copy") + " & " + shell_quote(tpusim_exe()) +
                                    " asm " + example("gemm512.s") + " -o " +
                                    shell_quote(d + "/pipe") + "; rc=$?; wait; exit $rc");
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_EQ(tpusim("asm " + example("gemm512.s") + " -o " + d + "/direct.bin").code, 0);
    EXPECT_EQ(slurp(d + "/copy"), slurp(d + "/direct.bin"));
    EXPECT_TRUE(fs::is_fifo(fs::symlink_status(d + "/pipe")));
}

TEST(CliFiles, ASymlinkKeepsPointingAtTheUpdatedTarget) {
    const std::string d = fresh_dir(tmp("links"));
    std::ofstream(d + "/prog.bin") << "old";
    std::ofstream(d + "/model.ckpt") << "old";
    fs::create_symlink("prog.bin", d + "/prog-link");
    fs::create_symlink("model.ckpt", d + "/ckpt-link");
    ASSERT_EQ(tpusim("asm " + example("gemm512.s") + " -o " + d + "/prog-link").code, 0);
    const CliResult t = tpusim(kTrain + " --checkpoint " + d + "/ckpt-link");
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d + "/prog-link")));
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d + "/ckpt-link")));
    EXPECT_EQ(slurp(d + "/prog.bin").rfind("TPUPROG1", 0), 0u);
    EXPECT_EQ(slurp(d + "/model.ckpt").rfind("TPUCKPT1", 0), 0u);
    EXPECT_EQ(listing(d),
              (std::set<std::string>{"ckpt-link", "model.ckpt", "prog-link", "prog.bin"}));
}

TEST(CliFiles, WriteErrorsAreFatalAndNameTheFlag) {
    const std::string k = example("gemm512.s");
    const std::string full = ": cannot write '/dev/full': No space left on device\n";
    struct Case {
        std::string args, err;
    };
    const std::vector<Case> cases = {
        {"asm " + k + " -o /dev/full", "tpusim: error" + full},
        {"run " + k + " --stats /dev/full", "tpusim: error: --stats" + full},
        {"run " + k + " --trace /dev/full", "tpusim: error: --trace" + full},
        {"run " + k + " --dump 0:0x0:64=/dev/full", "tpusim: error: --dump" + full},
        {"gemm --m 128 --k 128 --n 128 --trace /dev/full", "tpusim: error: --trace" + full},
        {kTrain + " --metrics-report /dev/full", "tpusim: error: --metrics-report" + full},
        {kTrain + " --checkpoint /dev/full", "tpusim: error: checkpoint" + full},
    };
    for (const Case& c : cases) {
        const CliResult r = tpusim(c.args);
        EXPECT_EQ(r.code, 2) << c.args;
        EXPECT_EQ(r.err, c.err) << c.args;
    }
}

TEST(CliFiles, AFailedSaveLeavesNothingBehind) {
    const std::string d = fresh_dir(tmp("efbig"));
    std::ofstream(d + "/keep.ckpt") << "old";
    // A file-size limit of 1 KiB makes the checkpoint write fail with EFBIG on a regular file;
    // SIGXFSZ is ignored so the write returns an error instead of killing the process.
    const CliResult r = run_command("trap '' XFSZ; ulimit -f 1; " + shell_quote(tpusim_exe()) +
                                    " " + kTrain + " --checkpoint " + d + "/keep.ckpt");
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err,
              "tpusim: error: checkpoint: cannot write '" + d + "/keep.ckpt': File too large\n");
    EXPECT_EQ(slurp(d + "/keep.ckpt"), "old");
    EXPECT_EQ(listing(d), std::set<std::string>{"keep.ckpt"});
}

TEST(CliFiles, DirectoriesAreRefusedAsInputs) {
    const std::string d = fresh_dir(tmp("dirs"));
    fs::create_directories(d + "/kernel.s");
    fs::create_directories(d + "/data/train-images-idx3-ubyte.gz");
    const std::string k = example("gemm512.s");
    struct Case {
        std::string args, err;
    };
    const std::vector<Case> cases = {
        {"asm " + d + "/kernel.s",
         "tpusim: error: cannot open '" + d + "/kernel.s': Is a directory\n"},
        {"run " + d + "/kernel.s",
         "tpusim: error: kernel: cannot open '" + d + "/kernel.s': Is a directory\n"},
        {"run " + k + " --load 0:0x0=" + d,
         "tpusim: error: --load: cannot open '" + d + "': Is a directory\n"},
        {kTrain + " --resume " + d,
         "tpusim: error: checkpoint: cannot open '" + d + "': Is a directory\n"},
        {"train --no-progress --data fashion-mnist --data-dir " + d + "/data",
         "tpusim: error: cannot open '" + d +
             "/data/train-images-idx3-ubyte.gz': Is a directory\n"},
    };
    for (const Case& c : cases) {
        const CliResult r = tpusim(c.args);
        EXPECT_EQ(r.code, 2) << c.args;
        EXPECT_EQ(r.err, c.err) << c.args;
    }
    // asm of a directory must not write DIR.bin.
    EXPECT_EQ(listing(d), (std::set<std::string>{"data", "kernel.s"}));
}

TEST(CliFiles, RandomBytesAreNotParsedAsAssembly) {
    const std::string f = tmp("random.s");
    std::ofstream(f, std::ios::binary) << std::string("nop\n\x01\x02\xff", 7);
    const CliResult r = tpusim("run " + f);
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "tpusim: error: kernel '" + f +
                         "': neither a program image (no TPUPROG1 header) nor assembly text "
                         "(byte 0x01 at offset 4)\n");
}

}  // namespace
}  // namespace tpu::test
