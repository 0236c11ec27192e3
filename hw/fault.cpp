// SPDX-License-Identifier: Apache-2.0
#include "hw/fault.h"

#include <fmt/format.h>

namespace tpu::hw {

std::string FaultInfo::message() const {
    return fmt::format("device fault on core {} at pc {} ({}) in {}, cycle {}: {}", core, pc,
                       instruction, unit, cycle, what);
}

}  // namespace tpu::hw
