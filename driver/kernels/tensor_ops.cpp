// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/tensor_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/vector_ops.h"
#include "hw/core/numerics.h"

namespace tpu::driver {
namespace {

using detail::Body;
using detail::f32_bits;
using detail::Spec;
using detail::Stream;

/// Odd constant that spreads dropout's per-tile seeds (golden ratio, 32 bits).
constexpr uint32_t kSeedStride = 0x9E3779B9u;

std::string cores_text(const std::vector<uint32_t>& cores) {
    return fmt::format("[{}]", fmt::join(cores, ", "));
}

uint32_t addr(const Buffer& b) {
    return static_cast<uint32_t>(b.addr);
}

int parts_of(Precision p) {
    return p == Precision::Bf16 ? 1 : p == Precision::Fp32Pass3 ? 2 : 3;
}

/// Packs op(x) (Ro x Co fp32) into `parts` bf16 parts of Rp x Cp, zero-padded, part p at
/// s2 + p Rp Cp 2 bytes (the library GEMM's operand layout: hi, mid, lo as hw::split3).
/// Without the transpose x is stored Ro x Co; with it, Co x Ro. Launch args: s1 x, s2 dst.
Spec pack_spec(uint32_t Ro, uint32_t Co, uint32_t Rp, uint32_t Cp, bool transposed, int parts) {
    Spec sp;
    sp.name = fmt::format("matmul_pack {}x{} to {}x{} {} parts{}", Ro, Co, Rp, Cp,
                          transposed ? "T" : "N", parts);
    sp.units = Ro;
    // Areas: X fp32 rows of op(x); H0..H2 bf16 parts (Cp / 2 fp32 slots per row); S the
    // transposed source block; F, R1, R2 the fp32 temporaries of the split.
    const int X = 0, H = 1, S = 1 + parts, F = S + 1, R1 = S + 2, R2 = S + 3;
    sp.areas = {Cp};
    for (int p = 0; p < parts; ++p) sp.areas.push_back(Cp / 2);
    sp.areas.push_back(transposed ? Cp : 1);
    if (parts >= 2) sp.areas.insert(sp.areas.end(), {Cp, Cp});
    if (parts == 3) sp.areas.push_back(Cp);
    const uint64_t pad_bytes = uint64_t(Rp - Ro) * Cp * 2;
    if (pad_bytes) sp.fixed = {static_cast<uint32_t>(pad_bytes / 4)};
    const uint64_t part_bytes = uint64_t(Rp) * Cp * 2;

    if (transposed) {
        // The source block is Co rows of the tile's columns, at a fixed row stride of T values
        // so its zero rows Co..Cp (set once) stay where v.trans reads them.
        sp.ins = {Stream(1, S,
                         [=](Body& b, const std::string& first, const std::string& units,
                             const std::string& slot, const std::string& flag) {
                             b.line(fmt::format("        mul s13, {}, 4", first));
                             b.line("        add s13, s13, s1");
                             b.line(fmt::format("        mul s14, {}, 4", units));
                             b.line(fmt::format("        dma.hv {}, [s13], {}, s14, {}, {}, {}",
                                                b.at(slot, S), Co, uint64_t(b.tile_units()) * 4,
                                                uint64_t(Ro) * 4, flag));
                         })};
    } else {
        // Rows land Cp values apart; the padding columns (set once) stay zero.
        sp.ins = {Stream(1, X,
                         [=](Body& b, const std::string& first, const std::string& units,
                             const std::string& slot, const std::string& flag) {
                             b.line(
                                 fmt::format("        mul s13, {}, {}", first, uint64_t(Co) * 4));
                             b.line("        add s13, s13, s1");
                             b.line(fmt::format("        dma.hv {}, [s13], {}, {}, {}, {}, {}",
                                                b.at(slot, X), units, uint64_t(Co) * 4,
                                                uint64_t(Cp) * 4, uint64_t(Co) * 4, flag));
                         })};
    }
    for (int p = 0; p < parts; ++p)
        sp.outs.emplace_back(
            2, H + p,
            [=](Body& b, const std::string& first, const std::string& units,
                const std::string& slot, const std::string& flag) {
                b.line(fmt::format("        mul s13, {}, {}", first, uint64_t(Cp) * 2));
                b.line(fmt::format("        add s13, s13, s2"));
                if (p) b.line(fmt::format("        add s13, s13, {}", p * part_bytes));
                b.line(fmt::format("        mul s14, {}, {}", units, uint64_t(Cp) * 2));
                b.line(fmt::format("        dma.vh [s13], {}, 1, s14, s14, s14, {}",
                                   b.at(slot, H + p), flag));
            });
    // Zeros: x > x is false for every x (NaN too), whatever VMEM held before.
    sp.prologue = [=](Body& b) {
        const uint64_t n = uint64_t(b.tile_units()) * Cp;
        int count = 0;
        if (Co < Cp)
            for (int slot = 0; slot < 2; ++slot) {
                const std::string a = b.slot(slot, transposed ? S : X);
                b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", a, a, a, n));
                ++count;
            }
        if (pad_bytes) {
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", b.f(0), b.f(0), b.f(0),
                               pad_bytes / 4));
            ++count;
        }
        if (count) b.line(fmt::format("        wait f5, {}", count));
        // Rows Ro..Rp of every part are zero (K padding of the weights).
        for (int p = 0; pad_bytes && p < parts; ++p)
            b.line(fmt::format("        dma.vh [s2+{}], {}, 1, {}, {}, {}, f6",
                               p * part_bytes + uint64_t(Ro) * Cp * 2, b.f(0), pad_bytes, pad_bytes,
                               pad_bytes));
    };
    sp.epilogue = [=](Body& b) {
        if (pad_bytes) b.line(fmt::format("        wait f6, {}", parts));
    };
    // The VPU works on whole tiles (the rows of a ragged last tile past its end are not stored).
    sp.body = [=](Body& b) {
        const uint64_t n = uint64_t(b.tile_units()) * Cp;
        if (transposed)
            b.vpu(
                fmt::format("        v.trans {}, {}, {}, {}", b.a(X), b.a(S), Cp, b.tile_units()));
        emit_split([&](const std::string& ins) { b.vpu(ins); }, parts,
                   [&](int q) { return b.a(H + q); }, b.a(X), parts >= 2 ? b.a(F) : "",
                   parts >= 2 ? b.a(R1) : "", parts == 3 ? b.a(R2) : "", fmt::format("{}", n));
    };
    return sp;
}

