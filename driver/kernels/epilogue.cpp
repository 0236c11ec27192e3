// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/epilogue.h"

#include <fmt/format.h>

namespace tpu::driver {

isa::Arg EpilogueTile::side(size_t i) const {
    if (i >= m_sides.size())
        throw m_b.error(
            fmt::format("epilogue: side {} of a tile with {} sides", i, m_sides.size()));
    return m_sides[i];
}

uint32_t Epilogue::count(EpilogueSide::Kind kind) const {
    uint32_t n = 0;
    for (const EpilogueSide& s : sides) n += s.kind == kind;
    return n;
}

}  // namespace tpu::driver
