// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 25 migration): the builder conv2d kernels emit the same binaries as the text
// kernels they replace, for every tiling the planner chooses on the tests' shapes, ResNet's
// layers, the validation rows and random shapes on several boards.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "driver/kernels/conv2d.h"
#include "hw/board.h"

namespace tpu::driver::text {
isa::Program conv2d_program_text(const Conv2dShape& s, const Conv2dTiling& t);
isa::Program pack_input_text(const Conv2dShape& s, const Conv2dTiling& t, uint64_t vmem);
isa::Program pack_weight_text(const Conv2dShape& s, const Conv2dTiling& t, uint64_t vmem);
isa::Program im2col_tap_text(const Conv2dShape& s, uint32_t kh, uint32_t kw, uint64_t vmem);
isa::Program col2im_tap_text(const Conv2dShape& s, uint32_t kh, uint32_t kw, uint64_t vmem);
isa::Program im2col_rows_text(const Conv2dShape& s, uint64_t vmem);
isa::Program col2im_rows_text(const Conv2dShape& s, uint64_t vmem);
isa::Program zero_text(uint64_t units, uint64_t vmem);
}  // namespace tpu::driver::text

namespace tpu::driver {
namespace {

std::string describe(const Conv2dShape& s) {
    return fmt::format("N{} H{} W{} Cin{} Cout{} k{} s{} p{}", s.batch, s.height, s.width, s.cin,
                       s.cout, s.kernel, s.stride, s.pad);
}

/// Compares the text and builder programs of one helper; both must fail to plan alike.
template <class Text>
void compare_aux(Conv2dAux kind, const Conv2dShape& s, const hw::BoardConfig& cfg, uint32_t kh,
                 uint32_t kw, uint64_t units, Text text, int& checked, const std::string& what) {
    const uint64_t vmem = cfg.core.vmem_bytes;
    std::optional<isa::Program> want, got;
    try {
        want = text();
    } catch (const DeviceError&) {
    }
    try {
        got = generate(
            plan_conv2d_aux(kind, s, cfg.core.mxu_rows, cfg.core.mxu_cols, kh, kw, units, vmem));
    } catch (const DeviceError&) {
    }
    ASSERT_EQ(want.has_value(), got.has_value()) << what;
    if (!want) return;
    ASSERT_EQ(isa::encode_program(*got), isa::encode_program(*want)) << what;
    ++checked;
}

TEST(Conv2dMigration, BuilderProgramsEqualTheTextKernels) {
    const std::vector<std::vector<std::string>> boards = {
        {},
        {"core.vmem_bytes=262144"},
        {"core.vmem_bytes=2097152"},
        {"core.mxus=1"},
        {"core.mxu_rows=8", "core.mxu_cols=8"},
        {"core.vmem_bytes=8192", "core.mxu_rows=8", "core.mxu_cols=8"},
        {"core.vmem_bytes=262144", "core.mxu_rows=8", "core.mxu_cols=8"}};
    std::vector<Conv2dShape> shapes = {
        // conv2d_test, conv2d_tensor_test, conv2d_grad_test, grad_check_test
        {2, 6, 5, 5, 7, 3, 1, 1},
        {3, 9, 7, 130, 129, 3, 2, 1},
        {1, 11, 10, 3, 16, 7, 2, 3},
        {2, 4, 4, 200, 130, 1, 1, 0},
        {2, 5, 5, 8, 8, 1, 2, 0},
        {1, 8, 9, 17, 33, 3, 1, 0},
        {9, 6, 6, 20, 12, 3, 1, 0},
        {16, 7, 7, 64, 40, 3, 1, 1},
        {2, 7, 9, 12, 10, 7, 1, 3},
        {2, 20, 18, 130, 20, 3, 1, 1},
        {1, 29, 27, 6, 5, 5, 2, 2},
        {3, 5, 4, 9, 6, 3, 1, 1},
        {1, 30, 32, 3, 64, 7, 2, 3},
        {3, 9, 8, 3, 20, 7, 2, 3},
        {1, 6, 200, 1, 5, 3, 1, 1},
        {2, 9, 7, 130, 129, 3, 2, 1},
        {1, 11, 10, 3, 16, 5, 2, 2},
        {1, 3, 5, 3, 4, 3, 2, 0},
        {2, 7, 9, 1, 32, 3, 1, 1},
        {1, 7, 7, 12, 10, 7, 1, 3},
        {2, 6, 5, 3, 20, 3, 1, 1},
        {2, 7, 6, 20, 3, 3, 2, 1},
        {2, 7, 7, 3, 20, 3, 2, 0},
        {2, 5, 6, 20, 3, 3, 1, 0},
        {2, 4, 5, 20, 3, 1, 1, 0},
        {2, 5, 5, 3, 20, 1, 2, 1},
        {1, 9, 8, 3, 5, 5, 2, 2},
        {2, 6, 6, 130, 129, 3, 1, 1},
        {1, 6, 5, 20, 3, 3, 2, 1},
        {1, 2, 512, 128, 3, 7, 1, 3},
        {2, 5, 4, 3, 2, 3, 1, 1},
        {1, 6, 5, 2, 3, 3, 2, 1},
        {1, 4, 4, 2, 2, 1, 2, 0},
        // the validation rows
        {64, 56, 56, 64, 64, 3, 1, 1},
        {64, 28, 28, 128, 128, 3, 1, 1},
        {64, 14, 14, 256, 256, 3, 1, 1},
        {64, 7, 7, 512, 512, 3, 1, 1}};
    // ResNet-18/50 layers (torchvision) at 224 and at smaller images, several batches.
    const std::vector<std::array<uint32_t, 6>> resnet = {
        // H, Cin, Cout, k, stride, pad
        {224, 3, 64, 7, 2, 3},    {56, 64, 64, 3, 1, 1},     {56, 64, 64, 1, 1, 0},
        {56, 64, 256, 1, 1, 0},   {56, 256, 64, 1, 1, 0},    {56, 256, 128, 1, 1, 0},
        {56, 128, 128, 3, 2, 1},  {56, 64, 128, 3, 2, 1},    {56, 64, 128, 1, 2, 0},
        {56, 256, 512, 1, 2, 0},  {28, 128, 128, 3, 1, 1},   {28, 128, 512, 1, 1, 0},
        {28, 512, 128, 1, 1, 0},  {28, 512, 256, 1, 1, 0},   {28, 256, 256, 3, 2, 1},
        {28, 128, 256, 3, 2, 1},  {28, 128, 256, 1, 2, 0},   {28, 512, 1024, 1, 2, 0},
        {14, 256, 256, 3, 1, 1},  {14, 256, 1024, 1, 1, 0},  {14, 1024, 256, 1, 1, 0},
        {14, 1024, 512, 1, 1, 0}, {14, 512, 512, 3, 2, 1},   {14, 256, 512, 3, 2, 1},
        {14, 256, 512, 1, 2, 0},  {14, 1024, 2048, 1, 2, 0}, {7, 512, 512, 3, 1, 1},
        {7, 512, 2048, 1, 1, 0},  {7, 2048, 512, 1, 1, 0}};
    for (const auto& [H, ci, co, k, st, p] : resnet)
        for (uint32_t scale : {1u, 4u, 7u})
            for (uint32_t n : {1u, 8u, 64u}) {
                const uint32_t h = std::max<uint32_t>(H / scale, k);
                shapes.push_back({n, h, h, ci, co, k, st, p});
            }
    std::mt19937 rng(11);
    auto d = [&](uint32_t lo, uint32_t hi) {
        return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    };
    for (int i = 0; i < 60; ++i)
        shapes.push_back(
            {d(1, 12), d(1, 40), d(1, 40), d(1, 300), d(1, 300), d(1, 7), d(1, 3), d(0, 3)});
    int checked = 0;
    for (const auto& o : boards) {
        const auto cfg = hw::BoardConfig::load("", o);
        const uint64_t vmem = cfg.core.vmem_bytes;
        for (const Conv2dShape& s0 : shapes) {
            try {
                s0.validate();
            } catch (const DeviceError&) {
                continue;
            }
            for (uint32_t n : {s0.batch, (s0.batch + 1) / 2, std::max(1u, s0.batch / 8)}) {
                Conv2dShape s = s0;
                s.batch = n;
                const std::string what = fmt::format("{} on {}", describe(s), fmt::join(o, " "));
                std::optional<Conv2dTiling> t;
                try {
                    t = plan_conv2d(cfg, s0, n);
                } catch (const DeviceError&) {
                }
                if (t) {
                    ASSERT_EQ(isa::encode_program(generate(Conv2dKey{s, *t})),
                              isa::encode_program(text::conv2d_program_text(s, *t)))
                        << what;
                    ++checked;
                    compare_aux(
                        Conv2dAux::PackInput, s, cfg, 0, 0, 0,
                        [&] { return text::pack_input_text(s, *t, vmem); }, checked,
                        "pack_x " + what);
                    compare_aux(
                        Conv2dAux::PackWeight, s, cfg, 0, 0, 0,
                        [&] { return text::pack_weight_text(s, *t, vmem); }, checked,
                        "pack_w " + what);
                }
                compare_aux(
                    Conv2dAux::Im2colRows, s, cfg, 0, 0, 0,
                    [&] { return text::im2col_rows_text(s, vmem); }, checked,
                    "im2col_rows " + what);
                compare_aux(
                    Conv2dAux::Col2imRows, s, cfg, 0, 0, 0,
                    [&] { return text::col2im_rows_text(s, vmem); }, checked,
                    "col2im_rows " + what);
                if (s.kernel <= 3 || n == s0.batch)
                    for (uint32_t kh = 0; kh < s.kernel; ++kh)
                        for (uint32_t kw = 0; kw < s.kernel; ++kw) {
                            // Taps that never read the image are not launched.
                            auto reaches = [&](uint32_t size, uint32_t out, uint32_t kp) {
                                const uint32_t first =
                                    s.pad > kp ? (s.pad - kp + s.stride - 1) / s.stride : 0;
                                const int64_t hi = int64_t(size) - 1 + s.pad - kp;
                                const uint32_t end =
                                    hi < 0 ? 0
                                           : std::min<uint32_t>(out, uint32_t(hi / s.stride) + 1);
                                return end > first;
                            };
                            if (!reaches(s.height, s.out_height(), kh) ||
                                !reaches(s.width, s.out_width(), kw))
                                continue;
                            compare_aux(
                                Conv2dAux::Im2colTap, s, cfg, kh, kw, 0,
                                [&] { return text::im2col_tap_text(s, kh, kw, vmem); }, checked,
                                fmt::format("im2col tap {} {} {}", kh, kw, what));
                            compare_aux(
                                Conv2dAux::Col2imTap, s, cfg, kh, kw, 0,
                                [&] { return text::col2im_tap_text(s, kh, kw, vmem); }, checked,
                                fmt::format("col2im tap {} {} {}", kh, kw, what));
                        }
            }
        }
        for (uint64_t units : {1ull, 7ull, 1000ull, 70000ull, 100003ull, 4194304ull})
            compare_aux(
                Conv2dAux::Zero, {}, cfg, 0, 0, units, [&] { return text::zero_text(units, vmem); },
                checked, fmt::format("zero {}", units));
    }
    fmt::print("{} programs compared\n", checked);
    EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace tpu::driver
