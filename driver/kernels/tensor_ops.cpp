// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/tensor_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/split.h"
#include "driver/kernels/vector_ops.h"
#include "hw/core/numerics.h"

namespace tpu::driver {
namespace {

using detail::f32_bits;
using isa::fimm;
using isa::imm;
using isa::Opcode;
using streaming::Body;
using streaming::Operand;
using streaming::Param;
using streaming::Spec;
using streaming::Stream;

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

// ---- matmul_pack -----------------------------------------------------------------------------

const std::array<Param, 2> kPackParams = {{{"x"}, {"dst"}}};

/// Packs op(x) (Ro x Co fp32) into `parts` bf16 parts of Rp x Cp, zero-padded, part p at
/// dst + p Rp Cp 2 bytes (the library GEMM's operand layout: hi, mid, lo as hw::split3).
/// Without the transpose x is stored Ro x Co; with it, Co x Ro.
Spec pack_spec(uint32_t Ro, uint32_t Co, uint32_t Rp, uint32_t Cp, bool transposed, int parts,
               std::span<const Operand> o) {
    const Operand x = o[0], dst = o[1];
    Spec sp;
    sp.fp.name = "matmul_pack";
    sp.fp.units = Ro;
    // Areas: X fp32 rows of op(x); H0..H2 bf16 parts (Cp / 2 fp32 slots per row); S the
    // transposed source block; F, R1, R2 the fp32 temporaries of the split.
    const int X = 0, H = 1, S = 1 + parts, F = S + 1, R1 = S + 2, R2 = S + 3;
    sp.fp.areas = {Cp};
    for (int p = 0; p < parts; ++p) sp.fp.areas.push_back(Cp / 2);
    sp.fp.areas.push_back(transposed ? Cp : 1);
    if (parts >= 2) sp.fp.areas.insert(sp.fp.areas.end(), {Cp, Cp});
    if (parts == 3) sp.fp.areas.push_back(Cp);
    const int64_t pad_bytes = int64_t(Rp - Ro) * Cp * 2;
    if (pad_bytes) sp.fp.fixed = {static_cast<uint32_t>(pad_bytes / 4)};
    const int64_t part_bytes = int64_t(Rp) * Cp * 2;

    if (transposed) {
        // The source block is Co rows of the tile's columns, at a fixed row stride of T values
        // so its zero rows Co..Cp (set once) stay where v.trans reads them.
        sp.ins = {Stream(x, S,
                         [=](Body& b, const isa::Reg& first, const isa::Reg& units,
                             const isa::Reg& slot, const isa::Flag& flag) {
                             b.emit(Opcode::Mul, {b.tmp(0), first, imm(4)});
                             b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), x.value});
                             b.emit(Opcode::Mul, {b.tmp(1), units, imm(4)});
                             b.emit(Opcode::DmaHv,
                                    {b.at(slot, S), b.tmp(0), imm(Co), b.tmp(1),
                                     imm(int64_t(b.tile_units()) * 4), imm(int64_t(Ro) * 4), flag});
                         })};
    } else {
        // Rows land Cp values apart; the padding columns (set once) stay zero.
        sp.ins = {Stream(x, X,
                         [=](Body& b, const isa::Reg& first, const isa::Reg& units,
                             const isa::Reg& slot, const isa::Flag& flag) {
                             b.emit(Opcode::Mul, {b.tmp(0), first, imm(int64_t(Co) * 4)});
                             b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), x.value});
                             b.emit(Opcode::DmaHv,
                                    {b.at(slot, X), b.tmp(0), units, imm(int64_t(Co) * 4),
                                     imm(int64_t(Cp) * 4), imm(int64_t(Co) * 4), flag});
                         })};
    }
    for (int p = 0; p < parts; ++p)
        sp.outs.emplace_back(dst, H + p,
                             [=](Body& b, const isa::Reg& first, const isa::Reg& units,
                                 const isa::Reg& slot, const isa::Flag& flag) {
                                 b.emit(Opcode::Mul, {b.tmp(0), first, imm(int64_t(Cp) * 2)});
                                 b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), dst.value});
                                 if (p)
                                     b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), imm(p * part_bytes)});
                                 b.emit(Opcode::Mul, {b.tmp(1), units, imm(int64_t(Cp) * 2)});
                                 b.emit(Opcode::DmaVh, {b.tmp(0), b.at(slot, H + p), imm(1),
                                                        b.tmp(1), b.tmp(1), b.tmp(1), flag});
                             });
    // The padding rows' stores are issued in the prologue and waited for in the epilogue.
    auto pad = std::make_shared<std::unique_ptr<isa::CountedFlag>>();
    // Zeros: x > x is false for every x (NaN too), whatever VMEM held before.
    sp.prologue = [=](Body& b) {
        const int64_t n = int64_t(b.tile_units()) * Cp;
        isa::CountedFlag zero(b.builder(), "zero", isa::Count::AtBuild, 5);
        if (Co < Cp)
            for (int slot = 0; slot < 2; ++slot) {
                const isa::Arg a = b.slot(slot, transposed ? S : X);
                zero.issue(Opcode::VCmpGt, {a, a, a, imm(n)});
            }
        if (pad_bytes) zero.issue(Opcode::VCmpGt, {b.f(0), b.f(0), b.f(0), imm(pad_bytes / 4)});
        zero.wait_all();
        if (!pad_bytes) return;
        // Rows Ro..Rp of every part are zero (K padding of the weights).
        *pad = std::make_unique<isa::CountedFlag>(b.builder(), "pad", isa::Count::AtBuild, 6);
        for (int p = 0; p < parts; ++p)
            (*pad)->issue(Opcode::DmaVh,
                          {dst.value + (p * part_bytes + int64_t(Ro) * Cp * 2), b.f(0), imm(1),
                           imm(pad_bytes), imm(pad_bytes), imm(pad_bytes)});
    };
    sp.epilogue = [=](Body&) {
        if (!*pad) return;
        (*pad)->wait_all();
        pad->reset();
    };
    // The VPU works on whole tiles (the rows of a ragged last tile past its end are not stored).
    sp.body = [=](Body& b) {
        const isa::Arg n = imm(int64_t(b.tile_units()) * Cp);
        if (transposed) b.vpu(Opcode::VTrans, {b.a(X), b.a(S), imm(Cp), imm(b.tile_units())});
        emit_split([&](Opcode op, std::initializer_list<isa::Arg> args) { b.vpu(op, args); }, parts,
                   [&](int q) { return b.a(H + q); }, b.a(X), parts >= 2 ? b.a(F) : imm(0),
                   parts >= 2 ? b.a(R1) : imm(0), parts == 3 ? b.a(R2) : imm(0), n);
    };
    return sp;
}

