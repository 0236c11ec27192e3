// SPDX-License-Identifier: Apache-2.0
// The composable dot emitter (emit_dot): every operand layout, both stationary sides and the
// epilogues of output fusions, bit-exact against the host references with the race detector on;
// a dot composed with softmax in one program (through HBM and through VMEM); two library GEMMs
// (emit_gemm) in one program.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/gemm.h"
#include "driver/kernels/kernel.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/core/numerics.h"
#include "tests/common/paths.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using isa::fimm;
using isa::imm;
using isa::Opcode;
using tutil::bits_of;
using tutil::random_values;

int parts_of(Precision p) {
    return p == Precision::Bf16 ? 1 : p == Precision::Fp32Pass3 ? 2 : 3;
}
uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

/// Index of element (r, c) of a rows x cols array in DotLayout::VpuTiles (8 x 128 tiles).
size_t tiled_at(uint32_t r, uint32_t c, uint32_t cols) {
    return (size_t(r / 8) * ceil_div(cols, 128) + c / 128) * 1024 + (r % 8) * 128 + c % 128;
}

/// Bytes of `x` (rows x cols, row-major) in `layout` (matmul_kernel.h's DotLayout offsets).
std::vector<uint8_t> lay_out(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                             DotLayout layout, bool is_a, const DotKey& k) {
    const uint32_t R = k.R, C = k.C;
    std::vector<uint8_t> out;
    auto put32 = [&](std::vector<float>& v) {
        out.resize(v.size() * 4);
        std::memcpy(out.data(), v.data(), out.size());
    };
    switch (layout) {
        case DotLayout::RowMajor: {
            std::vector<float> v = x;
            put32(v);
            break;
        }
        case DotLayout::Transposed: {
            std::vector<float> v(x.size());
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t c = 0; c < cols; ++c)
                    v[size_t(c) * rows + r] = x[size_t(r) * cols + c];
            put32(v);
            break;
        }
        case DotLayout::Tiles: {  // W (K x N): fp32 R x C tiles
            const uint32_t KT = ceil_div(rows, R), NT = ceil_div(cols, C);
            std::vector<float> v(size_t(KT) * NT * R * C, 0.0f);
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t c = 0; c < cols; ++c)
                    v[(size_t(r / R) * NT + c / C) * R * C + (r % R) * C + c % C] =
                        x[size_t(r) * cols + c];
            put32(v);
            break;
        }
        case DotLayout::VpuTiles: {  // A or C: fp32 8 x 128 tiles, row-major grid
            const uint32_t CT = ceil_div(cols, 128);
            std::vector<float> v(size_t(ceil_div(rows, 8)) * CT * 1024, 0.0f);
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t c = 0; c < cols; ++c)
                    v[tiled_at(r, c, cols)] = x[size_t(r) * cols + c];
            put32(v);
            break;
        }
        case DotLayout::TransposedTiles: {  // the transpose (cols x rows) in R x C tiles
            const uint32_t RT = ceil_div(cols, R), CT = ceil_div(rows, C);
            std::vector<float> v(size_t(RT) * CT * R * C, 0.0f);
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t c = 0; c < cols; ++c)
                    v[(size_t(c / R) * CT + r / C) * R * C + (c % R) * C + r % C] =
                        x[size_t(r) * cols + c];
            put32(v);
            break;
        }
        case DotLayout::TransposedVpuTiles: {  // the transpose (cols x rows) in 8 x 128 tiles
            std::vector<float> v(size_t(ceil_div(cols, 8)) * ceil_div(rows, 128) * 1024, 0.0f);
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t c = 0; c < cols; ++c)
                    v[tiled_at(c, r, rows)] = x[size_t(r) * cols + c];
            put32(v);
            break;
        }
        case DotLayout::Gemm: {  // bf16 parts; A: KT panels of M x R, W: R x C tiles
            const int P = parts_of(k.precision);
            const uint32_t KT = ceil_div(is_a ? cols : rows, R);
            const size_t part =
                is_a ? size_t(rows) * KT * R : size_t(KT) * R * ceil_div(cols, C) * C;
            std::vector<uint16_t> v(P * part, 0);
            const uint32_t NT = ceil_div(cols, C);
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t c = 0; c < cols; ++c) {
                    const auto s = hw::split3(x[size_t(r) * cols + c]);
                    const size_t at =
                        is_a ? (size_t(c / R) * rows + r) * R + c % R
                             : (size_t(r / R) * NT + c / C) * R * C + (r % R) * C + c % C;
                    for (int q = 0; q < P; ++q) v[q * part + at] = s[q];
                }
            out.resize(v.size() * 2);
            std::memcpy(out.data(), v.data(), out.size());
            break;
        }
    }
    return out;
}

/// An output fusion under test: optional bias (Column side), ReLU, residual (Full side).
struct Fusion {
    bool bias = false, relu = false, residual = false, store_bf16 = false;
};

struct Case {
    uint32_t M = 0, K = 0, N = 0;
    Precision precision = Precision::Bf16;
    DotLayout a = DotLayout::RowMajor, w = DotLayout::RowMajor, c = DotLayout::RowMajor;
    Stationary stationary = Stationary::Rhs;
    Fusion f;
    uint32_t block_rows = 0;    ///< 0: plan_dot's
    uint32_t group_panels = 0;  ///< column panels per MXU in a group (0: plan_dot's)
    /// C in one buffer, the Full sides prefetched and each panel's epilogue after a step of its
    /// own (DotKey::one_c_buffer, prefetch_sides, overlap_epilogue: the compiler's 2-D dots).
    bool one_c_buffer = false;
};

std::string describe(const Case& t, const DotKey& k) {
    return fmt::format("{}x{}x{} {} a {} w {} c {} {} T{} gp{} bias{} relu{} res{} bf16{}", t.M,
                       t.K, t.N, precision_name(t.precision), dot_layout_name(t.a),
                       dot_layout_name(t.w), dot_layout_name(t.c),
                       t.stationary == Stationary::Lhs ? "lhs" : "rhs", k.block_rows,
                       k.group_panels, t.f.bias, t.f.relu, t.f.residual, t.f.store_bf16);
}

/// The epilogue body of `f`: bias row, ReLU, residual, in that order (sides: bias first).
std::function<void(EpilogueTile&)> body_of(const Fusion& f) {
    if (!f.bias && !f.relu && !f.residual) return {};
    return [f](EpilogueTile& t) {
        isa::Builder& b = t.builder();
        const isa::Reg n = b.reg("epilogue.values");
        b.emit(Opcode::Mul, {n, t.rows(), imm(t.cols())});
        if (f.bias) t.vpu(Opcode::VAddRow, {t.out(), t.out(), t.side(0), t.rows(), imm(t.cols())});
        if (f.relu) t.vpu(Opcode::VMaxS, {t.out(), t.out(), fimm(0.0f), n});
        if (f.residual) t.vpu(Opcode::VAdd, {t.out(), t.out(), t.side(f.bias ? 1 : 0), n});
    };
}

