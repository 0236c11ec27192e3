// SPDX-License-Identifier: Apache-2.0
// tpusim run: load a kernel and its data, run it on a set of cores, dump results.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <sys/stat.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "hw/board.h"
#include "isa/assembler.h"
#include "sim/file_io.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/run_output.h"

namespace tpu::cli {
namespace {

/// "CORES[:hbm|:vmem]:ADDR[:BYTES]" from --load/--dump.
struct Region {
    std::vector<uint32_t> cores;
    bool hbm = true;
    uint64_t addr = 0;
    uint64_t bytes = 0;
    std::string file;
};

uint64_t parse_number(std::string_view s, std::string_view what, const std::string& spec) {
    uint64_t v = 0;
    int base = 10;
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2), base = 16;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size())
        throw InputError(fmt::format("'{}': {} '{}' is not a number", spec, what, s));
    return v;
}

Region parse_region(const std::string& spec, bool with_bytes, uint32_t num_cores) {
    const std::string form =
        with_bytes ? "CORE[:hbm|:vmem]:ADDR:BYTES=FILE" : "CORES[:hbm|:vmem]:ADDR=FILE";
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq + 1 == spec.size())
        throw InputError(fmt::format("'{}': expected {}", spec, form));
    Region r;
    r.file = spec.substr(eq + 1);
    std::vector<std::string> parts;
    std::stringstream ss(spec.substr(0, eq));
    for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
    const size_t want = with_bytes ? 3 : 2;
    if (parts.size() == want + 1) {
        if (parts[1] != "hbm" && parts[1] != "vmem")
            throw InputError(fmt::format("'{}': memory '{}' must be hbm or vmem", spec, parts[1]));
        r.hbm = parts[1] == "hbm";
        parts.erase(parts.begin() + 1);
    }
    if (parts.size() != want) throw InputError(fmt::format("'{}': expected {}", spec, form));
    try {
        r.cores = hw::parse_core_set(parts[0], num_cores);
    } catch (const std::invalid_argument& e) {
        throw InputError(fmt::format("'{}': {}", spec, e.what()));
    }
    if (with_bytes && r.cores.size() != 1)
        throw InputError(fmt::format("'{}': a dump names one core", spec));
    r.addr = parse_number(parts[1], "address", spec);
    if (with_bytes) {
        r.bytes = parse_number(parts[2], "byte count", spec);
        // Refused before the run rather than after it (sim::OutputFile's rule).
        try {
            sim::check_output_path(r.file);
        } catch (const sim::OutputError& e) {
            throw InputError(fmt::format("--dump: {}", e.what()));
        }
    }
    return r;
}

/// Copies --load's file into memory as it reads it, so the room left in the memory bounds the
/// read: a larger file (or an endless one, /dev/zero) is an error after at most that many bytes,
/// and no host copy of the whole file is made.
void load_region(hw::Board& board, const Region& r) {
    struct stat st {};
    if (::stat(r.file.c_str(), &st) != 0 || S_ISDIR(st.st_mode))
        throw InputError(fmt::format("--load: cannot open '{}': {}", r.file,
                                     std::strerror(S_ISDIR(st.st_mode) ? EISDIR : errno)));
    const hw::SparseMemory& first = r.hbm ? board.hbm(r.cores[0]) : board.vmem(r.cores[0]);
    const uint64_t room = r.addr <= first.size() ? first.size() - r.addr : 0;
    const auto too_big = [&](const std::string& bytes) {
        return InputError(fmt::format("--load {}: {} bytes at 0x{:x} do not fit in {} ({} bytes)",
                                      r.file, bytes, r.addr, first.name(), first.size()));
    };
    // A regular file is measured first; the message then gives its exact size.
    if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > room)
        throw too_big(std::to_string(st.st_size));
    std::ifstream in(r.file, std::ios::binary);
    if (!in)
        throw InputError(fmt::format("--load: cannot open '{}': {}", r.file, std::strerror(errno)));
    std::vector<uint8_t> chunk(1 << 20), old(chunk.size());
    const auto is_zero = [](const uint8_t* p, uint64_t n) {
        return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
    };
    uint64_t at = 0;
    while (in.read(reinterpret_cast<char*>(chunk.data()), std::streamsize(chunk.size())) ||
           in.gcount() > 0) {
        const auto n = static_cast<uint64_t>(in.gcount());
        if (n > room - at) throw too_big(fmt::format("more than {}", room));
        const bool zeros = is_zero(chunk.data(), n);
        for (uint32_t c : r.cores)
            if (board.owns(c)) {
                hw::SparseMemory& mem = r.hbm ? board.hbm(c) : board.vmem(c);
                // Zeros over untouched memory change nothing and would cost host memory for
                // every page (a --load of /dev/zero reads the whole HBM before it fails).
                if (zeros) {
                    mem.read(r.addr + at, {old.data(), n});
                    if (is_zero(old.data(), n)) continue;
                }
                mem.write(r.addr + at, {chunk.data(), n});
            }
        at += n;
    }
    if (in.bad()) throw InputError(fmt::format("--load: cannot read '{}': read error", r.file));
}
}  // namespace

