// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/pool.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

using isa::Arg;
using isa::fimm;
using isa::imm;
using isa::Opcode;
using streaming::Body;
using streaming::Operand;
using streaming::Param;
using streaming::Spec;
using streaming::Stream;

/// -inf, the max-pool padding.
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// The VPU ops of one tile, counted once at the end (count()): large windows issue hundreds of
/// ops per tile, and one counter update per op would double the program.
class VpuOps {
public:
    explicit VpuOps(Body& b) : m_f(b.vpu_flag()) {}
    void operator()(Opcode op, std::initializer_list<Arg> args) { m_f.issue_deferred(op, args); }
    void count() { m_f.count_deferred(); }

private:
    isa::CountedFlag& m_f;
};

/// The layout the kernels use for one padded input row: its Wp = W + 2 pad columns split into
/// `stride` phases, phase r holding padded columns r, r + s, r + 2 s, ... So window column kw of
/// output columns 0..OW-1 is the contiguous run of phase kw mod s starting at column kw div s,
/// and every VPU op streams whole output rows even with stride > 1: the DMA engine does the
/// strided gather, one 2-D transfer per row and phase.
struct Geo {
    uint32_t N, H, W, C, k, s, p, OH, OW;
    uint32_t J;  ///< columns per phase (covers every window and every input column)

    explicit Geo(const PoolShape& sh)
        : N(sh.batch),
          H(sh.height),
          W(sh.width),
          C(sh.channels),
          k(sh.kernel),
          s(sh.stride),
          p(sh.pad),
          OH(sh.out_height()),
          OW(sh.out_width()),
          J(std::max(OW + (k - 1) / s, (W + 2 * p + s - 1) / s)) {}
    /// Values of one output row.
    uint32_t n() const { return OW * C; }
    /// Phases a window reads (kw mod s for kw < k).
    uint32_t window_phases() const { return std::min(s, k); }
    /// Output rows whose windows hold one input row, at most.
    uint32_t windows_per_row() const { return (k + s - 1) / s; }
    /// Bytes of one phase column (C values).
    uint64_t col_bytes() const { return uint64_t(C) * 4; }
    /// The input columns in phase r: phase columns j0 .. j0 + count - 1, input column iw0 first.
    struct Cols {
        uint32_t j0 = 0, count = 0, iw0 = 0;
    };
    Cols cols(uint32_t r) const {
        Cols c;
        c.j0 = p > r ? (p - r + s - 1) / s : 0;
        if (W + p <= r) return c;
        const uint32_t j1 = std::min(J - 1, (W - 1 + p - r) / s);
        if (j1 < c.j0) return c;
        c.count = j1 - c.j0 + 1;
        c.iw0 = c.j0 * s + r - p;
        return c;
    }
};

/// Sets `values` fp32 at VMEM operand `at` to +0.0 (x > x is false for every x) or, with
/// `neg_inf`, to -inf; one or two VPU ops on `fill`.
void fill(isa::CountedFlag& f, Arg at, uint64_t values, bool neg_inf) {
    const Arg n = imm(static_cast<int64_t>(values));
    f.issue(Opcode::VCmpGt, {at, at, at, n});
    if (neg_inf) f.issue(Opcode::VAddS, {at, at, fimm(kNegInf), n});
}

/// Sets tmp(0) to the output row and tmp(1) to the image of the window a stream loads.
using RowPrefix = std::function<void(Body&, const isa::Reg& first)>;

/// A stream that loads phase r of input row oh * s - p + kh of image n into `area`: one strided
/// DMA from HBM tensor `x` when the row exists, else one VMEM copy of the padding kept in fixed
/// area `pad_fixed`. Either way exactly one transfer signals the flag.
Stream window_row(const Geo& g, const Operand& x, const RowPrefix& prefix, uint32_t kh, uint32_t r,
                  int area, int pad_fixed) {
    return Stream(
        x, area,
        [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
            const isa::Flag& flag) {
            isa::Builder& bb = b.builder();
            const isa::Reg &t0 = b.tmp(0), &t1 = b.tmp(1);
            const Geo::Cols c = g.cols(r);
            const uint64_t cb = g.col_bytes();
            const Arg bytes = imm(static_cast<int64_t>(c.count * cb));
            const Arg dst = b.at(slot, area) + static_cast<int64_t>(c.j0 * cb);
            const isa::Label ok = bb.label("row"), done = bb.label("row_done");
            prefix(b, first);
            bb.emit(Opcode::Mul, {t0, t0, imm(g.s)});
            bb.emit(Opcode::Add, {t0, t0, imm(int64_t(kh) - int64_t(g.p))});
            // A row above the image wraps to a large unsigned value.
            bb.emit(Opcode::Bltu, {t0, imm(g.H), ok});
            bb.emit(Opcode::DmaVv, {dst, b.f(pad_fixed), imm(1), bytes, bytes, bytes, flag});
            bb.emit(Opcode::Jmp, {done});
            bb.bind(ok);
            bb.emit(Opcode::Mul, {t1, t1, imm(g.H)});
            bb.emit(Opcode::Add, {t0, t0, t1});
            bb.emit(Opcode::Mul, {t0, t0, imm(static_cast<int64_t>(g.W * cb))});
            bb.emit(Opcode::Add, {t0, t0, x.value});
            const Arg cbi = imm(static_cast<int64_t>(cb));
            bb.emit(Opcode::DmaHv, {dst, t0 + static_cast<int64_t>(c.iw0 * cb), imm(c.count), cbi,
                                    cbi, imm(static_cast<int64_t>(cb * g.s)), flag});
            bb.bind(done);
        });
}