/// The host reference of the fused dot: matmul_reference, then the epilogue's fp32 ops.
std::vector<float> reference(const Case& t, const std::vector<float>& a,
                             const std::vector<float>& w, const std::vector<float>& bias,
                             const std::vector<float>& res, uint32_t R) {
    auto y = matmul_reference(a, t.M, t.K, false, w, t.K, t.N, false, t.precision, R);
    if (t.f.bias) y = bias_add_reference(y, bias, t.M, t.N);
    if (t.f.relu) y = relu_reference(y);
    if (t.f.residual) y = add_reference(y, res);
    return y;
}

/// C (fp32 values, or bf16 as fp32) out of its HBM bytes in `layout`.
std::vector<float> read_c(const std::vector<uint8_t>& bytes, const Case& t, const DotKey& k) {
    const size_t e = t.f.store_bf16 ? 2 : 4;
    std::vector<float> y(size_t(t.M) * t.N);
    for (uint32_t r = 0; r < t.M; ++r)
        for (uint32_t c = 0; c < t.N; ++c) {
            const size_t at = t.c == DotLayout::Gemm ? (size_t(c / k.C) * t.M + r) * k.C + c % k.C
                              : t.c == DotLayout::VpuTiles           ? tiled_at(r, c, t.N)
                              : t.c == DotLayout::TransposedVpuTiles ? tiled_at(c, r, t.M)
                              : t.c == DotLayout::TransposedTiles
                                  ? (size_t(c / k.C) * ceil_div(t.M, k.C) + r / k.C) * k.C * k.C +
                                        (c % k.C) * k.C + r % k.C
                                  : size_t(r) * t.N + c;
            if (e == 4) {
                std::memcpy(&y[size_t(r) * t.N + c], bytes.data() + at * 4, 4);
            } else {
                uint16_t h;
                std::memcpy(&h, bytes.data() + at * 2, 2);
                y[size_t(r) * t.N + c] = hw::bf16_to_f32(h);
            }
        }
    return y;
}

std::vector<float> to_bf16(std::vector<float> y) {
    for (float& v : y) v = hw::bf16_to_f32(hw::f32_to_bf16(v));
    return y;
}

/// One SystemC simulation per test process: every case of a test runs on its device.
std::unique_ptr<Device> open_checked() {
    return Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
}

void run_case(Device& device, const Case& t, uint32_t seed) {
    const hw::BoardConfig& cfg = device.config();
    DotKey shape{.M = t.M,
                 .K = t.K,
                 .N = t.N,
                 .precision = t.precision,
                 .a = t.a,
                 .w = t.w,
                 .c = t.c,
                 .stationary = t.stationary,
                 .column_sides = t.f.bias ? 1u : 0u,
                 .full_sides = t.f.residual ? 1u : 0u,
                 .store_bf16 = t.f.store_bf16};
    auto planned = plan_dot(cfg, shape, cfg.core.vmem_bytes);
    ASSERT_TRUE(planned);
    DotKey k = *planned;
    if (t.block_rows) k.block_rows = t.block_rows;
    if (t.group_panels) k.group_panels = t.group_panels;
    if (t.one_c_buffer) {
        k.one_c_buffer = true;
        k.prefetch_sides = k.full_sides > 0;
        k.overlap_epilogue = true;
    }
    SCOPED_TRACE(describe(t, k) + (t.one_c_buffer ? " one C buffer" : ""));
    const auto a = random_values(size_t(t.M) * t.K, seed, -2.0f, 2.0f);
    const auto w = random_values(size_t(t.K) * t.N, seed + 1, -2.0f, 2.0f);
    const auto bias = random_values(t.N, seed + 2, -2.0f, 2.0f);
    const auto res = random_values(size_t(t.M) * t.N, seed + 3, -2.0f, 2.0f);

    Device* dev = &device;
    auto put = [&](const std::vector<uint8_t>& bytes) {
        Buffer buf = dev->alloc(std::max<size_t>(bytes.size(), 4), 0);
        dev->write(buf, bytes.data(), bytes.size());
        return buf;
    };
    const Buffer ba = put(lay_out(a, t.M, t.K, t.a, true, k));
    const Buffer bw = put(lay_out(w, t.K, t.N, t.w, false, k));
    const Buffer bb = put(lay_out(bias, 1, t.N, DotLayout::RowMajor, false, k));
    // A residual has the output's shape and layout.
    const std::vector<uint8_t> res_bytes = [&] {
        if (t.c != DotLayout::Gemm)
            return lay_out(res, t.M, t.N,
                           t.c == DotLayout::VpuTiles ? DotLayout::VpuTiles : DotLayout::RowMajor,
                           false, k);
        std::vector<float> v(size_t(ceil_div(t.N, k.C)) * k.C * t.M, 0.0f);
        for (uint32_t r = 0; r < t.M; ++r)
            for (uint32_t c = 0; c < t.N; ++c)
                v[(size_t(c / k.C) * t.M + r) * k.C + c % k.C] = res[size_t(r) * t.N + c];
        std::vector<uint8_t> out(v.size() * 4);
        std::memcpy(out.data(), v.data(), out.size());
        return out;
    }();
    const Buffer br = put(res_bytes);
    const size_t c_bytes = t.c == DotLayout::TransposedTiles
                               ? size_t(ceil_div(t.N, k.C)) * ceil_div(t.M, k.C) * k.C * k.C * 4
                           : t.c == DotLayout::VpuTiles
                               ? size_t(ceil_div(t.M, 8)) * ceil_div(t.N, 128) * 4096
                           : t.c == DotLayout::TransposedVpuTiles
                               ? size_t(ceil_div(t.N, 8)) * ceil_div(t.M, 128) * 4096
                               : (t.c == DotLayout::Gemm ? size_t(ceil_div(t.N, k.C)) * k.C : t.N) *
                                     t.M * (t.f.store_bf16 ? 2 : 4);
    const Buffer bc = dev->alloc(c_bytes, 0);

    isa::Builder b("dot_test");
    const isa::Reg ra = b.arg("a"), rw = b.arg("w"), rc = b.arg("c");
    Epilogue ep;
    isa::Reg rbias, rres;
    if (t.f.bias) {
        rbias = b.arg("bias");
        ep.sides.push_back({EpilogueSide::Kind::Column, streaming::Operand::hbm(rbias)});
    }
    if (t.f.residual) {
        rres = b.arg("res");
        ep.sides.push_back({EpilogueSide::Kind::Full, streaming::Operand::hbm(rres)});
    }
    ep.body = body_of(t.f);
    ep.store_bf16 = t.f.store_bf16;
    emit_dot(
        b, k,
        {streaming::Operand::hbm(ra), streaming::Operand::hbm(rw), streaming::Operand::hbm(rc)},
        ep);
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& args) {
        args.set("a", ba).set("w", bw).set("c", bc);
        if (t.f.bias) args.set("bias", bb);
        if (t.f.residual) args.set("res", br);
    });
    std::vector<uint8_t> got_bytes(c_bytes);
    dev->read(bc, got_bytes.data(), c_bytes);
    auto want = reference(t, a, w, bias, res, k.R);
    if (t.f.store_bf16) want = to_bf16(want);
    EXPECT_EQ(bits_of(read_c(got_bytes, t, k)), bits_of(want));
}

