// SPDX-License-Identifier: Apache-2.0
// isa/README.md documents every instruction; it must say what the opcode table says.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "isa/doc.h"
#include "isa/isa.h"
#include "tests/common/paths.h"

namespace tpu::isa {
namespace {

std::string readme() {
    std::ifstream in(test::source_dir() + "/isa/README.md");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

TEST(IsaDoc, ReadmeReferenceMatchesTheOpcodeTable) {
    const std::string text = readme();
    const std::string begin = "<!-- BEGIN GENERATED: isa reference -->\n";
    const auto b = text.find(begin);
    const auto e = text.find("<!-- END GENERATED -->");
    ASSERT_NE(b, std::string::npos);
    ASSERT_NE(e, std::string::npos);
    EXPECT_EQ(text.substr(b + begin.size(), e - b - begin.size()), reference_markdown())
        << "isa/README.md is stale: run `tpusim asm --write-doc isa/README.md`";
}

TEST(IsaDoc, EveryInstructionHasARowWithUnitAndTiming) {
    const std::string ref = reference_markdown();
    for (const OpInfo& oi : op_table()) {
        const std::string row = "| `" + std::string(oi.mnemonic) + "` |";
        const auto at = ref.find(row);
        ASSERT_NE(at, std::string::npos) << oi.mnemonic;
        const std::string line = ref.substr(at, ref.find('\n', at) - at);
        EXPECT_NE(line.find("| " + std::string(unit_name(oi.unit)) + " |"), std::string::npos)
            << line;
        EXPECT_NE(line.find("| " + std::string(timing_name(oi.timing)) + " |"), std::string::npos)
            << line;
    }
}

}  // namespace
}  // namespace tpu::isa
