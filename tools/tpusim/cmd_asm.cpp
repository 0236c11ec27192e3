// SPDX-License-Identifier: Apache-2.0
// tpusim asm / disasm: text assembly <-> program images, and the generated ISA reference.
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "isa/doc.h"
#include "sim/file_io.h"
#include "tools/tpusim/commands.h"

namespace tpu::cli {
namespace {

constexpr std::string_view kBegin = "<!-- BEGIN GENERATED: isa reference -->";
constexpr std::string_view kEnd = "<!-- END GENERATED -->";

std::string read_text(const std::string& path) {
    try {
        return sim::read_input_file(path, kMaxKernelFileBytes);
    } catch (const sim::InputFileError& e) {
        throw InputError(e.what());
    }
}

void write_file(const std::string& path, const void* data, size_t size) {
    try {
        sim::write_output_file(path, std::string_view(static_cast<const char*>(data), size));
    } catch (const sim::OutputError& e) {
        throw InputError(e.what());
    }
}

/// Replaces the generated section of a README with the current reference.
void update_readme(const std::string& path) {
    std::string text = read_text(path);
    const size_t b = text.find(kBegin);
    const size_t e = text.find(kEnd);
    if (b == std::string::npos || e == std::string::npos || e < b)
        throw InputError(fmt::format("'{}' has no '{}' ... '{}' section", path, kBegin, kEnd));
    const size_t from = b + kBegin.size();
    text.replace(from, e - from, "\n" + isa::reference_markdown());
    write_file(path, text.data(), text.size());
}

}  // namespace

void register_asm_commands(CLI::App& app) {
    struct AsmOpts {
        std::string input, output, write_doc;
        bool doc = false, json = false;
    };
    auto a = std::make_shared<AsmOpts>();
    auto* as = app.add_subcommand("asm", "assemble a kernel (.s) into a program image (.bin)");
    as->add_option("input", a->input, "assembly source");
    as->add_option("-o,--output", a->output, "program image to write (default: INPUT with .bin)")
        ->check(output_path());
    as->add_flag("--doc", a->doc, "print the instruction reference (Markdown) and exit");
    as->add_option("--write-doc", a->write_doc,
                   "rewrite the generated section of a README (e.g. isa/README.md)");
    as->add_flag("--json", a->json, "print {\"instructions\", \"bytes\", \"output\"} on stdout");
    as->callback([a] {
        if (a->doc) {
            fmt::print("{}", isa::reference_markdown());
            return;
        }
        if (!a->write_doc.empty()) {
            update_readme(a->write_doc);
            return;
        }
        if (a->input.empty())
            throw InputError("asm: no input file (usage: tpusim asm IN.s -o OUT.bin)");
        isa::Program prog;
        try {
            prog = isa::assemble(read_text(a->input), a->input);
        } catch (const isa::AsmError& e) {
            throw SourceError(e.what());
        }
        std::string out = a->output;
        if (out.empty()) out = std::filesystem::path(a->input).replace_extension(".bin").string();
        const auto image = isa::encode_program(prog);
        write_file(out, image.data(), image.size());
        if (a->json)
            fmt::print("{}\n", nlohmann::json{{"instructions", prog.code.size()},
                                              {"bytes", image.size()},
                                              {"output", out}}
                                   .dump());
        else
            fmt::print("{}: {} instructions, {} bytes -> {}\n", a->input, prog.code.size(),
                       image.size(), out);
    });

    struct DisOpts {
        std::string input;
        bool pc = false;
    };
    auto d = std::make_shared<DisOpts>();
    auto* dis = app.add_subcommand("disasm", "print a program image (.bin) as assembly");
    dis->add_option("input", d->input, "program image")->required();
    dis->add_flag("--pc", d->pc, "append the instruction index to each line");
    dis->callback([d] {
        const std::string bytes = read_text(d->input);
        isa::Program prog;
        try {
            prog = isa::decode_program(
                std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        } catch (const isa::DecodeError& e) {
            throw InputError(fmt::format("{}: {}", d->input, e.what()));
        }
        fmt::print("{}", isa::disassemble(prog, {.show_pc = d->pc}));
    });
}

}  // namespace tpu::cli