const Fusion kNone{};
const Fusion kBiasRelu{.bias = true, .relu = true};
const Fusion kResidual{.residual = true};
const Fusion kAll{.bias = true, .relu = true, .residual = true};
const Fusion kBf16{.bias = true, .store_bf16 = true};
const Fusion kAllBf16{.bias = true, .relu = true, .residual = true, .store_bf16 = true};

TEST(DotKernel, FusedEpiloguesAreBitExact) {
    // Ragged M, K, N (a narrow last panel, a short last K tile); several blocks where block_rows
    // is set, so a block's first group overwrites A's panels and the Column side stays.
    const std::vector<Case> cases = {
        {.M = 37, .K = 300, .N = 129, .precision = Precision::Bf16, .f = kBiasRelu},
        {.M = 100,
         .K = 130,
         .N = 300,
         .precision = Precision::Fp32Pass3,
         .f = kAll,
         .block_rows = 24},
        {.M = 50, .K = 260, .N = 260, .precision = Precision::Fp32Pass6, .f = kResidual},
        {.M = 33, .K = 129, .N = 200, .precision = Precision::Bf16, .f = kBf16},
        {.M = 70,
         .K = 140,
         .N = 520,
         .precision = Precision::Fp32Pass3,
         .f = kAllBf16,
         .block_rows = 32},
    };
    uint32_t seed = 11;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, TransposedAndTiledOperandsAreBitExact) {
    // W stored N x K (dX = dY W^T), A stored K x M, W in fp32 tiles.
    const std::vector<Case> cases = {
        {.M = 45,
         .K = 200,
         .N = 140,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::RowMajor,
         .w = DotLayout::Transposed,
         .f = kBiasRelu},
        {.M = 60,
         .K = 150,
         .N = 300,
         .precision = Precision::Bf16,
         .a = DotLayout::Transposed,
         .w = DotLayout::Transposed,
         .f = kResidual,
         .block_rows = 16},
        {.M = 40,
         .K = 257,
         .N = 129,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::Transposed,
         .w = DotLayout::Tiles,
         .f = kAll},
        {.M = 300,
         .K = 128,
         .N = 256,
         .precision = Precision::Bf16,
         .a = DotLayout::RowMajor,
         .w = DotLayout::Tiles,
         .f = kNone},
    };
    uint32_t seed = 71;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, ActivationsInEightByOneTwentyEightTilesAreBitExact) {
    // The compiler's default layout of an activation (T(8,128)): A read a band of 8 rows at a
    // time, C and the residual written and read the same way; one, two and three column groups
    // (N = 128, 384, 768 on two MXUs), several blocks where block_rows is set.
    const std::vector<Case> cases = {
        {.M = 64,
         .K = 256,
         .N = 384,
         .precision = Precision::Bf16,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .f = kAll,
         .block_rows = 16},
        {.M = 40,
         .K = 384,
         .N = 768,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::RowMajor,
         .c = DotLayout::VpuTiles,
         .f = kBiasRelu},
        {.M = 24,
         .K = 130,
         .N = 128,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::RowMajor,
         .w = DotLayout::Transposed,
         .c = DotLayout::VpuTiles,
         .f = kResidual},
        {.M = 56,
         .K = 128,
         .N = 200,
         .precision = Precision::Bf16,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::RowMajor,
         .f = kNone,
         .block_rows = 24},
        // W an activation too (a dot of two activations): its 128 x 128 tiles are 16 bands.
        {.M = 48,
         .K = 256,
         .N = 640,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::VpuTiles,
         .f = kAll,
         .block_rows = 16},
        {.M = 20,
         .K = 384,
         .N = 256,
         .precision = Precision::Bf16,
         .a = DotLayout::RowMajor,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::RowMajor,
         .f = kBiasRelu},
    };
    uint32_t seed = 231;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, TheLhsStationaryReadsAndWritesEightByOneTwentyEightTiles) {
    // C^T = W^T A^T with A^T held and W^T streamed, both stored transposed in 8 x 128 tiles
    // (the compiler's {0,1:T(8,128)} of A, {1,0:T(8,128)} of a [N, K] weight): C in tiles,
    // written per band and column tile of each transposed-back result tile (several blocks,
    // the residual read the same way), or C^T in tiles (the result tile transposed again,
    // stored as the RHS stationary stores it; three panels, N not a multiple of 128), or C
    // from fp32 row-major operands.
    const std::vector<Case> cases = {
        {.M = 256,
         .K = 256,
         .N = 1152,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::VpuTiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 384},
        {.M = 384,
         .K = 256,
         .N = 200,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::TransposedVpuTiles,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu,
         .block_rows = 104},
        {.M = 136,
         .K = 130,
         .N = 256,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::RowMajor,
         .w = DotLayout::Transposed,
         .c = DotLayout::VpuTiles,
         .stationary = Stationary::Lhs,
         .f = kResidual},
    };
    uint32_t seed = 531;
    // The streamed operand stored transposed in tiles (a weight gradient's dY^T with the RHS
    // stationary, W stored K x N with the LHS stationary): blocks of one tile column, the last
    // one short (M = 200), transposed in VMEM.
    const std::vector<Case> streamed_transposed = {
        {.M = 200,
         .K = 256,
         .N = 384,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .f = kAll},
        {.M = 256,
         .K = 128,
         .N = 300,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::RowMajor,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu},
    };
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
    for (const Case& t : streamed_transposed) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, TheBackwardReadsAndWritesWeightsInTheirTransposedMxuTiles) {
    // A [out, in] weight lies as W^T in 128 x 128 tiles ({0,1:T(128,128)}): dX = dY W reads it
    // tile by tile, transposed in VMEM; dW = dY^T X writes C^T in the same tiles, the result
    // tile transposed after its epilogue (blocks of whole tiles; M = 200 and N = 200 pad the
    // last tiles, whose padding is don't-care).
    const std::vector<Case> cases = {
        {.M = 64,
         .K = 300,
         .N = 200,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::RowMajor,
         .w = DotLayout::TransposedTiles,
         .c = DotLayout::RowMajor,
         .f = kBiasRelu},
        {.M = 48,
         .K = 256,
         .N = 384,
         .precision = Precision::Bf16,
         .a = DotLayout::RowMajor,
         .w = DotLayout::TransposedTiles,
         .c = DotLayout::VpuTiles,
         .f = kAll},
        {.M = 200,
         .K = 128,
         .N = 384,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::TransposedTiles,
         .f = kBiasRelu},
        {.M = 384,
         .K = 64,
         .N = 256,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::Transposed,
         .w = DotLayout::RowMajor,
         .c = DotLayout::TransposedTiles,
         .f = kNone,
         .block_rows = 256},
    };
    uint32_t seed = 631;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, PaddedEightByOneTwentyEightTilesAreBitExact) {
    // Dims that are not whole tiles (XLA's tiles pad them; the padding's values are
    // unspecified): rows not a multiple of 8, K and N not multiples of 128, on either side
    // stationary; a narrow last panel of W and C moved band by band.
    std::vector<Case> cases = {
        {.M = 20,
         .K = 200,
         .N = 200,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::VpuTiles,
         .f = kAll,
         .block_rows = 16},
        {.M = 30,
         .K = 300,
         .N = 10,
         .precision = Precision::Bf16,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .f = kBiasRelu},
        {.M = 200,
         .K = 200,
         .N = 10,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::VpuTiles,
         .stationary = Stationary::Lhs,
         .f = kAll},
        {.M = 128,
         .K = 100,
         .N = 20,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::TransposedVpuTiles,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu},
        {.M = 10,
         .K = 128,
         .N = 300,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::TransposedTiles,
         .f = kNone},
    };
    // A held operand stored transposed in tiles (the weight gradient's X when the planner
    // holds it), and C^T in the MXU's tiles with the LHS stationary (a weight gradient
    // streaming N = 784 inputs' columns).
    cases.push_back({.M = 10,
                     .K = 128,
                     .N = 200,
                     .precision = Precision::Fp32Pass3,
                     .a = DotLayout::TransposedVpuTiles,
                     .w = DotLayout::TransposedVpuTiles,
                     .c = DotLayout::VpuTiles,
                     .f = kBiasRelu});
    cases.push_back({.M = 256,
                     .K = 128,
                     .N = 300,
                     .precision = Precision::Bf16,
                     .a = DotLayout::TransposedVpuTiles,
                     .w = DotLayout::VpuTiles,
                     .c = DotLayout::TransposedTiles,
                     .stationary = Stationary::Lhs,
                     .f = kBiasRelu});
    cases.push_back({.M = 200,
                     .K = 100,
                     .N = 260,
                     .precision = Precision::Fp32Pass6,
                     .a = DotLayout::RowMajor,
                     .w = DotLayout::VpuTiles,
                     .c = DotLayout::TransposedTiles,
                     .stationary = Stationary::Lhs,
                     .f = kNone});
    uint32_t seed = 731;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, EightByOneTwentyEightTilesFeedA256Array) {
    // v6e's 256 x 256 MXUs (Cloud TPU v6e system architecture, docs.cloud.google.com/tpu/docs/
    // v6e: 256x256 matrix-multiply units beside a VPU of 128 lanes x 8 sublanes; four per core
    // in the preset, configs/presets.md) read the compiler's 8 x 128 tiles too: an MXU tile is
    // R / 8 bands of C / 128 tiles, a whole panel moved band by band and tile by tile in a loop
    // per tile column, or unrolled per band (a last panel or step narrower than 256 values,
    // padded or not a multiple of 128). Either side stationary, C in tiles or transposed in
    // them, operands transposed in tiles.
    const std::vector<Case> cases = {
        // K = 512 whole steps; N = 768: three panels of one group; W in the MXU's tiles.
        {.M = 40,
         .K = 512,
         .N = 768,
         .precision = Precision::Bf16,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .f = kAll,
         .block_rows = 16},
        // K = 384: a last step of 128 values; N = 1280: a group of four panels and one more.
        {.M = 48,
         .K = 384,
         .N = 1280,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::VpuTiles,
         .f = kAll},
        // Padded: K = 200 (a step of a whole tile and 72 lanes of the next), N = 456 (a last
        // panel of 200 columns: a tile and 72 lanes), rows not a multiple of 8.
        {.M = 20,
         .K = 200,
         .N = 456,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::VpuTiles,
         .f = kAll,
         .block_rows = 16},
        // N = 384: a last panel of one whole tile.
        {.M = 24,
         .K = 256,
         .N = 384,
         .precision = Precision::Bf16,
         .a = DotLayout::RowMajor,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::VpuTiles,
         .f = kResidual},
        // The LHS stationary: A^T held and W^T streamed in transposed tiles, C in tiles.
        {.M = 256,
         .K = 512,
         .N = 1152,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::VpuTiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 384},
        // C^T in tiles: M = 384 is a panel of 256 and one of 128.
        {.M = 384,
         .K = 256,
         .N = 200,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::TransposedVpuTiles,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu,
         .block_rows = 104},
        // The streamed operand transposed in tiles (a weight gradient's dY^T), K = 512.
        {.M = 200,
         .K = 512,
         .N = 384,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .f = kAll},
        {.M = 256,
         .K = 128,
         .N = 300,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::RowMajor,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu},
        // A held W^T in tiles with K = 384 (a step of two tile columns, then one).
        {.M = 10,
         .K = 384,
         .N = 200,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::TransposedVpuTiles,
         .c = DotLayout::VpuTiles,
         .f = kBiasRelu},
        // C^T in the MXU's 256 x 256 tiles (a weight gradient in its parameter's layout):
        // blocks of two tile columns of the streamed dY^T, a short last one (M = 300) reading
        // one.
        {.M = 300,
         .K = 128,
         .N = 256,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::TransposedTiles,
         .f = kNone},
        {.M = 256,
         .K = 128,
         .N = 300,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedVpuTiles,
         .w = DotLayout::VpuTiles,
         .c = DotLayout::TransposedTiles,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu},
    };
    uint32_t seed = 931;
    auto dev = Device::open(hw::BoardConfig::load(test::source_dir() + "/configs/v6e-8.json",
                                                  {"sim.race_detector=true"}));
    ASSERT_EQ(dev->config().core.mxu_rows, 256u);
    for (const Case& t : cases) {
        SCOPED_TRACE(fmt::format("{}x{}x{}", t.M, t.K, t.N));
        const auto k = plan_dot(dev->config(),
                                DotKey{.M = t.M,
                                       .K = t.K,
                                       .N = t.N,
                                       .a = t.a,
                                       .w = t.w,
                                       .c = t.c,
                                       .stationary = t.stationary},
                                dev->config().core.vmem_bytes);
        ASSERT_TRUE(k);
        EXPECT_EQ(k->mxus, 4u);
        run_case(*dev, t, seed += 10);
    }
}

