// SPDX-License-Identifier: Apache-2.0
// Steps beyond the 4 GiB that a 32-bit address reaches (issue #29: ResNet-50 training at 128
// images per core needs 10.1 GB per core): the HBM windows (`hbm.map`) and the wide programs
// that map each fusion's buffers to them (CodegenOptions::wide_addresses).

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "driver/device.h"
#include "isa/builder.h"

namespace tpu::compiler {
namespace {

using namespace test;
using isa::imm;
using isa::Opcode;

TEST(CompilerBigStep, HbmMapMovesAWindowOfLaterDmasAbove4GiB) {
    // A value written at offset 0x100 of window 3 mapped to 5 GiB lands at HBM byte
    // 5 GiB + 0x100: the driver reads it there.
    const auto cfg = hw::BoardConfig::load("", {});
    ASSERT_GT(cfg.hbm.bytes_per_core, (uint64_t(5) << 30) + (1 << 20));
    auto dev = driver::Device::open(cfg);
    isa::Builder b("hbm_map", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Vmem v = b.vmem("v", 512);
    const isa::Flag f = b.flag("f");
    const isa::Reg r = b.reg("r");
    b.emit(Opcode::Li, {r, imm(0x3f800000)});                       // 1.0f
    b.emit(Opcode::VCmpGt, {v.at(0), v.at(0), v.at(0), imm(128)});  // +0.0 whatever VMEM held
    b.emit(Opcode::VAddS, {v.at(0), v.at(0), r, imm(128), f});
    b.emit(Opcode::Wait, {f, imm(1)});
    b.emit(Opcode::HbmMap, {imm(3), imm(int64_t((uint64_t(5) << 30) / isa::kHbmMapUnit))});
    b.emit(Opcode::DmaVh, {imm(int64_t(3 * isa::kHbmWindowBytes + 0x100)), v.at(0), imm(1),
                           imm(512), imm(512), imm(512), f});
    b.emit(Opcode::Wait, {f, imm(2)});
    b.emit(Opcode::Halt, {});
    dev->launch({0}, b.finish());
    // Place a buffer over that range: the window is full first, so alloc_wide goes above it.
    const driver::Buffer fill = dev->alloc(dev->largest_free_block(0), 0);
    const driver::Buffer high =
        dev->alloc_wide((uint64_t(5) << 30) + 1024 - (uint64_t(4) << 30), 0);
    ASSERT_EQ(high.addr, uint64_t(4) << 30);
    std::vector<float> got(128);
    dev->read(high, got.data(), 512, (uint64_t(1) << 30) + 0x100);
    for (float x : got) ASSERT_EQ(x, 1.0f);
    dev->free(high);
    dev->free(fill);
}

/// Runs `record` on `cores` of a board whose every core's 4 GiB window is full, so the step's
/// buffers (parameters, inputs, temps, outputs) all lie above it and it runs wide programs;
/// expects the evaluator's bits and one launch (race detector on). With `hole`, the window
/// keeps that many bytes free at its start and 4.5 GiB above it are taken: the step's first
/// buffers land at HBM byte 0, the others beyond 8.5 GiB, more than 4 GiB apart.
void expect_wide_bit_exact(const std::vector<Leaf>& leaves, const Record& record,
                           const std::vector<uint32_t>& cores, uint64_t hole = 0) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    std::vector<driver::Buffer> fill;
    for (uint32_t c : cores) {
        const driver::Buffer low = hole ? dev->alloc(hole, c) : driver::Buffer{};
        fill.push_back(dev->alloc(dev->largest_free_block(c), c));
        if (!hole) continue;
        dev->free(low);
        fill.push_back(dev->alloc_wide((uint64_t(9) << 29), c));
        ASSERT_EQ(fill.back().addr, uint64_t(4) << 30);
    }
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, cores, cg);
    const uint64_t launches = dev->metrics().launches;
    const auto got = run(device, leaves, record);
    EXPECT_EQ(dev->metrics().launches - launches, 1u);
    HostBackend host(cores.size());
    const auto want = run(host, leaves, record);
    for (size_t r = 0; r < cores.size(); ++r) EXPECT_TRUE(same_bits(got[r], want[r])) << r;
    for (const driver::Buffer& b : fill) dev->free(b);
}

TEST(CompilerBigStep, AStepAboveTheWindowRunsWideProgramsBitExact) {
    // A dot with its epilogue, loop fusions and the ring all-reduce over two replicas (its
    // remote HBM writes go through the sender's windows, which both replicas map alike).
    const std::vector<Leaf> leaves = {
        {"x", f32({64, 256}), {randoms(64 * 256, 1), randoms(64 * 256, 2)}},
        {"w", f32({256, 256}), {randoms(256 * 256, 3, -0.1f, 0.1f)}, true},
        {"b", f32({256}), {randoms(256, 4)}, true}};
    expect_wide_bit_exact(leaves,
                          [](Graph& g, const std::vector<ValueId>& v) {
                              const ValueId h = relu(g, linear(g, v[0], v[1], v[2]));
                              const ValueId k = broadcast(g, literal(g, 0.01), {64, 256}, {});
                              return add(g, all_reduce(g, exp(g, mul(g, h, k)), 0.5), h);
                          },
                          {0, 1});
}

TEST(CompilerBigStep, ConvolutionsAndTheirGradientsAboveTheWindowBitExact) {
    // The convolution kernels address their temps from the arena's register (codegen_conv.cpp,
    // Addresses), which in a wide program holds 0 and each temp adds its window address.
    const std::vector<Leaf> leaves = {
        {"x", f32({2, 8, 8, 128}), {randoms(2 * 64 * 128, 11)}},
        {"w", f32({3, 3, 128, 128}), {randoms(9 * 128 * 128, 12, -0.1f, 0.1f)}, true}};
    expect_wide_bit_exact(
        leaves,
        [](Graph& g, const std::vector<ValueId>& v) {
            const ValueId y = relu(g, conv2d(g, v[0], v[1], 1, 1));
            const ValueId dx = conv2d_input_grad(g, y, v[1], {2, 8, 8, 128}, 1, 1);
            const ValueId dw = conv2d_filter_grad(g, dx, y, 3, 1, 1);
            return add(g, dw, v[1]);
        },
        {0});
}

TEST(CompilerBigStep, BuffersMoreThan4GiBApartRunThroughWindowsBitExact) {
    // The first buffers fill a 300 KiB hole at HBM byte 0, the others lie beyond 8.5 GiB (with
    // the driver's debug log: w at 0x0, b at 0x40000, x at 0x220000000 and the temps after
    // it), so the dot fusion's operands are more than 4 GiB apart, each in a window of its own.
    const std::vector<Leaf> leaves = {
        {"x", f32({64, 256}), {randoms(64 * 256, 21)}},
        {"w", f32({256, 256}), {randoms(256 * 256, 22, -0.1f, 0.1f)}, true},
        {"b", f32({256}), {randoms(256, 23)}, true}};
    expect_wide_bit_exact(
        leaves,
        [](Graph& g, const std::vector<ValueId>& v) {
            const ValueId h = relu(g, linear(g, v[0], v[1], v[2]));
            return add(g, exp(g, mul(g, h, h)), h);
        },
        {0}, 300 * 1024);
}

}  // namespace
}  // namespace tpu::compiler
