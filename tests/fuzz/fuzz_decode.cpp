// SPDX-License-Identifier: Apache-2.0
// Fuzzes the binary decoder: any image either decodes or throws DecodeError; a decoded image
// re-encodes to the same bytes (the encoding has no redundant forms).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "isa/disassembler.h"
#include "isa/isa.h"

int tpu_fuzz_decode(const uint8_t* data, size_t size) {
    const std::span<const uint8_t> image(data, size);
    tpu::isa::Program p;
    try {
        p = tpu::isa::decode_program(image);
    } catch (const tpu::isa::DecodeError&) {
        return 0;
    }
    const auto bytes = tpu::isa::encode_program(p);
    if (bytes.size() != size || !std::equal(bytes.begin(), bytes.end(), data)) std::abort();
    (void)tpu::isa::disassemble(p);
    return 0;
}

#ifndef TPU_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return tpu_fuzz_decode(data, size);
}
#endif
