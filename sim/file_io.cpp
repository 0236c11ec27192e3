// SPDX-License-Identifier: Apache-2.0
#include "sim/file_io.h"
#include "sim/cluster.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace tpu::sim {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, int err) {
    throw OutputError(
        fmt::format("cannot write '{}': {}", path, err != 0 ? std::strerror(err) : "write failed"));
}

/// `path` with every symlink along the final component followed, so the rename replaces the
/// file the link points at and the link itself survives. A dangling link resolves to the
/// path it names, which is then created.
std::string resolve_links(const std::string& path) {
    fs::path p(path);
    for (int depth = 0; depth < 40; ++depth) {
        std::error_code ec;
        if (!fs::is_symlink(fs::symlink_status(p, ec))) return p.string();
        const fs::path next = fs::read_symlink(p, ec);
        if (ec) fail(path, ec.value());
        p = next.is_absolute() ? next : p.parent_path() / next;
    }
    fail(path, ELOOP);
}

// ---- temporary files a signal may have to remove ------------------------------------------

/// One live temporary file. A signal handler reads `path` only while `state` is kLive, and the
/// owner writes `path` only while it holds the slot in state kClaimed, so the handler never
/// sees a half-written name (everything here is async-signal-safe: atomics and unlink).
struct TempSlot {
    std::atomic<int> state{0};
    char path[PATH_MAX] = {};
};
constexpr int kFree = 0, kClaimed = 1, kLive = 2;
/// More output files than any command keeps open at once (a trace, stats, their config, a
/// checkpoint, a report).
constexpr int kTempSlots = 64;
TempSlot g_temps[kTempSlots];
static_assert(std::atomic<int>::is_always_lock_free);

/// Registers `path` for remove_temporary_files(); -1 when the name is too long or every slot
/// is taken (the file is then only removed by its OutputFile).
int register_temp(const std::string& path) {
    if (path.size() >= PATH_MAX) return -1;
    for (int i = 0; i < kTempSlots; ++i) {
        int expected = kFree;
        if (!g_temps[i].state.compare_exchange_strong(expected, kClaimed)) continue;
        std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
        g_temps[i].state.store(kLive);
        return i;
    }
    return -1;
}

void unregister_temp(int slot) {
    if (slot >= 0) g_temps[slot].state.store(kFree);
}

}  // namespace

void remove_temporary_files() noexcept {
    for (TempSlot& t : g_temps)
        if (t.state.load() == kLive) ::unlink(t.path);
}

// ---- input ----------------------------------------------------------------------------------

std::string bytes_text(uint64_t bytes) {
    for (const auto& [unit, shift] :
         {std::pair{"GiB", 30}, std::pair{"MiB", 20}, std::pair{"KiB", 10}})
        if (bytes >= (uint64_t(1) << shift) && bytes % (uint64_t(1) << shift) == 0)
            return fmt::format("{} {}", bytes >> shift, unit);
    return fmt::format("{} bytes", bytes);
}

std::string read_input_file(const std::string& path, uint64_t max_bytes) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode))
        throw InputFileError(fmt::format("cannot open '{}': {}", path,
                                         std::strerror(S_ISDIR(st.st_mode) ? EISDIR : errno)));
    const auto too_long = [&] {
        return InputFileError(
            fmt::format("cannot read '{}': longer than {} (the most this input "
                        "may hold)",
                        path, bytes_text(max_bytes)));
    };
    // A regular file says how long it is: refuse it before reading a byte.
    if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > max_bytes) throw too_long();
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputFileError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
    std::string bytes;
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
        const auto n = static_cast<size_t>(in.gcount());
        if (n > max_bytes - bytes.size()) throw too_long();
        bytes.append(buf, n);
    }
    if (in.bad()) throw InputFileError(fmt::format("cannot read '{}': read error", path));
    return bytes;
}

std::string rank_path(const std::string& path) {
    return rank_path(path, Cluster::rank());
}

std::string rank_path(const std::string& path, int rank) {
    if (rank == 0) return path;
    const size_t slash = path.find_last_of('/');
    const size_t name = slash == std::string::npos ? 0 : slash + 1;
    const size_t dot = path.find_last_of('.');
    // A leading dot names a hidden file, not an extension.
    const bool ext = dot != std::string::npos && dot > name;
    const size_t at = ext ? dot : path.size();
    return fmt::format("{}.rank{}{}", path.substr(0, at), rank, path.substr(at));
}

