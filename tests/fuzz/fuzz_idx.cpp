// SPDX-License-Identifier: Apache-2.0
// Fuzzes the IDX dataset reader (raw and gzip): any bytes decode or throw DataError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "trainer/dataset.h"

int tpu_fuzz_idx(const uint8_t* data, size_t size) {
    try {
        const auto a = tpu::trainer::decode_idx({data, size}, "fuzz.idx");
        uint64_t total = 1;
        for (uint32_t d : a.dims) total *= d;
        if (total != a.data.size()) std::abort();
    } catch (const tpu::trainer::DataError&) {
    }
    return 0;
}

#ifndef TPU_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return tpu_fuzz_idx(data, size);
}
#endif
