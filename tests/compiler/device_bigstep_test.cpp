// SPDX-License-Identifier: Apache-2.0
// Steps beyond the 4 GiB that a 32-bit address reaches (issue #29: ResNet-50 training at 128
// images per core needs 10.1 GB per core): the HBM window base (`hbm.base`) and the wide
// programs that set it per fusion (CodegenOptions::wide_addresses).

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "driver/device.h"
#include "isa/builder.h"

namespace tpu::compiler {
namespace {

using namespace test;
using isa::imm;
using isa::Opcode;

TEST(CompilerBigStep, HbmBaseMovesTheWindowOfLaterDmasAbove4GiB) {
    // A value written at window offset 0x100 with the base at 5 GiB lands at HBM byte
    // 5 GiB + 0x100: the driver reads it there.
    const auto cfg = hw::BoardConfig::load("", {});
    ASSERT_GT(cfg.hbm.bytes_per_core, (uint64_t(5) << 30) + (1 << 20));
    auto dev = driver::Device::open(cfg);
    isa::Builder b("hbm_base", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Vmem v = b.vmem("v", 512);
    const isa::Flag f = b.flag("f");
    const isa::Reg r = b.reg("r");
    b.emit(Opcode::Li, {r, imm(0x3f800000)});                       // 1.0f
    b.emit(Opcode::VCmpGt, {v.at(0), v.at(0), v.at(0), imm(128)});  // +0.0 whatever VMEM held
    b.emit(Opcode::VAddS, {v.at(0), v.at(0), r, imm(128), f});
    b.emit(Opcode::Wait, {f, imm(1)});
    b.emit(Opcode::HbmBase, {imm(int64_t((uint64_t(5) << 30) / isa::kHbmBaseUnit))});
    b.emit(Opcode::DmaVh, {imm(0x100), v.at(0), imm(1), imm(512), imm(512), imm(512), f});
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
/// expects the evaluator's bits and one launch (race detector on).
void expect_wide_bit_exact(const std::vector<Leaf>& leaves, const Record& record,
                           const std::vector<uint32_t>& cores) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    std::vector<driver::Buffer> fill;
    for (uint32_t c : cores) fill.push_back(dev->alloc(dev->largest_free_block(c), c));
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
    // remote HBM writes are offsets from the sender's window base, which both replicas share).
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
    // The convolution kernels address their temps from the arena's base (codegen_conv.cpp,
    // Addresses), which in a wide program may lie below the fusion's window base: the 32-bit
    // wrap brings each temp back into the window.
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

}  // namespace
}  // namespace tpu::compiler