/// Forward kernels: the output row's image and row from the unit index.
RowPrefix forward_prefix(const Geo& g) {
    return [=](Body& b, const isa::Reg& first) {
        b.emit(Opcode::Remu, {b.tmp(0), first, imm(g.OH)});
        b.emit(Opcode::Divu, {b.tmp(1), first, imm(g.OH)});
    };
}

/// Backward kernels (a unit is an input row ih): output row (ih + p) div s - q, which wraps
/// to a large value below 0.
RowPrefix backward_prefix(const Geo& g, uint32_t q) {
    return [=](Body& b, const isa::Reg& first) {
        const isa::Reg& t0 = b.tmp(0);
        b.emit(Opcode::Remu, {t0, first, imm(g.H)});
        b.emit(Opcode::Add, {t0, t0, imm(g.p)});
        b.emit(Opcode::Divu, {t0, t0, imm(g.s)});
        b.emit(Opcode::Sub, {t0, t0, imm(q)});
        b.emit(Opcode::Divu, {b.tmp(1), first, imm(g.H)});
    };
}

/// Window areas A[kh * phases + r] of one output row, appended to `sp`; returns the first.
int add_window(Spec& sp, const Geo& g, const Operand& x, const RowPrefix& prefix, int pad_fixed) {
    const int first = static_cast<int>(sp.fp.areas.size());
    for (uint32_t kh = 0; kh < g.k; ++kh)
        for (uint32_t r = 0; r < g.window_phases(); ++r) {
            const int area = static_cast<int>(sp.fp.areas.size());
            sp.fp.areas.push_back(g.J * g.C);
            if (g.cols(r).count) sp.ins.push_back(window_row(g, x, prefix, kh, r, area, pad_fixed));
        }
    return first;
}

/// Operand of window tap (kh, kw) for output columns 0..OW-1.
Arg tap(const Body& b, const Geo& g, int window, uint32_t kh, uint32_t kw) {
    const int area = window + static_cast<int>(kh * g.window_phases() + kw % g.s);
    return b.a(area) + static_cast<int64_t>(uint64_t(kw / g.s) * g.col_bytes());
}

/// out = max (or the sum) of the taps in window order.
void reduce_window(const Body& b, VpuOps& v, const Geo& g, int window, Arg out, bool is_max) {
    const Arg n = imm(g.n());
    if (g.k == 1) {
        if (is_max)
            v(Opcode::VMaxS, {out, tap(b, g, window, 0, 0), fimm(kNegInf), n});
        else
            v(Opcode::VAddS, {out, tap(b, g, window, 0, 0), fimm(-0.0f), n});
        return;
    }
    const Opcode op = is_max ? Opcode::VMax : Opcode::VAdd;
    v(op, {out, tap(b, g, window, 0, 0), tap(b, g, window, 0, 1), n});
    for (uint32_t t = 2; t < g.k * g.k; ++t)
        v(op, {out, out, tap(b, g, window, t / g.k, t % g.k), n});
}

/// Prologue: the padding areas of both slots and the fixed areas hold `pad` (and `zero`
/// fixed areas +0.0) before the first load; loads only ever overwrite the input columns.
void fill_prologue(Body& b, const Geo& g, int window, uint32_t windows, int pad_fixed, bool neg_inf,
                   int zero_fixed, uint32_t zero_values) {
    isa::CountedFlag f(b.builder(), "fill", isa::Count::AtBuild, 5);
    if (pad_fixed >= 0) fill(f, b.f(pad_fixed), uint64_t(g.J) * g.C, neg_inf);
    if (zero_fixed >= 0) fill(f, b.f(zero_fixed), zero_values, false);
    for (int slot = 0; slot < 2; ++slot)
        for (uint32_t a = 0; a < windows * g.k * g.window_phases(); ++a)
            fill(f, b.slot(slot, window + static_cast<int>(a)), uint64_t(g.J) * g.C, neg_inf);
    f.wait_all();
}