/// Elementwise kernel over n values with `areas` one-value areas.
Spec elementwise(const std::string& name, uint64_t n, int areas) {
    Spec sp;
    sp.name = name;
    sp.units = n;
    sp.areas.assign(areas, 1);
    return sp;
}

/// GELU constants: sqrt(2 / pi) and the cubic coefficient (and 3x it, for the derivative).
constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kGeluC3 = 0.134145f;

Spec dropout_spec(uint64_t n) {
    enum { X, U, Z, P, K, Out };
    Spec sp = elementwise("dropout", n, 6);
    sp.ins = {{1, X}};
    sp.outs = {{2, K}, {3, Out}};
    // s4 seed of this replica, s5 the largest float below p, s6 1 / (1 - p).
    sp.body = [](Body& b) {
        b.line(fmt::format("        mul s15, s16, {}", kSeedStride));
        b.line("        add s15, s15, s4");
        b.vpu(fmt::format("        v.rand {}, s15, s18", b.a(U)));
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s18", b.a(Z), b.a(U), b.a(U)));
        b.vpu(fmt::format("        v.adds {}, {}, s5, s18", b.a(P), b.a(Z)));
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s18", b.a(K), b.a(U), b.a(P)));
        b.vpu(fmt::format("        v.muls {}, {}, s6, s18", b.a(K), b.a(K)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(Out), b.a(X), b.a(K)));
    };
    return sp;
}

/// Broadcasts gamma (fixed area `gamma`) over the tile's rows into area `g`, exactly: -0.0 +
/// gamma[j] == gamma[j] for every value. `any` is an area whose first s15 values are loaded.
void broadcast_row(Body& b, int g, int any, int gamma, uint32_t cols) {
    b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s15", b.a(g), b.a(any), b.a(any)));
    b.vpu(fmt::format("        v.muls {}, {}, -1.0, s15", b.a(g), b.a(g)));
    b.vpu(fmt::format("        v.addrow {}, {}, {}, s18, {}", b.a(g), b.a(g), b.f(gamma), cols));
}

