// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/pool.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "driver/kernels/legacy_stream.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

using detail::Body;
using detail::f32_bits;
using detail::Spec;
using detail::Stream;

/// -inf as an fp32 immediate (the max-pool padding).
constexpr uint32_t kNegInfBits = 0xff800000u;

/// Emits VPU ops of the body on flag f2 and counts them once at the end: large windows issue
/// hundreds of ops per tile, and one counter update per op would double the program.
class VpuOps {
public:
    explicit VpuOps(Body& b) : m_b(b) {}
    VpuOps(const VpuOps&) = delete;
    VpuOps& operator=(const VpuOps&) = delete;
    ~VpuOps() {
        if (m_n) m_b.line(fmt::format("        add s26, s26, {}", m_n));
    }
    /// One VPU instruction.
    void operator()(const std::string& ins) {
        m_b.line(ins + ", f2");
        ++m_n;
    }

private:
    Body& m_b;
    int m_n = 0;
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
    std::string key() const { return fmt::format("{}x{}x{}x{} k{} s{} p{}", N, H, W, C, k, s, p); }
};

/// Sets `values` fp32 at VMEM operand `at` to +0.0 (x > x is false for every x) or, with
/// `neg_inf`, to -inf; one or two VPU ops on flag f5, returned.
int fill(Body& b, const std::string& at, uint64_t values, bool neg_inf) {
    b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", at, at, at, values));
    if (!neg_inf) return 1;
    b.line(fmt::format("        v.adds {}, {}, {:#x}, {}, f5", at, at, kNegInfBits, values));
    return 2;
}

/// Sets s13 to the output row and s14 to the image of the window a stream loads.
using RowPrefix = std::function<void(Body&, const std::string& first)>;

/// A stream that loads phase r of input row oh * s - p + kh of image n into `area`: one strided
/// DMA from HBM (arg `x_arg`) when the row exists, else one VMEM copy of the padding kept in
/// fixed area `pad_fixed`. Either way exactly one transfer signals the flag.
Stream window_row(const Geo& g, int x_arg, const RowPrefix& prefix, uint32_t q, uint32_t kh,
                  uint32_t r, int area, int pad_fixed) {
    return Stream(x_arg, area,
                  [=](Body& b, const std::string& first, const std::string&,
                      const std::string& slot, const std::string& flag) {
                      const Geo::Cols c = g.cols(r);
                      const uint64_t cb = g.col_bytes(), bytes = c.count * cb;
                      const std::string dst = fmt::format("[{}+{}]", slot, b.off(area) + c.j0 * cb);
                      const std::string ok = b.label(fmt::format("row{}_{}_{}", q, kh, r));
                      const std::string done = b.label(fmt::format("rowd{}_{}_{}", q, kh, r));
                      prefix(b, first);
                      b.line(fmt::format("        mul s13, s13, {}", g.s));
                      b.line(fmt::format("        add s13, s13, {}", int64_t(kh) - int64_t(g.p)));
                      // A row above the image wraps to a large unsigned value.
                      b.line(fmt::format("        bltu s13, {}, {}", g.H, ok));
                      b.line(fmt::format("        dma.vv {}, [{}], 1, {}, {}, {}, {}", dst,
                                         b.fixed_addr(pad_fixed), bytes, bytes, bytes, flag));
                      b.line(fmt::format("        jmp {}", done));
                      b.line(fmt::format("{}: mul s14, s14, {}", ok, g.H));
                      b.line("        add s13, s13, s14");
                      b.line(fmt::format("        mul s13, s13, {}", uint64_t(g.W) * cb));
                      b.line(fmt::format("        add s13, s13, s{}", x_arg));
                      b.line(fmt::format("        dma.hv {}, [s13+{}], {}, {}, {}, {}, {}", dst,
                                         uint64_t(c.iw0) * cb, c.count, cb, cb, cb * g.s, flag));
                      b.line(done + ":");
                  });
}

/// Forward kernels: the output row's image and row from the unit index.
RowPrefix forward_prefix(const Geo& g) {
    return [=](Body& b, const std::string& first) {
        b.line(fmt::format("        remu s13, {}, {}", first, g.OH));
        b.line(fmt::format("        divu s14, {}, {}", first, g.OH));
    };
}

