// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "driver/kernels/kernel.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/vector_ops.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using tutil::bits_of;
using tutil::open_device;
using tutil::random_values;

const std::vector<uint32_t> kEight = {0, 1, 2, 3, 4, 5, 6, 7};

std::string text(const PoolShape& s) {
    return fmt::format("{}x{}x{}x{} k{} s{} p{}", s.batch, s.height, s.width, s.channels, s.kernel,
                       s.stride, s.pad);
}

/// Forward and backward of max and average pooling on `cores` (different data per replica),
/// each replica bit-exact against the references.
void check_pool(Device& dev, ProgramCache& cache, const std::vector<uint32_t>& cores,
                const PoolShape& s, uint32_t seed) {
    SCOPED_TRACE(text(s) + fmt::format(" on {} cores", cores.size()));
    const uint32_t in = s.batch * s.height * s.width,
                   out = s.batch * s.out_height() * s.out_width();
    Tensor x = alloc_tensor(dev, cores, in, s.channels),
           dx = alloc_tensor(dev, cores, in, s.channels);
    Tensor y = alloc_tensor(dev, cores, out, s.channels),
           dy = alloc_tensor(dev, cores, out, s.channels);
    std::vector<std::vector<float>> xs, dys;
    for (size_t i = 0; i < cores.size(); ++i) {
        xs.push_back(random_values(size_t(in) * s.channels, seed + uint32_t(i)));
        dys.push_back(random_values(size_t(out) * s.channels, seed + 50 + uint32_t(i)));
        write_tensor(dev, x, i, xs.back());
        write_tensor(dev, dy, i, dys.back());
    }
    max_pool2d(dev, cache, s, x, y);
    max_pool2d_grad(dev, cache, s, x, dy, dx);
    for (size_t i = 0; i < cores.size(); ++i) {
        ASSERT_EQ(bits_of(read_tensor(dev, y, i)), bits_of(max_pool2d_reference(s, xs[i])))
            << "max_pool2d replica " << i;
        ASSERT_EQ(bits_of(read_tensor(dev, dx, i)),
                  bits_of(max_pool2d_grad_reference(s, xs[i], dys[i])))
            << "max_pool2d_grad replica " << i;
    }
    avg_pool2d(dev, cache, s, x, y);
    avg_pool2d_grad(dev, cache, s, dy, dx);
    for (size_t i = 0; i < cores.size(); ++i) {
        ASSERT_EQ(bits_of(read_tensor(dev, y, i)), bits_of(avg_pool2d_reference(s, xs[i])))
            << "avg_pool2d replica " << i;
        ASSERT_EQ(bits_of(read_tensor(dev, dx, i)), bits_of(avg_pool2d_grad_reference(s, dys[i])))
            << "avg_pool2d_grad replica " << i;
    }
    for (Tensor* t : {&x, &dx, &y, &dy}) free_tensor(dev, *t);
}

TEST(Pool, MaxAndAvgBitExactOnOneCore) {
    auto dev = open_device();
    ProgramCache cache;
    // Stride 2 with padding 1; channels past 128; stride 1 (overlapping windows, three per
    // input row); a 1x1 kernel with stride 2 (columns and rows no window reads get zero
    // gradient); a 7x7 kernel with padding 3; kernel = stride; odd sizes throughout.
    const std::vector<PoolShape> shapes = {
        {.batch = 2, .height = 7, .width = 9, .channels = 3, .kernel = 3, .stride = 2, .pad = 1},
        {.batch = 1, .height = 6, .width = 5, .channels = 130, .kernel = 2, .stride = 2},
        {.batch = 1, .height = 6, .width = 5, .channels = 4, .kernel = 3, .stride = 1, .pad = 1},
        {.batch = 2, .height = 5, .width = 6, .channels = 2, .kernel = 1, .stride = 2},
        {.batch = 1, .height = 9, .width = 8, .channels = 5, .kernel = 7, .stride = 1, .pad = 3},
        {.batch = 1, .height = 10, .width = 11, .channels = 3, .kernel = 3, .stride = 3, .pad = 1},
    };
    uint32_t seed = 1;
    for (const PoolShape& s : shapes) check_pool(*dev, cache, {0}, s, seed += 10);
}