Spec layer_norm_spec(uint32_t rows, uint32_t cols) {
    enum { X, Xc, Sq, Xh, G, Y, Out, Sum, Mean, Var, Rstd };
    const uint32_t C = cols;
    Spec sp;
    sp.name = "layer_norm";
    sp.units = rows;
    sp.areas = {C, C, C, C, C, C, C, 1, 1, 1, 1};
    sp.fixed = {C, C};  // gamma, beta
    sp.fixed_ins = {{2, 0}, {3, 1}};
    sp.ins = {{1, X}};
    sp.outs = {{4, Out}, {5, Mean}, {6, Rstd}};
    // s7 fp32(1 / cols), s8 eps.
    sp.body = [C](Body& b) {
        b.line(fmt::format("        mul s15, s18, {}", C));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(Sum), b.a(X), C));
        b.vpu(fmt::format("        v.muls {}, {}, s7, s18", b.a(Mean), b.a(Sum)));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(Xc), b.a(X), b.a(Mean), C));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(Sq), b.a(Xc), b.a(Xc)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(Sum), b.a(Sq), C));
        b.vpu(fmt::format("        v.muls {}, {}, s7, s18", b.a(Var), b.a(Sum)));
        b.vpu(fmt::format("        v.adds {}, {}, s8, s18", b.a(Var), b.a(Var)));
        b.vpu(fmt::format("        v.rsqrt {}, {}, s18", b.a(Rstd), b.a(Var)));
        b.vpu(fmt::format("        v.mulcol {}, {}, {}, s18, {}", b.a(Xh), b.a(Xc), b.a(Rstd), C));
        broadcast_row(b, G, X, 0, C);
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(Y), b.a(Xh), b.a(G)));
        b.vpu(fmt::format("        v.addrow {}, {}, {}, s18, {}", b.a(Out), b.a(Y), b.f(1), C));
    };
    return sp;
}

Spec layer_norm_grad_spec(uint32_t rows, uint32_t cols) {
    enum { X, Dy, Mean, Rstd, Xc, Xh, Gb, G, Gx, T, U, Dx, P, S1, S2 };
    enum { Gamma, Dg, Db, Tg, Tb };
    const uint32_t C = cols;
    Spec sp;
    sp.name = "layer_norm_grad";
    sp.units = rows;
    sp.areas = {C, C, 1, 1, C, C, C, C, C, C, C, C, C, 1, 1};
    sp.fixed = {C, C, C, C, C};
    sp.fixed_ins = {{3, Gamma}};
    sp.fixed_outs = {{7, Dg}, {8, Db}};
    sp.ins = {{1, X}, {2, Dy}, {4, Mean}, {5, Rstd}};
    sp.outs = {{6, Dx}};
    // s9 fp32(1 / cols).
    sp.body = [C](Body& b) {
        b.line(fmt::format("        mul s15, s18, {}", C));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(Xc), b.a(X), b.a(Mean), C));
        b.vpu(fmt::format("        v.mulcol {}, {}, {}, s18, {}", b.a(Xh), b.a(Xc), b.a(Rstd), C));
        broadcast_row(b, Gb, X, Gamma, C);
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(G), b.a(Dy), b.a(Gb)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(S1), b.a(G), C));
        b.vpu(fmt::format("        v.muls {}, {}, s9, s18", b.a(S1), b.a(S1)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(Gx), b.a(G), b.a(Xh)));
        b.vpu(fmt::format("        v.rsum {}, {}, s18, {}", b.a(S2), b.a(Gx), C));
        b.vpu(fmt::format("        v.muls {}, {}, s9, s18", b.a(S2), b.a(S2)));
        b.vpu(fmt::format("        v.subcol {}, {}, {}, s18, {}", b.a(T), b.a(G), b.a(S1), C));
        b.vpu(fmt::format("        v.mulcol {}, {}, {}, s18, {}", b.a(U), b.a(Xh), b.a(S2), C));
        b.vpu(fmt::format("        v.sub {}, {}, {}, s15", b.a(T), b.a(T), b.a(U)));
        b.vpu(fmt::format("        v.mulcol {}, {}, {}, s18, {}", b.a(Dx), b.a(T), b.a(Rstd), C));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s15", b.a(P), b.a(Dy), b.a(Xh)));
        // Column sums as col_sum: the first tile's stored, later tiles' added in order.
        b.line(fmt::format("        bne s16, 0, {}", b.label("lg_more")));
        b.vpu(fmt::format("        v.csum {}, {}, s18, {}", b.f(Dg), b.a(P), C));
        b.vpu(fmt::format("        v.csum {}, {}, s18, {}", b.f(Db), b.a(Dy), C));
        b.line(fmt::format("        jmp {}", b.label("lg_done")));
        b.line(
            fmt::format("{}: v.csum {}, {}, s18, {}, f2", b.label("lg_more"), b.f(Tg), b.a(P), C));
        b.line("        add s26, s26, 1");
        b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.f(Dg), b.f(Dg), b.f(Tg), C));
        b.vpu(fmt::format("        v.csum {}, {}, s18, {}", b.f(Tb), b.a(Dy), C));
        b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.f(Db), b.f(Db), b.f(Tb), C));
        b.line(b.label("lg_done") + ":");
    };
    return sp;
}

