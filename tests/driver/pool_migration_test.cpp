// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the builder pooling kernels emit the same binaries as the text
// kernels they replace, for the shapes the tests, the trainer's models (the CNN's 2 x 2 pools,
// ResNet-18/50's stem max pool and global average pool) and random windows use.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "driver/kernels/pool.h"
#include "hw/board.h"

namespace tpu::driver::text_pool {
isa::Program pool_program_text(int which, const PoolShape& s, uint64_t vmem_bytes);
}  // namespace tpu::driver::text_pool

namespace tpu::driver {
namespace {

TEST(PoolMigration, BuilderProgramsEqualTheTextKernels) {
    const uint64_t vmem = hw::BoardConfig::load("", {}).core.vmem_bytes;
    std::vector<PoolShape> shapes = {
        {.batch = 2, .height = 7, .width = 9, .channels = 3, .kernel = 3, .stride = 2, .pad = 1},
        {.batch = 1, .height = 6, .width = 5, .channels = 130, .kernel = 2, .stride = 2},
        {.batch = 1, .height = 6, .width = 5, .channels = 4, .kernel = 3, .stride = 1, .pad = 1},
        {.batch = 2, .height = 5, .width = 6, .channels = 2, .kernel = 1, .stride = 2},
        {.batch = 1, .height = 9, .width = 8, .channels = 5, .kernel = 7, .stride = 1, .pad = 3},
        {.batch = 1, .height = 10, .width = 11, .channels = 3, .kernel = 3, .stride = 3, .pad = 1},
        {.batch = 2, .height = 5, .width = 7, .channels = 6, .kernel = 3, .stride = 2, .pad = 1},
        {.batch = 1, .height = 4, .width = 4, .channels = 1, .kernel = 2, .stride = 2},
        {.batch = 3, .height = 7, .width = 5, .channels = 131},
        {.batch = 1,
         .height = 112,
         .width = 112,
         .channels = 64,
         .kernel = 3,
         .stride = 2,
         .pad = 1},
    };
    for (uint32_t n : {1u, 2u, 4u, 8u, 16u, 32u, 64u}) {
        shapes.push_back({n, 112, 112, 64, 3, 2, 1});  // ResNet stem pool at 224 x 224
        shapes.push_back({n, 16, 16, 64, 3, 2, 1});    // and at 32 x 32
        shapes.push_back({n, 28, 28, 32, 2, 2, 0});    // the CNN's pools
        shapes.push_back({n, 14, 14, 64, 2, 2, 0});
        shapes.push_back({n, 7, 7, 512});  // ResNet-18/50 global average pools
        shapes.push_back({n, 7, 7, 2048});
        shapes.push_back({n, 1, 1, 512});
    }
    std::mt19937 rng(11);
    std::uniform_int_distribution<uint32_t> d(1, 12);
    while (shapes.size() < 200) {
        PoolShape s{.batch = d(rng) % 4 + 1,
                    .height = d(rng),
                    .width = d(rng),
                    .channels = d(rng) * (d(rng) % 3 ? 1 : 20),
                    .kernel = d(rng) % 5 + 1,
                    .stride = d(rng) % 4 + 1};
        s.pad = d(rng) % (s.kernel / 2 + 1);
        if (s.height + 2 * s.pad < s.kernel || s.width + 2 * s.pad < s.kernel) continue;
        shapes.push_back(s);
    }
    const PoolOp ops[] = {PoolOp::Max,     PoolOp::Avg,    PoolOp::MaxGrad,
                          PoolOp::AvgGrad, PoolOp::Global, PoolOp::GlobalGrad};
    int checked = 0;
    for (const PoolShape& s : shapes)
        for (int w = 0; w < 6; ++w) {
            PoolKey k;
            try {
                k = plan_pool(ops[w], s, vmem);
            } catch (const DeviceError&) {
                continue;  // does not fit: neither kernel builds
            }
            const auto want = isa::encode_program(text_pool::pool_program_text(w, k.shape, vmem));
            ASSERT_EQ(isa::encode_program(generate(k)), want)
                << k.name()
                << fmt::format(" {}x{}x{}x{} k{} s{} p{}", s.batch, s.height, s.width, s.channels,
                               s.kernel, s.stride, s.pad);
            ++checked;
        }
    EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace tpu::driver
