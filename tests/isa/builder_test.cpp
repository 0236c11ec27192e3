// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "isa/assembler.h"
#include "isa/builder.h"
#include "isa/disassembler.h"

namespace tpu::isa {
namespace {

TEST(Builder, BuildsTheSameProgramAsTheAssembler) {
    Builder b;
    const Label loop = b.label("loop");
    const Label done = b.label("done");
    b.emit(Opcode::Li, {s(1), imm(4)});
    b.bind(loop);
    b.emit(Opcode::VMulS, {s(2) + 64, imm(0x100), fimm(2.0f), imm(1024), f(1)});
    b.emit(Opcode::Sub, {s(1), s(1), imm(1)});
    b.emit(Opcode::Beq, {s(1), imm(0), done});
    b.emit(Opcode::Jmp, {loop});
    b.bind(done);
    b.emit(Opcode::Halt, {});
    const Program p = b.finish();
    const Program q = assemble(R"(
        li s1, 4
loop:   v.muls [s2+64], [0x100], 2.0, 1024, f1
        sub s1, s1, 1
        beq s1, 0, done
        jmp loop
done:   halt
)");
    EXPECT_EQ(p.code, q.code);
    EXPECT_EQ(p.labels, q.labels);
    EXPECT_EQ(assemble(disassemble(p)).code, p.code);
}

TEST(Builder, RejectsBadOperands) {
    Builder b;
    auto msg = [&](Opcode op, std::initializer_list<Arg> args) -> std::string {
        try {
            b.emit(op, args);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "no error";
    };
    EXPECT_EQ(msg(Opcode::Add, {s(1), s(2)}), "add at pc 0: expects 3 operands, got 2");
    EXPECT_EQ(msg(Opcode::Add, {imm(1), s(2), s(3)}),
              "add at pc 0: operand 1 must be a register s0..s31");
    EXPECT_EQ(msg(Opcode::Wait, {s(1), imm(1)}), "wait at pc 0: operand 1 must be a flag f0..f31");
    EXPECT_EQ(msg(Opcode::Li, {s(1), imm(1ll << 33)}),
              "li at pc 0: operand 2 immediate 8589934592 does not fit in 32 bits");
    EXPECT_EQ(msg(Opcode::VExp, {imm(0), imm(0), imm(8), f(40)}),
              "v.exp at pc 0: operand 4 (completion) must be a flag f0..f31");
    EXPECT_EQ(msg(Opcode::VExp, {imm(0), imm(0), imm(8), f(2)}), "no error");
}

TEST(Builder, UnboundLabelAndDuplicateNames) {
    Builder b;
    const Label l = b.label("never");
    b.emit(Opcode::Jmp, {l});
    try {
        b.finish();
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "label 'never' is used by the instruction at pc 0 but never bound");
    }
    Builder c;
    const Label a1 = c.label("loop"), a2 = c.label("loop");
    c.bind(a1);
    c.emit(Opcode::Nop, {});
    c.bind(a2);
    c.emit(Opcode::Jmp, {a2});
    const Program p = c.finish();
    ASSERT_EQ(p.labels.size(), 2u);
    EXPECT_EQ(p.labels[1].first, "loop_2");
    EXPECT_EQ(assemble(disassemble(p)).code, p.code);
    {
        // A suffix a kernel already took is skipped, also where the search resumes.
        Builder d;
        std::vector<Label> ls;
        for (const char* n : {"loop", "loop", "loop_3", "loop", "loop_2x"}) {
            ls.push_back(d.label(n));
            d.bind(ls.back());
            d.emit(Opcode::Nop, {});
        }
        const Program q = d.finish();
        std::vector<std::string> names;
        for (const auto& l : q.labels) names.push_back(l.first);
        EXPECT_EQ(names,
                  (std::vector<std::string>{"loop", "loop_2", "loop_3", "loop_4", "loop_2x"}));
    }
    EXPECT_THROW(c.label("s3"), std::invalid_argument);
    EXPECT_THROW(c.label("9lives"), std::invalid_argument);
    EXPECT_THROW(c.bind(a1), std::invalid_argument);
}

/// The BuildError `f` throws ("no error" if it returns).
std::string build_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const BuildError& e) {
        return e.what();
    }
    return "no error";
}