/// The largest float below p, so that u >= p is u > below(p) (no float lies between them).
float below(float p) {
    return std::nextafter(p, -std::numeric_limits<float>::infinity());
}

void check_dropout_p(float p) {
    if (!(p >= 0.0f && p < 1.0f))
        throw DeviceError(ErrorKind::Usage, fmt::format("dropout: p = {} is outside [0, 1)", p));
}

}  // namespace

// ---- matmul ----------------------------------------------------------------------------------

Event matmul(Device& dev, ProgramCache& cache, const Tensor& a, bool transpose_a, const Tensor& b,
             bool transpose_b, const Tensor& c, Precision precision, const Tensor* bias) {
    if (a.cores != b.cores || a.cores != c.cores)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("matmul: a, b and c must be on the same cores (a on {}, b "
                        "on {}, c on {})",
                        cores_text(a.cores), cores_text(b.cores), cores_text(c.cores)));
    const uint32_t M = transpose_a ? a.cols : a.rows, K = transpose_a ? a.rows : a.cols;
    const uint32_t Kb = transpose_b ? b.cols : b.rows, N = transpose_b ? b.rows : b.cols;
    if (K != Kb)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("matmul: op(a) is {} x {} but op(b) is {} x {} (inner "
                                      "dimensions differ)",
                                      M, K, Kb, N));
    if (c.rows != M || c.cols != N)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("matmul: c is {} x {} but op(a) x op(b) is {} x {}", c.rows, c.cols, M, N));
    if (bias) check_tensor(*bias, 1, N, c, "matmul", "bias");
    // The fused kernel reads the fp32 operands in tiles and converts them in VMEM, and adds the
    // bias before C leaves; packing, the library GEMM and bias_add remain for what it cannot
    // hold (VMEM, instruction memory).
    if (const auto mt = plan_matmul(dev.config(), M, K, N, transpose_a, transpose_b, precision,
                                    bias != nullptr)) {
        const isa::Program& prog = cache.get(matmul_key(*mt), [&] { return matmul_program(*mt); });
        if (prog.code.size() * isa::kInstrBytes <= dev.config().core.imem_bytes)
            return dev.launch(a.cores, prog, [&](size_t i) {
                std::vector<uint32_t> args{addr(a.bufs[i]), addr(b.bufs[i]), addr(c.bufs[i])};
                if (bias) args.push_back(addr(bias->bufs[i]));
                return args;
            });
    }
    const GemmTiling t = plan_gemm(dev.config(), M, K, N, precision);
    const int P = parts_of(precision);
    std::vector<Buffer> sa, sw;
    auto release = [&] {
        for (const Buffer& x : sa) dev.free(x);
        for (const Buffer& x : sw) dev.free(x);
    };
    std::vector<Event> evs;
    try {
        for (uint32_t core : a.cores) {
            sa.push_back(dev.alloc(uint64_t(P) * M * t.Kp * 2, core));
            sw.push_back(dev.alloc(uint64_t(P) * t.Kp * t.Np * 2, core));
        }
        evs.push_back(detail::run(dev, cache, pack_spec(M, K, M, t.Kp, transpose_a, P), a.cores,
                                  [&](size_t i) {
                                      return std::vector<uint32_t>{addr(a.bufs[i]), addr(sa[i])};
                                  }));
        evs.push_back(detail::run(dev, cache, pack_spec(K, N, t.Kp, t.Np, transpose_b, P), a.cores,
                                  [&](size_t i) {
                                      return std::vector<uint32_t>{addr(b.bufs[i]), addr(sw[i])};
                                  }));
        const isa::Program& prog =
            cache.get(gemm_key_compact(t, N), [&] { return gemm_program_compact(t, N); });
        evs.push_back(dev.launch(a.cores, prog, [&](size_t i) {
            return std::vector<uint32_t>{addr(sa[i]), addr(sw[i]), addr(c.bufs[i]), M,
                                         M * t.Kp * 2};
        }));
        if (bias) evs.push_back(bias_add(dev, cache, c, *bias, c));
    } catch (...) {
        release();
        throw;
    }
    release();
    return detail::merge(evs);
}