void check_output_path(const std::string& path) {
    if (path.empty()) throw OutputError("cannot write '': empty file name");
    // Output files are written beside their target and renamed onto it; standard output is a
    // stream, not a file (and often carries the command's result): name it /dev/stdout.
    if (path == "-")
        throw OutputError(
            "cannot write '-': standard output is not an output file here (name a file, or "
            "/dev/stdout; ./- for a file named '-')");
}

OutputFile::OutputFile(std::string path, size_t buffer_bytes, Ranks ranks)
    : m_path(std::move(path)) {
    check_output_path(m_path);
    if (ranks == Ranks::First && Cluster::rank() != 0) {
        // Every rank computes the same output; rank 0 alone writes it.
        m_out.open("/dev/null", std::ios::binary | std::ios::out);
        if (!m_out) fail("/dev/null", errno);
        m_in_place = true;
        return;
    }
    if (buffer_bytes > 0) {
        // libstdc++ honours pubsetbuf only before the file is opened.
        m_buffer.resize(buffer_bytes);
        m_out.rdbuf()->pubsetbuf(m_buffer.data(), static_cast<std::streamsize>(buffer_bytes));
    }
    // A device or FIFO reached through a link (/dev/stdout -> /proc/self/fd/1 -> "pipe:[N]",
    // which names nothing on disk) is written in place through the link, as the kernel
    // resolves it.
    struct stat direct {};
    if (::stat(m_path.c_str(), &direct) == 0 && !S_ISREG(direct.st_mode) &&
        !S_ISDIR(direct.st_mode)) {
        m_out.open(m_path, std::ios::binary | std::ios::out);
        if (!m_out) fail(m_path, errno);
        m_in_place = true;
        return;
    }
    m_target = resolve_links(m_path);
    struct stat st {};
    const bool exists = ::stat(m_target.c_str(), &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) fail(m_path, EISDIR);
    if (exists && !S_ISREG(st.st_mode)) {
        m_out.open(m_target, std::ios::binary | std::ios::out);
        if (!m_out) fail(m_path, errno);
        m_in_place = true;
        return;
    }
    // The temporary file lives beside the target so the rename stays within one file system.
    static std::atomic<unsigned> counter{0};
    const fs::path target(m_target);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    m_tmp = (dir / fmt::format(".{}.tmp{}-{}", target.filename().string(), ::getpid(),
                               counter.fetch_add(1)))
                .string();
    // Registered before it exists: a signal between the open and the registration would
    // otherwise leave it behind.
    m_tmp_slot = register_temp(m_tmp);
    const int fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        const int err = errno;
        unregister_temp(m_tmp_slot);
        m_tmp_slot = -1;
        m_tmp.clear();
        fail(m_path, err);
    }
    // A replaced file keeps its permissions; a new one gets 0666 less the umask, as open gives.
    if (exists) (void)::fchmod(fd, st.st_mode & 07777);
    ::close(fd);
    m_out.open(m_tmp, std::ios::binary | std::ios::out | std::ios::trunc);
    if (!m_out) {
        const int err = errno;
        discard();
        fail(m_path, err);
    }
}

OutputFile::~OutputFile() {
    if (!m_committed) discard();
}

void OutputFile::discard() noexcept {
    if (m_out.is_open()) m_out.close();
    if (!m_tmp.empty()) ::unlink(m_tmp.c_str());
    m_tmp.clear();
    unregister_temp(m_tmp_slot);
    m_tmp_slot = -1;
}

void OutputFile::commit() {
    // A write that failed earlier left its errno behind (best effort: nothing else that sets
    // errno runs between stream writes in practice); otherwise the flush sets it.
    if (m_out) errno = 0;
    m_out.flush();
    int err = errno;
    if (m_out) {
        m_out.close();
        err = errno;
    }
    if (!m_out) {
        discard();
        fail(m_path, err);
    }
    if (!m_tmp.empty() && std::rename(m_tmp.c_str(), m_target.c_str()) != 0) {
        err = errno;
        discard();
        fail(m_path, err);
    }
    // Renamed: the name is the target's now, which a signal must not remove.
    unregister_temp(m_tmp_slot);
    m_tmp_slot = -1;
    m_tmp.clear();
    m_committed = true;
}

void write_output_file(const std::string& path, std::string_view bytes) {
    OutputFile f(path);
    f.stream().write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.commit();
}

}  // namespace tpu::sim