TEST(BuilderPools, RegistersComeLowestFirstOrAsHintedAndReturnWhenReleased) {
    Builder b("k");
    const Reg x = b.arg("x"), y = b.arg("y");
    EXPECT_EQ(x.index(), 1);
    EXPECT_EQ(y.index(), 2);
    Reg t = b.reg("t");
    EXPECT_EQ(t.index(), 3);
    const Reg h = b.reg("h", 16);
    EXPECT_EQ(h.index(), 16);
    const Reg taken = b.reg("taken", 16);  // 16 is held: the lowest free one instead
    EXPECT_EQ(taken.index(), 4);
    t.release();
    EXPECT_FALSE(t);
    EXPECT_EQ(b.reg("again").index(), 3);
    EXPECT_EQ(build_error([&] {
                  b.emit(Opcode::Li, {t, imm(1)});
              }),
              "use of a released or empty register handle");
}

TEST(BuilderPools, RunningOutNamesTheKernelAndEveryHolder) {
    Builder b("layer_norm");
    std::vector<Reg> held;
    for (int i = 1; i < kNumSregs; ++i) held.push_back(b.reg(i == 1 ? "rows" : "t"));
    const std::string e = build_error([&] { b.reg("one_more"); });
    EXPECT_EQ(e.rfind("kernel 'layer_norm': out of scalar registers for 'one_more' (31 in use: "
                      "s1 rows, s2 t, s3 t,",
                      0),
              0u)
        << e;
    // Inside a nested kernel's scope the error names that kernel and the names carry its prefix.
    held.pop_back();
    {
        const auto scope = b.scope("softmax");
        const Reg r = b.reg("tile");
        EXPECT_EQ(r.name(), "softmax.tile");
        EXPECT_NE(build_error([&] {
                      b.reg("b");
                  }).find("kernel 'softmax': out of scalar registers for 'softmax.b'"),
                  std::string::npos);
    }
    EXPECT_EQ(b.kernel(), "layer_norm");
}

TEST(BuilderPools, LaunchArgumentsMustComeFirst) {
    Builder b("gemm");
    const Reg t = b.reg("tmp");
    EXPECT_EQ(build_error([&] { b.arg("rows"); }),
              "kernel 'gemm': launch argument 'rows' must be s1, which holds 'tmp'; declare "
              "launch arguments before other registers");
}

TEST(BuilderPools, AFlagHandedOutAgainIsResetFirst) {
    // A flag counts up for the whole launch, so a second holder must not see the first one's
    // count: the builder emits fset fN, 0 when it hands out a flag that was held before.
    Builder b("k");
    {
        const Flag a = b.flag("a", 3);
        EXPECT_EQ(a.index(), 3);
        b.emit(Opcode::Signal, {a, imm(1)});
    }
    const Flag c = b.flag("c", 3);
    b.emit(Opcode::Halt, {});
    const Program p = b.finish();
    EXPECT_EQ(p.code, assemble("signal f3, 1\nfset f3, 0\nhalt").code);
}