std::vector<float> matmul_reference(const std::vector<float>& a, uint32_t a_rows, uint32_t a_cols,
                                    bool transpose_a, const std::vector<float>& b, uint32_t b_rows,
                                    uint32_t b_cols, bool transpose_b, Precision precision,
                                    uint32_t mxu_rows) {
    auto op = [](const std::vector<float>& x, uint32_t r, uint32_t c, bool tr) {
        if (!tr) return x;
        std::vector<float> y(x.size());
        for (uint32_t i = 0; i < r; ++i)
            for (uint32_t j = 0; j < c; ++j) y[size_t(j) * r + i] = x[size_t(i) * c + j];
        return y;
    };
    const uint32_t M = transpose_a ? a_cols : a_rows, K = transpose_a ? a_rows : a_cols;
    const uint32_t N = transpose_b ? b_rows : b_cols;
    return gemm_reference(op(a, a_rows, a_cols, transpose_a), op(b, b_rows, b_cols, transpose_b), M,
                          K, N, precision, mxu_rows);
}

// ---- copies ----------------------------------------------------------------------------------

Event copy(Device& dev, ProgramCache& cache, const Tensor& src, const Tensor& dst) {
    check_same(src, dst, "copy");
    Spec sp = elementwise("copy", src.elements(), 1);
    sp.ins = {{1, 0}};
    sp.outs = {{2, 0}};
    sp.body = [](Body&) {};
    return detail::run(dev, cache, sp, {&src, &dst});
}

Event copy_columns(Device& dev, ProgramCache& cache, const Tensor& src, uint32_t first_col,
                   const Tensor& dst) {
    if (src.cores != dst.cores || src.rows != dst.rows || uint64_t(first_col) + dst.cols > src.cols)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("copy_columns: columns {}..{} of a {} x {} tensor on cores "
                        "{} do not fit a {} x {} tensor on cores {}",
                        first_col, uint64_t(first_col) + dst.cols, src.rows, src.cols,
                        cores_text(src.cores), dst.rows, dst.cols, cores_text(dst.cores)));
    const uint32_t W = dst.cols, S = src.cols;
    Spec sp;
    sp.name = fmt::format("copy_columns of {}", S);
    sp.units = dst.rows;
    sp.areas = {W};
    // Rows of W values, S values apart in HBM.
    sp.ins = {Stream(1, 0,
                     [=](Body& b, const std::string& first, const std::string& units,
                         const std::string& slot, const std::string& flag) {
                         b.line(fmt::format("        mul s13, {}, {}", first, uint64_t(S) * 4));
                         b.line("        add s13, s13, s1");
                         b.line(fmt::format("        dma.hv {}, [s13], {}, {}, {}, {}, {}",
                                            b.at(slot, 0), units, uint64_t(W) * 4, uint64_t(W) * 4,
                                            uint64_t(S) * 4, flag));
                     })};
    sp.outs = {{2, 0}};
    sp.body = [](Body&) {};
    return detail::run(dev, cache, sp, src.cores, [&](size_t i) {
        return std::vector<uint32_t>{addr(src.bufs[i]) + first_col * 4, addr(dst.bufs[i])};
    });
}

