// SPDX-License-Identifier: Apache-2.0
// The composable conv2d emitter (emit_conv2d): output-fusion epilogues (a Column side, a Full
// side, ReLU, a bf16 store) and a conv2d composed with an elementwise kernel in one program,
// bit-exact against the host references with the race detector on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/kernel.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/core/numerics.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using isa::fimm;
using isa::imm;
using isa::Opcode;
using streaming::Operand;
using tutil::random_values;

/// One convolution's operands on core 0: x and w packed on the device by the packing kernels,
/// the bias padded to NT C values, a second bias (Column side) and a residual (Full side).
struct Operands {
    Conv2dShape s;
    Conv2dTiling t;
    std::vector<float> x, w, bias, bias2, res;
    Buffer px, pw, pb, pb2, pres, y;
};

/// A buffer's address as an immediate operand: the program is built for these buffers, so the
/// conv2d kernel (26 registers) leaves the launch-argument registers to the caller.
Operand at(const Buffer& b) {
    return Operand::hbm(imm(int64_t(b.addr)));
}

Buffer put(Device& dev, const std::vector<float>& v) {
    Buffer b = dev.alloc(v.size() * 4, 0);
    dev.write(b, v.data(), v.size() * 4);
    return b;
}

Operands make(Device& dev, ProgramCache& cache, const Conv2dShape& s, uint32_t column_sides,
              uint32_t full_sides, uint32_t y_bytes) {
    const hw::BoardConfig& cfg = dev.config();
    Operands o;
    o.s = s;
    o.t = plan_conv2d(cfg, s, s.batch, column_sides, full_sides);
    const size_t out = size_t(s.batch) * s.out_height() * s.out_width() * s.cout;
    o.x = random_values(size_t(s.batch) * s.height * s.width * s.cin, 1);
    o.w = random_values(size_t(s.kernel) * s.kernel * s.cin * s.cout, 2);
    o.bias = random_values(s.cout, 3);
    o.bias2 = random_values(s.cout, 4);
    o.res = random_values(out, 5);
    const Conv2dTiling& t = o.t;
    o.px = dev.alloc(uint64_t(s.batch) * t.phases * t.phases * t.CT * t.Hq * t.Wq * t.R * 2, 0);
    o.pw = dev.alloc(uint64_t(t.NT) * s.kernel * s.kernel * t.CT * t.R * t.C * 2, 0);
    std::vector<float> padded(size_t(t.NT) * t.C, 0.0f);
    std::copy(o.bias.begin(), o.bias.end(), padded.begin());
    o.pb = put(dev, padded);
    o.pb2 = put(dev, o.bias2);
    o.pres = put(dev, o.res);
    o.y = dev.alloc(out * y_bytes, 0);
    const Buffer bx = put(dev, o.x), bw = put(dev, o.w);
    const uint64_t vmem = cfg.core.vmem_bytes;
    launch(dev, cache, plan_conv2d_aux(Conv2dAux::PackInput, s, t.R, t.C, 0, 0, 0, vmem), {0},
           [&](size_t, LaunchArgs& a) { a.set("x", bx).set("packed", o.px); });
    launch(dev, cache, plan_conv2d_aux(Conv2dAux::PackWeight, s, t.R, t.C, 0, 0, 0, vmem), {0},
           [&](size_t, LaunchArgs& a) { a.set("w", bw).set("packed", o.pw); });
    return o;
}

/// out = relu(out + column side 0 + full side 1), on the VPU.
void bias_residual_relu(EpilogueTile& t) {
    isa::Builder& b = t.builder();
    const isa::Reg n = b.reg("values");
    b.emit(Opcode::Mul, {n, t.rows(), imm(t.cols())});
    t.vpu(Opcode::VAddRow, {t.out(), t.out(), t.side(0), t.rows(), imm(t.cols())});
    t.vpu(Opcode::VAdd, {t.out(), t.out(), t.side(1), n});
    t.vpu(Opcode::VMaxS, {t.out(), t.out(), fimm(0.0f), n});
}

