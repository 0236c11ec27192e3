// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/attention.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>

#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

/// Rows [first, first + rows) of every replica of `t`, as a Tensor that aliases its memory.
Tensor rows_of(const Tensor& t, uint64_t first, uint32_t rows) {
    Tensor v = t;
    v.rows = rows;
    for (Buffer& b : v.bufs) {
        b.addr += first * t.cols * 4;
        b.bytes = uint64_t(rows) * t.cols * 4;
    }
    return v;
}

/// q and `per_head` are groups * seq x dhead on q's cores, p groups * seq x seq.
void check_shapes(const AttentionShape& s, const char* kernel, const Tensor& q,
                  std::initializer_list<std::pair<const Tensor*, const char*>> per_head,
                  const Tensor& p) {
    const uint32_t rows = s.groups() * s.seq;
    check_tensor(q, rows, s.dhead, q, kernel, "q");
    for (const auto& [t, label] : per_head) check_tensor(*t, rows, s.dhead, q, kernel, label);
    check_tensor(p, rows, s.seq, q, kernel, "p");
}

/// c_g = op(a_g) x op(b_g) for every head g, bf16 on the MXU.
void per_head(Device& dev, ProgramCache& cache, std::vector<Event>& evs, const AttentionShape& s,
              const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
    for (uint32_t g = 0; g < s.groups(); ++g) {
        const uint64_t r0 = uint64_t(g) * s.seq;
        evs.push_back(matmul(dev, cache, rows_of(a, r0, s.seq), ta, rows_of(b, r0, s.seq), tb,
                             rows_of(c, r0, s.seq), Precision::Bf16));
    }
}

/// Host: the seq x cols block of head g.
std::vector<float> block(const std::vector<float>& x, uint32_t g, uint32_t seq, uint32_t cols) {
    const auto* p = x.data() + size_t(g) * seq * cols;
    return {p, p + size_t(seq) * cols};
}

void put(std::vector<float>& x, uint32_t g, const std::vector<float>& b) {
    std::copy(b.begin(), b.end(), x.begin() + ptrdiff_t(g) * ptrdiff_t(b.size()));
}

}  // namespace

float AttentionShape::scale() const {
    return static_cast<float>(1.0 / std::sqrt(double(dhead)));
}

Event attention(Device& dev, ProgramCache& cache, const AttentionShape& s, const Tensor& q,
                const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& p) {
    check_shapes(s, "attention", q, {{&k, "k"}, {&v, "v"}, {&o, "o"}}, p);
    std::vector<Event> evs;
    // The scores go through p: Q K^T lands there and the softmax rewrites it in place, so the
    // forward pass needs no scratch beyond the matmuls' packed operands.
    per_head(dev, cache, evs, s, q, false, k, true, p);
    evs.push_back(scaled_softmax(dev, cache, p, s.scale(), s.causal, p));
    per_head(dev, cache, evs, s, p, false, v, false, o);
    return detail::merge(evs);
}

Event attention_grad(Device& dev, ProgramCache& cache, const AttentionShape& s, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& dout,
                     const Tensor& dq, const Tensor& dk, const Tensor& dv) {
    check_shapes(s, "attention_grad", q,
                 {{&k, "k"}, {&v, "v"}, {&dout, "dout"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}}, p);
    Tensor ds = alloc_tensor(dev, q.cores, s.groups() * s.seq, s.seq);
    std::vector<Event> evs;
    try {
        per_head(dev, cache, evs, s, p, true, dout, false, dv);
        per_head(dev, cache, evs, s, dout, false, v, true, ds);
        evs.push_back(scaled_softmax_grad(dev, cache, p, ds, s.scale(), ds));
        per_head(dev, cache, evs, s, ds, false, k, false, dq);
        per_head(dev, cache, evs, s, ds, true, q, false, dk);
    } catch (...) {
        free_tensor(dev, ds);
        throw;
    }
    free_tensor(dev, ds);
    return detail::merge(evs);
}

AttentionResult attention_reference(const AttentionShape& s, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    uint32_t mxu_rows) {
    const uint32_t S = s.seq, D = s.dhead;
    AttentionResult r{std::vector<float>(size_t(s.groups()) * S * D),
                      std::vector<float>(size_t(s.groups()) * S * S)};
    for (uint32_t g = 0; g < s.groups(); ++g) {
        const auto qg = block(q, g, S, D), kg = block(k, g, S, D), vg = block(v, g, S, D);
        const auto sc =
            matmul_reference(qg, S, D, false, kg, S, D, true, Precision::Bf16, mxu_rows);
        const auto pg = softmax_reference(sc, S, S, s.scale(), s.causal);
        put(r.p, g, pg);
        put(r.o, g, matmul_reference(pg, S, S, false, vg, S, D, false, Precision::Bf16, mxu_rows));
    }
    return r;
}

AttentionGradResult attention_grad_reference(const AttentionShape& s, const std::vector<float>& q,
                                             const std::vector<float>& k,
                                             const std::vector<float>& v,
                                             const std::vector<float>& p,
                                             const std::vector<float>& dout, uint32_t mxu_rows) {
    const uint32_t S = s.seq, D = s.dhead;
    const Precision bf = Precision::Bf16;
    AttentionGradResult r;
    r.dq.resize(q.size());
    r.dk.resize(q.size());
    r.dv.resize(q.size());
    for (uint32_t g = 0; g < s.groups(); ++g) {
        const auto qg = block(q, g, S, D), kg = block(k, g, S, D), vg = block(v, g, S, D);
        const auto pg = block(p, g, S, S), dog = block(dout, g, S, D);
        put(r.dv, g, matmul_reference(pg, S, S, true, dog, S, D, false, bf, mxu_rows));
        const auto dp = matmul_reference(dog, S, D, false, vg, S, D, true, bf, mxu_rows);
        const auto ds = softmax_grad_reference(pg, dp, S, S, s.scale());
        put(r.dq, g, matmul_reference(ds, S, S, false, kg, S, D, false, bf, mxu_rows));
        put(r.dk, g, matmul_reference(ds, S, S, true, qg, S, D, false, bf, mxu_rows));
    }
    return r;
}

}  // namespace tpu::driver