TEST(DotKernel, GemmLayoutsAreBitExact) {
    // The library GEMM's tile-major bf16 operands and C panels (fp32 or bf16).
    const std::vector<Case> cases = {
        {.M = 37,
         .K = 300,
         .N = 129,
         .precision = Precision::Bf16,
         .a = DotLayout::Gemm,
         .w = DotLayout::Gemm,
         .c = DotLayout::Gemm,
         .f = kBiasRelu},
        {.M = 90,
         .K = 200,
         .N = 300,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::Gemm,
         .w = DotLayout::Gemm,
         .c = DotLayout::Gemm,
         .f = kAll,
         .block_rows = 40},
        {.M = 70,
         .K = 130,
         .N = 140,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::RowMajor,
         .w = DotLayout::Gemm,
         .c = DotLayout::RowMajor,
         .f = kResidual},
        {.M = 50,
         .K = 129,
         .N = 260,
         .precision = Precision::Bf16,
         .a = DotLayout::Gemm,
         .w = DotLayout::RowMajor,
         .c = DotLayout::Gemm,
         .f = kAllBf16},
    };
    uint32_t seed = 131;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, LhsStationaryIsBitExact) {
    // C^T = W^T A^T: A's tiles held, W's columns streamed; the same passes in the same order,
    // so the same bits as C = A W; each result tile transposed back before the epilogue.
    const std::vector<Case> cases = {
        {.M = 129,
         .K = 200,
         .N = 30,
         .precision = Precision::Bf16,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu},
        {.M = 260,
         .K = 130,
         .N = 45,
         .precision = Precision::Fp32Pass3,
         .a = DotLayout::Transposed,
         .w = DotLayout::RowMajor,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 16},
        {.M = 100,
         .K = 300,
         .N = 70,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::RowMajor,
         .w = DotLayout::Transposed,
         .stationary = Stationary::Lhs,
         .f = kResidual},
        {.M = 140,
         .K = 129,
         .N = 20,
         .precision = Precision::Bf16,
         .stationary = Stationary::Lhs,
         .f = kAllBf16},
    };
    uint32_t seed = 191;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, TheLastGroupIsStoredInTwoPiecesBitExact) {
    // A last group with a second panel on every MXU (group_panels > 1): at the kernel's end the
    // first panel of each MXU is stored once its last matmul is done (its own flag), the others
    // after every MXU is done; in every flush each panel's stores follow its own epilogue while
    // the VPU works on the next panel's (two VPU flags in turn). Ragged blocks, a narrow last
    // panel (an odd count: MXU 0 takes three), both stationary sides, several groups, fp32
    // passes, a bf16 C.
    const std::vector<Case> cases = {
        {.M = 300,
         .K = 260,
         .N = 650,
         .precision = Precision::Bf16,
         .f = kAll,
         .block_rows = 128,
         .group_panels = 3},
        {.M = 70,
         .K = 140,
         .N = 520,
         .precision = Precision::Fp32Pass3,
         .f = kAllBf16,
         .block_rows = 32,
         .group_panels = 3},
        {.M = 100,
         .K = 130,
         .N = 1000,
         .precision = Precision::Bf16,
         .f = kBiasRelu,
         .block_rows = 64,
         .group_panels = 2},
        {.M = 390,
         .K = 200,
         .N = 300,
         .precision = Precision::Bf16,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 128,
         .group_panels = 2},
        {.M = 260,
         .K = 130,
         .N = 45,
         .precision = Precision::Fp32Pass6,
         .a = DotLayout::Transposed,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu,
         .block_rows = 16,
         .group_panels = 2},
    };
    uint32_t seed = 311;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, CInOneBufferBitExact) {
    // DotKey::one_c_buffer (LHS stationary): each group's panels are transposed out of C before
    // the next group's first matmuls overwrite it, and with a prefetched residual its tiles sit
    // in two panel slots, panel m + 2's loaded once panel m's epilogue is done (the last block's
    // panels 2 and 3 into the streamed operand's staging slots). Several groups
    // (the pending group a middle and a last one), ragged blocks, a flush in one piece (3 K
    // steps) and split over steps (5), the end's flush, C row-major and in 8 x 128 tiles, fp32
    // passes, a bf16 C, a weight streamed from its MXU tiles.
    const std::vector<Case> cases = {
        {.M = 520,
         .K = 384,
         .N = 700,
         .precision = Precision::Bf16,
         .w = DotLayout::Tiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 256,
         .group_panels = 2,
         .one_c_buffer = true},
        {.M = 512,
         .K = 640,
         .N = 768,
         .precision = Precision::Bf16,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 256,
         .group_panels = 2,
         .one_c_buffer = true},
        {.M = 256,
         .K = 256,
         .N = 300,
         .precision = Precision::Fp32Pass3,
         .stationary = Stationary::Lhs,
         .f = kAllBf16,
         .block_rows = 128,
         .group_panels = 1,
         .one_c_buffer = true},
        {.M = 384,
         .K = 256,
         .N = 1000,
         .precision = Precision::Bf16,
         .w = DotLayout::Tiles,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu,
         .block_rows = 384,
         .group_panels = 1,
         .one_c_buffer = true},
        // One group a block: the last block's panels 2 and 3 of the residual in the streamed
        // operand's staging slots (one block, its first step in halves; three, a ragged last).
        {.M = 512,
         .K = 384,
         .N = 256,
         .precision = Precision::Bf16,
         .a = DotLayout::VpuTiles,
         .w = DotLayout::Tiles,
         .c = DotLayout::VpuTiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 256,
         .group_panels = 2,
         .one_c_buffer = true},
        {.M = 512,
         .K = 384,
         .N = 700,
         .precision = Precision::Bf16,
         .w = DotLayout::Tiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 256,
         .group_panels = 2,
         .one_c_buffer = true},
    };
    uint32_t seed = 511;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, ThePlannerKeepsCInOneBufferWhereItTakesFewerBlocks) {
    // BERT-large's projection part (512 x 2048 x 2048, weight streamed from its MXU tiles, the
    // activations in 8 x 128 tiles, a bias): with C in two buffers a block of 2 048 streamed rows
    // does not fit in VMEM (C twice, its transposed copy, the staged panel: about 8 KiB a row),
    // so the planner cuts two blocks of 1 024 and each held tile pays two drains; with one
    // buffer the whole 2 048 rows fit in one block. BERT-base's (768) is one block either way,
    // so it keeps two buffers (one costs each group a wait for its transposes).
    const auto cfg = hw::BoardConfig::load("", {});
    DotKey shape{.M = 512,
                 .K = 2048,
                 .N = 2048,
                 .a = DotLayout::VpuTiles,
                 .w = DotLayout::Tiles,
                 .c = DotLayout::VpuTiles,
                 .stationary = Stationary::Lhs,
                 .column_sides = 1};
    const auto two = plan_dot(cfg, shape, cfg.core.vmem_bytes);
    ASSERT_TRUE(two);
    EXPECT_FALSE(two->one_c_buffer);
    EXPECT_EQ(two->block_rows, 1024u);
    shape.one_c_buffer = true;
    const auto one = plan_dot(cfg, shape, cfg.core.vmem_bytes);
    ASSERT_TRUE(one);
    EXPECT_TRUE(one->one_c_buffer);
    EXPECT_EQ(one->block_rows, 2048u);
    EXPECT_LE(dot_vmem_bytes(*one), cfg.core.vmem_bytes);
    shape.K = shape.N = 768;
    const auto base = plan_dot(cfg, shape, cfg.core.vmem_bytes);
    ASSERT_TRUE(base);
    EXPECT_FALSE(base->one_c_buffer);
    EXPECT_EQ(base->block_rows, 768u);
}