Spec pack_spec(const PackKey& k, std::span<const Operand> o) {
    return pack_spec(k.rows, k.cols, k.rows_padded, k.cols_padded, k.transposed, k.parts, o);
}

// ---- column copies ---------------------------------------------------------------------------

const std::array<Param, 2> kCopyParams = {{{"src"}, {"dst"}}};

Spec column_copy_spec(bool into, uint32_t rows, uint32_t W, uint32_t S,
                      std::span<const Operand> o) {
    const Operand src = o[0], dst = o[1];
    Spec sp;
    sp.fp = {into ? "copy_into_columns" : "copy_columns", rows, {W}, {}};
    if (!into) {
        // Rows of W values, S values apart in HBM.
        sp.ins = {Stream(src, 0,
                         [=](Body& b, const isa::Reg& first, const isa::Reg& units,
                             const isa::Reg& slot, const isa::Flag& flag) {
                             b.emit(Opcode::Mul, {b.tmp(0), first, imm(int64_t(S) * 4)});
                             b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), src.value});
                             b.emit(Opcode::DmaHv,
                                    {b.at(slot, 0), b.tmp(0), units, imm(int64_t(W) * 4),
                                     imm(int64_t(W) * 4), imm(int64_t(S) * 4), flag});
                         })};
        sp.outs = {{dst, 0}};
    } else {
        sp.ins = {{src, 0}};
        // Rows of W values stored S values apart in HBM.
        sp.outs = {Stream(dst, 0,
                          [=](Body& b, const isa::Reg& first, const isa::Reg& units,
                              const isa::Reg& slot, const isa::Flag& flag) {
                              b.emit(Opcode::Mul, {b.tmp(0), first, imm(int64_t(S) * 4)});
                              b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), dst.value});
                              b.emit(Opcode::DmaVh,
                                     {b.tmp(0), b.at(slot, 0), units, imm(int64_t(W) * 4),
                                      imm(int64_t(S) * 4), imm(int64_t(W) * 4), flag});
                          })};
    }
    sp.body = [](Body&) {};
    return sp;
}

