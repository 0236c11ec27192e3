// SPDX-License-Identifier: Apache-2.0
// The single-core GEMM kernel on CoreModel alone: bit-exact against the MXU contract on ragged
// shapes, and the worked timing example of hw/README.md.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "driver/kernels/vmem_gemm.h"
#include "hw/board_config.h"
#include "hw/core/core_model.h"
#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"

namespace tpu::hw {
namespace {

struct GemmRun {
    std::vector<float> c;
    uint64_t cycles;
    std::vector<InstrRecord> records;
};

GemmRun run_gemm(BoardConfig cfg, uint32_t M, uint32_t K, uint32_t N, uint32_t mxus,
                 const std::vector<uint16_t>& a, const std::vector<uint16_t>& w) {
    const uint32_t R = cfg.core.mxu_rows, C = cfg.core.mxu_cols;
    driver::VmemGemm g{M, K, N, 0, 0, 0, mxus, 3};
    const auto bytes = driver::vmem_gemm_bytes(g, R, C);
    g.w_addr = static_cast<uint32_t>(bytes.a);
    g.c_addr = static_cast<uint32_t>(bytes.a + bytes.w);
    SparseMemory hbm("hbm", cfg.hbm.bytes_per_core), vmem("vmem", cfg.core.vmem_bytes);
    const auto pa = driver::pack_a(a, M, K, R), pw = driver::pack_w(w, K, N, R, C);
    vmem.write(0, {reinterpret_cast<const uint8_t*>(pa.data()), pa.size() * 2});
    vmem.write(g.w_addr, {reinterpret_cast<const uint8_t*>(pw.data()), pw.size() * 2});
    CoreModel core(0, cfg, hbm, vmem, nullptr);
    core.record(true);
    core.load(driver::vmem_gemm_program(g, R, C));
    core.start(0, {});
    const auto st = core.run_alone();
    EXPECT_EQ(st.block, CoreModel::Block::Halted);
    std::vector<float> packed(bytes.c / 4);
    vmem.read(g.c_addr, {reinterpret_cast<uint8_t*>(packed.data()), bytes.c});
    return {driver::unpack_c(packed, M, N, C), st.cycle, core.records()};
}

TEST(VmemGemm, RaggedShapesAreBitExact) {
    BoardConfig cfg;
    cfg.core.mxu_rows = cfg.core.mxu_cols = 8;
    std::mt19937 rng(3);
    for (auto [M, K, N] :
         {std::array<uint32_t, 3>{1, 1, 1}, {7, 9, 5}, {13, 8, 8}, {16, 17, 23}, {30, 40, 9}}) {
        std::vector<uint16_t> a(size_t(M) * K), w(size_t(K) * N);
        std::normal_distribution<float> nd;
        for (auto& x : a) x = f32_to_bf16(nd(rng));
        for (auto& x : w) x = f32_to_bf16(nd(rng));
        for (uint32_t mxus : {1u, 2u}) {
            const GemmRun r = run_gemm(cfg, M, K, N, mxus, a, w);
            // Reference: the whole K at once, accumulated in 8-row passes like the tiles.
            std::vector<float> want(size_t(M) * N, 0.0f);
            for (uint32_t k0 = 0; k0 < K; k0 += 8) {
                const uint32_t kk = std::min(8u, K - k0);
                std::vector<uint16_t> ap(size_t(M) * kk), wp(size_t(kk) * N);
                for (uint32_t i = 0; i < M; ++i)
                    for (uint32_t k = 0; k < kk; ++k) ap[i * kk + k] = a[i * K + k0 + k];
                for (uint32_t k = 0; k < kk; ++k)
                    for (uint32_t n = 0; n < N; ++n) wp[k * N + n] = w[(k0 + k) * N + n];
                mxu_matmul(ap.data(), int(M), int(kk), wp.data(), int(N), want.data(), k0 > 0);
            }
            EXPECT_EQ(0, std::memcmp(r.c.data(), want.data(), want.size() * 4))
                << M << "x" << K << "x" << N << " on " << mxus << " MXUs";
        }
    }
}

TEST(VmemGemm, WorkedExampleOfTheReadme) {
    // 128 x 512 x 128 on one 128x128 MXU: 4 folds of T = 128 (hw/README.md, "MXU").
    auto spans_of = [](bool drains, uint64_t& cycles) {
        BoardConfig cfg;
        cfg.sim.functional = false;
        cfg.core.mxu_swap_drains = drains;
        const GemmRun r = run_gemm(cfg, 128, 512, 128, 1, std::vector<uint16_t>(128 * 512),
                                   std::vector<uint16_t>(512 * 128));
        std::vector<std::pair<uint64_t, uint64_t>> spans;
        for (const auto& rec : r.records)
            if (rec.op == isa::Opcode::MxuLw || rec.op == isa::Opcode::MxuMm)
                spans.emplace_back(rec.start, rec.done);
        cycles = r.cycles;
        return spans;
    };
    uint64_t cycles = 0;
    // The default board: a matmul on a new tile waits until the previous one has left the
    // array, so each fold costs T + R + C - 2 = 382 cycles.
    const std::vector<std::pair<uint64_t, uint64_t>> drained = {
        {1, 129},    {129, 511},  // lw0, mm0: the mm waits for its weights
        {129, 257},  {511, 893},  // lw1 loads the shadow while mm0 streams; mm1 waits for its drain
        {511, 639},  {893, 1275},  //
        {893, 1021}, {1275, 1657}};
    EXPECT_EQ(spans_of(true, cycles), drained);
    EXPECT_EQ(cycles, 1658u);  // wait sees f3 at 1657; halt issues at 1658
    // The wavefront swap: mm1 follows mm0's input port, each fold costs max(T, R) = 128.
    const std::vector<std::pair<uint64_t, uint64_t>> wavefront = {{1, 129},   {129, 511},  //
                                                                  {129, 257}, {257, 639},  //
                                                                  {257, 385}, {385, 767},  //
                                                                  {385, 513}, {513, 895}};
    EXPECT_EQ(spans_of(false, cycles), wavefront);
    EXPECT_EQ(cycles, 896u);
}

}  // namespace
}  // namespace tpu::hw