TEST(DotKernel, TheFirstStepRunsInTwoHalvesBitExact) {
    // A streamed operand in the MXU's tiles (a weight: A stored transposed in tiles with the RHS
    // stationary, W in tiles with the LHS), bf16: the kernel's first step converts and streams
    // the first half of its panel while the second half arrives, the first panel of each MXU
    // going on with the second half's rows on the same weights. A short first block (a padded
    // last tile), several blocks, a single and a double panel per MXU, every epilogue side.
    const std::vector<Case> cases = {
        {.M = 300,
         .K = 256,
         .N = 300,
         .precision = Precision::Bf16,
         .a = DotLayout::TransposedTiles,
         .f = kAll,
         .block_rows = 384},
        {.M = 200,
         .K = 384,
         .N = 520,
         .precision = Precision::Bf16,
         .w = DotLayout::Tiles,
         .stationary = Stationary::Lhs,
         .f = kBiasRelu,
         .block_rows = 256},
        {.M = 390,
         .K = 256,
         .N = 1000,
         .precision = Precision::Bf16,
         .w = DotLayout::Tiles,
         .stationary = Stationary::Lhs,
         .f = kAll,
         .block_rows = 512,
         .group_panels = 2},
    };
    uint32_t seed = 411;
    auto dev = open_checked();
    for (const Case& t : cases) run_case(*dev, t, seed += 10);
}

