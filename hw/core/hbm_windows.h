// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "isa/isa.h"

namespace tpu::hw {

/// A core's HBM window map (isa/README.md, "HBM windows"): the one translation from the 32-bit
/// HBM addresses of DMA and ICI instructions to physical bytes, asked by the TensorCore, its
/// race detector and the cycle-stepped reference alike. Window w = addr >> 29 maps to
/// `base[w] x 256` bytes; after reset the map is the identity over the first 4 GiB, so a
/// program that never executes `hbm.map` addresses HBM exactly as before windows existed.
class HbmWindows {
public:
    HbmWindows() { reset(); }
    /// The identity map: window w at w x 512 MiB.
    void reset() {
        for (uint32_t w = 0; w < isa::kHbmWindows; ++w)
            m_base[w] = w * (isa::kHbmWindowBytes / isa::kHbmMapUnit);
    }
    /// `hbm.map w, units` (w < kHbmWindows, checked by the caller).
    void map(uint32_t w, uint32_t units) { m_base[w] = units; }
    /// Whether the map is the identity (no translation needed).
    bool identity() const {
        for (uint32_t w = 0; w < isa::kHbmWindows; ++w)
            if (m_base[w] != w * (isa::kHbmWindowBytes / isa::kHbmMapUnit)) return false;
        return true;
    }
    /// The physical byte of program address `a`. Addresses past 4 GiB (the end of a 2-D span
    /// that runs off the last window) continue in window 7's mapping.
    uint64_t phys(uint64_t a) const {
        const uint64_t w = std::min<uint64_t>(a >> isa::kHbmWindowBits, isa::kHbmWindows - 1);
        return uint64_t(m_base[w]) * isa::kHbmMapUnit + (a - (w << isa::kHbmWindowBits));
    }
    /// Whether [a, a + len) lies in one window (or past the last), so it translates as a whole.
    static bool one_window(uint64_t a, uint64_t len) {
        const uint64_t last = isa::kHbmWindows - 1;
        const uint64_t w0 = std::min<uint64_t>(a >> isa::kHbmWindowBits, last);
        const uint64_t w1 =
            std::min<uint64_t>((a + (len ? len - 1 : 0)) >> isa::kHbmWindowBits, last);
        return w0 == w1;
    }
    /// Calls f(program_address, physical_address, length) for each piece of [a, a + len) that
    /// lies in one window, in address order.
    template <class F>
    void pieces(uint64_t a, uint64_t len, F&& f) const {
        while (len > 0) {
            const uint64_t w = a >> isa::kHbmWindowBits;
            const uint64_t n = w >= isa::kHbmWindows - 1
                                   ? len
                                   : std::min(len, ((w + 1) << isa::kHbmWindowBits) - a);
            f(a, phys(a), n);
            a += n;
            len -= n;
        }
    }

    /// Calls f(row, skip, physical, rows, row_bytes) for each piece of a 2-D transfer (`rows`
    /// rows of `row_bytes`, `stride` apart, from program address `a`) whose HBM bytes lie in
    /// one window: runs of whole rows, and a row that crosses a boundary split at it (`skip`:
    /// the piece's first byte within row `row`). One piece unless the transfer crosses a window
    /// boundary. The TensorCore issues the pieces one after the other (core_model.cpp,
    /// exec_dma); the reference cuts its requests alike (core_ref.cpp).
    template <class F>
    void pieces_2d(uint64_t a, uint64_t rows, uint64_t row_bytes, uint64_t stride, F&& f) const {
        if (rows == 0 || one_window(a, (rows - 1) * stride + row_bytes)) {
            f(uint64_t(0), uint64_t(0), phys(a), rows, row_bytes);
            return;
        }
        const uint64_t none = UINT64_MAX;
        uint64_t run_w = none, run_row = 0, run_n = 0;
        const auto flush = [&] {
            if (run_n) f(run_row, uint64_t(0), phys(a + run_row * stride), run_n, row_bytes);
            run_w = none;
            run_n = 0;
        };
        for (uint64_t r = 0; r < rows; ++r) {
            const uint64_t ra = a + r * stride;
            if (one_window(ra, row_bytes)) {
                const uint64_t w =
                    std::min<uint64_t>(ra >> isa::kHbmWindowBits, isa::kHbmWindows - 1);
                if (w != run_w) {
                    flush();
                    run_w = w;
                    run_row = r;
                }
                ++run_n;
                continue;
            }
            flush();
            pieces(ra, row_bytes, [&](uint64_t pa, uint64_t ph, uint64_t n) {
                f(r, pa - ra, ph, uint64_t(1), n);
            });
        }
        flush();
    }

private:
    std::array<uint32_t, isa::kHbmWindows> m_base{};
};

}  // namespace tpu::hw
