// SPDX-License-Identifier: Apache-2.0
#include "hw/core/mxu_model.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "hw/core/numerics.h"

namespace tpu::hw {

void mxu_matmul(const uint16_t* lhs, int T, int K, const uint16_t* w, int N, float* out,
                bool accumulate) {
    std::vector<float> wf(size_t(K) * N);
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_f32(w[i]);
    std::vector<float> psum(N);
    for (int t = 0; t < T; ++t) {
        std::fill(psum.begin(), psum.end(), 0.0f);
        // k outer, n inner: every column still sums its products in k order.
        for (int k = 0; k < K; ++k) {
            const float a = bf16_to_f32(lhs[size_t(t) * K + k]);
            const float* wr = &wf[size_t(k) * N];
            for (int n = 0; n < N; ++n) psum[n] = psum[n] + a * wr[n];
        }
        float* o = out + size_t(t) * N;
        for (int n = 0; n < N; ++n) o[n] = accumulate ? o[n] + psum[n] : psum[n];
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
    if (!m_lw_consumed) start = std::max(start, m_lw_done);
    const uint64_t done = start + T + m_rows + m_cols - 2;
    if (!m_lw_consumed) {
        // This mm swaps the shadow weights into the array; the shadow is free from now.
        m_shadow_free = start;
        m_lw_consumed = true;
    }
    m_last_start = start;
    m_input_free = start + T;
    return {start, done};
}

}  // namespace tpu::hw