float inv_window(const Geo& g) {
    return 1.0f / static_cast<float>(g.k * g.k);
}

/// Forward max or average pooling, operands x, y.
Spec pool_spec(const PoolKey& k, std::span<const Operand> o) {
    const Geo g(k.shape);
    const bool is_max = k.op == PoolOp::Max;
    Spec sp;
    sp.fp = {k.name(), uint64_t(g.N) * g.OH, {}, {g.J * g.C}, 1};
    const int window = add_window(sp, g, o[0], forward_prefix(g), 0);
    const int out = static_cast<int>(sp.fp.areas.size());
    sp.fp.areas.push_back(g.n());
    sp.outs = {{o[1], out}};
    sp.prologue = [=](Body& b) { fill_prologue(b, g, window, 1, 0, is_max, -1, 0); };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        reduce_window(b, v, g, window, b.a(out), is_max);
        if (!is_max && g.k > 1)
            v(Opcode::VMulS, {b.a(out), b.a(out), fimm(inv_window(g)), imm(g.n())});
        if (!is_max && g.k == 1) v(Opcode::VMulS, {b.a(out), b.a(out), fimm(1.0f), imm(g.n())});
        v.count();
    };
    return sp;
}

/// A stream that loads output row (ih + p) div s - q of dy into `area` when that window holds
/// input row ih (kernel row (ih + p) mod s + q s < k, output row in range), else zeros from
/// fixed area `zero_fixed`.
Stream dy_row(const Geo& g, const Operand& dy, uint32_t q, int area, int zero_fixed) {
    return Stream(
        dy, area,
        [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
            const isa::Flag& flag) {
            isa::Builder& bb = b.builder();
            const isa::Reg &t0 = b.tmp(0), &t1 = b.tmp(1);
            const Arg bytes = imm(int64_t(g.n()) * 4);
            const Arg dst = b.at(slot, area);
            const isa::Label bad = bb.label("dy_zero"), done = bb.label("dy_done");
            bb.emit(Opcode::Remu, {t0, first, imm(g.H)});
            bb.emit(Opcode::Add, {t0, t0, imm(g.p)});
            bb.emit(Opcode::Remu, {t1, t0, imm(g.s)});
            bb.emit(Opcode::Add, {t1, t1, imm(int64_t(q) * g.s)});
            bb.emit(Opcode::Bge, {t1, imm(g.k), bad});
            bb.emit(Opcode::Divu, {t0, t0, imm(g.s)});
            bb.emit(Opcode::Blt, {t0, imm(q), bad});
            bb.emit(Opcode::Sub, {t0, t0, imm(q)});
            bb.emit(Opcode::Bge, {t0, imm(g.OH), bad});
            bb.emit(Opcode::Divu, {t1, first, imm(g.H)});
            bb.emit(Opcode::Mul, {t1, t1, imm(g.OH)});
            bb.emit(Opcode::Add, {t0, t0, t1});
            bb.emit(Opcode::Mul, {t0, t0, bytes});
            bb.emit(Opcode::Add, {t0, t0, dy.value});
            bb.emit(Opcode::DmaHv, {dst, t0, imm(1), bytes, bytes, bytes, flag});
            bb.emit(Opcode::Jmp, {done});
            bb.bind(bad);
            bb.emit(Opcode::DmaVv, {dst, b.f(zero_fixed), imm(1), bytes, bytes, bytes, flag});
            bb.bind(done);
        });
}

/// Backward: phase areas D[r] (r < s) of the dx row, zeroed per tile, and one store per phase
/// with input columns into dx with a strided DMA. Returns the first area.
int add_dx_phases(Spec& sp, const Geo& g, const Operand& dx) {
    const int first = static_cast<int>(sp.fp.areas.size());
    for (uint32_t r = 0; r < g.s; ++r) {
        const int area = static_cast<int>(sp.fp.areas.size());
        sp.fp.areas.push_back(g.J * g.C);
        const Geo::Cols c = g.cols(r);
        if (!c.count) continue;
        sp.outs.emplace_back(
            dx, area,
            [=](Body& b, const isa::Reg& first_unit, const isa::Reg&, const isa::Reg& slot,
                const isa::Flag& flag) {
                const uint64_t cb = g.col_bytes();
                const isa::Reg& t0 = b.tmp(0);
                b.emit(Opcode::Mul, {t0, first_unit, imm(int64_t(g.W * cb))});
                b.emit(Opcode::Add, {t0, t0, dx.value});
                const Arg cbi = imm(int64_t(cb));
                b.emit(Opcode::DmaVh,
                       {t0 + int64_t(c.iw0 * cb), b.at(slot, area) + int64_t(c.j0 * cb),
                        imm(c.count), cbi, imm(int64_t(cb * g.s)), cbi, flag});
            });
    }
    return first;
}