// ---- elementwise and row kernels -------------------------------------------------------------

/// GELU constants: sqrt(2 / pi) and the cubic coefficient (and 3x it, for the derivative).
constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kGeluC3 = 0.134145f;

/// Name and operands of each TensorOp, in enum order.
struct OpInfo {
    const char* name;
    std::vector<Param> params;
};
const OpInfo& info_of(TensorOp op) {
    static const std::array<OpInfo, 7> kInfo = {{
        {"copy", {{"src"}, {"dst"}}},
        {"round_bf16", {{"x"}, {"out"}}},
        {"gelu", {{"x"}, {"out"}}},
        {"gelu_grad", {{"x"}, {"dy"}, {"dx"}}},
        {"dropout", {{"x"}, {"mask"}, {"out"}, {"seed", true}, {"below_p", true}, {"keep", true}}},
        {"layer_norm",
         {{"x"},
          {"gamma"},
          {"beta"},
          {"out"},
          {"mean"},
          {"rstd"},
          {"inv_cols", true},
          {"eps", true}}},
        {"layer_norm_grad",
         {{"x"},
          {"dy"},
          {"gamma"},
          {"mean"},
          {"rstd"},
          {"dx"},
          {"dgamma"},
          {"dbeta"},
          {"inv_cols", true}}},
    }};
    return kInfo.at(static_cast<size_t>(op));
}

/// Elementwise kernel over n values with `areas` one-value areas.
Spec elementwise(TensorOp op, uint64_t n, int areas) {
    Spec sp;
    sp.fp.name = info_of(op).name;
    sp.fp.units = n;
    sp.fp.areas.assign(areas, 1);
    return sp;
}

/// Th = tanh(kGeluK (x + kGeluC x^3)), the shared start of gelu and gelu_grad (same order as
/// gelu_reference): X2 = x x, U = X2 x, U = U kGeluC, U = x + U, U = U kGeluK, Th = tanh(U).
void gelu_tanh(Body& b, int X, int X2, int U, int Th) {
    const isa::Reg& n = b.units();
    b.vpu(Opcode::VMul, {b.a(X2), b.a(X), b.a(X), n});
    b.vpu(Opcode::VMul, {b.a(U), b.a(X2), b.a(X), n});
    b.vpu(Opcode::VMulS, {b.a(U), b.a(U), imm(f32_bits(kGeluC)), n});
    b.vpu(Opcode::VAdd, {b.a(U), b.a(X), b.a(U), n});
    b.vpu(Opcode::VMulS, {b.a(U), b.a(U), imm(f32_bits(kGeluK)), n});
    b.vpu(Opcode::VTanh, {b.a(Th), b.a(U), n});
}

/// Broadcasts gamma (fixed area `gamma`) over the tile's rows into area `g`, exactly: -0.0 +
/// gamma[j] == gamma[j] for every value. `any` is an area whose first scratch() values are
/// loaded.
void broadcast_row(Body& b, int g, int any, int gamma, uint32_t cols) {
    b.vpu(Opcode::VCmpGt, {b.a(g), b.a(any), b.a(any), b.scratch()});
    b.vpu(Opcode::VMulS, {b.a(g), b.a(g), fimm(-1.0f), b.scratch()});
    b.vpu(Opcode::VAddRow, {b.a(g), b.a(g), b.f(gamma), b.units(), imm(cols)});
}

