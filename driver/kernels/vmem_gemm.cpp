// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/vmem_gemm.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "isa/builder.h"

namespace tpu::driver {

using isa::Opcode;

VmemGemmBytes vmem_gemm_bytes(const VmemGemm& g, uint32_t R, uint32_t C) {
    const uint64_t kt = (g.K + R - 1) / R, nt = (g.N + C - 1) / C;
    return {kt * g.M * R * 2, kt * nt * R * C * 2, nt * g.M * C * 4};
}

isa::Program vmem_gemm_program(const VmemGemm& g, uint32_t R, uint32_t C) {
    if (g.M == 0 || g.K == 0 || g.N == 0 || g.mxus == 0)
        throw std::invalid_argument(
            fmt::format("GEMM shape {}x{}x{} on {} MXUs is empty", g.M, g.K, g.N, g.mxus));
    const uint32_t kt = (g.K + R - 1) / R, nt = (g.N + C - 1) / C;
    isa::Builder b;
    using isa::imm;
    for (uint32_t n0 = 0; n0 < nt; n0 += g.mxus) {
        const uint32_t group = std::min(g.mxus, nt - n0);
        for (uint32_t k = 0; k < kt; ++k) {
            const uint32_t kk = std::min(R, g.K - k * R);
            for (uint32_t m = 0; m < group; ++m) {
                const uint32_t n = n0 + m;
                const uint32_t nn = std::min(C, g.N - n * C);
                const uint64_t w = g.w_addr + (uint64_t(n) * kt + k) * R * C * 2;
                const uint64_t a = g.a_addr + uint64_t(k) * g.M * R * 2;
                const uint64_t c = g.c_addr + uint64_t(n) * g.M * C * 4;
                b.emit(Opcode::MxuLw, {imm(m), imm(int64_t(w)), imm(kk), imm(nn)});
                if (k + 1 == kt)
                    b.emit(Opcode::MxuMm, {imm(m), imm(int64_t(c)), imm(int64_t(a)), imm(g.M),
                                           imm(k > 0), isa::f(g.done_flag)});
                else
                    b.emit(Opcode::MxuMm,
                           {imm(m), imm(int64_t(c)), imm(int64_t(a)), imm(g.M), imm(k > 0)});
            }
        }
    }
    b.emit(Opcode::Wait, {isa::f(g.done_flag), imm(nt)});
    b.emit(Opcode::Halt, {});
    return b.finish();
}

std::vector<uint16_t> pack_a(const std::vector<uint16_t>& a, uint32_t M, uint32_t K, uint32_t R) {
    const uint32_t kt = (K + R - 1) / R;
    std::vector<uint16_t> out(size_t(kt) * M * R, 0);
    for (uint32_t k = 0; k < kt; ++k) {
        const uint32_t kk = std::min(R, K - k * R);
        uint16_t* panel = &out[size_t(k) * M * R];
        for (uint32_t i = 0; i < M; ++i)
            std::copy_n(&a[size_t(i) * K + k * R], kk, &panel[size_t(i) * kk]);
    }
    return out;
}

std::vector<uint16_t> pack_w(const std::vector<uint16_t>& w, uint32_t K, uint32_t N, uint32_t R,
                             uint32_t C) {
    const uint32_t kt = (K + R - 1) / R, nt = (N + C - 1) / C;
    std::vector<uint16_t> out(size_t(kt) * nt * R * C, 0);
    for (uint32_t n = 0; n < nt; ++n)
        for (uint32_t k = 0; k < kt; ++k) {
            const uint32_t kk = std::min(R, K - k * R), nn = std::min(C, N - n * C);
            uint16_t* tile = &out[(size_t(n) * kt + k) * R * C];
            for (uint32_t r = 0; r < kk; ++r)
                std::copy_n(&w[size_t(k * R + r) * N + n * C], nn, &tile[size_t(r) * nn]);
        }
    return out;
}

std::vector<float> unpack_c(const std::vector<float>& c, uint32_t M, uint32_t N, uint32_t C) {
    const uint32_t nt = (N + C - 1) / C;
    std::vector<float> out(size_t(M) * N);
    for (uint32_t n = 0; n < nt; ++n) {
        const uint32_t nn = std::min(C, N - n * C);
        const float* panel = &c[size_t(n) * M * C];
        for (uint32_t i = 0; i < M; ++i)
            std::copy_n(&panel[size_t(i) * nn], nn, &out[size_t(i) * N + n * C]);
    }
    return out;
}

}  // namespace tpu::driver
