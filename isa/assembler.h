// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "isa/isa.h"

namespace tpu::isa {

/// An assembly error. what() is "FILE:LINE:COL: error: MESSAGE", the form editors jump to.
class AsmError : public std::runtime_error {
public:
    AsmError(std::string file, int line, int col, std::string message);
    const std::string& file() const { return m_file; }
    int line() const { return m_line; }
    int col() const { return m_col; }
    /// The message without the location prefix.
    const std::string& message() const { return m_message; }

private:
    std::string m_file;
    int m_line;
    int m_col;
    std::string m_message;
};

/// Assembles text (syntax in isa/README.md); `filename` only names the source in errors.
/// Throws AsmError at the first error.
Program assemble(std::string_view text, std::string_view filename = "<input>");
/// Reads and assembles a file; an unreadable file is an AsmError at line 0.
Program assemble_file(const std::string& path);

}  // namespace tpu::isa
