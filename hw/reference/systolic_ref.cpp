// SPDX-License-Identifier: Apache-2.0
#include "hw/reference/systolic_ref.h"

#include <bit>
#include <cmath>
#include <stdexcept>

#include "hw/core/numerics.h"

namespace tpu::hw {

/// A matmul in flight: what its swap token captured and how many results are still inside.
struct SystolicRef::Matmul {
    uint64_t outputs_left = 0;   ///< T x C results (padding columns too) not yet out
    std::vector<float> weights;  ///< R x C: the row weight pipelines filled by its swap token
};

SystolicRef::SystolicRef(uint32_t rows, uint32_t cols, bool swap_drains)
    : m_rows(rows), m_cols(cols), m_swap_drains(swap_drains) {
    if (rows == 0 || cols == 0) throw std::invalid_argument("SystolicRef: empty array");
}

std::vector<MxuSpan> SystolicRef::run(const std::vector<SystolicRefInstr>& prog) {
    const uint32_t R = m_rows, C = m_cols;
    const size_t pes = size_t(R) * C;
    m_shadow.assign(pes, 0.0f);
    m_active.assign(pes, 0.0f);
    m_a.assign(pes, 0.0f);
    m_a_tag.assign(pes, -1);
    m_a_row.assign(pes, 0);
    m_a_swap.assign(pes, 0);
    m_p.assign(pes, 0.0f);
    m_p_tag.assign(pes, -1);
    m_p_row.assign(pes, 0);
    m_skew.assign(R, PortSlot{});
    for (auto& s : m_skew) s.a.assign(R, 0.0f);
    m_busy_pes = 0;

    const size_t n_instr = prog.size();
    std::vector<MxuSpan> spans(n_instr, MxuSpan{0, 0});
    std::vector<Matmul> mms(n_instr);
    size_t completed = 0;

    // Shadow buffer: Empty (never loaded), Loading (the loader is writing it), Full (a complete
    // tile no matmul has taken yet), Consumed (its tile went to the array; may be refilled).
    enum class Shadow { Empty, Loading, Full, Consumed } shadow = Shadow::Empty;
    int64_t loader = -1;  // lw being written by the weight loader, -1 = idle
    uint32_t loader_row = 0;
    int64_t port = -1;  // mm whose LHS rows the input port is emitting, -1 = idle
    uint32_t port_row = 0;
    bool port_swap = false;
    uint32_t valid_slots = 0;  // skew-line slots holding LHS data
    size_t head = 0;           // in-order queue head
    size_t mms_in_array = 0;   // matmuls started whose last result is not written yet

    for (uint64_t c = 0; completed < n_instr; ++c) {
        // (1) Issue from the queue head, in order; several may start in one cycle.
        while (head < n_instr && prog[head].ready <= c) {
            const SystolicRefInstr& ins = prog[head];
            if (ins.op == SystolicRefInstr::Op::Lw) {
                // The loader takes a tile once it wrote the last row of the previous one. The
                // shadow may then hold an untaken tile (overwritten) or a taken one whose rows
                // are still being captured by a swap token: that token captured row k at s + k,
                // and this load writes row k at c + k >= s + k (a capture reads before a write).
                if (loader >= 0) break;
                loader = int64_t(head);
                loader_row = 0;
                shadow = Shadow::Loading;
            } else {
                if (shadow == Shadow::Empty)
                    throw std::logic_error("mxu.mm without loaded weights");
                if (port >= 0) break;                  // the input port streams the previous mm
                if (shadow == Shadow::Loading) break;  // its tile is not complete yet
                // A swap with the array still holding an earlier matmul's results waits.
                if (m_swap_drains && shadow == Shadow::Full && mms_in_array > 0) break;
                port_swap = shadow == Shadow::Full;
                if (port_swap) {
                    shadow = Shadow::Consumed;
                    mms[head].weights.assign(pes, 0.0f);
                }
                port = int64_t(head);
                port_row = 0;
                mms[head].outputs_left = uint64_t(ins.T) * C;
                ++mms_in_array;
            }
            spans[head].start = c;
            ++head;
        }

        // (2) The input port emits one zero-padded LHS row into the skew line.
        PortSlot& slot = m_skew[c % R];
        valid_slots -= slot.tag >= 0;
        slot.tag = -1;
        if (port >= 0) {
            const SystolicRefInstr& ins = prog[size_t(port)];
            slot.tag = int32_t(port);
            slot.row = int32_t(port_row);
            slot.swap = port_swap && port_row == 0;
            for (uint32_t k = 0; k < R; ++k)
                slot.a[k] =
                    int(k) < ins.K ? bf16_to_f32(ins.lhs[size_t(port_row) * ins.K + k]) : 0.0f;
            ++valid_slots;
            if (++port_row == ins.T) port = -1;
        }

        // (3) Every PE works on what reached it this cycle (nothing to do in an empty array).
        if (m_busy_pes > 0 || valid_slots > 0) {
            const size_t finished = step_array(c, mms, prog, spans);
            completed += finished;
            mms_in_array -= finished;
        }

        // (4) The loader writes one tile row into the shadow registers.
        if (loader >= 0) {
            const SystolicRefInstr& ins = prog[size_t(loader)];
            float* dst = &m_shadow[size_t(loader_row) * C];
            for (uint32_t n = 0; n < C; ++n)
                dst[n] = int(loader_row) < ins.K && int(n) < ins.N
                             ? bf16_to_f32(ins.w[size_t(loader_row) * ins.N + n])
                             : 0.0f;
            if (++loader_row == R) {
                spans[size_t(loader)].done = c + 1;
                ++completed;
                loader = -1;
                shadow = Shadow::Full;
            }
        }

        // (5) Nothing moves and the head waits for its ready cycle: skip the empty cycles.
        if (loader < 0 && port < 0 && m_busy_pes == 0 && valid_slots == 0 && head < n_instr &&
            prog[head].ready > c + 1)
            c = prog[head].ready - 1;
    }
    return spans;
}

size_t SystolicRef::step_array(uint64_t c, std::vector<Matmul>& mms,
                               const std::vector<SystolicRefInstr>& prog,
                               std::vector<MxuSpan>& spans) {
    const uint32_t R = m_rows, C = m_cols;
    size_t completed = 0;
    uint32_t busy = 0;
    // Bottom-right to top-left, so each PE still sees its left and upper neighbours' registers
    // from the previous cycle.
    for (uint32_t k = R; k-- > 0;) {
        const PortSlot& in = m_skew[(c + R - k) % R];  // emitted k cycles ago
        for (uint32_t n = C; n-- > 0;) {
            const size_t i = size_t(k) * C + n;
            int32_t tag, row;
            bool swap;
            float a;
            if (n == 0) {
                tag = in.tag;
                row = in.row;
                swap = in.swap;
                a = in.a[k];
                // The swap token enters PE row k: the row's shadow weights join its pipeline.
                if (tag >= 0 && swap) {
                    float* wrow = &mms[size_t(tag)].weights[size_t(k) * C];
                    for (uint32_t j = 0; j < C; ++j) wrow[j] = m_shadow[size_t(k) * C + j];
                }
            } else {
                tag = m_a_tag[i - 1];
                row = m_a_row[i - 1];
                swap = m_a_swap[i - 1] != 0;
                a = m_a[i - 1];
            }
            m_a_tag[i] = tag;
            m_a_row[i] = row;
            m_a_swap[i] = swap;
            m_a[i] = a;
            m_p_tag[i] = tag;
            m_p_row[i] = row;
            if (tag < 0) continue;
            ++busy;
            if (swap) m_active[i] = mms[size_t(tag)].weights[i];
            float pin = 0.0f;
            if (k > 0) {
                // The partial sum from above must belong to the same LHS row of the same mm.
                if (m_p_tag[i - C] != tag || m_p_row[i - C] != row)
                    throw std::logic_error("SystolicRef: partial sums out of step");
                pin = m_p[i - C];
            }
            const float p = pin + a * m_active[i];
            m_p[i] = p;
            if (k + 1 < R) continue;
            // Leaves the bottom of column n.
            const SystolicRefInstr& ins = prog[size_t(tag)];
            if (int(n) < ins.N) {
                float& o = ins.out[size_t(row) * ins.N + n];
                const float r = ins.accumulate ? o + p : p;
                o = std::isnan(r) ? std::bit_cast<float>(kMxuNanBits) : r;
            }
            Matmul& mm = mms[size_t(tag)];
            if (--mm.outputs_left == 0) {
                spans[size_t(tag)].done = c + 1;
                mm.weights = {};
                ++completed;
            }
        }
    }
    m_busy_pes = busy;
    return completed;
}

}  // namespace tpu::hw
