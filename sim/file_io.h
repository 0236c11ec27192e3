// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

/// The one way tpusim reads an input file and writes an output file (programs, stats, dumps,
/// traces, checkpoints, reports), so every file behaves the same when it is a directory, a
/// device, a symlink or on a full disk.
namespace tpu::sim {

/// An input file could not be read; the message names the path and the reason.
class InputFileError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// The most bytes read_input_file() takes by default: every input has a bound, so an endless
/// one (/dev/zero, a FIFO that never closes) is an error instead of a process that grows until
/// it is killed. Callers that know a tighter natural bound (a config, a checkpoint's declared
/// size, a memory's size) pass it.
inline constexpr uint64_t kMaxInputBytes = uint64_t(1) << 30;

/// The whole contents of `path`, at most `max_bytes` of them; throws InputFileError ("cannot
/// open 'DIR': Is a directory", "cannot read '/dev/zero': longer than 16 MiB (the most this
/// input may hold)"). A directory is refused up front: an ifstream opens one and then fails
/// deep inside the first read. A regular file is measured before it is read; anything else
/// (a device, a FIFO) is read up to max_bytes + 1 bytes.
std::string read_input_file(const std::string& path, uint64_t max_bytes = kMaxInputBytes);
/// "16 MiB", "1 GiB", "300 bytes": a byte bound as input errors state it.
std::string bytes_text(uint64_t bytes);

/// Removes every temporary file an OutputFile has open (async-signal-safe: it only calls
/// unlink). The SIGTERM and second-Ctrl-C handlers and Cluster::abort call it before the
/// process ends without running destructors, so no hidden `.NAME.tmpPID-N` file survives.
void remove_temporary_files() noexcept;

/// An output file could not be written; the message names the path and the reason.
class OutputError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// `path` for MPI rank `rank`'s own file: unchanged for rank 0 (and in one process), else with
/// ".rankN" before the extension ("t.json" -> "t.rank1.json", "t" -> "t.rank1").
std::string rank_path(const std::string& path, int rank);
/// rank_path() for this process's rank.
std::string rank_path(const std::string& path);

/// Throws OutputError for a name OutputFile refuses before touching the file system: "" and
/// "-" (standard output is a stream, not a file that can be replaced atomically). Tools check
/// their output options with it before a run, not after.
void check_output_path(const std::string& path);

/// An output file being written. A regular file (or the regular file a symlink resolves to,
/// or a path that does not exist yet) is written to a temporary file in the same directory
/// and renamed onto it by commit(), so readers see the old file or the new one and a failure
/// leaves neither a torn file nor the temporary behind. Anything else that exists (a device
/// such as /dev/null, a FIFO) is written in place: replacing it would destroy it.
class OutputFile {
public:
    /// Which MPI ranks write the file.
    enum class Ranks {
        First,  ///< rank 0 only (the others write to /dev/null): results, stats, checkpoints
        Each,   ///< every rank its own file (per-rank traces)
    };
    /// Opens `path` for writing, with a stream buffer of `buffer_bytes` (0: the library's
    /// default); throws OutputError (a directory, a missing parent, no permission, or `-`:
    /// standard output is not a file here, /dev/stdout is written in place).
    explicit OutputFile(std::string path, size_t buffer_bytes = 0, Ranks ranks = Ranks::First);
    /// Without a successful commit() the temporary file is removed and the target untouched.
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    /// The stream to write to.
    std::ostream& stream() { return m_out; }
    /// Flushes and closes, checking every step, then renames the temporary file onto the
    /// target; throws OutputError naming the path (e.g. "No space left on device").
    void commit();
    /// The path as given.
    const std::string& path() const { return m_path; }
    /// True when the path is not a regular file (a device, a FIFO) and is written in place.
    bool in_place() const { return m_in_place; }

private:
    /// Closes and removes the temporary file, if any (nothrow).
    void discard() noexcept;

    std::string m_path;          ///< as given by the user
    std::string m_target;        ///< `m_path` with symlinks resolved: the file that gets replaced
    std::string m_tmp;           ///< temporary file beside `m_target`; empty when writing in place
    int m_tmp_slot = -1;         ///< its entry for remove_temporary_files() (-1: none)
    std::vector<char> m_buffer;  ///< declared before `m_out`, which uses it until destroyed
    std::ofstream m_out;
    bool m_in_place = false;
    bool m_committed = false;
};

/// Writes `bytes` to `path` as OutputFile does; throws OutputError.
void write_output_file(const std::string& path, std::string_view bytes);

}  // namespace tpu::sim