/// Operand of phase area D[kw mod s] at the column where window column kw of output column 0
/// lands.
Arg dx_at(const Body& b, const Geo& g, int phases, uint32_t kw) {
    return b.a(phases + static_cast<int>(kw % g.s)) + int64_t(uint64_t(kw / g.s) * g.col_bytes());
}

void zero_phases(const Body& b, VpuOps& v, const Geo& g, int phases) {
    for (uint32_t r = 0; r < g.s; ++r) {
        const Arg d = b.a(phases + static_cast<int>(r));
        v(Opcode::VCmpGt, {d, d, d, imm(int64_t(g.J) * g.C)});
    }
}

/// Backward of average pooling, operands dy, dx.
Spec avg_grad_spec(const PoolKey& k, std::span<const Operand> o) {
    const Geo g(k.shape);
    Spec sp;
    sp.fp = {k.name(), uint64_t(g.N) * g.H, {}, {g.n()}, 1};
    const uint32_t Q = g.windows_per_row();
    for (uint32_t q = 0; q < Q; ++q) {
        sp.ins.push_back(dy_row(g, o[0], q, static_cast<int>(sp.fp.areas.size()), 0));
        sp.fp.areas.push_back(g.n());
    }
    const int gs = static_cast<int>(sp.fp.areas.size());
    sp.fp.areas.push_back(g.n());
    const int phases = add_dx_phases(sp, g, o[1]);
    sp.prologue = [=](Body& b) {
        isa::CountedFlag f(b.builder(), "fill", isa::Count::AtBuild, 5);
        fill(f, b.f(0), g.n(), false);
        f.wait_all();
    };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        zero_phases(b, v, g, phases);
        for (uint32_t q = 0; q < Q; ++q) {
            v(Opcode::VMulS, {b.a(gs), b.a(static_cast<int>(q)), fimm(inv_window(g)), imm(g.n())});
            for (uint32_t kw = 0; kw < g.k; ++kw) {
                const Arg d = dx_at(b, g, phases, kw);
                v(Opcode::VAdd, {d, d, b.a(gs), imm(g.n())});
            }
        }
        v.count();
    };
    return sp;
}

