// SPDX-License-Identifier: Apache-2.0
// Kernels written with the program builder: typed keys in the program cache, launch arguments
// bound by name, and two kernels composed into one program.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "driver/kernels/kernel.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/vector_ops.h"
#include "isa/disassembler.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using streaming::Operand;
using tutil::bits_of;
using tutil::error_of;
using tutil::open_device;
using tutil::random_values;

/// The BuildError `f` throws ("no error" if it returns).
std::string build_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const isa::BuildError& e) {
        return e.what();
    }
    return "no error";
}

/// "" when no two registers, flags or memory ranges were held at the same instruction by two
/// names; else the first such pair. An independent check of what the pools promise.
std::string first_clash(const isa::Program& p) {
    for (size_t i = 0; i < p.symbols.size(); ++i)
        for (size_t j = i + 1; j < p.symbols.size(); ++j) {
            const isa::Symbol &a = p.symbols[i], &b = p.symbols[j];
            const bool same_time = a.first_pc < b.end_pc && b.first_pc < a.end_pc;
            const uint64_t a_end = a.index + std::max<uint64_t>(a.bytes, 1),
                           b_end = b.index + std::max<uint64_t>(b.bytes, 1);
            if (a.kind == b.kind && same_time && a.index < b_end && b.index < a_end)
                return a.name + " and " + b.name;
        }
    return "";
}

/// y = softmax(a + b) with the sum kept in VMEM: the add kernel stores into a VMEM region of
/// the caller's and the softmax kernel loads from it. Launch arguments: a, b, y.
isa::Program add_then_softmax(const hw::BoardConfig& cfg, uint32_t rows, uint32_t cols) {
    isa::Builder b("add_softmax",
                   {.vmem_bytes = cfg.core.vmem_bytes, .smem_bytes = cfg.core.smem_bytes});
    const isa::Reg a = b.arg("a"), bb = b.arg("b"), y = b.arg("y");
    const uint64_t n = uint64_t(rows) * cols;
    const isa::Vmem sum = b.vmem("sum", n * 4);
    // Each kernel plans its tiles in the VMEM left beside the sum.
    const VectorKey add_key = plan_vector(VectorOp::Add, n, 1, b.vmem_free());
    emit(b, add_key, std::vector{Operand::hbm(a), Operand::hbm(bb), Operand::vmem(sum)});
    const SoftmaxKey sm_key = plan_softmax(rows, cols, false, false, b.vmem_free());
    emit(b, sm_key, std::vector{Operand::vmem(sum), Operand::hbm(y)});
    b.emit(isa::Opcode::Halt, {});
    return b.finish();
}