Event copy_into_columns(Device& dev, ProgramCache& cache, const Tensor& src, const Tensor& dst,
                        uint32_t first_col) {
    if (src.cores != dst.cores || src.rows != dst.rows || uint64_t(first_col) + src.cols > dst.cols)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("copy_into_columns: a {} x {} tensor on cores {} does not fit columns "
                        "{}..{} of a {} x {} tensor on cores {}",
                        src.rows, src.cols, cores_text(src.cores), first_col,
                        uint64_t(first_col) + src.cols, dst.rows, dst.cols, cores_text(dst.cores)));
    const uint32_t W = src.cols, S = dst.cols;
    Spec sp;
    sp.name = fmt::format("copy_into_columns of {}", S);
    sp.units = src.rows;
    sp.areas = {W};
    sp.ins = {{1, 0}};
    // Rows of W values stored S values apart in HBM.
    sp.outs = {Stream(2, 0,
                      [=](Body& b, const std::string& first, const std::string& units,
                          const std::string& slot, const std::string& flag) {
                          b.line(fmt::format("        mul s13, {}, {}", first, uint64_t(S) * 4));
                          b.line("        add s13, s13, s2");
                          b.line(fmt::format("        dma.vh [s13], {}, {}, {}, {}, {}, {}",
                                             b.at(slot, 0), units, uint64_t(W) * 4, uint64_t(S) * 4,
                                             uint64_t(W) * 4, flag));
                      })};
    sp.body = [](Body&) {};
    return detail::run(dev, cache, sp, src.cores, [&](size_t i) {
        return std::vector<uint32_t>{addr(src.bufs[i]), addr(dst.bufs[i]) + first_col * 4};
    });
}

Event round_bf16(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_same(x, out, "round_bf16");
    Spec sp = elementwise("round_bf16", x.elements(), 3);
    sp.ins = {{1, 0}};
    sp.outs = {{2, 2}};
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.f2bf {}, {}, s18", b.a(1), b.a(0)));
        b.vpu(fmt::format("        v.bf2f {}, {}, s18", b.a(2), b.a(1)));
    };
    return detail::run(dev, cache, sp, {&x, &out});
}

std::vector<float> round_bf16_reference(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = hw::bf16_round(x[i]);
    return out;
}

// ---- GELU ------------------------------------------------------------------------------------

namespace {

/// Th = tanh(kGeluK (x + kGeluC x^3)), the shared start of gelu and gelu_grad (same order as
/// gelu_reference): X2 = x x, U = X2 x, U = U kGeluC, U = x + U, U = U kGeluK, Th = tanh(U).
void gelu_tanh(Body& b, int X, int X2, int U, int Th) {
    b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(X2), b.a(X), b.a(X)));
    b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(U), b.a(X2), b.a(X)));
    b.vpu(fmt::format("        v.muls {}, {}, {}, s18", b.a(U), b.a(U), f32_bits(kGeluC)));
    b.vpu(fmt::format("        v.add {}, {}, {}, s18", b.a(U), b.a(X), b.a(U)));
    b.vpu(fmt::format("        v.muls {}, {}, {}, s18", b.a(U), b.a(U), f32_bits(kGeluK)));
    b.vpu(fmt::format("        v.tanh {}, {}, s18", b.a(Th), b.a(U)));
}

}  // namespace

Event gelu(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_same(x, out, "gelu");
    enum { X, X2, U, Th, Out };
    Spec sp = elementwise("gelu", x.elements(), 5);
    sp.ins = {{1, X}};
    sp.outs = {{2, Out}};
    sp.body = [](Body& b) {
        gelu_tanh(b, X, X2, U, Th);
        b.vpu(fmt::format("        v.adds {}, {}, 1.0, s18", b.a(Th), b.a(Th)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(Out), b.a(X), b.a(Th)));
        b.vpu(fmt::format("        v.muls {}, {}, 0.5, s18", b.a(Out), b.a(Out)));
    };
    return detail::run(dev, cache, sp, {&x, &out});
}