/// The epilogue's result on the host: the conv's exact numerics, then the same fp32 ops. The
/// shapes are ones conv2d does not fold into K (conv2d_reference would model the folded GEMM).
std::vector<float> reference(const Operands& o, uint32_t R) {
    EXPECT_FALSE(conv2d_folds_taps(o.s, R));
    std::vector<float> y = conv2d_reference(o.x, o.w, o.bias, o.s, R);
    const uint32_t co = o.s.cout;
    for (size_t i = 0; i < y.size(); ++i) {
        float v = y[i] + o.bias2[i % co];
        v = v + o.res[i];
        y[i] = std::isnan(v) ? v : std::max(v, 0.0f);
    }
    return y;
}

struct EpilogueCase {
    Conv2dShape shape;
    std::vector<std::string> sets;
    bool bf16;
    std::string name;
};
void PrintTo(const EpilogueCase& c, std::ostream* os) {
    *os << c.name;
}

class Conv2dEpilogue : public ::testing::TestWithParam<EpilogueCase> {};

TEST_P(Conv2dEpilogue, BiasResidualReluAndStoreAreBitExact) {
    const EpilogueCase& c = GetParam();
    std::vector<std::string> sets = c.sets;
    sets.push_back("sim.race_detector=true");
    auto dev = Device::open(hw::BoardConfig::load("", sets));
    const hw::BoardConfig& cfg = dev->config();
    ProgramCache cache;
    const Operands o = make(*dev, cache, c.shape, 1, 1, c.bf16 ? 2 : 4);
    const Conv2dKey key{o.s, o.t, c.bf16};

    isa::Builder b("conv2d_epilogue", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg x = b.arg("x"), w = b.arg("w"), bias = b.arg("bias"), y = b.arg("y");
    Epilogue ep;
    ep.sides = {{EpilogueSide::Kind::Column, at(o.pb2)}, {EpilogueSide::Kind::Full, at(o.pres)}};
    ep.body = bias_residual_relu;
    ep.store_bf16 = c.bf16;
    emit_conv2d(b, key,
                {Operand::hbm(x), Operand::hbm(w), Operand::hbm(bias), Operand::hbm(y),
                 Operand::scalar(imm(conv2d_blocks(o.s, o.t)))},
                ep);
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& a) {
        a.set("x", o.px).set("w", o.pw).set("bias", o.pb).set("y", o.y);
    });
    const std::vector<float> want = reference(o, cfg.core.mxu_rows);
    if (c.bf16) {
        std::vector<uint16_t> got(want.size()), bits(want.size());
        dev->read(o.y, got.data(), got.size() * 2);
        for (size_t i = 0; i < want.size(); ++i) bits[i] = hw::f32_to_bf16(want[i]);
        EXPECT_EQ(got, bits);
    } else {
        std::vector<float> got(want.size());
        dev->read(o.y, got.data(), got.size() * 4);
        EXPECT_BITS_EQ(got, want);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Odd, Conv2dEpilogue,
    ::testing::Values(
        EpilogueCase{{2, 6, 5, 40, 7, 3, 1, 1}, {}, false, "k3_one_cin_tile"},
        EpilogueCase{{2, 6, 5, 40, 7, 3, 1, 1}, {}, true, "k3_one_cin_tile_bf16"},
        EpilogueCase{{3, 9, 7, 130, 129, 3, 2, 1}, {}, false, "two_tiles_each_way"},
        EpilogueCase{{3, 9, 7, 130, 129, 3, 2, 1}, {}, true, "two_tiles_each_way_bf16"},
        EpilogueCase{{2, 20, 18, 130, 20, 3, 1, 1},
                     {"core.vmem_bytes=262144"},
                     true,
                     "bands_in_small_vmem_bf16"},
        EpilogueCase{{2, 6, 5, 5, 8, 3, 1, 1},
                     {"core.mxu_rows=8", "core.mxu_cols=8"},
                     true,
                     "whole_pixel_tile_on_8x8_bf16"},
        // A Cout tile per MXU (4 tiles, 2 groups; the first group's epilogues
        // deferred into the second's steps): each image's tiles in a loop, its
        // side tiles loaded per tile (tests/driver/conv2d_cout_test.cpp).
        EpilogueCase{{2, 6, 5, 130, 512, 3, 1, 1}, {}, false, "cout_tile_per_mxu"},
        EpilogueCase{{2, 6, 5, 130, 512, 3, 1, 1}, {}, true, "cout_tile_per_mxu_bf16"}),
    [](const auto& info) { return info.param.name; });

