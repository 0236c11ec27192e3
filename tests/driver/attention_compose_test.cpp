// SPDX-License-Identifier: Apache-2.0
// The fused attention kernel composed into programs with other kernels, reading Q, K and V out
// of a fused QKV projection and writing O with merged heads (the token-major layout of
// AttentionKey), so a head split is a change of dims, never a copy.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/attention.h"
#include "driver/kernels/kernel.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/vector_ops.h"
#include "tests/driver/driver_test_util.h"

namespace tpu::driver {
namespace {

using streaming::Operand;
using tutil::bits_of;
using tutil::open_device;
using tutil::random_values;

/// Columns [col, col + heads * dhead) of token-major rows of `row` values, as the head-major
/// [batch, heads, seq, dhead] tensor attention_reference takes.
std::vector<float> heads_of(const std::vector<float>& x, const AttentionShape& s, uint32_t row,
                            uint32_t col) {
    std::vector<float> out;
    for (uint32_t b = 0; b < s.batch; ++b)
        for (uint32_t h = 0; h < s.heads; ++h)
            for (uint32_t t = 0; t < s.seq; ++t)
                for (uint32_t d = 0; d < s.dhead; ++d)
                    out.push_back(x[(size_t(b) * s.seq + t) * row + col + h * s.dhead + d]);
    return out;
}

/// The head-major `x` written into columns [col, ...) of token-major rows of `row` values.
void merge_into(std::vector<float>& out, const std::vector<float>& x, const AttentionShape& s,
                uint32_t row, uint32_t col) {
    size_t i = 0;
    for (uint32_t b = 0; b < s.batch; ++b)
        for (uint32_t h = 0; h < s.heads; ++h)
            for (uint32_t t = 0; t < s.seq; ++t)
                for (uint32_t d = 0; d < s.dhead; ++d)
                    out[(size_t(b) * s.seq + t) * row + col + h * s.dhead + d] = x[i++];
}

/// y = relu(attention(a + b)): the add writes the fused QKV projection [batch * seq,
/// 3 * hidden] to HBM, attention reads its heads with strided DMAs and writes O as
/// [batch * seq, hidden], relu reads O. Launch arguments: a, b, qkv, o, p, bias, y.
isa::Program add_attention_relu(const hw::BoardConfig& cfg, const AttentionShape& s) {
    isa::Builder b("add_attention_relu",
                   {.vmem_bytes = cfg.core.vmem_bytes, .smem_bytes = cfg.core.smem_bytes});
    const isa::Reg a = b.arg("a"), bb = b.arg("b"), qkv = b.arg("qkv"), o = b.arg("o");
    const isa::Reg p = b.arg("p"), bias = b.arg("bias"), y = b.arg("y");
    const uint64_t tokens = uint64_t(s.batch) * s.seq;
    const int64_t hidden = int64_t(s.heads) * s.dhead;
    emit(b, plan_vector(VectorOp::Add, tokens * 3 * hidden, 1, b.vmem_free()),
         std::vector{Operand::hbm(a), Operand::hbm(bb), Operand::hbm(qkv)});
    // Planned in the VMEM the caller leaves free; the layout makes it read the fused QKV.
    AttentionKey k = *plan_attention(cfg, s, false, b.vmem_free());
    k.heads = s.heads, k.qkv_row = uint32_t(3 * hidden), k.out_row = uint32_t(hidden);
    const float scale = s.scale();
    emit(b, k,
         std::vector{Operand::hbm(qkv), Operand::hbm(qkv + hidden * 4),
                     Operand::hbm(qkv + 2 * hidden * 4), Operand::hbm(o), Operand::hbm(p),
                     Operand::scalar(isa::fimm(scale)), Operand::hbm(bias)});
    emit(b, plan_vector(VectorOp::Relu, tokens * k.out_row, 1, b.vmem_free()),
         std::vector{Operand::hbm(o), Operand::hbm(y)});
    b.emit(isa::Opcode::Halt, {});
    return b.finish();
}

TEST(AttentionCompose, AddAttentionReluInOneProgramReadsHeadsOutOfAFusedQkv) {
    // Race detector on (open_device): a missing wait between the add's stores of the QKV, the
    // attention's strided loads of it, its stores of O and relu's loads would be a device
    // fault, as would two kernels' flags or registers in use at once.
    auto dev = open_device();
    const std::vector<uint32_t> cores = {0, 1};
    // Two key tiles, one head per block; six heads of two sequences in one block, causal.
    for (const AttentionShape& s :
         {AttentionShape{2, 2, 130, 16, false}, AttentionShape{2, 3, 20, 8, true}}) {
        SCOPED_TRACE(fmt::format("{}x{}x{}x{}{}", s.batch, s.heads, s.seq, s.dhead,
                                 s.causal ? " causal" : ""));
        const uint32_t hidden = s.heads * s.dhead, tokens = s.batch * s.seq;
        const isa::Program prog = add_attention_relu(dev->config(), s);
        EXPECT_EQ(prog.args, (std::vector<std::string>{"a", "b", "qkv", "o", "p", "bias", "y"}));
        Tensor a = alloc_tensor(*dev, cores, tokens, 3 * hidden),
               b = alloc_tensor(*dev, cores, tokens, 3 * hidden),
               qkv = alloc_tensor(*dev, cores, tokens, 3 * hidden);
        Tensor o = alloc_tensor(*dev, cores, tokens, hidden),
               y = alloc_tensor(*dev, cores, tokens, hidden);
        Tensor p = alloc_tensor(*dev, cores, s.groups() * s.seq, s.seq),
               bias = alloc_tensor(*dev, cores, s.seq, s.seq);
        write_tensor_all(*dev, bias, causal_bias(s.seq));
        std::vector<std::vector<float>> av, bv;
        for (size_t i = 0; i < cores.size(); ++i) {
            av.push_back(random_values(size_t(tokens) * 3 * hidden, 30 + uint32_t(i)));
            bv.push_back(random_values(size_t(tokens) * 3 * hidden, 40 + uint32_t(i)));
            write_tensor(*dev, a, i, av[i]);
            write_tensor(*dev, b, i, bv[i]);
        }
        launch(*dev, cores, prog, [&](size_t i, LaunchArgs& args) {
            args.set("a", a.bufs[i]).set("b", b.bufs[i]).set("qkv", qkv.bufs[i]);
            args.set("o", o.bufs[i]).set("p", p.bufs[i]).set("bias", bias.bufs[i]);
            args.set("y", y.bufs[i]);
        });
        for (size_t i = 0; i < cores.size(); ++i) {
            const std::vector<float> x = add_reference(av[i], bv[i]);
            const AttentionResult r = attention_reference(
                s, heads_of(x, s, 3 * hidden, 0), heads_of(x, s, 3 * hidden, hidden),
                heads_of(x, s, 3 * hidden, 2 * hidden), dev->config().core.mxu_rows);
            std::vector<float> o_merged(size_t(tokens) * hidden);
            merge_into(o_merged, r.o, s, hidden, 0);
            EXPECT_EQ(bits_of(read_tensor(*dev, p, i)), bits_of(r.p)) << "replica " << i;
            EXPECT_EQ(bits_of(read_tensor(*dev, y, i)), bits_of(relu_reference(o_merged)))
                << "replica " << i;
        }
        for (Tensor* t : {&a, &b, &qkv, &o, &y, &p, &bias}) free_tensor(*dev, *t);
    }
}

TEST(AttentionCompose, BackwardWritesDqDkDvIntoAFusedGradient) {
    // The backward kernel in the token-major layout: Q, K, V out of one fused QKV, dO with
    // merged heads, dQ, dK and dV into the columns of one fused [batch * seq, 3 * hidden]
    // gradient, as the QKV projection's backward consumes it.
    auto dev = open_device();
    const std::vector<uint32_t> cores = {0};
    for (const AttentionShape& s :
         {AttentionShape{2, 2, 130, 16, false}, AttentionShape{2, 3, 20, 8, false}}) {
        SCOPED_TRACE(fmt::format("{}x{}x{}x{}", s.batch, s.heads, s.seq, s.dhead));
        const uint32_t hidden = s.heads * s.dhead, tokens = s.batch * s.seq, row = 3 * hidden;
        AttentionKey k = *plan_attention(dev->config(), s, true);
        k.heads = s.heads, k.qkv_row = row, k.out_row = hidden;
        const isa::Program prog = generate(k);
        Tensor qkv = alloc_tensor(*dev, cores, tokens, row),
               dqkv = alloc_tensor(*dev, cores, tokens, row);
        Tensor dout = alloc_tensor(*dev, cores, tokens, hidden);
        Tensor p = alloc_tensor(*dev, cores, s.groups() * s.seq, s.seq);
        const std::vector<float> x = random_values(size_t(tokens) * row, 7),
                                 dov = random_values(size_t(tokens) * hidden, 8);
        const std::vector<float> q = heads_of(x, s, row, 0), kk = heads_of(x, s, row, hidden),
                                 v = heads_of(x, s, row, 2 * hidden);
        const uint32_t R = dev->config().core.mxu_rows;
        const std::vector<float> pv = attention_reference(s, q, kk, v, R).p;
        write_tensor(*dev, qkv, 0, x);
        write_tensor(*dev, dout, 0, dov);
        write_tensor(*dev, p, 0, pv);
        write_tensor(*dev, dqkv, 0, std::vector<float>(size_t(tokens) * row, 0.0f));
        launch(*dev, cores, prog, [&](size_t, LaunchArgs& args) {
            const auto at = [](const Tensor& t, uint32_t col) {
                return static_cast<uint32_t>(t.bufs[0].addr + uint64_t(col) * 4);
            };
            args.set("q", at(qkv, 0)).set("k", at(qkv, hidden)).set("v", at(qkv, 2 * hidden));
            args.set("p", p.bufs[0]).set("dout", dout.bufs[0]);
            args.set("dq", at(dqkv, 0)).set("dk", at(dqkv, hidden)).set("dv", at(dqkv, 2 * hidden));
            args.set_f32("scale", s.scale());
        });
        const AttentionGradResult g =
            attention_grad_reference(s, q, kk, v, pv, heads_of(dov, s, hidden, 0), R);
        std::vector<float> want(size_t(tokens) * row);
        merge_into(want, g.dq, s, row, 0);
        merge_into(want, g.dk, s, row, hidden);
        merge_into(want, g.dv, s, row, 2 * hidden);
        EXPECT_EQ(bits_of(read_tensor(*dev, dqkv, 0)), bits_of(want));
        for (Tensor* t : {&qkv, &dqkv, &dout, &p}) free_tensor(*dev, *t);
    }
}

TEST(AttentionCompose, TokenMajorKeysThatDoNotFitTheirRowsAreBuildErrors) {
    const auto cfg = hw::BoardConfig::load("", {});
    AttentionKey k = *plan_attention(cfg, {2, 3, 20, 8, false}, false);
    k.heads = 4, k.qkv_row = 96, k.out_row = 32;
    try {
        generate(k);
        ADD_FAILURE() << "no error";
    } catch (const isa::BuildError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "kernel 'attention_fwd': token-major layout of 4 heads x 8 over 6 groups with "
                  "rows of 96 (q, k, v) and 32 (o) values: the heads must divide the groups and "
                  "fit in the rows");
    }
}

}  // namespace
}  // namespace tpu::driver