Spec tensor_op_spec(TensorOp op, uint64_t units, uint32_t cols, std::span<const Operand> o) {
    const uint32_t C = cols;
    switch (op) {
        case TensorOp::Copy: {
            Spec sp = elementwise(op, units, 1);
            sp.ins = {{o[0], 0}};
            sp.outs = {{o[1], 0}};
            sp.body = [](Body&) {};
            return sp;
        }
        case TensorOp::RoundBf16: {
            Spec sp = elementwise(op, units, 3);
            sp.ins = {{o[0], 0}};
            sp.outs = {{o[1], 2}};
            sp.body = [](Body& b) {
                b.vpu(Opcode::VF2Bf, {b.a(1), b.a(0), b.units()});
                b.vpu(Opcode::VBf2F, {b.a(2), b.a(1), b.units()});
            };
            return sp;
        }
        case TensorOp::Gelu: {
            enum { X, X2, U, Th, Out };
            Spec sp = elementwise(op, units, 5);
            sp.ins = {{o[0], X}};
            sp.outs = {{o[1], Out}};
            sp.body = [](Body& b) {
                const isa::Reg& n = b.units();
                gelu_tanh(b, X, X2, U, Th);
                b.vpu(Opcode::VAddS, {b.a(Th), b.a(Th), fimm(1.0f), n});
                b.vpu(Opcode::VMul, {b.a(Out), b.a(X), b.a(Th), n});
                b.vpu(Opcode::VMulS, {b.a(Out), b.a(Out), fimm(0.5f), n});
            };
            return sp;
        }
        case TensorOp::GeluGrad: {
            enum { X, Dy, X2, U, Th, L, S, P, Out };
            Spec sp = elementwise(op, units, 9);
            sp.ins = {{o[0], X}, {o[1], Dy}};
            sp.outs = {{o[2], Out}};
            sp.body = [](Body& b) {
                const isa::Reg& n = b.units();
                gelu_tanh(b, X, X2, U, Th);
                b.vpu(Opcode::VAddS, {b.a(L), b.a(Th), fimm(1.0f), n});
                b.vpu(Opcode::VMulS, {b.a(L), b.a(L), fimm(0.5f), n});
                b.vpu(Opcode::VMul, {b.a(S), b.a(Th), b.a(Th), n});
                b.vpu(Opcode::VMulS, {b.a(S), b.a(S), fimm(-1.0f), n});
                b.vpu(Opcode::VAddS, {b.a(S), b.a(S), fimm(1.0f), n});
                b.vpu(Opcode::VMulS, {b.a(P), b.a(X2), imm(f32_bits(kGeluC3)), n});
                b.vpu(Opcode::VAddS, {b.a(P), b.a(P), fimm(1.0f), n});
                b.vpu(Opcode::VMulS, {b.a(P), b.a(P), imm(f32_bits(kGeluK)), n});
                b.vpu(Opcode::VMul, {b.a(S), b.a(S), b.a(P), n});
                b.vpu(Opcode::VMul, {b.a(S), b.a(S), b.a(X), n});
                b.vpu(Opcode::VMulS, {b.a(S), b.a(S), fimm(0.5f), n});
                b.vpu(Opcode::VAdd, {b.a(L), b.a(L), b.a(S), n});
                b.vpu(Opcode::VMul, {b.a(Out), b.a(L), b.a(Dy), n});
            };
            return sp;
        }
        case TensorOp::Dropout: {
            enum { X, U, Z, P, K, Out };
            Spec sp = elementwise(op, units, 6);
            sp.ins = {{o[0], X}};
            sp.outs = {{o[1], K}, {o[2], Out}};
            const isa::Arg seed = o[3].value, below_p = o[4].value, keep = o[5].value;
            sp.body = [=](Body& b) {
                const isa::Reg& n = b.units();
                b.emit(Opcode::Mul, {b.scratch(), b.tile(), imm(kSeedStride)});
                b.emit(Opcode::Add, {b.scratch(), b.scratch(), seed});
                b.vpu(Opcode::VRand, {b.a(U), b.scratch(), n});
                b.vpu(Opcode::VCmpGt, {b.a(Z), b.a(U), b.a(U), n});
                b.vpu(Opcode::VAddS, {b.a(P), b.a(Z), below_p, n});
                b.vpu(Opcode::VCmpGt, {b.a(K), b.a(U), b.a(P), n});
                b.vpu(Opcode::VMulS, {b.a(K), b.a(K), keep, n});
                b.vpu(Opcode::VMul, {b.a(Out), b.a(X), b.a(K), n});
            };
            return sp;
        }
        case TensorOp::LayerNorm: {
            enum { X, Xc, Sq, Xh, G, Y, Out, Sum, Mean, Var, Rstd };
            Spec sp;
            sp.fp = {info_of(op).name, units, {C, C, C, C, C, C, C, 1, 1, 1, 1}, {C, C}};
            sp.fixed_ins = {{o[1], 0}, {o[2], 1}};  // gamma, beta
            sp.ins = {{o[0], X}};
            sp.outs = {{o[3], Out}, {o[4], Mean}, {o[5], Rstd}};
            const isa::Arg inv = o[6].value, eps = o[7].value;
            sp.body = [=](Body& b) {
                const isa::Reg &r = b.units(), &n = b.scratch();
                b.emit(Opcode::Mul, {n, r, imm(C)});
                b.vpu(Opcode::VRSum, {b.a(Sum), b.a(X), r, imm(C)});
                b.vpu(Opcode::VMulS, {b.a(Mean), b.a(Sum), inv, r});
                b.vpu(Opcode::VSubCol, {b.a(Xc), b.a(X), b.a(Mean), r, imm(C)});
                b.vpu(Opcode::VMul, {b.a(Sq), b.a(Xc), b.a(Xc), n});
                b.vpu(Opcode::VRSum, {b.a(Sum), b.a(Sq), r, imm(C)});
                b.vpu(Opcode::VMulS, {b.a(Var), b.a(Sum), inv, r});
                b.vpu(Opcode::VAddS, {b.a(Var), b.a(Var), eps, r});
                b.vpu(Opcode::VRsqrt, {b.a(Rstd), b.a(Var), r});
                b.vpu(Opcode::VMulCol, {b.a(Xh), b.a(Xc), b.a(Rstd), r, imm(C)});
                broadcast_row(b, G, X, 0, C);
                b.vpu(Opcode::VMul, {b.a(Y), b.a(Xh), b.a(G), n});
                b.vpu(Opcode::VAddRow, {b.a(Out), b.a(Y), b.f(1), r, imm(C)});
            };
            return sp;
        }
        case TensorOp::LayerNormGrad: {
            enum { X, Dy, Mean, Rstd, Xc, Xh, Gb, G, Gx, T, U, Dx, P, S1, S2 };
            enum { Gamma, Dg, Db, Tg, Tb };
            Spec sp;
            sp.fp = {info_of(op).name,
                     units,
                     {C, C, 1, 1, C, C, C, C, C, C, C, C, C, 1, 1},
                     {C, C, C, C, C}};
            sp.fixed_ins = {{o[2], Gamma}};
            sp.fixed_outs = {{o[6], Dg}, {o[7], Db}};
            sp.ins = {{o[0], X}, {o[1], Dy}, {o[3], Mean}, {o[4], Rstd}};
            sp.outs = {{o[5], Dx}};
            const isa::Arg inv = o[8].value;
            sp.body = [=](Body& b) {
                const isa::Reg &r = b.units(), &n = b.scratch();
                b.emit(Opcode::Mul, {n, r, imm(C)});
                b.vpu(Opcode::VSubCol, {b.a(Xc), b.a(X), b.a(Mean), r, imm(C)});
                b.vpu(Opcode::VMulCol, {b.a(Xh), b.a(Xc), b.a(Rstd), r, imm(C)});
                broadcast_row(b, Gb, X, Gamma, C);
                b.vpu(Opcode::VMul, {b.a(G), b.a(Dy), b.a(Gb), n});
                b.vpu(Opcode::VRSum, {b.a(S1), b.a(G), r, imm(C)});
                b.vpu(Opcode::VMulS, {b.a(S1), b.a(S1), inv, r});
                b.vpu(Opcode::VMul, {b.a(Gx), b.a(G), b.a(Xh), n});
                b.vpu(Opcode::VRSum, {b.a(S2), b.a(Gx), r, imm(C)});
                b.vpu(Opcode::VMulS, {b.a(S2), b.a(S2), inv, r});
                b.vpu(Opcode::VSubCol, {b.a(T), b.a(G), b.a(S1), r, imm(C)});
                b.vpu(Opcode::VMulCol, {b.a(U), b.a(Xh), b.a(S2), r, imm(C)});
                b.vpu(Opcode::VSub, {b.a(T), b.a(T), b.a(U), n});
                b.vpu(Opcode::VMulCol, {b.a(Dx), b.a(T), b.a(Rstd), r, imm(C)});
                b.vpu(Opcode::VMul, {b.a(P), b.a(Dy), b.a(Xh), n});
                // Column sums as col_sum: the first tile's stored, later tiles' added in order.
                b.builder().if_(
                    isa::Cond::Eq, b.tile(), imm(0),
                    [&] {
                        b.vpu(Opcode::VCSum, {b.f(Dg), b.a(P), r, imm(C)});
                        b.vpu(Opcode::VCSum, {b.f(Db), b.a(Dy), r, imm(C)});
                    },
                    [&] {
                        b.vpu(Opcode::VCSum, {b.f(Tg), b.a(P), r, imm(C)});
                        b.vpu(Opcode::VAdd, {b.f(Dg), b.f(Dg), b.f(Tg), imm(C)});
                        b.vpu(Opcode::VCSum, {b.f(Tb), b.a(Dy), r, imm(C)});
                        b.vpu(Opcode::VAdd, {b.f(Db), b.f(Db), b.f(Tb), imm(C)});
                    });
            };
            return sp;
        }
    }
    throw std::logic_error("tensor_op_spec: unknown TensorOp");
}

