// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace tpu::isa {

/// The instruction reference (Markdown table) generated from the opcode table. isa/README.md
/// holds a copy between its GENERATED markers; tests/isa/isa_doc_test.cpp keeps them equal.
std::string reference_markdown();

}  // namespace tpu::isa