Event gelu_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                const Tensor& dx) {
    check_same(x, dy, "gelu_grad");
    check_same(x, dx, "gelu_grad");
    enum { X, Dy, X2, U, Th, L, S, P, Out };
    Spec sp = elementwise("gelu_grad", x.elements(), 9);
    sp.ins = {{1, X}, {2, Dy}};
    sp.outs = {{3, Out}};
    sp.body = [](Body& b) {
        gelu_tanh(b, X, X2, U, Th);
        b.vpu(fmt::format("        v.adds {}, {}, 1.0, s18", b.a(L), b.a(Th)));
        b.vpu(fmt::format("        v.muls {}, {}, 0.5, s18", b.a(L), b.a(L)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(S), b.a(Th), b.a(Th)));
        b.vpu(fmt::format("        v.muls {}, {}, -1.0, s18", b.a(S), b.a(S)));
        b.vpu(fmt::format("        v.adds {}, {}, 1.0, s18", b.a(S), b.a(S)));
        b.vpu(fmt::format("        v.muls {}, {}, {}, s18", b.a(P), b.a(X2), f32_bits(kGeluC3)));
        b.vpu(fmt::format("        v.adds {}, {}, 1.0, s18", b.a(P), b.a(P)));
        b.vpu(fmt::format("        v.muls {}, {}, {}, s18", b.a(P), b.a(P), f32_bits(kGeluK)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(S), b.a(S), b.a(P)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(S), b.a(S), b.a(X)));
        b.vpu(fmt::format("        v.muls {}, {}, 0.5, s18", b.a(S), b.a(S)));
        b.vpu(fmt::format("        v.add {}, {}, {}, s18", b.a(L), b.a(L), b.a(S)));
        b.vpu(fmt::format("        v.mul {}, {}, {}, s18", b.a(Out), b.a(L), b.a(Dy)));
    };
    return detail::run(dev, cache, sp, {&x, &dy, &dx});
}

namespace {

/// gelu_tanh's operations on one value, in the same order.
float gelu_tanh_reference(float x) {
    const float x2 = x * x;
    float u = x2 * x;
    u = u * kGeluC;
    u = x + u;
    u = u * kGeluK;
    return std::tanh(u);
}

}  // namespace

std::vector<float> gelu_reference(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const float h = gelu_tanh_reference(x[i]) + 1.0f;
        out[i] = (x[i] * h) * 0.5f;
    }
    return out;
}

std::vector<float> gelu_grad_reference(const std::vector<float>& x, const std::vector<float>& dy) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const float th = gelu_tanh_reference(x[i]);
        const float l = (th + 1.0f) * 0.5f;
        float s = th * th;
        s = s * -1.0f;
        s = s + 1.0f;
        float p = (x[i] * x[i]) * kGeluC3;
        p = p + 1.0f;
        p = p * kGeluK;
        s = s * p;
        s = s * x[i];
        s = s * 0.5f;
        out[i] = (l + s) * dy[i];
    }
    return out;
}

// ---- dropout ---------------------------------------------------------------------------------

Event dropout(Device& dev, ProgramCache& cache, const Tensor& x, float p, uint32_t seed,
              const Tensor& mask, const Tensor& out) {
    check_same(x, mask, "dropout");
    check_same(x, out, "dropout");
    check_dropout_p(p);
    const float keep = 1.0f / (1.0f - p);
    return detail::run(dev, cache, dropout_spec(x.elements()), x.cores, [&](size_t i) {
        return std::vector<uint32_t>{addr(x.bufs[i]),    addr(mask.bufs[i]),
                                     addr(out.bufs[i]),  seed + static_cast<uint32_t>(i),
                                     f32_bits(below(p)), f32_bits(keep)};
    });
}

uint32_t dropout_tile_values(const hw::BoardConfig& cfg, uint64_t n) {
    return detail::tile_units(dropout_spec(n), cfg);
}

DropoutResult dropout_reference(const std::vector<float>& x, float p, uint32_t replica_seed,
                                uint32_t tile_values) {
    check_dropout_p(p);
    const float keep = 1.0f / (1.0f - p), lim = below(p);
    DropoutResult r{std::vector<float>(x.size()), std::vector<float>(x.size())};
    for (size_t i = 0; i < x.size(); ++i) {
        const uint64_t tile = i / tile_values;
        const float u = hw::vpu_uniform(replica_seed + static_cast<uint32_t>(tile) * kSeedStride,
                                        i - tile * tile_values);
        r.mask[i] = (u > lim ? 1.0f : 0.0f) * keep;
        r.out[i] = x[i] * r.mask[i];
    }
    return r;
}

// ---- layer norm ------------------------------------------------------------------------------

Event layer_norm(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& gamma,
                 const Tensor& beta, float eps, const Tensor& out, const Tensor& mean,
                 const Tensor& rstd) {
    const char* name = "layer_norm";
    check_tensor(gamma, 1, x.cols, x, name, "gamma");
    check_tensor(beta, 1, x.cols, x, name, "beta");
    check_same(x, out, name);
    check_tensor(mean, x.rows, 1, x, name, "mean");
    check_tensor(rstd, x.rows, 1, x, name, "rstd");
    const float inv = 1.0f / static_cast<float>(x.cols);
    return detail::run(dev, cache, layer_norm_spec(x.rows, x.cols),
                       {&x, &gamma, &beta, &out, &mean, &rstd}, {f32_bits(inv), f32_bits(eps)});
}