/// Backward kernels (a unit is an input row ih): output row (ih + p) div s - q, which wraps
/// to a large value below 0.
RowPrefix backward_prefix(const Geo& g, uint32_t q) {
    return [=](Body& b, const std::string& first) {
        b.line(fmt::format("        remu s13, {}, {}", first, g.H));
        b.line(fmt::format("        add s13, s13, {}", g.p));
        b.line(fmt::format("        divu s13, s13, {}", g.s));
        b.line(fmt::format("        sub s13, s13, {}", q));
        b.line(fmt::format("        divu s14, {}, {}", first, g.H));
    };
}

/// Window areas A[kh * phases + r] of one output row, appended to `sp`; returns the first.
int add_window(Spec& sp, const Geo& g, int x_arg, const RowPrefix& prefix, uint32_t q,
               int pad_fixed) {
    const int first = static_cast<int>(sp.areas.size());
    for (uint32_t kh = 0; kh < g.k; ++kh)
        for (uint32_t r = 0; r < g.window_phases(); ++r) {
            const int area = static_cast<int>(sp.areas.size());
            sp.areas.push_back(g.J * g.C);
            if (g.cols(r).count)
                sp.ins.push_back(window_row(g, x_arg, prefix, q, kh, r, area, pad_fixed));
        }
    return first;
}

/// Operand of window tap (kh, kw) for output columns 0..OW-1.
std::string tap(const Body& b, const Geo& g, int window, uint32_t kh, uint32_t kw) {
    const int area = window + static_cast<int>(kh * g.window_phases() + kw % g.s);
    return fmt::format("[s19+{}]", b.off(area) + uint64_t(kw / g.s) * g.col_bytes());
}

/// out = max (or the sum) of the taps in window order.
void reduce_window(Body& b, VpuOps& v, const Geo& g, int window, const std::string& out,
                   bool is_max) {
    const char* op = is_max ? "v.max" : "v.add";
    const uint32_t n = g.n();
    if (g.k == 1) {
        if (is_max)
            v(fmt::format("        v.maxs {}, {}, {:#x}, {}", out, tap(b, g, window, 0, 0),
                          kNegInfBits, n));
        else
            v(fmt::format("        v.adds {}, {}, -0.0, {}", out, tap(b, g, window, 0, 0), n));
        return;
    }
    v(fmt::format("        {} {}, {}, {}, {}", op, out, tap(b, g, window, 0, 0),
                  tap(b, g, window, 0, 1), n));
    for (uint32_t t = 2; t < g.k * g.k; ++t)
        v(fmt::format("        {} {}, {}, {}, {}", op, out, out,
                      tap(b, g, window, t / g.k, t % g.k), n));
}

/// Prologue: the padding areas of both slots and the fixed areas hold `pad` (and `zero`
/// fixed areas +0.0) before the first load; loads only ever overwrite the input columns.
void fill_prologue(Body& b, const Geo& g, int window, uint32_t windows, int pad_fixed, bool neg_inf,
                   int zero_fixed, uint32_t zero_values) {
    int ops = 0;
    if (pad_fixed >= 0) ops += fill(b, b.f(pad_fixed), uint64_t(g.J) * g.C, neg_inf);
    if (zero_fixed >= 0) ops += fill(b, b.f(zero_fixed), zero_values, false);
    for (int slot = 0; slot < 2; ++slot)
        for (uint32_t a = 0; a < windows * g.k * g.window_phases(); ++a)
            ops +=
                fill(b, b.slot(slot, window + static_cast<int>(a)), uint64_t(g.J) * g.C, neg_inf);
    b.line(fmt::format("        wait f5, {}", ops));
}

float inv_window(const Geo& g) {
    return 1.0f / static_cast<float>(g.k * g.k);
}

Spec pool_spec(const Geo& g, bool is_max) {
    Spec sp;
    sp.name = fmt::format("{} {}", is_max ? "max_pool2d" : "avg_pool2d", g.key());
    sp.units = uint64_t(g.N) * g.OH;
    sp.max_tile_units = 1;
    sp.fixed = {g.J * g.C};
    const int window = add_window(sp, g, 1, forward_prefix(g), 0, 0);
    const int out = static_cast<int>(sp.areas.size());
    sp.areas.push_back(g.n());
    sp.outs = {{2, out}};
    sp.prologue = [=](Body& b) { fill_prologue(b, g, window, 1, 0, is_max, -1, 0); };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        reduce_window(b, v, g, window, b.a(out), is_max);
        if (!is_max && g.k > 1)
            v(fmt::format("        v.muls {}, {}, {}, {}", b.a(out), b.a(out),
                          f32_bits(inv_window(g)), g.n()));
        if (!is_max && g.k == 1)
            v(fmt::format("        v.muls {}, {}, 1.0, {}", b.a(out), b.a(out), g.n()));
    };
    return sp;
}

