// SPDX-License-Identifier: Apache-2.0
#include "driver/program_cache.h"

#include <chrono>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "isa/disassembler.h"
#include "sim/file_io.h"

namespace tpu::driver {
namespace {

/// With TPU_DUMP_PROGRAMS=DIR, writes every compiled program to DIR/<image hash>.bin, its
/// disassembly with the builder's names to DIR/<image hash>.s, and appends "<image hash> <name>"
/// to DIR/programs.txt, so the programs two builds compile over a test suite can be compared
/// (driver/README.md, "Migrating a text kernel").
void dump(const isa::Program& p) {
    const char* dir = std::getenv("TPU_DUMP_PROGRAMS");
    if (!dir || !*dir) return;
    const std::string hash = fmt::format("{:016x}", isa::image_hash(p));
    const auto image = isa::encode_program(p);
    sim::write_output_file(
        fmt::format("{}/{}.bin", dir, hash),
        std::string_view(reinterpret_cast<const char*>(image.data()), image.size()));
    sim::write_output_file(fmt::format("{}/{}.s", dir, hash),
                           isa::disassemble(p, {.show_pc = true}));
    const std::string list = fmt::format("{}/programs.txt", dir);
    std::ofstream out(list, std::ios::app);
    out << hash << ' ' << p.name << '\n';
    if (!out.flush()) throw sim::OutputError(fmt::format("cannot append to '{}'", list));
}

}  // namespace

isa::Program ProgramCache::compile(const std::string& name,
                                   const std::function<isa::Program()>& generate) {
    const auto t0 = std::chrono::steady_clock::now();
    isa::Program p = generate();
    if (p.name.empty()) p.name = name;
    m_compile_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++m_misses;
    dump(p);
    return p;
}

}  // namespace tpu::driver