TEST(BuilderPools, VmemIsFirstFitAlignedAndClashesAreNamed) {
    Builder b("k", Limits{.vmem_bytes = 4096});
    const Vmem a = b.vmem("a", 100);
    Vmem g = b.vmem("gap", 256);
    const Vmem c = b.vmem("c", 300);
    EXPECT_EQ(a.addr(), 0u);
    EXPECT_EQ(g.addr(), 256u);
    EXPECT_EQ(c.addr(), 512u);
    g.release();
    EXPECT_EQ(b.vmem("small", 200).addr(), 256u);  // the freed gap is reused
    EXPECT_EQ(b.vmem_free(), 4096u - 1024);
    EXPECT_EQ(build_error([&] { b.vmem_at("pinned", 0, 64); }),
              "kernel 'k': VMEM [0, 64) for 'pinned' overlaps 'a' [0, 100), held since pc 0");
    EXPECT_EQ(build_error([&] { b.vmem("big", 4000); }),
              "kernel 'k': out of VMEM for 'big' (4000 bytes; largest free block 3072 of 4096; "
              "2 in use: [0, 100) a, [512, 812) c)");
    EXPECT_EQ(b.vmem_at("pinned", 2048, 64).addr(), 2048u);
    const Smem s = b.smem("counters", 3);
    EXPECT_EQ(s.words(), 3u);
    EXPECT_EQ(s.word(2).imm, int64_t(s.addr() + 8));
}

TEST(BuilderControl, LoopAndIfEmitTheBranchesOfTheHandWrittenCode) {
    Builder b("k");
    const Reg i = b.reg("i"), x = b.reg("x");
    b.loop(i, imm(0), imm(8), 2, [&] {
        b.if_(
            Cond::Eq, i, imm(4),
            [&] {
                b.emit(Opcode::Add, {x, x, imm(1)});
            },
            [&] {
                b.emit(Opcode::Sub, {x, x, imm(1)});
            });
        b.if_(Cond::Ltu, x, i, [&] { b.emit(Opcode::Nop, {}); });
    });
    b.emit(Opcode::Halt, {});
    const Program p = b.finish();
    EXPECT_EQ(p.code, assemble(R"(
        li s1, 0
top:    bne s1, 4, else
        add s2, s2, 1
        jmp endif
else:   sub s2, s2, 1
endif:  bltu s2, s1, then
        jmp skip
then:   nop
skip:   add s1, s1, 2
        blt s1, 8, top
        halt
)")
                          .code);
    EXPECT_EQ(build_error([&] { b.loop(i, imm(3), imm(3), 1, [] {}); }),
              "kernel 'k': loop from 3 to 3 step 1 is empty (the body runs at least once)");
}

TEST(BuilderControl, CountedFlagsWaitForExactlyWhatWasIssued) {
    Builder b("k");
    {
        CountedFlag dma(b, "dma", Count::AtBuild, 4);
        dma.wait_all();  // nothing issued: nothing to wait for
        dma.issue(Opcode::DmaVv, {imm(0), imm(64), imm(1), imm(64), imm(64), imm(64)});
        dma.issue(Opcode::DmaVv, {imm(64), imm(128), imm(1), imm(64), imm(64), imm(64)});
        dma.wait_all();
        CountedFlag vpu(b, "vpu", Count::InRegister, 2, 26);
        vpu.issue(Opcode::VExp, {imm(0), imm(0), imm(16)});
        vpu.wait_all();
    }
    b.emit(Opcode::Halt, {});
    EXPECT_EQ(b.finish().code, assemble(R"(
        dma.vv [0], [64], 1, 64, 64, 64, f4
        dma.vv [64], [128], 1, 64, 64, 64, f4
        wait f4, 2
        li s26, 0
        v.exp [0], [0], 16, f2
        add s26, s26, 1
        wait f2, s26
        halt
)")
                                   .code);
    // Releasing a counted flag with issues nobody waited for is an error at finish().
    Builder c("leaky");
    {
        CountedFlag f(c, "loads");
        f.issue(Opcode::VExp, {imm(0), imm(0), imm(16)});
    }
    EXPECT_EQ(build_error([&] { c.finish(); }),
              "kernel 'leaky': counted flag 'loads' was released with issued instructions not "
              "waited for (wait_all)");
}