/// A stream that loads output row (ih + p) div s - q of dy (arg `dy_arg`) into `area` when
/// that window holds input row ih (kernel row (ih + p) mod s + q s < k, output row in range),
/// else zeros from fixed area `zero_fixed`.
Stream dy_row(const Geo& g, int dy_arg, uint32_t q, int area, int zero_fixed) {
    return Stream(dy_arg, area,
                  [=](Body& b, const std::string& first, const std::string&,
                      const std::string& slot, const std::string& flag) {
                      const uint64_t bytes = uint64_t(g.n()) * 4;
                      const std::string dst = b.at(slot, area);
                      const std::string bad = b.label(fmt::format("dyz{}", q));
                      const std::string done = b.label(fmt::format("dyd{}", q));
                      b.line(fmt::format("        remu s13, {}, {}", first, g.H));
                      b.line(fmt::format("        add s13, s13, {}", g.p));
                      b.line(fmt::format("        remu s14, s13, {}", g.s));
                      b.line(fmt::format("        add s14, s14, {}", q * g.s));
                      b.line(fmt::format("        bge s14, {}, {}", g.k, bad));
                      b.line(fmt::format("        divu s13, s13, {}", g.s));
                      b.line(fmt::format("        blt s13, {}, {}", q, bad));
                      b.line(fmt::format("        sub s13, s13, {}", q));
                      b.line(fmt::format("        bge s13, {}, {}", g.OH, bad));
                      b.line(fmt::format("        divu s14, {}, {}", first, g.H));
                      b.line(fmt::format("        mul s14, s14, {}", g.OH));
                      b.line("        add s13, s13, s14");
                      b.line(fmt::format("        mul s13, s13, {}", bytes));
                      b.line(fmt::format("        add s13, s13, s{}", dy_arg));
                      b.line(fmt::format("        dma.hv {}, [s13], 1, {}, {}, {}, {}", dst, bytes,
                                         bytes, bytes, flag));
                      b.line(fmt::format("        jmp {}", done));
                      b.line(fmt::format("{}: dma.vv {}, {}, 1, {}, {}, {}, {}", bad, dst,
                                         b.f(zero_fixed), bytes, bytes, bytes, flag));
                      b.line(done + ":");
                  });
}

/// Backward: phase areas D[r] (r < s) of the dx row, zeroed per tile, and one store per phase
/// with input columns into dx (arg `dx_arg`) with a strided DMA. Returns the first area.
int add_dx_phases(Spec& sp, const Geo& g, int dx_arg) {
    const int first = static_cast<int>(sp.areas.size());
    for (uint32_t r = 0; r < g.s; ++r) {
        const int area = static_cast<int>(sp.areas.size());
        sp.areas.push_back(g.J * g.C);
        const Geo::Cols c = g.cols(r);
        if (!c.count) continue;
        sp.outs.emplace_back(
            dx_arg, area,
            [=](Body& b, const std::string& first_unit, const std::string&, const std::string& slot,
                const std::string& flag) {
                const uint64_t cb = g.col_bytes();
                b.line(fmt::format("        mul s13, {}, {}", first_unit, uint64_t(g.W) * cb));
                b.line(fmt::format("        add s13, s13, s{}", dx_arg));
                b.line(
                    fmt::format("        dma.vh [s13+{}], [{}+{}], {}, {}, {}, "
                                "{}, {}",
                                uint64_t(c.iw0) * cb, slot, b.off(area) + c.j0 * cb, c.count, cb,
                                cb * g.s, cb, flag));
            });
    }
    return first;
}

/// Operand of phase area D[kw mod s] at the column where window column kw of output column 0
/// lands.
std::string dx_at(const Body& b, const Geo& g, int phases, uint32_t kw) {
    return fmt::format("[s19+{}]", b.off(phases + static_cast<int>(kw % g.s)) +
                                       uint64_t(kw / g.s) * g.col_bytes());
}

void zero_phases(Body& b, VpuOps& v, const Geo& g, int phases) {
    for (uint32_t r = 0; r < g.s; ++r) {
        const std::string d = b.a(phases + static_cast<int>(r));
        v(fmt::format("        v.cmpgt {}, {}, {}, {}", d, d, d, uint64_t(g.J) * g.C));
    }
}

