// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "driver/kernels/conv2d.h"

namespace tpu::driver {

/// One parameterised conv2d test: a shape, the cores it runs on, and the test's name.
struct ConvCase {
    Conv2dShape shape;  ///< {batch, H, W, Cin, Cout, k, stride, pad}
    uint32_t cores;     ///< cores 0 .. cores-1
    std::string name;   ///< the test's suffix
};

/// GoogleTest prints a case by its name.
inline void PrintTo(const ConvCase& c, std::ostream* os) {
    *os << c.name;
}

}  // namespace tpu::driver