TEST(ProgramBuilder, AnElementwiseKernelFeedsASoftmaxThroughVmemInOneProgram) {
    // Race detector on (open_device): a missing wait between the add's stores into the sum and
    // the softmax's loads from it would be a device fault, as would any clash of flags.
    auto dev = open_device();
    const std::vector<uint32_t> cores = {0, 1};
    for (auto [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{{3, 5}, {300, 129}}) {
        SCOPED_TRACE(testing::Message() << rows << " x " << cols);
        const isa::Program prog = add_then_softmax(dev->config(), rows, cols);
        EXPECT_EQ(first_clash(prog), "");
        EXPECT_EQ(prog.args, (std::vector<std::string>{"a", "b", "y"}));
        Tensor a = alloc_tensor(*dev, cores, rows, cols), b = alloc_tensor(*dev, cores, rows, cols);
        Tensor y = alloc_tensor(*dev, cores, rows, cols);
        std::vector<std::vector<float>> av, bv;
        for (size_t i = 0; i < cores.size(); ++i) {
            av.push_back(random_values(size_t(rows) * cols, 10 + uint32_t(i), -4.0f, 4.0f));
            bv.push_back(random_values(size_t(rows) * cols, 20 + uint32_t(i), -4.0f, 4.0f));
            write_tensor(*dev, a, i, av[i]);
            write_tensor(*dev, b, i, bv[i]);
        }
        launch(*dev, cores, prog, [&](size_t i, LaunchArgs& args) {
            args.set("a", a.bufs[i]).set("b", b.bufs[i]).set("y", y.bufs[i]);
        });
        for (size_t i = 0; i < cores.size(); ++i)
            EXPECT_EQ(bits_of(read_tensor(*dev, y, i)),
                      bits_of(softmax_reference(add_reference(av[i], bv[i]), rows, cols)))
                << "replica " << i;
        for (Tensor* t : {&a, &b, &y}) free_tensor(*dev, *t);
    }
}

TEST(ProgramBuilder, ClashingCompositionsAreRejectedWhenBuilt) {
    const auto cfg = hw::BoardConfig::load("", {});
    isa::Builder b("fused", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg a = b.arg("a"), y = b.arg("y");
    const isa::Vmem sum = b.vmem("sum", 4096);
    // A tensor placed by hand over the sum another kernel left in VMEM.
    EXPECT_EQ(build_error([&] { b.vmem_at("y_tile", 1024, 4096); }),
              "kernel 'fused': VMEM [1024, 5120) for 'y_tile' overlaps 'sum' [0, 4096), held "
              "since pc 0");
    // A kernel planned for the whole VMEM, emitted beside the sum: a row of 2 097 000 values
    // takes tile slots of 8 388 096 + 256 bytes, two of which fit in 16 MiB but not beside the
    // sum's 4096 bytes (slot 0 ends at 4096 + 8 388 352 = 8 392 448, leaving 8 384 768).
    const VectorKey whole = plan_vector(VectorOp::RowSum, 1, 2097000, cfg.core.vmem_bytes);
    EXPECT_EQ(build_error([&] {
                  emit(b, whole, std::vector{Operand::hbm(a), Operand::hbm(y)});
              }),
              "kernel 'row_sum': out of VMEM for 'row_sum.tiles.slot1' (8388352 bytes; largest "
              "free block 8384768 of 16777216; 2 in use: [0, 4096) sum, [4096, 8392448) "
              "row_sum.tiles.slot0)");
    // Operands that do not match the kernel's signature.
    EXPECT_EQ(build_error([&] { emit(b, whole, std::vector{Operand::hbm(a)}); }),
              "kernel 'row_sum': 1 operands given; it takes 2");
    EXPECT_EQ(build_error([&] {
                  emit(b, whole, std::vector{Operand::hbm(a), Operand::scalar(isa::imm(0))});
              }),
              "kernel 'row_sum': operand 2 ('out') is a scalar; expected a tensor");
}

TEST(ProgramBuilder, AFixedLoadOfPaddedRowsMustFitItsArea) {
    // A table of rows padded to whole lane chunks as it loads (FixedIo::rows: 192 values a row,
    // 256 apart in VMEM): 17 rows fill an area of 17 x 256 values, an 18th would write past it.
    const auto cfg = hw::BoardConfig::load("", {});
    isa::Builder b("padded", {.vmem_bytes = cfg.core.vmem_bytes});
    const isa::Reg t = b.arg("t");
    streaming::Spec sp;
    sp.fp.name = "table";
    sp.fp.units = 1;
    sp.fp.areas = {1};
    sp.fp.fixed = {17 * 256};
    sp.body = [](streaming::Body&) {};
    sp.fixed_ins.push_back({Operand::hbm(t), 0, 192, 17, 256});
    EXPECT_EQ(build_error([&] { streaming::emit(b, sp, 1); }), "no error");
    sp.fixed_ins[0].rows = 18;
    EXPECT_EQ(build_error([&] { streaming::emit(b, sp, 1); }),
              "kernel 'table': 18 rows of 192 values, 256 apart, in a fixed area of 4352");
}

TEST(ProgramBuilder, LaunchArgumentsAreBoundByTheirDeclaredNames) {
    auto dev = open_device();
    const isa::Program prog = generate(plan_vector(VectorOp::Scale, 8, 1, 1 << 20));
    EXPECT_EQ(prog.name, "scale");
    EXPECT_EQ(prog.args, (std::vector<std::string>{"a", "out", "s"}));
    const Buffer x = dev->alloc(32, 0);
    auto run = [&](const BindFn& bind) { launch(*dev, {0}, prog, bind); };
    EXPECT_EQ(
        error_of([&] { run([&](size_t, LaunchArgs& a) { a.set("a", x).set("out", x); }); }, true),
        "scale: launch argument 's' (s3) is not set");
    EXPECT_EQ(error_of([&] { run([&](size_t, LaunchArgs& a) { a.set("x", x); }); }, true),
              "scale: 'x' is not a launch argument of the kernel (it has: a, out, s)");
    EXPECT_EQ(
        error_of([&] { run([&](size_t, LaunchArgs& a) { a.set("a", x).set("a", x); }); }, true),
        "scale: launch argument 'a' is set twice");
    EXPECT_EQ(dev->metrics().launches, 0u);
}

TEST(ProgramBuilder, TypedKeysShareTheCacheCountersAndNameTheKernels) {
    ProgramCache cache;
    const VectorKey add = plan_vector(VectorOp::Add, 1000, 1, 1 << 24);
    const SoftmaxKey sm = plan_softmax(10, 20, true, false, 1 << 24);
    const isa::Program& p1 = cache.get(add);
    const isa::Program& p2 = cache.get(sm);
    EXPECT_EQ(&cache.get(add), &p1);  // a hit returns the cached program
    EXPECT_EQ(cache.misses(), 2u);
    EXPECT_EQ(cache.hits(), 1u);
    EXPECT_EQ(p1.name, "add");
    EXPECT_EQ(p2.name, "softmax");
    // Every field takes part in the comparison: another tiling is another program.
    VectorKey other = add;
    other.tile = 500;
    EXPECT_NE(&cache.get(other), &p1);
    EXPECT_EQ(cache.misses(), 3u);
    // The names of a builder program show in its disassembly.
    const std::string text = isa::disassemble(p2);
    EXPECT_NE(text.find("# launch arguments: s1 x, s2 y, s3 scale"), std::string::npos) << text;
    EXPECT_NE(text.find("s19 softmax.slot"), std::string::npos) << text;
}

// ---- The worked example of driver/README.md ("Writing a kernel"), kept compiling here ------

/// y = alpha * x + y over n fp32 values, one VMEM tile at a time.
struct AxpyKey {
    uint64_t n = 0;     ///< values
    uint32_t tile = 0;  ///< values per VMEM tile
    auto operator<=>(const AxpyKey&) const = default;
    std::string name() const { return "axpy"; }
    friend size_t hash_value(const AxpyKey& k) { return hash_fields(k.n, k.tile); }
};

isa::Program generate(const AxpyKey& k) {
    using enum isa::Opcode;
    using isa::imm;
    isa::Builder b(k.name());
    const isa::Reg x = b.arg("x"), y = b.arg("y"), alpha = b.arg("alpha");  // s1, s2, s3
    const isa::Vmem vx = b.vmem("x", k.tile * 4), vy = b.vmem("y", k.tile * 4);
    const isa::Reg i = b.reg("i"), len = b.reg("len"), bytes = b.reg("bytes");
    const isa::Reg off = b.reg("off"), at = b.reg("at");
    isa::CountedFlag loads(b, "loads", isa::Count::InRegister);
    isa::CountedFlag vpu(b, "vpu", isa::Count::InRegister);
    isa::CountedFlag stores(b, "stores", isa::Count::InRegister);
    b.loop(i, imm(0), imm(int64_t(k.n)), k.tile, [&] {
        b.emit(Sub, {len, imm(int64_t(k.n)), i});  // len = min(tile, n - i)
        b.if_(isa::Cond::Geu, len, imm(k.tile), [&] { b.emit(Li, {len, imm(k.tile)}); });
        b.emit(Shl, {bytes, len, imm(2)});
        b.emit(Shl, {off, i, imm(2)});
        stores.wait_all();  // the previous tile's store has read vy
        b.emit(Add, {at, off, x});
        loads.issue(DmaHv, {vx, at, imm(1), bytes, bytes, bytes});
        b.emit(Add, {at, off, y});
        loads.issue(DmaHv, {vy, at, imm(1), bytes, bytes, bytes});
        loads.wait_all();
        vpu.issue(VMulS, {vx, vx, alpha, len});
        vpu.issue(VAdd, {vy, vx, vy, len});
        vpu.wait_all();
        stores.issue(DmaVh, {at, vy, imm(1), bytes, bytes, bytes});
    });
    stores.wait_all();
    b.emit(Halt, {});
    return b.finish();
}

/// Runs axpy on `x` and `y` (one core's buffers of n values).
Event axpy(Device& dev, ProgramCache& cache, float alpha, const Buffer& x, const Buffer& y,
           uint64_t n) {
    const AxpyKey key{n, static_cast<uint32_t>(std::min<uint64_t>(n, 8192))};
    return launch(dev, cache, key, {x.core}, [&](size_t, LaunchArgs& a) {
        a.set("x", x).set("y", y).set_f32("alpha", alpha);
    });
}

TEST(ProgramBuilder, TheReadmesWorkedExampleRuns) {
    auto dev = open_device();  // race detector on: the waits must be right
    ProgramCache cache;
    const uint64_t n = 20000;  // three tiles, the last one ragged
    const auto xv = random_values(n, 1), yv = random_values(n, 2);
    const Buffer x = dev->alloc(n * 4, 0), y = dev->alloc(n * 4, 0);
    dev->write(x, xv.data(), n * 4);
    dev->write(y, yv.data(), n * 4);
    axpy(*dev, cache, 0.5f, x, y, n);
    std::vector<float> got(n), want(n);
    dev->read(y, got.data(), n * 4);
    for (size_t i = 0; i < n; ++i) want[i] = xv[i] * 0.5f + yv[i];
    EXPECT_EQ(bits_of(got), bits_of(want));
    EXPECT_EQ(dev->kernel_stats().at(0).name, "axpy");
}

}  // namespace
}  // namespace tpu::driver