Event layer_norm_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                      const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dgamma, const Tensor& dbeta) {
    const char* name = "layer_norm_grad";
    check_same(x, dy, name);
    check_same(x, dx, name);
    check_tensor(gamma, 1, x.cols, x, name, "gamma");
    check_tensor(mean, x.rows, 1, x, name, "mean");
    check_tensor(rstd, x.rows, 1, x, name, "rstd");
    check_tensor(dgamma, 1, x.cols, x, name, "dgamma");
    check_tensor(dbeta, 1, x.cols, x, name, "dbeta");
    const float inv = 1.0f / static_cast<float>(x.cols);
    return detail::run(dev, cache, layer_norm_grad_spec(x.rows, x.cols),
                       {&x, &dy, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta}, {f32_bits(inv)});
}

uint32_t layer_norm_grad_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols) {
    return detail::tile_units(layer_norm_grad_spec(rows, cols), cfg);
}

LayerNormResult layer_norm_reference(const std::vector<float>& x, const std::vector<float>& gamma,
                                     const std::vector<float>& beta, float eps, uint32_t rows,
                                     uint32_t cols) {
    const float inv = 1.0f / static_cast<float>(cols);
    LayerNormResult r{std::vector<float>(x.size()), std::vector<float>(rows),
                      std::vector<float>(rows)};
    std::vector<float> xc(cols);
    for (size_t i = 0; i < rows; ++i) {
        const float* xr = &x[i * cols];
        float s = 0.0f;
        for (size_t j = 0; j < cols; ++j) s = s + xr[j];
        const float mean = s * inv;
        float ss = 0.0f;
        for (size_t j = 0; j < cols; ++j) {
            xc[j] = xr[j] - mean;
            ss = ss + xc[j] * xc[j];
        }
        const float var = ss * inv + eps;
        const float rstd = 1.0f / std::sqrt(var);
        for (size_t j = 0; j < cols; ++j) r.out[i * cols + j] = (xc[j] * rstd) * gamma[j] + beta[j];
        r.mean[i] = mean;
        r.rstd[i] = rstd;
    }
    return r;
}

LayerNormGradResult layer_norm_grad_reference(const std::vector<float>& x,
                                              const std::vector<float>& dy,
                                              const std::vector<float>& gamma,
                                              const std::vector<float>& mean,
                                              const std::vector<float>& rstd, uint32_t rows,
                                              uint32_t cols, uint32_t tile_rows) {
    const float inv = 1.0f / static_cast<float>(cols);
    LayerNormGradResult r{std::vector<float>(x.size()), std::vector<float>(cols),
                          std::vector<float>(cols)};
    std::vector<float> xh(cols), g(cols), tg(cols), tb(cols);
    for (uint32_t r0 = 0; r0 < rows; r0 += tile_rows) {
        std::fill(tg.begin(), tg.end(), 0.0f);
        std::fill(tb.begin(), tb.end(), 0.0f);
        for (size_t i = r0; i < std::min(rows, r0 + tile_rows); ++i) {
            const float* xr = &x[i * cols];
            const float* d = &dy[i * cols];
            float s1 = 0.0f, s2 = 0.0f;
            for (size_t j = 0; j < cols; ++j) {
                xh[j] = (xr[j] - mean[i]) * rstd[i];
                g[j] = d[j] * gamma[j];
                s1 = s1 + g[j];
            }
            for (size_t j = 0; j < cols; ++j) s2 = s2 + g[j] * xh[j];
            s1 = s1 * inv;
            s2 = s2 * inv;
            for (size_t j = 0; j < cols; ++j) {
                r.dx[i * cols + j] = ((g[j] - s1) - xh[j] * s2) * rstd[i];
                tg[j] = tg[j] + d[j] * xh[j];
                tb[j] = tb[j] + d[j];
            }
        }
        for (size_t j = 0; j < cols; ++j) {
            r.dgamma[j] = r0 == 0 ? tg[j] : r.dgamma[j] + tg[j];
            r.dbeta[j] = r0 == 0 ? tb[j] : r.dbeta[j] + tb[j];
        }
    }
    return r;
}

}  // namespace tpu::driver
