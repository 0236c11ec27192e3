// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tpu::hw {

/// A device fault: what a kernel did wrong, where. The faulting core stops; the board stops
/// the simulation and the driver turns the fault into an error.
struct FaultInfo {
    uint32_t core = 0;        ///< faulting core
    uint32_t pc = 0;          ///< instruction index
    std::string instruction;  ///< disassembled instruction
    std::string unit;         ///< unit that faulted ("sequencer", "dma", "mxu1", ...)
    uint64_t address = 0;     ///< offending address (if any)
    uint64_t cycle = 0;       ///< cycle of the fault
    std::string what;         ///< e.g. "HBM read of 64 bytes at 0x400000000 is outside 16 GiB"

    /// "core 3 pc 17 (dma.hv [s1], [s2+64], ...): <what> at cycle N"
    std::string message() const;
};

/// Thrown by device-side code (and rethrown by the board) for a FaultInfo.
class DeviceFault : public std::runtime_error {
public:
    explicit DeviceFault(FaultInfo info)
        : std::runtime_error(info.message()), m_info(std::move(info)) {}
    const FaultInfo& info() const { return m_info; }

private:
    FaultInfo m_info;
};

}  // namespace tpu::hw
