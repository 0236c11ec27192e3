// SPDX-License-Identifier: Apache-2.0
// Fuzzes the config loader: any text either yields a valid board config or a ConfigError.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hw/board_config.h"
#include "sim/config_io.h"

int tpu_fuzz_config(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    tpu::hw::BoardConfig cfg;
    try {
        tpu::sim::apply_json(tpu::sim::root_of(cfg), text, "fuzz.json");
        cfg.validate();
        (void)tpu::sim::dump_json(tpu::sim::root_of(cfg));
    } catch (const tpu::sim::ConfigError&) {
    }
    return 0;
}

#ifndef TPU_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return tpu_fuzz_config(data, size);
}
#endif