Spec avg_grad_spec(const Geo& g) {
    Spec sp;
    sp.name = fmt::format("avg_pool2d_grad {}", g.key());
    sp.units = uint64_t(g.N) * g.H;
    sp.max_tile_units = 1;
    sp.fixed = {g.n()};
    const uint32_t Q = g.windows_per_row();
    for (uint32_t q = 0; q < Q; ++q) {
        sp.ins.push_back(dy_row(g, 1, q, static_cast<int>(sp.areas.size()), 0));
        sp.areas.push_back(g.n());
    }
    const int gs = static_cast<int>(sp.areas.size());
    sp.areas.push_back(g.n());
    const int phases = add_dx_phases(sp, g, 2);
    sp.prologue = [=](Body& b) {
        b.line(fmt::format("        wait f5, {}", fill(b, b.f(0), g.n(), false)));
    };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        zero_phases(b, v, g, phases);
        for (uint32_t q = 0; q < Q; ++q) {
            v(fmt::format("        v.muls {}, {}, {}, {}", b.a(gs), b.a(static_cast<int>(q)),
                          f32_bits(inv_window(g)), g.n()));
            for (uint32_t kw = 0; kw < g.k; ++kw) {
                const std::string d = dx_at(b, g, phases, kw);
                v(fmt::format("        v.add {}, {}, {}, {}", d, d, b.a(gs), g.n()));
            }
        }
    };
    return sp;
}

Spec max_grad_spec(const Geo& g) {
    Spec sp;
    sp.name = fmt::format("max_pool2d_grad {}", g.key());
    sp.units = uint64_t(g.N) * g.H;
    sp.max_tile_units = 1;
    enum { Pad, Zero };
    sp.fixed = {g.J * g.C, g.n()};
    const uint32_t Q = g.windows_per_row(), n = g.n(), taps = g.k * g.k;
    std::vector<int> window, dy, out, routed;
    for (uint32_t q = 0; q < Q; ++q)
        window.push_back(add_window(sp, g, 1, backward_prefix(g, q), q, Pad));
    for (uint32_t q = 0; q < Q; ++q) {
        dy.push_back(static_cast<int>(sp.areas.size()));
        sp.ins.push_back(dy_row(g, 2, q, dy.back(), Zero));
        out.push_back(dy.back() + 1);
        routed.push_back(dy.back() + 2);
        sp.areas.insert(sp.areas.end(), {n, n, taps * n});
    }
    const int Z = static_cast<int>(sp.areas.size()), NF = Z + 1, GT = Z + 2, MT = Z + 3;
    sp.areas.insert(sp.areas.end(), {n, n, n, n});
    const int phases = add_dx_phases(sp, g, 3);
    sp.prologue = [=](Body& b) { fill_prologue(b, g, window[0], Q, Pad, true, Zero, n); };
    sp.body = [=](Body& b) {
        VpuOps v(b);
        zero_phases(b, v, g, phases);
        v(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(Z), b.a(Z), b.a(Z), n));
        for (uint32_t q = 0; q < Q; ++q) {
            // Route dy to the first tap equal to the window's maximum: NF is 1 until a tap has
            // taken it, so each window's dy lands exactly once.
            reduce_window(b, v, g, window[q], b.a(out[q]), true);
            v(fmt::format("        v.adds {}, {}, 1.0, {}", b.a(NF), b.a(Z), n));
            for (uint32_t t = 0; t < taps; ++t) {
                v(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(GT), b.a(out[q]),
                              tap(b, g, window[q], t / g.k, t % g.k), n));
                v(fmt::format("        v.sel {}, {}, {}, {}, {}", b.a(MT), b.a(GT), b.a(Z), b.a(NF),
                              n));
                v(fmt::format("        v.sub {}, {}, {}, {}", b.a(NF), b.a(NF), b.a(MT), n));
                v(fmt::format("        v.mul [s19+{}], {}, {}, {}",
                              b.off(routed[q]) + uint64_t(t) * n * 4, b.a(MT), b.a(dy[q]), n));
            }
            // Input row ih is kernel row (ih + p) mod s + q s of this window; when that is past
            // the kernel, dy is zeros and any row will do, so take row 0.
            const std::string ok = b.label(fmt::format("kh{}", q));
            b.line(fmt::format("        remu s15, s17, {}", g.H));
            b.line(fmt::format("        add s15, s15, {}", g.p));
            b.line(fmt::format("        remu s15, s15, {}", g.s));
            b.line(fmt::format("        add s15, s15, {}", q * g.s));
            b.line(fmt::format("        blt s15, {}, {}", g.k, ok));
            b.line("        li s15, 0");
            b.line(fmt::format("{}: mul s15, s15, {}", ok, uint64_t(g.k) * n * 4));
            b.line("        add s15, s15, s19");
            for (uint32_t kw = 0; kw < g.k; ++kw) {
                const std::string d = dx_at(b, g, phases, kw);
                v(fmt::format("        v.add {}, {}, [s15+{}], {}", d, d,
                              b.off(routed[q]) + uint64_t(kw) * n * 4, n));
            }
        }
    };
    return sp;
}