TEST(DotKernel, EmptyEpilogueEmitsTheMatmulKernel) {
    // The stand-alone dot of a matmul's key is the matmul kernel, instruction for instruction.
    const auto cfg = hw::BoardConfig::load("", {});
    for (const auto& [M, K, N, ta, tb] :
         std::vector<std::tuple<uint32_t, uint32_t, uint32_t, bool, bool>>{
             {37, 300, 129, false, false},
             {300, 1152, 640, true, true},
             {8, 256, 129, false, true}})
        for (Precision p : {Precision::Bf16, Precision::Fp32Pass6}) {
            const auto mk = plan_matmul(cfg, M, K, N, ta, tb, p);
            ASSERT_TRUE(mk);
            EXPECT_EQ(isa::encode_program(generate(mk->dot())), isa::encode_program(generate(*mk)));
        }
}

TEST(DotKernel, UnsupportedKeysAreNamed) {
    DotKey k{.M = 10,
             .K = 10,
             .N = 10,
             .a = DotLayout::Gemm,
             .stationary = Stationary::Lhs,
             .block_rows = 8};
    EXPECT_NE(dot_unsupported(k).find("LHS stationary"), std::string::npos) << dot_unsupported(k);
    k = DotKey{.M = 10, .K = 10, .N = 10, .a = DotLayout::Tiles, .block_rows = 8};
    EXPECT_NE(dot_unsupported(k).find("tiles"), std::string::npos) << dot_unsupported(k);
    // 8 x 128 tiles pad their dims (DotKernel.PaddedEightByOneTwentyEightTilesAreBitExact) but
    // need the MXU their tiles are cut for; a weight streamed in MXU tiles (W^T with the LHS
    // stationary) is read a whole tile per K step: K a multiple of the tile.
    k = DotKey{.M = 12, .K = 128, .N = 128, .a = DotLayout::VpuTiles, .R = 64, .block_rows = 8};
    EXPECT_NE(dot_unsupported(k).find("multiple of 128 rows and columns"), std::string::npos)
        << dot_unsupported(k);
    k = DotKey{.M = 16,
               .K = 130,
               .N = 128,
               .w = DotLayout::TransposedTiles,
               .stationary = Stationary::Lhs,
               .block_rows = 128};
    EXPECT_NE(dot_unsupported(k).find("K a multiple of 128"), std::string::npos)
        << dot_unsupported(k);
    k = DotKey{
        .M = 16, .K = 128, .N = 128, .c = DotLayout::VpuTiles, .block_rows = 8, .store_bf16 = true};
    EXPECT_NE(dot_unsupported(k).find("fp32 store"), std::string::npos) << dot_unsupported(k);
    // An epilogue whose sides the key does not announce.
    k = DotKey{.M = 10, .K = 10, .N = 10, .block_rows = 8};
    isa::Builder b("dot");
    const isa::Reg x = b.arg("x");
    Epilogue ep;
    ep.sides.push_back({EpilogueSide::Kind::Column, streaming::Operand::hbm(x)});
    EXPECT_THROW(emit_dot(b, k,
                          {streaming::Operand::hbm(x), streaming::Operand::hbm(x),
                           streaming::Operand::hbm(x)},
                          ep),
                 isa::BuildError);
}

TEST(DotKernel, PlannerCountsTheDotsOwnTraffic) {
    const auto cfg = hw::BoardConfig::load("", {});
    // No extra traffic is the library GEMM's estimate, so plan_gemm's choices stay.
    const GemmTiling t = plan_gemm(cfg, 512, 768, 768, Precision::Bf16);
    const double base = gemm_estimate_cycles(cfg, t, 512);
    EXPECT_EQ(gemm_estimate_cycles(cfg, t, 512, GemmTraffic{}), base);
    // 512 x 768 x 768 bf16 is HBM-bound (README "matmul"): a residual's 1.5 MiB costs cycles,
    // fp32 operands (4 bytes a value, not 2) cost more, a bf16 C saves some.
    EXPECT_GT(gemm_estimate_cycles(cfg, t, 512, {.full_sides = 1}), base);
    EXPECT_GT(gemm_estimate_cycles(cfg, t, 512, {.a_fp32 = true, .w_fp32 = true}), base);
    EXPECT_LT(gemm_estimate_cycles(cfg, t, 512, {.c_bf16 = true}), base);
    // plan_dot keeps to the VMEM it is given (a composing caller's Builder::vmem_free()).
    const DotKey shape{.M = 2000, .K = 512, .N = 512, .full_sides = 1};
    const auto roomy = plan_dot(cfg, shape, cfg.core.vmem_bytes);
    const auto tight = plan_dot(cfg, shape, 1u << 20);
    ASSERT_TRUE(roomy && tight);
    EXPECT_LE(dot_vmem_bytes(*roomy), cfg.core.vmem_bytes);
    EXPECT_LE(dot_vmem_bytes(*tight), 1u << 20);
    EXPECT_LT(tight->block_rows, roomy->block_rows);
    EXPECT_FALSE(plan_dot(cfg, shape, 4096));
    // A key the kernel cannot run is a usage error naming why.
    EXPECT_THROW(
        plan_dot(
            cfg,
            DotKey{.M = 8, .K = 8, .N = 8, .a = DotLayout::Gemm, .stationary = Stationary::Lhs},
            cfg.core.vmem_bytes),
        DeviceError);
}

