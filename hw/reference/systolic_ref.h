// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hw/core/mxu_model.h"

/// Cycle-stepped, PE-level reference of one MXU, used only by tests to prove MxuTimer and
/// mxu_matmul exact. It decides every start cycle from explicit hardware state (queue head,
/// weight loader, shadow buffer, input port) and moves every value one PE per cycle.
namespace tpu::hw {

/// One instruction in the reference MXU's queue. Buffers are owned by the caller.
struct SystolicRefInstr {
    /// Which instruction.
    enum class Op { Lw, Mm };
    Op op = Op::Lw;                 ///< lw (load weights) or mm (matmul)
    uint64_t ready = 0;             ///< cycle it reaches the unit
    int K = 0;                      ///< lw: tile rows; mm: LHS row length (the tile's K)
    int N = 0;                      ///< lw: tile columns; mm: output row length (the tile's N)
    const uint16_t* w = nullptr;    ///< lw: K x N bf16 weights, row-major
    uint32_t T = 0;                 ///< mm: LHS rows (>= 1)
    const uint16_t* lhs = nullptr;  ///< mm: T x K bf16 LHS, row-major
    float* out = nullptr;           ///< mm: T x N fp32 results
    bool accumulate = false;        ///< mm: add to `out` instead of overwriting it
};

/// R x C weight-stationary systolic array stepped one cycle at a time.
///
/// Hardware modelled (hw/README.md, "MXU"):
/// - lw: the weight loader writes tile row r into the shadow registers of PE row r at cycle
///   start + r (zero-padded to R x C), so the tile is complete at done = start + R.
/// - mm: the input port emits LHS row t (zero-padded to R) at cycle start + t; a skew delay line
///   of k stages brings element k to PE(k, 0) at start + t + k; it moves one PE right per cycle.
///   Each PE computes psum_out = psum_in + a * w (fp32), psum_in = +0.0 in row 0; partial sums
///   move one PE down per cycle and leave PE(R-1, n) at start + t + R - 1 + n.
/// - A matmul that consumes a new tile tags its first row with a swap token. When the token
///   enters PE row k (start + k) the row's shadow weights are captured into that row's weight
///   pipeline, which travels right with the token; PE(k, n) makes them active at start + k + n,
///   exactly when the matmul's first row reaches it. Earlier matmuls still in the array keep
///   their weights, and the shadow row may be refilled from that cycle on.
/// - With `swap_drains` (CoreConfig::mxu_swap_drains) the port holds such a matmul until
///   every earlier matmul's last result has been written: no partial sum is left in the array.
class SystolicRef {
public:
    /// An idle array of `rows` x `cols` PEs without weights.
    SystolicRef(uint32_t rows, uint32_t cols, bool swap_drains);
    /// Runs `prog` in order from cycle 0 until everything is done; writes every mm's `out`
    /// and returns each instruction's start and done. Throws std::logic_error
    /// ("mxu.mm without loaded weights") if an mm comes before any lw.
    std::vector<MxuSpan> run(const std::vector<SystolicRefInstr>& prog);

private:
    struct Matmul;
    /// Moves and computes every PE for one cycle; returns how many matmuls completed.
    size_t step_array(uint64_t cycle, std::vector<Matmul>& mms,
                      const std::vector<SystolicRefInstr>& prog, std::vector<MxuSpan>& spans);

    uint32_t m_rows, m_cols;
    bool m_swap_drains;
    std::vector<float> m_shadow;  ///< R x C shadow weight registers
    std::vector<float> m_active;  ///< R x C active weight registers
    // Per-PE pipeline registers (R x C): the LHS value passing right and its tag, and the
    // partial sum passing down. tag = index of the mm in the program, -1 = bubble.
    std::vector<float> m_a;
    std::vector<int32_t> m_a_tag;
    std::vector<int32_t> m_a_row;   ///< LHS row t of the value
    std::vector<uint8_t> m_a_swap;  ///< the value carries the swap token
    std::vector<float> m_p;
    std::vector<int32_t> m_p_tag;  ///< the partial sum's mm (checks the pipeline stays in step)
    std::vector<int32_t> m_p_row;  ///< the partial sum's LHS row
    uint32_t m_busy_pes = 0;       ///< PEs that held data after the last cycle
    // Input skew delay line: slot (cycle mod R) holds what the port emitted at that cycle; PE row
    // k reads the slot emitted k cycles earlier.
    struct PortSlot {
        int32_t tag = -1;
        int32_t row = 0;
        bool swap = false;
        std::vector<float> a;  ///< R elements
    };
    std::vector<PortSlot> m_skew;
};

}  // namespace tpu::hw
