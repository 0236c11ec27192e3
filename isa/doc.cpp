// SPDX-License-Identifier: Apache-2.0
#include "isa/doc.h"

#include <fmt/format.h>

#include "isa/isa.h"

namespace tpu::isa {
namespace {

std::string_view kind_text(char k) {
    switch (k) {
        case 'd':
            return "reg";
        case 'v':
            return "value";
        case 'm':
            return "[addr]";
        case 'f':
            return "flag";
        case 'l':
            return "label";
        default:
            return "?";
    }
}

}  // namespace

std::string reference_markdown() {
    std::string out =
        "| mnemonic | syntax | operands | unit | timing | semantics |\n"
        "|---|---|---|---|---|---|\n";
    for (const OpInfo& oi : op_table()) {
        std::string syntax(oi.mnemonic);
        std::string kinds;
        char letter = 'a';
        for (char k : oi.kinds) {
            if (k == 'c') {
                syntax += " [, fN]";
                kinds += ", completion flag (optional)";
                break;
            }
            syntax += letter == 'a' ? " " : ", ";
            syntax += k == 'm' ? fmt::format("[{}]", letter) : std::string(1, letter);
            kinds += fmt::format("{}{}: {}", letter == 'a' ? "" : ", ", letter, kind_text(k));
            ++letter;
        }
        std::string summary;
        for (char c : oi.summary) summary += c == '|' ? std::string("\\|") : std::string(1, c);
        out += fmt::format("| `{}` | `{}` | {} | {} | {} | {} |\n", oi.mnemonic, syntax,
                           kinds.empty() ? "none" : kinds, unit_name(oi.unit),
                           timing_name(oi.timing), summary);
    }
    return out;
}

}  // namespace tpu::isa