TEST(BuilderControl, DeferredCountsAndWaitsForAllButTheLatest) {
    Builder b("k");
    {
        // A body of many ops counts them once; a wait may leave the latest issues in flight.
        CountedFlag vpu(b, "vpu", Count::InRegister, 2, 26);
        vpu.issue_deferred(Opcode::VExp, {imm(0), imm(0), imm(16)});
        vpu.issue_deferred(Opcode::VExp, {imm(64), imm(64), imm(16)});
        vpu.count_deferred();
        vpu.issue(Opcode::VExp, {imm(128), imm(128), imm(16)});
        vpu.wait_all_but(1);
        vpu.wait_all();
        CountedFlag dma(b, "dma", Count::AtBuild, 4);
        dma.issue_deferred(Opcode::DmaVv, {imm(0), imm(64), imm(1), imm(64), imm(64), imm(64)});
        EXPECT_EQ(build_error([&] { dma.wait_all(); }),
                  "kernel 'k': counted flag 'dma': a wait with 1 issues not counted yet "
                  "(count_deferred)");
        dma.count_deferred();
        dma.issue(Opcode::DmaVv, {imm(64), imm(128), imm(1), imm(64), imm(64), imm(64)});
        dma.wait_all_but(1);
        EXPECT_EQ(build_error([&] { dma.wait_all_but(3); }),
                  "kernel 'k': counted flag 'dma': cannot wait for all but 3 of 2 issues");
        dma.wait_all();
    }
    b.emit(Opcode::Halt, {});
    EXPECT_EQ(b.finish().code, assemble(R"(
        li s26, 0
        v.exp [0], [0], 16, f2
        v.exp [64], [64], 16, f2
        add s26, s26, 2
        v.exp [128], [128], 16, f2
        add s26, s26, 1
        wait f2, s26-1
        wait f2, s26
        dma.vv [0], [64], 1, 64, 64, 64, f4
        dma.vv [64], [128], 1, 64, 64, 64, f4
        wait f4, 1
        wait f4, 2
        halt
)")
                                   .code);
}

TEST(BuilderControl, DoubleBufferTogglesBetweenItsSlots) {
    Builder b("k");
    const Vmem before = b.vmem("before", 768);
    const DoubleBuffer db(b, "tiles", 1024, {1, 8, 3, 9});
    EXPECT_EQ(db.slot(0).addr(), 768u);
    EXPECT_EQ(db.slot(1).addr(), 1792u);
    EXPECT_EQ(db.slot(0).addr() ^ db.toggle(), db.slot(1).addr());
    EXPECT_EQ(db.slot(1).addr() ^ db.toggle(), db.slot(0).addr());
    EXPECT_EQ(db.loads(1).index(), 8);
    EXPECT_EQ(db.stores(0).name(), "tiles.stores0");
}

TEST(BuilderNames, TheProgramCarriesThemAndTheDisassemblyShowsThem) {
    Builder b("scale");
    const Reg x = b.arg("x"), n = b.arg("n");
    {
        const Reg i = b.reg("i");
        const Flag done = b.flag("done");
        b.emit(Opcode::Li, {i, imm(0)});
        b.emit(Opcode::VMulS, {x, x, fimm(2.0f), n, done});
        b.emit(Opcode::Wait, {done, imm(1)});
    }
    b.emit(Opcode::Halt, {});
    const Program p = b.finish();
    EXPECT_EQ(p.name, "scale");
    EXPECT_EQ(p.args, (std::vector<std::string>{"x", "n"}));
    ASSERT_EQ(p.symbols.size(), 4u);
    EXPECT_EQ(p.symbols[2].name, "i");
    EXPECT_EQ(p.symbols[2].first_pc, 0u);
    EXPECT_EQ(p.symbols[2].end_pc, 3u);  // released before the halt
    EXPECT_EQ(p.symbols[0].end_pc, 4u);  // still held at finish()
    const std::string text = disassemble(p);
    EXPECT_NE(text.find("# launch arguments: s1 x, s2 n"), std::string::npos) << text;
    EXPECT_NE(text.find("v.muls [s1], [s1], 1073741824, s2, f0"), std::string::npos) << text;
    EXPECT_NE(text.find("# s1 x, s2 n, f0 done"), std::string::npos) << text;
    EXPECT_EQ(assemble(text).code, p.code);
}

}  // namespace
}  // namespace tpu::isa
