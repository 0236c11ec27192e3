// SPDX-License-Identifier: Apache-2.0
// sim::OutputFile and read_input_file: atomic replacement, symlinks, devices, directories.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "sim/file_io.h"
#include "tests/common/paths.h"
#include "tests/common/scratch.h"

namespace tpu::sim {
namespace {

namespace fs = std::filesystem;
using test::slurp;

/// A fresh directory private to this test process.
std::string fresh_dir(const std::string& name) {
    return test::fresh_dir(test::scratch("file_io-" + name));
}
using test::listing;

TEST(RankPath, RankZeroKeepsThePathOthersGetTheirOwnFile) {
    using tpu::sim::rank_path;
    EXPECT_EQ(rank_path("out/t.json", 0), "out/t.json");
    EXPECT_EQ(rank_path("out/t.json", 3), "out/t.rank3.json");
    EXPECT_EQ(rank_path("t.trace.json", 1), "t.trace.rank1.json");
    EXPECT_EQ(rank_path("trace", 2), "trace.rank2");
    EXPECT_EQ(rank_path("dir.d/trace", 2), "dir.d/trace.rank2");
    EXPECT_EQ(rank_path(".hidden", 1), ".hidden.rank1");
    // A process without mpirun is rank 0.
    EXPECT_EQ(rank_path("t.json"), "t.json");
}

TEST(OutputFile, ReplacesARegularFileOnlyAtCommit) {
    const std::string d = fresh_dir("commit");
    write_output_file(d + "/a.txt", "old");
    {
        OutputFile f(d + "/a.txt");
        EXPECT_FALSE(f.in_place());
        f.stream() << "new";
        EXPECT_EQ(slurp(d + "/a.txt"), "old");  // readers see the old file until the rename
        f.commit();
    }
    EXPECT_EQ(slurp(d + "/a.txt"), "new");
    EXPECT_EQ(listing(d), std::set<std::string>{"a.txt"});
}

TEST(OutputFile, WithoutCommitNothingIsLeftBehind) {
    const std::string d = fresh_dir("abandon");
    write_output_file(d + "/a.txt", "old");
    {
        OutputFile f(d + "/a.txt");
        f.stream() << "partial";
    }
    {
        OutputFile f(d + "/b.txt");
        f.stream() << "partial";
    }
    EXPECT_EQ(slurp(d + "/a.txt"), "old");
    EXPECT_EQ(listing(d), std::set<std::string>{"a.txt"});
}

TEST(OutputFile, ASymlinkSurvivesAndItsTargetIsReplaced) {
    const std::string d = fresh_dir("link");
    write_output_file(d + "/target", "old");
    fs::create_symlink("target", d + "/link");
    fs::create_symlink("missing", d + "/dangling");
    write_output_file(d + "/link", "new");
    write_output_file(d + "/dangling", "created");
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d + "/link")));
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d + "/dangling")));
    EXPECT_EQ(slurp(d + "/target"), "new");
    EXPECT_EQ(slurp(d + "/missing"), "created");
    EXPECT_EQ(listing(d), (std::set<std::string>{"dangling", "link", "missing", "target"}));
}