TEST(Pool, MaxAndAvgBitExactPerReplicaOnEightCores) {
    auto dev = open_device();
    ProgramCache cache;
    check_pool(
        *dev, cache, kEight,
        {.batch = 2, .height = 5, .width = 7, .channels = 6, .kernel = 3, .stride = 2, .pad = 1},
        3);
}

TEST(Pool, MaxPoolRoutesTiesToTheFirstMaximum) {
    auto dev = open_device();
    ProgramCache cache;
    // A constant image: every tap of a window ties, so each window's dy goes to its first
    // tap (top-left, padding excluded since -inf is below every value).
    const PoolShape s{.batch = 1, .height = 4, .width = 4, .channels = 1, .kernel = 2, .stride = 2};
    Tensor x = alloc_tensor(*dev, {0}, 16, 1), dx = alloc_tensor(*dev, {0}, 16, 1);
    Tensor dy = alloc_tensor(*dev, {0}, 4, 1);
    write_tensor(*dev, x, 0, std::vector<float>(16, 1.5f));
    write_tensor(*dev, dy, 0, {1.0f, 2.0f, 3.0f, 4.0f});
    max_pool2d_grad(*dev, cache, s, x, dy, dx);
    const std::vector<float> want = {1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0};
    EXPECT_EQ(read_tensor(*dev, dx, 0), want);
    EXPECT_EQ(max_pool2d_grad_reference(s, std::vector<float>(16, 1.5f), {1, 2, 3, 4}), want);
}

TEST(Pool, GlobalAvgPoolBitExactOnOneAndEightCores) {
    auto dev = open_device();
    ProgramCache cache;
    for (const std::vector<uint32_t>& cores : {std::vector<uint32_t>{0}, kEight}) {
        const PoolShape s{.batch = 3, .height = 7, .width = 5, .channels = 131};
        SCOPED_TRACE(fmt::format("{} cores", cores.size()));
        Tensor x = alloc_tensor(*dev, cores, 3 * 35, 131),
               dx = alloc_tensor(*dev, cores, 3 * 35, 131);
        Tensor y = alloc_tensor(*dev, cores, 3, 131), dy = alloc_tensor(*dev, cores, 3, 131);
        std::vector<std::vector<float>> xs, dys;
        for (size_t i = 0; i < cores.size(); ++i) {
            xs.push_back(random_values(3 * 35 * 131, 70 + uint32_t(i)));
            dys.push_back(random_values(3 * 131, 90 + uint32_t(i)));
            write_tensor(*dev, x, i, xs.back());
            write_tensor(*dev, dy, i, dys.back());
        }
        global_avg_pool(*dev, cache, s, x, y);
        global_avg_pool_grad(*dev, cache, s, dy, dx);
        for (size_t i = 0; i < cores.size(); ++i) {
            EXPECT_EQ(bits_of(read_tensor(*dev, y, i)),
                      bits_of(global_avg_pool_reference(s, xs[i])));
            EXPECT_EQ(bits_of(read_tensor(*dev, dx, i)),
                      bits_of(global_avg_pool_grad_reference(s, dys[i])));
        }
        for (Tensor* t : {&x, &dx, &y, &dy}) free_tensor(*dev, *t);
    }
}

