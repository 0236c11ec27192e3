// SPDX-License-Identifier: Apache-2.0
// The dot kernel's accumulate-into-C mode (DotKey::accumulate): dots over consecutive K blocks,
// each starting from the previous one's C, give the bits of one dot over all of K (a filter
// gradient's K loop, compiler/README.md "Filter gradients over K blocks"), race detector on.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "driver/kernels/kernel.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using isa::imm;
using isa::Opcode;
using tutil::bits_of;
using tutil::random_values;

struct Blocks {
    uint32_t M = 0, N = 0;
    std::vector<uint32_t> ks;  ///< K of each block (all but the last a multiple of 128)
    bool residual = false;     ///< the last block's epilogue adds a Full side
    uint32_t block_rows = 0;   ///< 0: plan_dot's
};

/// A (M x K, stored transposed as a filter gradient's col) times W (K x N) over the blocks `ks`
/// in one program: the first dot from zero into P, the others accumulating from P (the middle
/// ones back into P), the last into C through the epilogue; C against one dot over all of K.
void run_blocks(Device& dev, const Blocks& t, uint32_t seed) {
    const hw::BoardConfig& cfg = dev.config();
    uint32_t K = 0;
    for (uint32_t k : t.ks) K += k;
    const auto a = random_values(size_t(t.M) * K, seed, -2.0f, 2.0f);
    const auto w = random_values(size_t(K) * t.N, seed + 1, -2.0f, 2.0f);
    const auto res = random_values(size_t(t.M) * t.N, seed + 2, -2.0f, 2.0f);
    std::vector<float> at(a.size());  // A^T: K x M row-major
    for (uint32_t r = 0; r < t.M; ++r)
        for (uint32_t c = 0; c < K; ++c) at[size_t(c) * t.M + r] = a[size_t(r) * K + c];
    auto put = [&](const std::vector<float>& v) {
        Buffer buf = dev.alloc(v.size() * 4, 0);
        dev.write(buf, v.data(), v.size() * 4);
        return buf;
    };
    const Buffer ba = put(at), bw = put(w), br = put(res);
    const Buffer bp = dev.alloc(size_t(t.M) * t.N * 4, 0), bc = dev.alloc(size_t(t.M) * t.N * 4, 0);

    DotKey shape{.M = t.M,
                 .K = t.ks.front(),
                 .N = t.N,
                 .a = DotLayout::Transposed,
                 .full_sides = t.residual ? 1u : 0u};
    auto planned = plan_dot(cfg, shape, cfg.core.vmem_bytes);
    ASSERT_TRUE(planned);
    if (t.block_rows) planned->block_rows = t.block_rows;
    isa::Builder b("dot_accumulate_test");
    const isa::Reg ra = b.arg("a"), rw = b.arg("w"), rp = b.arg("p"), rc = b.arg("c"),
                   rr = b.arg("res");
    using streaming::Operand;
    uint64_t k0 = 0;
    for (size_t i = 0; i < t.ks.size(); ++i) {
        const bool last = i + 1 == t.ks.size();
        DotKey k = *planned;
        k.K = t.ks[i];
        k.accumulate = i > 0;
        k.full_sides = last && t.residual ? 1 : 0;
        const DotOperands ops{Operand::hbm(ra + int64_t(k0 * t.M * 4)),
                              Operand::hbm(rw + int64_t(k0 * t.N * 4)),
                              Operand::hbm(last ? isa::Arg(rc) : isa::Arg(rp))};
        Epilogue ep;
        if (k.full_sides) {
            ep.sides.push_back({EpilogueSide::Kind::Full, Operand::hbm(rr)});
            ep.body = [](EpilogueTile& tile) {
                isa::Builder& bb = tile.builder();
                const isa::Reg n = bb.reg("epilogue.values");
                bb.emit(Opcode::Mul, {n, tile.rows(), imm(tile.cols())});
                tile.vpu(Opcode::VAdd, {tile.out(), tile.out(), tile.side(0), n});
            };
        }
        if (last && i > 0)
            emit_dot_accumulate(b, k, ops, Operand::hbm(rp), ep);
        else
            emit_dot(b, k, ops, ep);
        k0 += t.ks[i];
    }
    b.emit(Opcode::Halt, {});
    launch(dev, {0}, b.finish(), [&](size_t, LaunchArgs& args) {
        args.set("a", ba).set("w", bw).set("p", bp).set("c", bc).set("res", br);
    });
    std::vector<float> got(size_t(t.M) * t.N);
    dev.read(bc, got.data(), got.size() * 4);
    auto want = matmul_reference(a, t.M, K, false, w, K, t.N, false, Precision::Bf16, planned->R);
    if (t.residual) want = add_reference(want, res);
    EXPECT_EQ(bits_of(got), bits_of(want));
    for (const Buffer& x : {ba, bw, br, bp, bc}) dev.free(x);
}

TEST(DotAccumulate, BlocksOverKAddUpToOneDotBitExact) {
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    // One column group, a short last K block (a partial last step) and the epilogue's side.
    run_blocks(*dev, {.M = 72, .N = 64, .ks = {256, 128, 200}, .residual = true}, 3);
    // Three column groups of two MXUs (first, middle, last: 5 panels, a narrow last one) and
    // several blocks of rows (each block's groups load their own C panels).
    run_blocks(*dev, {.M = 100, .N = 600, .ks = {384, 256, 130}, .block_rows = 40}, 13);
}

TEST(DotAccumulate, RefusesWhatItCannotAccumulate) {
    auto dev = Device::open(hw::BoardConfig::load("", {}));
    DotKey k{.M = 64, .K = 128, .N = 128, .store_bf16 = true, .accumulate = true};
    k = *plan_dot(dev->config(), k, dev->config().core.vmem_bytes);
    k.accumulate = true;
    isa::Builder b("refused");
    const isa::Reg r = b.arg("x");
    const DotOperands ops{streaming::Operand::hbm(r), streaming::Operand::hbm(r),
                          streaming::Operand::hbm(r)};
    Epilogue ep;
    ep.store_bf16 = true;
    EXPECT_THROW(emit_dot(b, k, ops, ep), isa::BuildError);  // C stored as bf16
    k.store_bf16 = false;
    k.accumulate = false;
    EXPECT_THROW(emit_dot_accumulate(b, k, ops, streaming::Operand::hbm(r)), isa::BuildError);
}

}  // namespace
}  // namespace tpu::driver
