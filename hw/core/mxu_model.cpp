// SPDX-License-Identifier: Apache-2.0
#include "hw/core/mxu_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "hw/core/numerics.h"

namespace tpu::hw {

// Why the physical array's zero padding is left out here: rows k >= K hold +0.0 weights and
// receive +0.0 LHS elements, so they add +0.0 * +0.0 = +0.0 to the partial sum. The partial sum
// starts at +0.0 and, in round-to-nearest, a sum is -0.0 only if both addends are -0.0, so it is
// never -0.0; and x + (+0.0) == x bit for bit for every other x, including +-inf and NaN.
// Columns n >= N are computed by the hardware but never written back.
void mxu_matmul(const uint16_t* lhs_bf16, int T, int K, const uint16_t* w_bf16, int N, float* out,
                bool accumulate) {
    // Converted once per call: the inner loop then runs on fp32 only and vectorises.
    thread_local std::vector<float> wf;
    thread_local std::vector<float> psum;
    thread_local std::vector<uint8_t> zero_row, finite_row;
    wf.resize(size_t(K) * N);
    psum.resize(size_t(N));
    zero_row.assign(size_t(K), 1);
    finite_row.assign(size_t(K), 1);
    for (int k = 0; k < K; ++k)
        for (int n = 0; n < N; ++n) {
            const float w = bf16_to_f32(w_bf16[size_t(k) * N + n]);
            wf[size_t(k) * N + n] = w;
            zero_row[k] &= w == 0.0f;
            finite_row[k] &= std::isfinite(w);
        }
    for (int t = 0; t < T; ++t) {
        std::fill(psum.begin(), psum.end(), 0.0f);
        // k outer, n inner: each column still adds its products in k order, and the n loop
        // has no dependence between iterations. -ffp-contract=off keeps * and + separate.
        for (int k = 0; k < K; ++k) {
            const float a = bf16_to_f32(lhs_bf16[size_t(t) * K + k]);
            // Products that are all +-0.0 leave every partial sum unchanged (it is never -0.0,
            // see above), so zero padding and ReLU zeros cost no host time. A zero times an
            // inf or NaN is NaN, so those are still computed.
            if ((a == 0.0f && finite_row[k]) || (zero_row[k] && std::isfinite(a))) continue;
            const float* wr = &wf[size_t(k) * N];
            float* p = psum.data();
            for (int n = 0; n < N; ++n) p[n] = p[n] + a * wr[n];
        }
        float* o = out + size_t(t) * N;
        for (int n = 0; n < N; ++n) {
            const float r = accumulate ? o[n] + psum[n] : psum[n];
            o[n] = std::isnan(r) ? std::bit_cast<float>(kMxuNanBits) : r;
        }
    }
}

MxuSpan MxuTimer::lw(uint64_t ready) {
    uint64_t start = std::max({ready, m_last_start, m_lw_done});
    if (m_have_lw) start = std::max(start, m_lw_consumed ? m_shadow_free : m_lw_done);
    const uint64_t done = start + m_rows;
    m_last_start = start;
    m_lw_done = done;
    m_have_lw = true;
    m_lw_consumed = false;
    return {start, done};
}

MxuSpan MxuTimer::mm(uint64_t ready, uint32_t T) {
    if (!m_have_lw) throw std::logic_error("mxu.mm without loaded weights");
    uint64_t start = std::max({ready, m_last_start, m_input_free});
    if (!m_lw_consumed) {
        start = std::max(start, m_lw_done);
        if (m_swap_drains) start = std::max(start, m_mm_done);
        // This mm moves the shadow tile into the array; the shadow may be refilled from now.
        m_shadow_free = start;
        m_lw_consumed = true;
    }
    const uint64_t done = start + T + m_rows + m_cols - 2;
    m_last_start = start;
    m_input_free = start + T;
    m_mm_done = done;
    return {start, done};
}

}  // namespace tpu::hw