TEST(Pool, MaxPoolThenReluAndGlobalPoolInOneProgramThroughVmem) {
    // y = relu(max_pool2d(x)) with the pooled rows left in a VMEM region of the caller's that
    // relu reads, then g = global_avg_pool(y) from HBM: three kernels in one program, the race
    // detector on (open_device), so a missing wait or a shared flag would be a device fault.
    auto dev = open_device();
    const PoolShape s{
        .batch = 2, .height = 9, .width = 7, .channels = 5, .kernel = 3, .stride = 2, .pad = 1};
    const PoolShape gs{.batch = 2, .height = s.out_height(), .width = s.out_width(), .channels = 5};
    const uint32_t in = s.batch * s.height * s.width,
                   out = s.batch * s.out_height() * s.out_width();
    const auto& cfg = dev->config();
    isa::Builder b("pool_relu_gap",
                   {.vmem_bytes = cfg.core.vmem_bytes, .smem_bytes = cfg.core.smem_bytes});
    const isa::Reg xr = b.arg("x"), yr = b.arg("y"), gr = b.arg("g");
    {
        const isa::Vmem pooled = b.vmem("pooled", uint64_t(out) * s.channels * 4);
        emit(b, plan_pool(PoolOp::Max, s, b.vmem_free()),
             std::vector{streaming::Operand::hbm(xr), streaming::Operand::vmem(pooled)});
        emit(b, plan_vector(VectorOp::Relu, uint64_t(out) * s.channels, 1, b.vmem_free()),
             std::vector{streaming::Operand::vmem(pooled), streaming::Operand::hbm(yr)});
    }
    emit(b, plan_pool(PoolOp::Global, gs, b.vmem_free()),
         std::vector{streaming::Operand::hbm(yr), streaming::Operand::hbm(gr)});
    b.emit(isa::Opcode::Halt, {});
    const isa::Program prog = b.finish();
    Tensor x = alloc_tensor(*dev, {0}, in, s.channels),
           y = alloc_tensor(*dev, {0}, out, s.channels);
    Tensor g = alloc_tensor(*dev, {0}, s.batch, s.channels);
    const std::vector<float> xv = random_values(size_t(in) * s.channels, 5);
    write_tensor(*dev, x, 0, xv);
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& a) {
        a.set("x", x.bufs[0]).set("y", y.bufs[0]).set("g", g.bufs[0]);
    });
    const std::vector<float> want = relu_reference(max_pool2d_reference(s, xv));
    EXPECT_EQ(bits_of(read_tensor(*dev, y, 0)), bits_of(want));
    EXPECT_EQ(bits_of(read_tensor(*dev, g, 0)), bits_of(global_avg_pool_reference(gs, want)));
    // The window rows are gathered by strided DMAs from HBM: x in VMEM is refused when built.
    isa::Builder c("bad");
    const isa::Vmem v = c.vmem("x", 4096);
    const isa::Reg r = c.arg("y");
    try {
        emit(c, plan_pool(PoolOp::Max, s, 1 << 20),
             std::vector{streaming::Operand::vmem(v), streaming::Operand::hbm(r)});
        ADD_FAILURE() << "no error";
    } catch (const isa::BuildError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "kernel 'max_pool2d': a custom transfer needs its tensor in HBM");
    }
    for (Tensor* t : {&x, &y, &g}) free_tensor(*dev, *t);
}

TEST(Pool, BadWindowsAreUsageErrors) {
    auto dev = open_device();
    ProgramCache cache;
    Tensor x = alloc_tensor(*dev, {0}, 16, 1), y = alloc_tensor(*dev, {0}, 4, 1);
    const PoolShape s{
        .batch = 1, .height = 4, .width = 4, .channels = 1, .kernel = 2, .stride = 2, .pad = 2};
    EXPECT_EQ(tutil::error_of([&] { max_pool2d(*dev, cache, s, x, y); }, true),
              "max_pool2d: pad 2 is more than half the kernel 2");
    // Issue #30, item 4: 2 x pad 2^31 wrapped to 0 in 32 bits and passed the rule above.
    PoolShape wraps = s;
    wraps.pad = 2147483648u;
    EXPECT_EQ(tutil::error_of([&] { max_pool2d(*dev, cache, wraps, x, y); }, true),
              "max_pool2d: pad 2147483648 is more than half the kernel 2");
    // And batch x height x width rows beyond a tensor's 32-bit row count.
    PoolShape rows = s;
    rows.pad = 0;
    rows.batch = 65536;
    rows.height = 65536;
    EXPECT_EQ(tutil::error_of([&] { max_pool2d(*dev, cache, rows, x, y); }, true),
              "max_pool2d: batch 65536 x height 65536 x width 4 = 17179869184 rows, more than a "
              "tensor holds (2^32 - 1)");
    // Global pooling keeps one image per tile: 512 x 512 x 16 values (16 MiB) cannot sit in two
    // slots (2 x (16 MiB + 2 x 256 bytes for the sum and mean areas)) of a 16 MiB VMEM.
    const PoolShape big{.batch = 1, .height = 512, .width = 512, .channels = 16};
    Tensor img = alloc_tensor(*dev, {0}, 512 * 512, 16), mean = alloc_tensor(*dev, {0}, 1, 16);
    EXPECT_EQ(tutil::error_of([&] { global_avg_pool(*dev, cache, big, img, mean); }, true),
              "global_avg_pool: a row of 4194304 values needs 33555456 bytes of VMEM in two tile "
              "slots; the core has 16777216");
}

}  // namespace
}  // namespace tpu::driver
