// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

/// The fast MXU: functional matmul under the numerics contract and the timing of one MXU's
/// in-order queue (hw/README.md, "MXU"). hw/reference/systolic_ref.h re-derives both PE by PE,
/// and tests/hw/mxu_test.cpp proves them equal. No SystemC here: the TensorCore calls these.
namespace tpu::hw {

/// Bits of the one NaN the MXU writes: every NaN result is this canonical quiet NaN.
inline constexpr uint32_t kMxuNanBits = 0x7FC00000u;

/// The weights of one mxu.lw in the form mxu_matmul computes with: fp32, columns padded to
/// the kernel's block width, and the exponent range that decides whether fused multiply-add
/// may be used (see mxu_model.cpp). Loading costs K x N conversions, once per mxu.lw.
class MxuTile {
public:
    /// Takes a K x N row-major bf16 tile.
    void load(const uint16_t* w_bf16, int K, int N);
    int rows() const { return m_K; }  ///< K
    int cols() const { return m_N; }  ///< N

    /// Biased fp32 exponents of the nonzero finite values of an operand, and whether it holds
    /// a denormal.
    struct ExpRange {
        int lo = 255;           ///< smallest exponent field of a nonzero finite value
        int hi = 0;             ///< largest; 0 when there is no nonzero finite value
        bool denormal = false;  ///< some value has exponent field 0 and a nonzero fraction
    };

private:
    friend void mxu_matmul(const uint16_t*, int, const MxuTile&, float*, bool);
    std::vector<float> m_w;  ///< K x m_stride fp32, columns N..m_stride-1 zero
    /// The rows of m_w that hold a nonzero value, and those rows alone (live x m_stride): a
    /// zero row adds only exact zeros, which cannot change a sum that starts at +0.0, so the
    /// arithmetic may skip it while the LHS column it meets is finite (see mxu_matmul).
    /// m_w_live is empty when every row is live (then there is nothing to skip).
    std::vector<int> m_live;
    std::vector<float> m_w_live;
    int m_K = 0, m_N = 0, m_stride = 0;
    ExpRange m_exp;
};

/// out (T x N, fp32) = [out +] lhs (T x K, bf16) x w (K x N, bf16), both row-major.
/// For each output (t, n) the partial sum starts at +0.0 and adds the fp32 products
/// a[t][k] * w[k][n] for k = 0..K-1 in order, each product and each sum rounded to fp32; the
/// result is then stored (`accumulate` false) or added to `out`. A NaN result is written as
/// kMxuNanBits, so results do not depend on which NaN operand the compiler put first.
/// K <= rows and N <= cols of the array; the zero padding of the rest is a no-op (see .cpp).
void mxu_matmul(const uint16_t* lhs_bf16, int T, const MxuTile& w, float* out, bool accumulate);
/// The same with the weights given as bf16 (prepared on every call).
void mxu_matmul(const uint16_t* lhs_bf16, int T, int K, const uint16_t* w_bf16, int N, float* out,
                bool accumulate);

/// Start and done cycle of one MXU instruction.
struct MxuSpan {
    uint64_t start;  ///< first cycle the unit works on it
    uint64_t done;   ///< its result (or weights) are complete; completion flags rise here
};

/// Timing of one MXU of R x C PEs executing mxu.lw / mxu.mm in order (hw/README.md,
/// "MXU timing"):
///  lw: start = max(ready, previous start, weight path free, shadow free); done = start + R.
///      The weight path is free at the previous lw's done. The shadow buffer is free once the
///      first mm after the previous lw has started (that mm moved the tile to the active
///      weights), or at the previous lw's done if no mm used it (the tile is overwritten).
///  mm: start = max(ready, previous start, input port free, done of the latest lw);
///      done = start + T + R + C - 2 (stream, skew down, skew across, write);
///      the input port is free at start + T. An mm after an mm reuses the active weights.
///      With `swap_drains`, an mm that moves a new tile into the array also waits for the
///      previous mm's done: the array swaps all its weights at once, so no earlier partial
///      sum may still be in it (a bubble of up to R + C - 2 cycles per tile).
class MxuTimer {
public:
    /// An idle MXU with `rows` x `cols` PEs and no weights loaded; `swap_drains` as
    /// CoreConfig::mxu_swap_drains.
    MxuTimer(uint32_t rows, uint32_t cols, bool swap_drains)
        : m_rows(rows), m_cols(cols), m_swap_drains(swap_drains) {}
    /// Weight load that reaches the unit at `ready`.
    MxuSpan lw(uint64_t ready);
    /// Matmul of T LHS rows that reaches the unit at `ready`; throws std::logic_error
    /// ("mxu.mm without loaded weights") if no lw came before it.
    MxuSpan mm(uint64_t ready, uint32_t T);
    /// Cycles from one matmul's start to the next one's in a stream where every matmul of T
    /// rows swaps in a tile loaded under its predecessor (double-buffered weights, the queues
    /// never empty): with `swap_drains` the predecessor's done, T + R + C - 2; otherwise the
    /// later of its input port (T) and the load that starts when it took the shadow (R). What a
    /// kernel planner charges per weight tile.
    static uint64_t swap_step_cycles(uint32_t rows, uint32_t cols, bool swap_drains, uint64_t T) {
        return swap_drains ? mm_cycles(rows, cols, T) : std::max<uint64_t>(T, rows);
    }
    /// Cycles from a matmul's start to its done (its results in VMEM): T + R + C - 2. What a
    /// kernel waits from a matmul's start before it may read the results.
    static uint64_t mm_cycles(uint32_t rows, uint32_t cols, uint64_t T) {
        return T + rows + cols - 2;
    }

private:
    uint32_t m_rows, m_cols;
    bool m_swap_drains;          ///< a tile swap waits for the array to drain
    uint64_t m_mm_done = 0;      ///< latest mm's done: the array is empty from here
    uint64_t m_last_start = 0;   ///< in-order queue: no start before the previous one
    uint64_t m_lw_done = 0;      ///< latest lw's done: weight path free, its tile complete
    uint64_t m_shadow_free = 0;  ///< start of the mm that consumed the latest lw
    uint64_t m_input_free = 0;   ///< LHS input port free from here
    bool m_have_lw = false;      ///< some lw was issued
    bool m_lw_consumed = true;   ///< latest lw already moved to the active weights by an mm
};

}  // namespace tpu::hw