/// Backward of max pooling, operands x, dy, dx.
Spec max_grad_spec(const PoolKey& k, std::span<const Operand> o) {
    const Geo g(k.shape);
    enum { Pad, Zero };
    Spec sp;
    const uint32_t Q = g.windows_per_row(), n = g.n(), taps = g.k * g.k;
    sp.fp = {k.name(), uint64_t(g.N) * g.H, {}, {g.J * g.C, n}, 1};
    std::vector<int> window, dy, out, routed;
    for (uint32_t q = 0; q < Q; ++q)
        window.push_back(add_window(sp, g, o[0], backward_prefix(g, q), Pad));
    for (uint32_t q = 0; q < Q; ++q) {
        dy.push_back(static_cast<int>(sp.fp.areas.size()));
        sp.ins.push_back(dy_row(g, o[1], q, dy.back(), Zero));
        out.push_back(dy.back() + 1);
        routed.push_back(dy.back() + 2);
        sp.fp.areas.insert(sp.fp.areas.end(), {n, n, taps * n});
    }
    const int Z = static_cast<int>(sp.fp.areas.size()), NF = Z + 1, GT = Z + 2, MT = Z + 3;
    sp.fp.areas.insert(sp.fp.areas.end(), {n, n, n, n});
    const int phases = add_dx_phases(sp, g, o[2]);
    sp.prologue = [=](Body& b) { fill_prologue(b, g, window[0], Q, Pad, true, Zero, n); };
    sp.body = [=](Body& b) {
        isa::Builder& bb = b.builder();
        const isa::Reg& row = b.scratch();
        const Arg N = imm(n);
        VpuOps v(b);
        zero_phases(b, v, g, phases);
        v(Opcode::VCmpGt, {b.a(Z), b.a(Z), b.a(Z), N});
        for (uint32_t q = 0; q < Q; ++q) {
            // Route dy to the first tap equal to the window's maximum: NF is 1 until a tap has
            // taken it, so each window's dy lands exactly once.
            reduce_window(b, v, g, window[q], b.a(out[q]), true);
            v(Opcode::VAddS, {b.a(NF), b.a(Z), fimm(1.0f), N});
            for (uint32_t t = 0; t < taps; ++t) {
                v(Opcode::VCmpGt,
                  {b.a(GT), b.a(out[q]), tap(b, g, window[q], t / g.k, t % g.k), N});
                v(Opcode::VSel, {b.a(MT), b.a(GT), b.a(Z), b.a(NF), N});
                v(Opcode::VSub, {b.a(NF), b.a(NF), b.a(MT), N});
                v(Opcode::VMul,
                  {b.a(routed[q]) + int64_t(uint64_t(t) * n * 4), b.a(MT), b.a(dy[q]), N});
            }
            // Input row ih is kernel row (ih + p) mod s + q s of this window; when that is past
            // the kernel, dy is zeros and any row will do, so take row 0.
            const isa::Label ok = bb.label("kernel_row");
            bb.emit(Opcode::Remu, {row, b.first(), imm(g.H)});
            bb.emit(Opcode::Add, {row, row, imm(g.p)});
            bb.emit(Opcode::Remu, {row, row, imm(g.s)});
            bb.emit(Opcode::Add, {row, row, imm(int64_t(q) * g.s)});
            bb.emit(Opcode::Blt, {row, imm(g.k), ok});
            bb.emit(Opcode::Li, {row, imm(0)});
            bb.bind(ok);
            bb.emit(Opcode::Mul, {row, row, imm(int64_t(g.k) * n * 4)});
            bb.emit(Opcode::Add, {row, row, b.a(0) - int64_t(b.off(0))});  // + the slot base
            for (uint32_t kw = 0; kw < g.k; ++kw) {
                const Arg d = dx_at(b, g, phases, kw);
                v(Opcode::VAdd, {d, d, row + int64_t(b.off(routed[q]) + uint64_t(kw) * n * 4), N});
            }
        }
        v.count();
    };
    return sp;
}

/// Global average pooling, operands x, y: one image per tile.
Spec gap_spec(const PoolKey& k, std::span<const Operand> o) {
    enum { X, Sum, Y };
    const uint32_t hw = k.shape.height * k.shape.width, C = k.shape.channels;
    Spec sp;
    sp.fp = {k.name(), k.shape.batch, {hw * C, C, C}, {}, 1};
    sp.ins = {{o[0], X}};
    sp.outs = {{o[1], Y}};
    const float inv = 1.0f / static_cast<float>(hw);
    sp.body = [=](Body& b) {
        VpuOps v(b);
        v(Opcode::VCSum, {b.a(Sum), b.a(X), imm(hw), imm(C)});
        v(Opcode::VMulS, {b.a(Y), b.a(Sum), fimm(inv), imm(C)});
        v.count();
    };
    return sp;
}

/// Backward of global average pooling, operands dy, dx.
Spec gap_grad_spec(const PoolKey& k, std::span<const Operand> o) {
    enum { G, G2, Nz, Dx };
    const uint32_t hw = k.shape.height * k.shape.width, C = k.shape.channels;
    Spec sp;
    sp.fp = {k.name(), k.shape.batch, {C, C, hw * C, hw * C}, {}, 1};
    sp.ins = {{o[0], G}};
    sp.outs = {{o[1], Dx}};
    const float inv = 1.0f / static_cast<float>(hw);
    const Arg n = imm(int64_t(hw) * C);
    // -0.0 + g == g for every g, so broadcasting onto -0.0 copies the row exactly.
    sp.body = [=](Body& b) {
        VpuOps v(b);
        v(Opcode::VMulS, {b.a(G2), b.a(G), fimm(inv), imm(C)});
        v(Opcode::VCmpGt, {b.a(Nz), b.a(Nz), b.a(Nz), n});
        v(Opcode::VMulS, {b.a(Nz), b.a(Nz), fimm(-1.0f), n});
        v(Opcode::VAddRow, {b.a(Dx), b.a(Nz), b.a(G2), imm(hw), imm(C)});
        v.count();
    };
    return sp;
}

Spec pool_spec_of(const PoolKey& k, std::span<const Operand> o) {
    switch (k.op) {
        case PoolOp::Max:
        case PoolOp::Avg:
            return pool_spec(k, o);
        case PoolOp::MaxGrad:
            return max_grad_spec(k, o);
        case PoolOp::AvgGrad:
            return avg_grad_spec(k, o);
        case PoolOp::Global:
            return gap_spec(k, o);
        case PoolOp::GlobalGrad:
            return gap_grad_spec(k, o);
    }
    throw isa::BuildError("pool: unknown PoolOp");
}

