// SPDX-License-Identifier: Apache-2.0
// Fuzzes the assembler: any text either assembles or throws AsmError; assembled programs
// survive a disassemble/reassemble round trip bit-identically.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "isa/assembler.h"
#include "isa/disassembler.h"

int tpu_fuzz_asm(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    tpu::isa::Program p;
    try {
        p = tpu::isa::assemble(text, "fuzz.s");
    } catch (const tpu::isa::AsmError&) {
        return 0;
    }
    const auto again = tpu::isa::assemble(tpu::isa::disassemble(p), "roundtrip.s");
    if (tpu::isa::encode_program(again) != tpu::isa::encode_program(p)) std::abort();
    return 0;
}

#ifndef TPU_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return tpu_fuzz_asm(data, size);
}
#endif