TEST(Conv2dEmit, ComposesWithAnElementwiseKernelInOneProgram) {
    // conv2d with a bias and ReLU epilogue, then out = y + r by vector_ops' add, in one
    // program: the add reads y after emit_conv2d has waited for its stores (race detector on).
    auto dev = Device::open(hw::BoardConfig::load("", {"sim.race_detector=true"}));
    const hw::BoardConfig& cfg = dev->config();
    ProgramCache cache;
    const Conv2dShape s{3, 9, 7, 130, 129, 3, 2, 1};
    const Operands o = make(*dev, cache, s, 1, 1, 4);
    const uint64_t n = o.res.size();
    const auto r = random_values(n, 6);
    const Buffer br = put(*dev, r), bout = dev->alloc(n * 4, 0);

    isa::Builder b("conv2d_add", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg x = b.arg("x"), w = b.arg("w"), bias = b.arg("bias"), y = b.arg("y");
    {
        Epilogue ep;
        ep.sides = {{EpilogueSide::Kind::Column, at(o.pb2)},
                    {EpilogueSide::Kind::Full, at(o.pres)}};
        ep.body = bias_residual_relu;
        emit_conv2d(b, Conv2dKey{o.s, o.t},
                    {Operand::hbm(x), Operand::hbm(w), Operand::hbm(bias), Operand::hbm(y),
                     Operand::scalar(imm(conv2d_blocks(o.s, o.t)))},
                    ep);
    }
    // The conv's registers are back in the pool: the add takes its own.
    const std::vector<Operand> ops = {Operand::hbm(y), at(br), at(bout)};
    emit(b, plan_vector(VectorOp::Add, n, 1, b.vmem_free()), ops);
    b.emit(Opcode::Halt, {});
    const isa::Program prog = b.finish();
    launch(*dev, {0}, prog, [&](size_t, LaunchArgs& a) {
        a.set("x", o.px).set("w", o.pw).set("bias", o.pb).set("y", o.y);
    });
    std::vector<float> want = reference(o, cfg.core.mxu_rows);
    for (size_t i = 0; i < n; ++i) want[i] = want[i] + r[i];
    std::vector<float> got(n);
    dev->read(bout, got.data(), n * 4);
    EXPECT_BITS_EQ(got, want);
}

TEST(Conv2dEmit, EmptyEpilogueEmitsTheStandaloneKernelAndMismatchesAreNamed) {
    const auto cfg = hw::BoardConfig::load("", {});
    const Conv2dShape s{2, 6, 5, 5, 7, 3, 1, 1};
    const Conv2dKey key{s, plan_conv2d(cfg, s, 2)};
    isa::Builder b("conv2d");
    std::vector<isa::Reg> regs;
    for (const char* a : {"x", "w", "bias", "y", "blocks"}) regs.push_back(b.arg(a));
    emit_conv2d(b, key,
                {Operand::hbm(regs[0]), Operand::hbm(regs[1]), Operand::hbm(regs[2]),
                 Operand::hbm(regs[3]), Operand::scalar(regs[4])});
    b.emit(Opcode::Halt, {});
    EXPECT_EQ(isa::encode_program(b.finish()), isa::encode_program(generate(key)));

    isa::Builder b2("conv2d");
    Epilogue ep;
    ep.sides = {{EpilogueSide::Kind::Full, Operand::hbm(imm(0))}};
    try {
        emit_conv2d(b2, key,
                    {Operand::hbm(imm(0)), Operand::hbm(imm(0)), Operand::hbm(imm(0)),
                     Operand::hbm(imm(0)), Operand::scalar(imm(1))},
                    ep);
        FAIL() << "an epilogue side the key does not plan for was accepted";
    } catch (const isa::BuildError& e) {
        EXPECT_NE(std::string(e.what()).find("0 Column and 1 Full sides"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace tpu::driver
