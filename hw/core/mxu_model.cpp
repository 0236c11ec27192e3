// SPDX-License-Identifier: Apache-2.0
#include "hw/core/mxu_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "hw/core/numerics.h"

namespace tpu::hw {

// Why the physical array's zero padding is left out here: rows k >= K hold +0.0 weights and
// receive +0.0 LHS elements, so they add +0.0 * +0.0 = +0.0 to the partial sum. The partial sum
// starts at +0.0 and, in round-to-nearest, a sum is -0.0 only if both addends are -0.0, so it is
// never -0.0; and x + (+0.0) == x bit for bit for every other x, including +-inf and NaN.
// Columns n >= N are computed by the hardware but never written back.
//
// How it runs at host speed: a register-blocked kernel keeps a kRowBlock x kColBlock block of
// partial sums in SIMD registers while k runs 0..K-1, so every column still adds its products
// in k order from +0.0 (bit-identical to the PE chain) while each loaded weight vector serves
// kRowBlock rows. -ffp-contract=off keeps the compiler from fusing the * and +.
//
// When fused multiply-add is exact: a product of two bf16 values has at most 16 significant
// bits, so it is exact in fp32 unless it under- or overflows. With biased exponents e1, e2 of
// two normal nonzero values the product lies in [2^(e1+e2-254), 2^(e1+e2-252)): it is a normal
// fp32 value when e1 + e2 >= 128 and below 2^128 when e1 + e2 <= 380. Zeros, infinities and NaN
// give the same product either way. Then fma(a, w, p) = round(a*w + p) = round(round(a*w) + p),
// the contract's two roundings, so a call whose operands' exponent ranges satisfy both bounds
// (and hold no denormal) uses FMA, and any other call the separate multiply and add.
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
#if defined(__AVX512F__) || defined(__FMA__)
constexpr bool kHaveFma = true;
#else
constexpr bool kHaveFma = false;
#endif
// GCC and clang vector extension: the widest vector the target has, any target.
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
constexpr int kColVecs = 2;                      // vectors of columns per block
constexpr int kColBlock = kColVecs * kLanes;     // columns per block
constexpr int kRowBlock = kLanes == 16 ? 8 : 4;  // rows per block (32 or 16 registers)

Vec load(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// p + a * w, one rounding when kFma (only called with exact products, see above). A scalar
// operand of a vector operation is broadcast to every lane.
template <bool kFma>
Vec mul_add(float a, Vec w, Vec p) {
#if defined(__AVX512F__)
    if constexpr (kFma) return _mm512_fmadd_ps(_mm512_set1_ps(a), w, p);
#elif defined(__FMA__)
    if constexpr (kFma) return _mm256_fmadd_ps(_mm256_set1_ps(a), w, p);
#endif
    return p + a * w;
}

// The magnitude bits of a bf16 (sign cleared) order like the magnitudes: 0 is zero, 1..0x7F7F
// finite (below 0x80 denormal), 0x7F80 inf, above it NaN. So two branch-free min/max
// reductions, which the compiler vectorises, give the exponent range.
MxuTile::ExpRange exp_range(const uint16_t* v, size_t count) {
    // Written with explicit vectors: GCC does not vectorise the 16-bit min/max reductions.
    using U16 = uint16_t __attribute__((vector_size(sizeof(Vec))));
    constexpr size_t kN = sizeof(U16) / sizeof(uint16_t);
    U16 vmin, vmax = {};
    for (size_t l = 0; l < kN; ++l) vmin[l] = 0xFFFF;
    size_t i = 0;
    for (; i + kN <= count; i += kN) {
        U16 m;
        std::memcpy(&m, v + i, sizeof m);
        m &= 0x7FFF;
        const U16 m1 = m - 1;  // zero wraps to 0xFFFF
        const U16 lt = (U16)(m1 < vmin);
        vmin = (m1 & lt) | (vmin & ~lt);
        const U16 fin = (U16)(m < 0x7F80);
        const U16 mf = m & fin;
        const U16 gt = (U16)(mf > vmax);
        vmax = (mf & gt) | (vmax & ~gt);
    }
    uint16_t min_minus_1 = 0xFFFF, max_finite = 0;
    for (size_t l = 0; l < kN; ++l) {
        min_minus_1 = std::min<uint16_t>(min_minus_1, vmin[l]);
        max_finite = std::max<uint16_t>(max_finite, vmax[l]);
    }
    for (; i < count; ++i) {
        const uint16_t m = v[i] & 0x7FFF;
        min_minus_1 = std::min<uint16_t>(min_minus_1, uint16_t(m - 1));  // zero wraps to 0xFFFF
        max_finite = std::max<uint16_t>(max_finite, m < 0x7F80 ? m : 0);
    }
    const unsigned min_nonzero = unsigned(min_minus_1) + 1;  // 0x10000: all zero
    MxuTile::ExpRange r;
    r.hi = max_finite >> 7;
    r.denormal = min_nonzero < 0x80;
    r.lo = min_nonzero < 0x7F80 ? int(min_nonzero >> 7) : 255;
    return r;
}

bool products_exact(const MxuTile::ExpRange& a, const MxuTile::ExpRange& w) {
    if (a.denormal || w.denormal) return false;
    if (a.hi == 0 || w.hi == 0) return true;  // one side has only zeros, inf and NaN
    return a.lo + w.lo >= 128 && a.hi + w.hi <= 380;
}

// Rows [t0, t0 + kRowBlock) x columns [n0, n0 + kColBlock) of the padded problem; writes the
// valid part of the block to out.
template <bool kFma>
void block(const float* a, int K, const float* w, int stride, int t0, int n0, int T, int N,
           float* out, bool accumulate) {
    Vec acc[kRowBlock][kColVecs] = {};
    const float* ar = a + size_t(t0) * K;
    const float* wc = w + n0;
    for (int k = 0; k < K; ++k) {
        // Fully unrolled so that the block of partial sums lives in registers.
        Vec wv[kColVecs];
#pragma GCC unroll 4
        for (int j = 0; j < kColVecs; ++j) wv[j] = load(wc + size_t(k) * stride + j * kLanes);
#pragma GCC unroll 16
        for (int i = 0; i < kRowBlock; ++i) {
            const float ai = ar[size_t(i) * K + k];
#pragma GCC unroll 4
            for (int j = 0; j < kColVecs; ++j) acc[i][j] = mul_add<kFma>(ai, wv[j], acc[i][j]);
        }
    }
    const int rows = std::min(kRowBlock, T - t0), cols = std::min(kColBlock, N - n0);
    for (int i = 0; i < rows; ++i) {
        float p[kColBlock];
        std::memcpy(p, acc[i], sizeof p);
        float* o = out + size_t(t0 + i) * N + n0;
        for (int n = 0; n < cols; ++n) {
            const float r = accumulate ? o[n] + p[n] : p[n];
            o[n] = std::isnan(r) ? std::bit_cast<float>(kMxuNanBits) : r;
        }
    }
}

}  // namespace

void MxuTile::load(const uint16_t* w_bf16, int K, int N) {
    m_K = K;
    m_N = N;
    m_stride = (N + kColBlock - 1) / kColBlock * kColBlock;
    // Every element is written below (values, then the zero padding), so no fill first.
    m_w.resize(size_t(K) * m_stride);
    for (int k = 0; k < K; ++k) {
        float* row = m_w.data() + size_t(k) * m_stride;
        for (int n = 0; n < N; ++n) row[n] = bf16_to_f32(w_bf16[size_t(k) * N + n]);
        std::fill(row + N, row + m_stride, 0.0f);
    }
    m_exp = exp_range(w_bf16, size_t(K) * N);
    m_live.clear();
    m_w_live.clear();
    for (int k = 0; k < K; ++k) {
        const uint16_t* row = w_bf16 + size_t(k) * N;
        if (!std::all_of(row, row + N, [](uint16_t v) { return (v & 0x7FFF) == 0; }))
            m_live.push_back(k);
    }
    // mxu_matmul reads the live rows only when some row is dead; a full tile (the usual case)
    // would copy all of m_w for nothing.
    if (int(m_live.size()) < K)
        for (const int k : m_live)
            m_w_live.insert(m_w_live.end(), m_w.begin() + ptrdiff_t(size_t(k) * m_stride),
                            m_w.begin() + ptrdiff_t(size_t(k + 1) * m_stride));
}

void mxu_matmul(const uint16_t* lhs_bf16, int T, const MxuTile& w, float* out, bool accumulate) {
    const int N = w.m_N;
    // Zero weight rows (padding channels, mostly) add a[t][k] * 0 = +-0 to every sum, which
    // leaves it unchanged: a sum that starts at +0.0 is never -0.0 (x + -x rounds to +0.0).
    // Only an infinite or NaN a[t][k] would make that product NaN, so the skip needs the LHS
    // columns that meet zero rows to be finite.
    bool skip = int(w.m_live.size()) < w.m_K;
    if (skip)
        for (int t = 0; t < T && skip; ++t) {
            const uint16_t* row = lhs_bf16 + size_t(t) * w.m_K;
            for (int k = 0, live = 0; k < w.m_K; ++k) {
                if (live < int(w.m_live.size()) && w.m_live[size_t(live)] == k) {
                    ++live;
                } else if ((row[k] & 0x7F80) == 0x7F80) {
                    skip = false;
                    break;
                }
            }
        }
    const int K = skip ? int(w.m_live.size()) : w.m_K;
    // The LHS in fp32 (only the live columns when skipping), rows padded to the row block
    // (their results are never written).
    thread_local std::vector<float> a;
    const int t_pad = (T + kRowBlock - 1) / kRowBlock * kRowBlock;
    a.resize(size_t(t_pad) * K);
    if (skip) {
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < K; ++j)
                a[size_t(t) * K + j] =
                    bf16_to_f32(lhs_bf16[size_t(t) * w.m_K + size_t(w.m_live[size_t(j)])]);
    } else {
        for (size_t i = 0; i < size_t(T) * K; ++i) a[i] = bf16_to_f32(lhs_bf16[i]);
    }
    std::fill(a.begin() + ptrdiff_t(size_t(T) * K), a.end(), 0.0f);
    const float* wp = skip ? w.m_w_live.data() : w.m_w.data();
    const bool fma = kHaveFma && products_exact(exp_range(lhs_bf16, size_t(T) * w.m_K), w.m_exp);
    // Column blocks outside: one block's weights (K x kColBlock) stay in L1 while rows stream.
    for (int n0 = 0; n0 < N; n0 += kColBlock)
        for (int t0 = 0; t0 < T; t0 += kRowBlock) {
            if (fma)
                block<true>(a.data(), K, wp, w.m_stride, t0, n0, T, N, out, accumulate);
            else
                block<false>(a.data(), K, wp, w.m_stride, t0, n0, T, N, out, accumulate);
        }
}

void mxu_matmul(const uint16_t* lhs_bf16, int T, int K, const uint16_t* w_bf16, int N, float* out,
                bool accumulate) {
    thread_local MxuTile tile;
    tile.load(w_bf16, K, N);
    mxu_matmul(lhs_bf16, T, tile, out, accumulate);
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
    const uint64_t done = start + mm_cycles(m_rows, m_cols, T);
    m_last_start = start;
    m_input_free = start + T;
    m_mm_done = done;
    return {start, done};
}

}  // namespace tpu::hw