void check_io(const PoolShape& s, const char* name, const Tensor& in, uint32_t in_rows,
              const Tensor& out, uint32_t out_rows) {
    s.validate(name);
    check_tensor(in, in_rows, s.channels, in, name, "input");
    check_tensor(out, out_rows, s.channels, in, name, "output");
}

uint32_t in_rows(const PoolShape& s) {
    return s.batch * s.height * s.width;
}
uint32_t out_rows(const PoolShape& s) {
    return s.batch * s.out_height() * s.out_width();
}

/// The global pooling's shape (its window fields ignored), checked against the image tensor
/// and the batch x channels one.
PoolShape whole_image(const PoolShape& s, const char* name, const Tensor& images,
                      const Tensor& per_image) {
    PoolShape g = s;
    g.kernel = 1, g.stride = 1, g.pad = 0;
    check_io(g, name, images, in_rows(g), per_image, g.batch);
    return g;
}

/// max_nan of the VPU: NaN if either is NaN, else the larger (the second on ties).
float max_nan(float x, float y) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<float>::quiet_NaN();
    return x > y ? x : y;
}

/// Host view of one image padded with `pad_value`.
struct Padded {
    const PoolShape& s;
    const std::vector<float>& x;
    float pad_value;
    float at(uint32_t n, int64_t ih, int64_t iw, uint32_t c) const {
        if (ih < 0 || iw < 0 || ih >= s.height || iw >= s.width) return pad_value;
        return x[((size_t(n) * s.height + size_t(ih)) * s.width + size_t(iw)) * s.channels + c];
    }
    /// Tap (kh, kw) of the window of output (oh, ow).
    float tap(uint32_t n, uint32_t oh, uint32_t ow, uint32_t kh, uint32_t kw, uint32_t c) const {
        return at(n, int64_t(oh) * s.stride - s.pad + kh, int64_t(ow) * s.stride - s.pad + kw, c);
    }
};

/// Calls f(n, oh, ow, c, output index) for every output value.
void for_each_output(const PoolShape& s,
                     const std::function<void(uint32_t, uint32_t, uint32_t, uint32_t, size_t)>& f) {
    size_t i = 0;
    for (uint32_t n = 0; n < s.batch; ++n)
        for (uint32_t oh = 0; oh < s.out_height(); ++oh)
            for (uint32_t ow = 0; ow < s.out_width(); ++ow)
                for (uint32_t c = 0; c < s.channels; ++c) f(n, oh, ow, c, i++);
}

/// dx per input value from +0.0: sum of contribution(n, oh, ow, kh, kw, c) over the windows
/// that hold it, by decreasing output row, then increasing kernel column (the kernels' order).
std::vector<float> gather_grad(
    const PoolShape& s,
    const std::function<float(uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t)>& part) {
    const uint32_t OH = s.out_height(), OW = s.out_width(), k = s.kernel, st = s.stride;
    std::vector<float> dx(size_t(in_rows(s)) * s.channels);
    size_t i = 0;
    for (uint32_t n = 0; n < s.batch; ++n)
        for (uint32_t ih = 0; ih < s.height; ++ih)
            for (uint32_t iw = 0; iw < s.width; ++iw)
                for (uint32_t c = 0; c < s.channels; ++c) {
                    float acc = 0.0f;
                    const uint32_t ph = ih + s.pad, pw = iw + s.pad;
                    for (uint32_t q = 0; q <= ph / st; ++q) {
                        const uint32_t oh = ph / st - q, kh = ph % st + q * st;
                        if (kh >= k) break;
                        if (oh >= OH) continue;
                        for (uint32_t kw = 0; kw < k && kw <= pw; ++kw) {
                            if ((pw - kw) % st) continue;
                            const uint32_t ow = (pw - kw) / st;
                            if (ow < OW) acc = acc + part(n, oh, ow, kh, kw, c);
                        }
                    }
                    dx[i++] = acc;
                }
    return dx;
}

}  // namespace

uint32_t PoolShape::out_height() const {
    return (height + 2 * pad - kernel) / stride + 1;
}

uint32_t PoolShape::out_width() const {
    return (width + 2 * pad - kernel) / stride + 1;
}