TEST(OutputFile, ReplacedFileKeepsItsPermissions) {
    const std::string d = fresh_dir("mode");
    write_output_file(d + "/x", "old");
    ASSERT_EQ(::chmod((d + "/x").c_str(), 0640), 0);
    write_output_file(d + "/x", "new");
    struct stat st {};
    ASSERT_EQ(::stat((d + "/x").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
}

TEST(OutputFile, DevicesAreWrittenInPlace) {
    OutputFile f("/dev/null");
    EXPECT_TRUE(f.in_place());
    f.stream() << "discarded";
    f.commit();
    struct stat st {};
    ASSERT_EQ(::stat("/dev/null", &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(OutputFile, ErrorsNameThePathAndTheReason) {
    const std::string d = fresh_dir("errors");
    auto message = [](const std::string& path, std::string_view bytes) {
        try {
            write_output_file(path, bytes);
        } catch (const OutputError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(message(d, "x"), "cannot write '" + d + "': Is a directory");
    EXPECT_EQ(message(d + "/no/such/file", "x"),
              "cannot write '" + d + "/no/such/file': No such file or directory");
    // /dev/full accepts the open and fails every write.
    EXPECT_EQ(message("/dev/full", std::string(100000, 'x')),
              "cannot write '/dev/full': No space left on device");
    EXPECT_EQ(message("/dev/full", "x"), "cannot write '/dev/full': No space left on device");
    EXPECT_EQ(listing(d), std::set<std::string>{});
}

TEST(ReadInputFile, RefusesDirectoriesAndNamesMissingFiles) {
    const std::string d = fresh_dir("read");
    write_output_file(d + "/f", std::string("a\0b", 3));
    EXPECT_EQ(read_input_file(d + "/f"), std::string("a\0b", 3));
    EXPECT_THROW(
        {
            try {
                read_input_file(d);
            } catch (const InputFileError& e) {
                EXPECT_EQ(std::string(e.what()), "cannot open '" + d + "': Is a directory");
                throw;
            }
        },
        InputFileError);
    EXPECT_THROW(read_input_file(d + "/none"), InputFileError);
}

TEST(ReadInputFile, EveryInputHasABound) {
    // Issue #30, class 5: an endless input (/dev/zero) grew until the process was killed. A
    // device is read to one byte past the bound; a regular file is refused by its size.
    const std::string too_long =
        "cannot read '/dev/zero': longer than 1 MiB (the most this "
        "input may hold)";
    try {
        read_input_file("/dev/zero", 1 << 20);
        ADD_FAILURE() << "/dev/zero read";
    } catch (const InputFileError& e) {
        EXPECT_EQ(std::string(e.what()), too_long);
    }
    const std::string d = fresh_dir("bound");
    write_output_file(d + "/f", std::string(100, 'x'));
    EXPECT_EQ(read_input_file(d + "/f", 100).size(), 100u);
    EXPECT_THROW(read_input_file(d + "/f", 99), InputFileError);
    EXPECT_EQ(bytes_text(16u << 20), "16 MiB");
    EXPECT_EQ(bytes_text(1000), "1000 bytes");
}

TEST(OutputFile, DashIsRefusedNotAFileNamedDash) {
    // Issue #30, class 10: `--stats -` wrote a file named '-' (and '-.config.json').
    const std::string here = std::filesystem::current_path().string();
    try {
        OutputFile f("-");
        ADD_FAILURE() << "'-' opened";
    } catch (const OutputError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "cannot write '-': standard output is not an output file here (name a file, or "
                  "/dev/stdout; ./- for a file named '-')");
    }
    EXPECT_FALSE(std::filesystem::exists(here + "/-"));
}

TEST(OutputFile, ASignalHandlerRemovesTheTemporaryFiles) {
    // What the SIGTERM and second-Ctrl-C handlers and Cluster::abort call before the process
    // ends without destructors: every open temporary file goes, committed targets stay.
    const std::string d = fresh_dir("signal");
    write_output_file(d + "/kept.txt", "kept");
    {
        OutputFile a(d + "/a.json"), b(d + "/b.json");
        a.stream() << "partial";
        EXPECT_EQ(listing(d).size(), 3u);  // kept.txt and two hidden temporary files
        remove_temporary_files();
        EXPECT_EQ(listing(d), std::set<std::string>{"kept.txt"});
    }
    EXPECT_EQ(slurp(d + "/kept.txt"), "kept");
    // A committed file is no temporary any more: the handler leaves it.
    OutputFile c(d + "/c.json");
    c.stream() << "done";
    c.commit();
    remove_temporary_files();
    EXPECT_EQ(slurp(d + "/c.json"), "done");
}

}  // namespace
}  // namespace tpu::sim