TEST(DotKernel, ComposesWithSoftmaxInOneProgram) {
    // A dot with a bias epilogue, then softmax over its rows, in one program: the softmax reads
    // C after emit_dot has waited for its stores (race detector on).
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    const uint32_t M = 70, K = 200, N = 150;
    const Precision p = Precision::Fp32Pass3;
    const auto a = random_values(size_t(M) * K, 501, -1.0f, 1.0f);
    const auto w = random_values(size_t(K) * N, 502, -1.0f, 1.0f);
    const auto bias = random_values(N, 503, -1.0f, 1.0f);
    auto dev = Device::open(cfg);
    auto put = [&](const std::vector<float>& v) {
        Buffer buf = dev->alloc(v.size() * 4, 0);
        dev->write(buf, v.data(), v.size() * 4);
        return buf;
    };
    const Buffer ba = put(a), bw = put(w), bb = put(bias);
    const Buffer bc = dev->alloc(size_t(M) * N * 4, 0), by = dev->alloc(size_t(M) * N * 4, 0);

    isa::Builder b("dot_softmax", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg ra = b.arg("a"), rw = b.arg("w"), rb = b.arg("bias"), rc = b.arg("c"),
                   ry = b.arg("y");
    {
        const auto k = plan_dot(
            cfg, DotKey{.M = M, .K = K, .N = N, .precision = p, .column_sides = 1}, b.vmem_free());
        ASSERT_TRUE(k);
        Epilogue ep;
        ep.sides.push_back({EpilogueSide::Kind::Column, streaming::Operand::hbm(rb)});
        ep.body = body_of(Fusion{.bias = true});
        emit_dot(
            b, *k,
            {streaming::Operand::hbm(ra), streaming::Operand::hbm(rw), streaming::Operand::hbm(rc)},
            ep);
    }
    const SoftmaxKey sk = plan_softmax(M, N, false, false, b.vmem_free());
    const std::vector<streaming::Operand> ops = {streaming::Operand::hbm(rc),
                                                 streaming::Operand::hbm(ry)};
    emit(b, sk, ops);
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& args) {
        args.set("a", ba).set("w", bw).set("bias", bb).set("c", bc).set("y", by);
    });
    std::vector<float> got(size_t(M) * N);
    dev->read(by, got.data(), got.size() * 4);
    const auto c = bias_add_reference(
        matmul_reference(a, M, K, false, w, K, N, false, p, cfg.core.mxu_rows), bias, M, N);
    EXPECT_EQ(bits_of(got), bits_of(softmax_reference(c, M, N)));
}

TEST(DotKernel, ComposesWithTheLayerNormThatConsumesItsResult) {
    // Issue 25's example: a GEMM (the fused dot, bias epilogue) and the layer norm of its result
    // in one program, each kernel's registers, flags and VMEM from the same pools; the layer
    // norm reads C after emit_dot has waited for its stores. Race detector on; every output of
    // the layer norm (y, mean, rstd) bit-exact with the host references.
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    const uint32_t M = 48, K = 256, N = 384;
    const Precision p = Precision::Bf16;
    const auto a = random_values(size_t(M) * K, 511, -1.0f, 1.0f);
    const auto w = random_values(size_t(K) * N, 512, -1.0f, 1.0f);
    const auto bias = random_values(N, 513, -1.0f, 1.0f);
    const auto gamma = random_values(N, 514, 0.5f, 1.5f);
    const auto beta = random_values(N, 515, -0.5f, 0.5f);
    auto dev = Device::open(cfg);
    auto put = [&](const std::vector<float>& v) {
        Buffer buf = dev->alloc(v.size() * 4, 0);
        dev->write(buf, v.data(), v.size() * 4);
        return buf;
    };
    const Buffer ba = put(a), bw = put(w), bb = put(bias), bg = put(gamma), bt = put(beta);
    const Buffer bc = dev->alloc(size_t(M) * N * 4, 0), by = dev->alloc(size_t(M) * N * 4, 0);
    const Buffer bm = dev->alloc(size_t(M) * 4, 0), br = dev->alloc(size_t(M) * 4, 0);

    isa::Builder b("gemm_layer_norm", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg ra = b.arg("a"), rw = b.arg("w"), rb = b.arg("bias"), rc = b.arg("c");
    const isa::Reg ry = b.arg("y"), rg = b.arg("gamma"), rt = b.arg("beta"), rm = b.arg("mean"),
                   rr = b.arg("rstd");
    using streaming::Operand;
    {
        const auto k = plan_dot(
            cfg, DotKey{.M = M, .K = K, .N = N, .precision = p, .column_sides = 1}, b.vmem_free());
        ASSERT_TRUE(k);
        Epilogue ep;
        ep.sides.push_back({EpilogueSide::Kind::Column, Operand::hbm(rb)});
        ep.body = body_of(Fusion{.bias = true});
        emit_dot(b, *k, {Operand::hbm(ra), Operand::hbm(rw), Operand::hbm(rc)}, ep);
    }
    const float eps = 1e-5f;
    const TensorOpKey lk = plan_tensor_op(TensorOp::LayerNorm, M, N, b.vmem_free());
    const std::vector<Operand> ops = {
        Operand::hbm(rc),
        Operand::hbm(rg),
        Operand::hbm(rt),
        Operand::hbm(ry),
        Operand::hbm(rm),
        Operand::hbm(rr),
        Operand::scalar(imm(int64_t(std::bit_cast<uint32_t>(1.0f / float(N))))),
        Operand::scalar(imm(int64_t(std::bit_cast<uint32_t>(eps))))};
    emit(b, lk, ops);
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& args) {
        args.set("a", ba).set("w", bw).set("bias", bb).set("c", bc).set("y", by);
        args.set("gamma", bg).set("beta", bt).set("mean", bm).set("rstd", br);
    });
    const auto c = bias_add_reference(
        matmul_reference(a, M, K, false, w, K, N, false, p, cfg.core.mxu_rows), bias, M, N);
    const LayerNormResult want = layer_norm_reference(c, gamma, beta, eps, M, N);
    std::vector<float> y(size_t(M) * N), mean(M), rstd(M);
    dev->read(by, y.data(), y.size() * 4);
    dev->read(bm, mean.data(), mean.size() * 4);
    dev->read(br, rstd.data(), rstd.size() * 4);
    EXPECT_EQ(bits_of(y), bits_of(want.out));
    EXPECT_EQ(bits_of(mean), bits_of(want.mean));
    EXPECT_EQ(bits_of(rstd), bits_of(want.rstd));
}

}  // namespace
}  // namespace tpu::driver