isa::Program load_kernel(const std::string& path) {
    std::string bytes;
    try {
        bytes = sim::read_input_file(path, kMaxKernelFileBytes);
    } catch (const sim::InputFileError& e) {
        throw InputError(fmt::format("kernel: {}", e.what()));
    }
    if (bytes.rfind("TPUPROG1", 0) == 0) {
        try {
            return isa::decode_program(
                std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        } catch (const isa::DecodeError& e) {
            throw InputError(fmt::format("{}: {}", path, e.what()));
        }
    }
    // Control characters (other than tab and line ends) never occur in assembly text; a
    // binary file would otherwise be reported as a pile of syntax errors.
    const auto binary = std::find_if(bytes.begin(), bytes.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u < 0x20 && c != '\t' && c != '\n' && c != '\r';
    });
    if (binary != bytes.end())
        throw InputError(fmt::format(
            "kernel '{}': neither a program image (no TPUPROG1 header) nor assembly text "
            "(byte 0x{:02x} at offset {})",
            path, static_cast<unsigned char>(*binary), binary - bytes.begin()));
    try {
        return isa::assemble(bytes, path);
    } catch (const isa::AsmError& e) {
        throw SourceError(e.what());
    }
}

void register_run_command(CLI::App& app) {
    struct Opts {
        CommonOptions common;
        std::string kernel;
        std::string cores = "0";
        std::vector<std::string> loads, dumps;
        std::vector<uint32_t> args;
    };
    auto o = std::make_shared<Opts>();
    auto* cmd = app.add_subcommand("run", "run a kernel (.s or .bin) on a set of cores");
    cmd->add_option("kernel", o->kernel, "kernel: assembly (.s) or program image (.bin)")
        ->required();
    cmd->add_option("--cores", o->cores, "cores to run on: 3, 0-7, 0,2,4 or all");
    cmd->add_option("--load", o->loads,
                    "CORES[:hbm|:vmem]:ADDR=FILE: copy FILE into memory before the run "
                    "(default hbm; repeatable)")
        ->default_str("");
    cmd->add_option("--dump", o->dumps,
                    "CORE[:hbm|:vmem]:ADDR:BYTES=FILE: write memory to FILE after the run "
                    "(repeatable)")
        ->default_str("");
    cmd->add_option("--args", o->args, "launch arguments, placed in s1, s2, ...")
        ->delimiter(',')
        ->default_str("");
    add_common_options(*cmd, o->common);
    cmd->callback([o] {
        const hw::BoardConfig cfg = o->common.board_config();
        isa::Program prog = load_kernel(o->kernel);
        // Per-kernel statistics name the kernel after its file ("vpu_chain.s" -> vpu_chain).
        prog.name = std::filesystem::path(o->kernel).stem().string();
        std::replace(prog.name.begin(), prog.name.end(), '.', '_');
        if (prog.name.empty()) prog.name = "kernel";
        std::vector<uint32_t> cores;
        try {
            cores = hw::parse_core_set(o->cores, cfg.cores());
        } catch (const std::invalid_argument& e) {
            throw InputError(fmt::format("--cores: {}", e.what()));
        }
        std::vector<Region> loads, dumps;
        for (const auto& s : o->loads) loads.push_back(parse_region(s, false, cfg.cores()));
        for (const auto& s : o->dumps) dumps.push_back(parse_region(s, true, cfg.cores()));

        RunSession session(cfg, o->common);
        hw::Board& board = session.board();
        for (const Region& r : loads) load_region(board, r);
        for (const Region& r : dumps)
            check_dump(board, r.cores[0], r.hbm, r.addr, r.bytes, "--dump " + r.file);
        // Loading here first keeps the instruction-memory error as the board words it.
        for (uint32_t c : cores) {
            try {
                board.load(c, prog);
            } catch (const std::invalid_argument& e) {
                throw InputError(e.what());
            }
        }
        const hw::LaunchResult res = session.launch(o->kernel, prog, cores, o->args);
        for (const Region& r : dumps) {
            std::vector<uint8_t> data(r.bytes);
            board.fetch(r.cores[0], r.hbm, r.addr, data);
            try {
                sim::write_output_file(
                    r.file,
                    std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
            } catch (const sim::OutputError& e) {
                throw InputError(fmt::format("--dump: {}", e.what()));
            }
        }
        session.report(res);
    });
}

}  // namespace tpu::cli