void PoolShape::validate(const char* kernel_name) const {
    auto bad = [&](const std::string& what) {
        throw DeviceError(ErrorKind::Usage, fmt::format("{}: {}", kernel_name, what));
    };
    if (!batch || !height || !width || !channels)
        bad(fmt::format("empty input {} x {} x {} x {}", batch, height, width, channels));
    if (!kernel || !stride)
        bad(fmt::format("kernel {} and stride {} must be >= 1", kernel, stride));
    // In 64 bits: 2 x pad wraps in 32, and so would the rows of a large batch.
    const uint64_t pad2 = 2 * uint64_t(pad);
    if (pad2 > kernel) bad(fmt::format("pad {} is more than half the kernel {}", pad, kernel));
    if (height + pad2 < kernel || width + pad2 < kernel)
        bad(fmt::format("kernel {} is larger than the padded input {} x {}", kernel, height + pad2,
                        width + pad2));
    const uint64_t rows = uint64_t(batch) * height * width;
    if (rows > UINT32_MAX)
        bad(
            fmt::format("batch {} x height {} x width {} = {} rows, more than a tensor holds "
                        "(2^32 - 1)",
                        batch, height, width, rows));
}

std::string PoolKey::name() const {
    switch (op) {
        case PoolOp::Max:
            return "max_pool2d";
        case PoolOp::Avg:
            return "avg_pool2d";
        case PoolOp::MaxGrad:
            return "max_pool2d_grad";
        case PoolOp::AvgGrad:
            return "avg_pool2d_grad";
        case PoolOp::Global:
            return "global_avg_pool";
        case PoolOp::GlobalGrad:
            return "global_avg_pool_grad";
    }
    return "pool";
}

PoolKey plan_pool(PoolOp op, const PoolShape& s, uint64_t vmem_bytes) {
    PoolKey k{op, s};
    if (op == PoolOp::Global || op == PoolOp::GlobalGrad) {
        k.shape.kernel = 1, k.shape.stride = 1, k.shape.pad = 0;
    }
    k.shape.validate(k.name().c_str());
    streaming::plan(pool_spec_of(k, streaming::placeholders(pool_params(k))).fp, vmem_bytes);
    return k;
}

std::vector<Param> pool_params(const PoolKey& k) {
    switch (k.op) {
        case PoolOp::MaxGrad:
            return {{"x"}, {"dy"}, {"dx"}};
        case PoolOp::AvgGrad:
        case PoolOp::GlobalGrad:
            return {{"dy"}, {"dx"}};
        default:
            return {{"x"}, {"y"}};
    }
}

void emit(isa::Builder& b, const PoolKey& k, std::span<const Operand> ops) {
    streaming::check_operands(k.name(), pool_params(k), ops);
    streaming::emit(b, pool_spec_of(k, ops), 1);
}

isa::Program generate(const PoolKey& k) {
    return streaming::standalone(k.name(), pool_params(k), 1,
                                 [&](std::span<const Operand> o) { return pool_spec_of(k, o); });
}

namespace {

/// Plans and launches `op` over the tensors' core set, operands in pool_params order.
Event run_pool(Device& dev, ProgramCache& cache, PoolOp op, const PoolShape& s,
               std::initializer_list<const Tensor*> tensors) {
    const PoolKey k = plan_pool(op, s, dev.config().core.vmem_bytes);
    const std::vector<Param> params = pool_params(k);
    const Tensor& first = **tensors.begin();
    return launch(dev, cache, k, first.cores, [&](size_t i, LaunchArgs& a) {
        size_t p = 0;
        for (const Tensor* t : tensors) a.set(params[p++].name, t->bufs[i]);
    });
}

}  // namespace

Event max_pool2d(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                 const Tensor& y) {
    check_io(s, "max_pool2d", x, in_rows(s), y, out_rows(s));
    return run_pool(dev, cache, PoolOp::Max, s, {&x, &y});
}

Event avg_pool2d(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                 const Tensor& y) {
    check_io(s, "avg_pool2d", x, in_rows(s), y, out_rows(s));
    return run_pool(dev, cache, PoolOp::Avg, s, {&x, &y});
}

Event max_pool2d_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                      const Tensor& dy, const Tensor& dx) {
    check_io(s, "max_pool2d_grad", x, in_rows(s), dy, out_rows(s));
    check_tensor(dx, in_rows(s), s.channels, x, "max_pool2d_grad", "dx");
    return run_pool(dev, cache, PoolOp::MaxGrad, s, {&x, &dy, &dx});
}

Event avg_pool2d_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& dy,
                      const Tensor& dx) {
    check_io(s, "avg_pool2d_grad", dx, in_rows(s), dy, out_rows(s));
    return run_pool(dev, cache, PoolOp::AvgGrad, s, {&dy, &dx});
}