namespace tpu::driver {
namespace {

TEST(DotKernel, LeavesItsResultInVmemForTheNextKernel) {
    // C in a VMEM region of the caller (Operand::vmem: stored with dma.vv), which softmax then
    // reads from there: C never crosses HBM. A residual from VMEM too.
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    const uint32_t M = 40, K = 300, N = 140;
    const Precision p = Precision::Bf16;
    const auto a = random_values(size_t(M) * K, 601, -1.0f, 1.0f);
    const auto w = random_values(size_t(K) * N, 602, -1.0f, 1.0f);
    const auto r = random_values(size_t(M) * N, 603, -1.0f, 1.0f);
    auto dev = Device::open(cfg);
    auto put = [&](const std::vector<float>& v) {
        Buffer buf = dev->alloc(v.size() * 4, 0);
        dev->write(buf, v.data(), v.size() * 4);
        return buf;
    };
    const Buffer ba = put(a), bw = put(w), br = put(r);
    const Buffer by = dev->alloc(size_t(M) * N * 4, 0);

    isa::Builder b("dot_vmem_softmax", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg ra = b.arg("a"), rw = b.arg("w"), rr = b.arg("res"), ry = b.arg("y");
    const isa::Vmem c = b.vmem("c", uint64_t(M) * N * 4, 512);
    const isa::Vmem res = b.vmem("res", uint64_t(M) * N * 4, 512);
    {
        isa::CountedFlag in(b, "res_in", isa::Count::AtBuild);
        in.issue(Opcode::DmaHv,
                 {res.at(0), rr, imm(1), imm(M * N * 4), imm(M * N * 4), imm(M * N * 4)});
        in.wait_all();
    }
    {
        const auto k = plan_dot(
            cfg, DotKey{.M = M, .K = K, .N = N, .precision = p, .full_sides = 1}, b.vmem_free());
        ASSERT_TRUE(k);
        Epilogue ep;
        ep.sides.push_back({EpilogueSide::Kind::Full, streaming::Operand::vmem(res)});
        ep.body = body_of(Fusion{.residual = true});
        emit_dot(
            b, *k,
            {streaming::Operand::hbm(ra), streaming::Operand::hbm(rw), streaming::Operand::vmem(c)},
            ep);
    }
    const SoftmaxKey sk = plan_softmax(M, N, false, false, b.vmem_free());
    const std::vector<streaming::Operand> ops = {streaming::Operand::vmem(c),
                                                 streaming::Operand::hbm(ry)};
    emit(b, sk, ops);
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& args) {
        args.set("a", ba).set("w", bw).set("res", br).set("y", by);
    });
    std::vector<float> got(size_t(M) * N);
    dev->read(by, got.data(), got.size() * 4);
    const auto y =
        add_reference(matmul_reference(a, M, K, false, w, K, N, false, p, cfg.core.mxu_rows), r);
    EXPECT_EQ(bits_of(got), bits_of(softmax_reference(y, M, N)));
}

}  // namespace
}  // namespace tpu::driver

namespace tpu::driver {
namespace {

/// `x` (rows x cols) as the library GEMM's row-major bf16 parts: rows x cols_p each, zero-padded
/// to `rows_p` x `cols_p`, the parts one after the other.
std::vector<uint16_t> gemm_rows(const std::vector<float>& x, uint32_t rows, uint32_t cols,
                                uint32_t rows_p, uint32_t cols_p, int P) {
    std::vector<uint16_t> v(size_t(P) * rows_p * cols_p, 0);
    for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t c = 0; c < cols; ++c) {
            const auto s = hw::split3(x[size_t(r) * cols + c]);
            for (int q = 0; q < P; ++q) v[(size_t(q) * rows_p + r) * cols_p + c] = s[q];
        }
    return v;
}

TEST(GemmEmit, TwoGemmsInOneProgramAreBitExact) {
    // The second emit_gemm is not the program's first code: it zeroes its counters itself and
    // its flags are reset as the builder hands them out again (race detector on).
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = Device::open(cfg);
    struct One {
        uint32_t M, K, N;
        Precision p;
        bool a_stream;
        std::vector<float> a, w;
        Buffer ba, bw, bc;
        GemmKey key;
    };
    std::vector<One> gemms = {{37, 300, 129, Precision::Fp32Pass3, false, {}, {}, {}, {}, {}, {}},
                              {70, 200, 300, Precision::Bf16, true, {}, {}, {}, {}, {}, {}}};
    uint32_t seed = 700;
    for (One& g : gemms) {
        g.a = random_values(size_t(g.M) * g.K, seed++, -1.0f, 1.0f);
        g.w = random_values(size_t(g.K) * g.N, seed++, -1.0f, 1.0f);
        GemmTiling t = plan_gemm(cfg, g.M, g.K, g.N, g.p);
        t.a_stream = g.a_stream;
        g.key = GemmKey{t, g.N};
        const int P = parts_of(g.p);
        const auto a16 = gemm_rows(g.a, g.M, g.K, g.M, t.Kp, P);
        const auto w16 = gemm_rows(g.w, g.K, g.N, t.Kp, t.Np, P);
        g.ba = dev->alloc(a16.size() * 2, 0);
        g.bw = dev->alloc(w16.size() * 2, 0);
        g.bc = dev->alloc(size_t(g.M) * g.N * 4, 0);
        dev->write(g.ba, a16.data(), a16.size() * 2);
        dev->write(g.bw, w16.data(), w16.size() * 2);
    }
    isa::Builder b("two_gemms", {.vmem_bytes = cfg.core.vmem_bytes});
    std::vector<isa::Reg> regs;
    for (size_t i = 0; i < gemms.size(); ++i)
        for (const char* n : {"a", "w", "c"}) regs.push_back(b.arg(fmt::format("{}{}", n, i)));
    for (size_t i = 0; i < gemms.size(); ++i) {
        const One& g = gemms[i];
        using streaming::Operand;
        emit_gemm(b, g.key,
                  {Operand::hbm(regs[3 * i]), Operand::hbm(regs[3 * i + 1]),
                   Operand::hbm(regs[3 * i + 2]), Operand::scalar(imm(g.M)),
                   Operand::scalar(imm(int64_t(g.M) * g.key.tiling.Kp * 2))});
    }
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& args) {
        for (size_t i = 0; i < gemms.size(); ++i)
            args.set(fmt::format("a{}", i), gemms[i].ba)
                .set(fmt::format("w{}", i), gemms[i].bw)
                .set(fmt::format("c{}", i), gemms[i].bc);
    });
    for (const One& g : gemms) {
        std::vector<float> got(size_t(g.M) * g.N);
        dev->read(g.bc, got.data(), got.size() * 4);
        EXPECT_EQ(bits_of(got),
                  bits_of(gemm_reference(g.a, g.w, g.M, g.K, g.N, g.p, cfg.core.mxu_rows)))
            << g.M << "x" << g.K << "x" << g.N;
    }
}

}  // namespace
}  // namespace tpu::driver