Spec gap_spec(const PoolShape& s) {
    enum { X, Sum, Y };
    const uint32_t hw = s.height * s.width, C = s.channels;
    Spec sp;
    sp.name = fmt::format("global_avg_pool {}x{}", hw, C);
    sp.units = s.batch;
    sp.max_tile_units = 1;
    sp.areas = {hw * C, C, C};
    sp.ins = {{1, X}};
    sp.outs = {{2, Y}};
    const float inv = 1.0f / static_cast<float>(hw);
    sp.body = [=](Body& b) {
        VpuOps v(b);
        v(fmt::format("        v.csum {}, {}, {}, {}", b.a(Sum), b.a(X), hw, C));
        v(fmt::format("        v.muls {}, {}, {}, {}", b.a(Y), b.a(Sum), f32_bits(inv), C));
    };
    return sp;
}

Spec gap_grad_spec(const PoolShape& s) {
    enum { G, G2, Nz, Dx };
    const uint32_t hw = s.height * s.width, C = s.channels;
    Spec sp;
    sp.name = fmt::format("global_avg_pool_grad {}x{}", hw, C);
    sp.units = s.batch;
    sp.max_tile_units = 1;
    sp.areas = {C, C, hw * C, hw * C};
    sp.ins = {{1, G}};
    sp.outs = {{2, Dx}};
    const float inv = 1.0f / static_cast<float>(hw);
    const uint64_t n = uint64_t(hw) * C;
    // -0.0 + g == g for every g, so broadcasting onto -0.0 copies the row exactly.
    sp.body = [=](Body& b) {
        VpuOps v(b);
        v(fmt::format("        v.muls {}, {}, {}, {}", b.a(G2), b.a(G), f32_bits(inv), C));
        v(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(Nz), b.a(Nz), b.a(Nz), n));
        v(fmt::format("        v.muls {}, {}, -1.0, {}", b.a(Nz), b.a(Nz), n));
        v(fmt::format("        v.addrow {}, {}, {}, {}, {}", b.a(Dx), b.a(Nz), b.a(G2), hw, C));
    };
    return sp;
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

Event max_pool2d(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                 const Tensor& y) {
    check_io(s, "max_pool2d", x, in_rows(s), y, out_rows(s));
    return detail::run(dev, cache, pool_spec(Geo(s), true), {&x, &y});
}

Event avg_pool2d(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                 const Tensor& y) {
    check_io(s, "avg_pool2d", x, in_rows(s), y, out_rows(s));
    return detail::run(dev, cache, pool_spec(Geo(s), false), {&x, &y});
}

Event max_pool2d_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                      const Tensor& dy, const Tensor& dx) {
    check_io(s, "max_pool2d_grad", x, in_rows(s), dy, out_rows(s));
    check_tensor(dx, in_rows(s), s.channels, x, "max_pool2d_grad", "dx");
    return detail::run(dev, cache, max_grad_spec(Geo(s)), {&x, &dy, &dx});
}

Event avg_pool2d_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& dy,
                      const Tensor& dx) {
    check_io(s, "avg_pool2d_grad", dx, in_rows(s), dy, out_rows(s));
    return detail::run(dev, cache, avg_grad_spec(Geo(s)), {&dy, &dx});
}

Event global_avg_pool(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& x,
                      const Tensor& y) {
    const PoolShape g = whole_image(s, "global_avg_pool", x, y);
    return detail::run(dev, cache, gap_spec(g), {&x, &y});
}

Event global_avg_pool_grad(Device& dev, ProgramCache& cache, const PoolShape& s, const Tensor& dy,
                           const Tensor& dx) {
    const PoolShape g = whole_image(s, "global_avg_pool_grad", dx, dy);
    return detail::run(dev, cache, gap_grad_spec(g), {&dy, &dx});
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