Event global_avg_pool(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                      const Tensor& y) {
    const PoolShape g = whole_image(s, "global_avg_pool", x, y);
    return run_pool(dev, cache, PoolOp::Global, g, {&x, &y});
}

Event global_avg_pool_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& dy,
                           const Tensor& dx) {
    const PoolShape g = whole_image(s, "global_avg_pool_grad", dx, dy);
    return run_pool(dev, cache, PoolOp::GlobalGrad, g, {&dy, &dx});
}

std::vector<float> max_pool2d_reference(const PoolShape& s, const std::vector<float>& x) {
    const Padded px{s, x, -std::numeric_limits<float>::infinity()};
    std::vector<float> y(size_t(out_rows(s)) * s.channels);
    for_each_output(s, [&](uint32_t n, uint32_t oh, uint32_t ow, uint32_t c, size_t i) {
        float acc = -std::numeric_limits<float>::infinity();
        for (uint32_t t = 0; t < s.kernel * s.kernel; ++t)
            acc = max_nan(acc, px.tap(n, oh, ow, t / s.kernel, t % s.kernel, c));
        y[i] = acc;
    });
    return y;
}

std::vector<float> avg_pool2d_reference(const PoolShape& s, const std::vector<float>& x) {
    const Padded px{s, x, 0.0f};
    const float inv = 1.0f / static_cast<float>(s.kernel * s.kernel);
    std::vector<float> y(size_t(out_rows(s)) * s.channels);
    for_each_output(s, [&](uint32_t n, uint32_t oh, uint32_t ow, uint32_t c, size_t i) {
        float acc = px.tap(n, oh, ow, 0, 0, c);
        for (uint32_t t = 1; t < s.kernel * s.kernel; ++t)
            acc = acc + px.tap(n, oh, ow, t / s.kernel, t % s.kernel, c);
        y[i] = acc * inv;
    });
    return y;
}

std::vector<float> max_pool2d_grad_reference(const PoolShape& s, const std::vector<float>& x,
                                             const std::vector<float>& dy) {
    const Padded px{s, x, -std::numeric_limits<float>::infinity()};
    const std::vector<float> y = max_pool2d_reference(s, x);
    const uint32_t OH = s.out_height(), OW = s.out_width(), k = s.kernel;
    return gather_grad(
        s, [&](uint32_t n, uint32_t oh, uint32_t ow, uint32_t kh, uint32_t kw, uint32_t c) {
            const size_t o = ((size_t(n) * OH + oh) * OW + ow) * s.channels + c;
            // The kernel's routing: nf stays 1 until the first tap not below the maximum.
            float nf = 1.0f, m = 0.0f;
            for (uint32_t t = 0; t <= kh * k + kw; ++t) {
                const bool gt = y[o] > px.tap(n, oh, ow, t / k, t % k, c);
                m = gt ? 0.0f : nf;
                nf = nf - m;
            }
            return m * dy[o];
        });
}

std::vector<float> avg_pool2d_grad_reference(const PoolShape& s, const std::vector<float>& dy) {
    const uint32_t OH = s.out_height(), OW = s.out_width();
    const float inv = 1.0f / static_cast<float>(s.kernel * s.kernel);
    return gather_grad(s,
                       [&](uint32_t n, uint32_t oh, uint32_t ow, uint32_t, uint32_t, uint32_t c) {
                           return dy[((size_t(n) * OH + oh) * OW + ow) * s.channels + c] * inv;
                       });
}

std::vector<float> global_avg_pool_reference(const PoolShape& s, const std::vector<float>& x) {
    const size_t hw = size_t(s.height) * s.width, C = s.channels;
    const float inv = 1.0f / static_cast<float>(hw);
    std::vector<float> y(size_t(s.batch) * C);
    for (size_t n = 0; n < s.batch; ++n)
        for (size_t c = 0; c < C; ++c) {
            float acc = 0.0f;
            for (size_t i = 0; i < hw; ++i) acc = acc + x[(n * hw + i) * C + c];
            y[n * C + c] = acc * inv;
        }
    return y;
}

std::vector<float> global_avg_pool_grad_reference(const PoolShape& s,
                                                  const std::vector<float>& dy) {
    const size_t hw = size_t(s.height) * s.width, C = s.channels;
    const float inv = 1.0f / static_cast<float>(hw);
    std::vector<float> dx(size_t(s.batch) * hw * C);
    for (size_t n = 0; n < s.batch; ++n)
        for (size_t i = 0; i < hw; ++i)
            for (size_t c = 0; c < C; ++c) dx[(n * hw + i) * C + c] = dy[n * C + c] * inv;
    return dx;
}

}  // namespace tpu::driver