/// Plans `op` on this device and launches its program on `cores`, replica i of `tensors` bound
/// to its tensor parameters in order and `scalars` to its scalar ones.
Event run(Device& dev, ProgramCache& cache, TensorOp op, uint64_t units, uint32_t cols,
          const std::vector<const Tensor*>& tensors, const std::vector<uint32_t>& scalars = {}) {
    const Tensor& first = *tensors.front();
    for (const Tensor* t : tensors)
        if (t->bufs.size() != first.cores.size() || t->cores != first.cores)
            throw DeviceError(
                ErrorKind::Usage,
                fmt::format("{}: tensors on different core sets ({} and {})", info_of(op).name,
                            cores_text(first.cores), cores_text(t->cores)));
    const auto& params = info_of(op).params;
    const TensorOpKey k = plan_tensor_op(op, units, cols, dev.config().core.vmem_bytes);
    return launch(dev, cache, k, first.cores, [&](size_t i, LaunchArgs& a) {
        for (size_t p = 0; p < params.size(); ++p)
            if (params[p].scalar)
                a.set(params[p].name, scalars.at(p - tensors.size()));
            else
                a.set(params[p].name, tensors.at(p)->bufs[i]);
    });
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

// ---- keys and generators ---------------------------------------------------------------------

std::string TensorOpKey::name() const {
    return info_of(op).name;
}

TensorOpKey plan_tensor_op(TensorOp op, uint64_t units, uint32_t cols, uint64_t vmem_bytes) {
    const auto ops = streaming::placeholders(tensor_op_params(op));
    return {op, units, cols, streaming::plan(tensor_op_spec(op, units, cols, ops).fp, vmem_bytes)};
}

std::span<const Param> tensor_op_params(TensorOp op) {
    return info_of(op).params;
}

void emit(isa::Builder& b, const TensorOpKey& k, std::span<const Operand> ops) {
    streaming::check_operands(k.name(), tensor_op_params(k.op), ops);
    streaming::emit(b, tensor_op_spec(k.op, k.units, k.cols, ops), k.tile);
}

isa::Program generate(const TensorOpKey& k) {
    return streaming::standalone(
        k.name(), tensor_op_params(k.op), k.tile,
        [&](std::span<const Operand> o) { return tensor_op_spec(k.op, k.units, k.cols, o); });
}

PackKey plan_pack(uint32_t rows, uint32_t cols, uint32_t rows_padded, uint32_t cols_padded,
                  bool transposed, int parts, uint64_t vmem_bytes) {
    PackKey k{rows, cols, rows_padded, cols_padded, transposed, static_cast<uint8_t>(parts), 0};
    k.tile = streaming::plan(pack_spec(k, streaming::placeholders(kPackParams)).fp, vmem_bytes);
    return k;
}

isa::Program generate(const PackKey& k) {
    return streaming::standalone(k.name(), kPackParams, k.tile,
                                 [&](std::span<const Operand> o) { return pack_spec(k, o); });
}

ColumnCopyKey plan_column_copy(bool into, uint32_t rows, uint32_t width, uint32_t stride,
                               uint64_t vmem_bytes) {
    const auto ops = streaming::placeholders(kCopyParams);
    return {into, rows, width, stride,
            streaming::plan(column_copy_spec(into, rows, width, stride, ops).fp, vmem_bytes)};
}

isa::Program generate(const ColumnCopyKey& k) {
    return streaming::standalone(k.name(), kCopyParams, k.tile, [&](std::span<const Operand> o) {
        return column_copy_spec(k.into, k.rows, k.width, k.stride, o);
    });
}

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
        const isa::Program& prog = cache.get(*mt);
        if (prog.code.size() * isa::kInstrBytes <= dev.config().core.imem_bytes)
            return launch(dev, a.cores, prog, [&](size_t i, LaunchArgs& args) {
                args.set("a", a.bufs[i]).set("b", b.bufs[i]).set("c", c.bufs[i]);
                if (bias) args.set("bias", bias->bufs[i]);
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
        const uint64_t vmem = dev.config().core.vmem_bytes;
        evs.push_back(launch(
            dev, cache, plan_pack(M, K, M, t.Kp, transpose_a, P, vmem), a.cores,
            [&](size_t i, LaunchArgs& args) { args.set("x", a.bufs[i]).set("dst", sa[i]); }));
        evs.push_back(launch(
            dev, cache, plan_pack(K, N, t.Kp, t.Np, transpose_b, P, vmem), a.cores,
            [&](size_t i, LaunchArgs& args) { args.set("x", b.bufs[i]).set("dst", sw[i]); }));
        evs.push_back(launch(dev, cache, GemmKey{t, N}, a.cores, [&](size_t i, LaunchArgs& args) {
            args.set("a", sa[i])
                .set("w", sw[i])
                .set("c", c.bufs[i])
                .set("rows", M)
                .set("a_part_bytes", M * t.Kp * 2);
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
    return run(dev, cache, TensorOp::Copy, src.elements(), 1, {&src, &dst});
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
    const ColumnCopyKey k =
        plan_column_copy(false, dst.rows, dst.cols, src.cols, dev.config().core.vmem_bytes);
    return launch(dev, cache, k, src.cores, [&](size_t i, LaunchArgs& a) {
        a.set("src", addr(src.bufs[i]) + first_col * 4).set("dst", dst.bufs[i]);
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
    const ColumnCopyKey k =
        plan_column_copy(true, src.rows, src.cols, dst.cols, dev.config().core.vmem_bytes);
    return launch(dev, cache, k, src.cores, [&](size_t i, LaunchArgs& a) {
        a.set("src", src.bufs[i]).set("dst", addr(dst.bufs[i]) + first_col * 4);
    });
}

Event round_bf16(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_same(x, out, "round_bf16");
    return run(dev, cache, TensorOp::RoundBf16, x.elements(), 1, {&x, &out});
}

std::vector<float> round_bf16_reference(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = hw::bf16_round(x[i]);
    return out;
}

// ---- GELU ------------------------------------------------------------------------------------

Event gelu(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& out) {
    check_same(x, out, "gelu");
    return run(dev, cache, TensorOp::Gelu, x.elements(), 1, {&x, &out});
}

Event gelu_grad(Device& dev, ProgramCache& cache, const Tensor& x, const Tensor& dy,
                const Tensor& dx) {
    check_same(x, dy, "gelu_grad");
    check_same(x, dx, "gelu_grad");
    return run(dev, cache, TensorOp::GeluGrad, x.elements(), 1, {&x, &dy, &dx});
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
    const TensorOpKey k =
        plan_tensor_op(TensorOp::Dropout, x.elements(), 1, dev.config().core.vmem_bytes);
    return launch(dev, cache, k, x.cores, [&](size_t i, LaunchArgs& a) {
        a.set("x", x.bufs[i]).set("mask", mask.bufs[i]).set("out", out.bufs[i]);
        a.set("seed", seed + static_cast<uint32_t>(i)).set_f32("below_p", below(p));
        a.set_f32("keep", keep);
    });
}

uint32_t dropout_tile_values(const hw::BoardConfig& cfg, uint64_t n) {
    return plan_tensor_op(TensorOp::Dropout, n, 1, cfg.core.vmem_bytes).tile;
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
    return run(dev, cache, TensorOp::LayerNorm, x.rows, x.cols,
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
    return run(dev, cache, TensorOp::LayerNormGrad, x.rows, x.cols,
               {&x, &dy, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta}, {f32_bits(inv)});
}

uint32_t layer_norm_grad_tile_rows(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols) {
    return plan_tensor_op(TensorOp::LayerNormGrad, rows, cols, cfg.core.vmem_bytes).tile;
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
