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

}  // namespace
}  // namespace tpu::sim
