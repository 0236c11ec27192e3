// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

/// The fast MXU: functional matmul under the numerics contract and the timing of one MXU's
/// in-order queue (hw/README.md, "MXU"). hw/reference/systolic_ref.h re-derives both PE by PE.
namespace tpu::hw {

/// out (T x N, fp32) = [out +] lhs (T x K, bf16) x w (K x N, bf16). For each output, the
/// partial sum starts at +0.0 and adds the fp32 products a[t][k] * w[k][n] for k = 0..K-1 in
/// order, each product and each sum rounded to fp32; then it is stored or added to `out`.
/// Rows K..R-1 of the physical array hold zero weights and add +0.0, which changes nothing
/// (the partial sum starts at +0.0 so it is never -0.0, and x + +0.0 == x otherwise).
void mxu_matmul(const uint16_t* lhs, int T, int K, const uint16_t* w, int N, float* out,
                bool accumulate);

/// Start and done cycle of one MXU instruction.
struct MxuSpan {
    uint64_t start;  ///< first cycle the unit works on it
    uint64_t done;   ///< its result (or weights) are complete; completion flags rise here
};

/// Timing of one MXU of R x C PEs executing mxu.lw / mxu.mm in order.
///  lw: start = max(ready, previous start, previous lw done, shadow free); done = start + R.
///      The shadow buffer is free once the first mm after the previous lw has started (that
///      mm moved the weights to the active buffer), or at the previous lw's done if no mm used
///      it.
///  mm: start = max(ready, previous start, previous mm start + its T (input port), done of the
///      latest lw); done = start + T + R + C - 2 (fill, skew and drain of the array).
class MxuTimer {
public:
    MxuTimer(uint32_t rows, uint32_t cols) : m_rows(rows), m_cols(cols) {}
    /// Weight load issued to the unit at `ready`.
    MxuSpan lw(uint64_t ready);
    /// Matmul of T LHS rows issued at `ready`; throws std::logic_error without a prior lw.
    MxuSpan mm(uint64_t ready, uint32_t T);

private:
    uint32_t m_rows, m_cols;
    uint64_t m_last_start = 0;    ///< in-order issue
    uint64_t m_lw_done = 0;       ///< latest lw's done (weight path free, weights ready)
    uint64_t m_shadow_free = 0;   ///< shadow buffer may be overwritten from here
    uint64_t m_input_free = 0;    ///< LHS input port free from here
    bool m_have_lw = false;       ///< some lw was issued
    bool m_lw_consumed = true;    ///< latest lw already moved to the active buffer by an mm
};

}  // namespace tpu::hw
