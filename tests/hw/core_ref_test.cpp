// SPDX-License-Identifier: Apache-2.0
// The fast TensorCore (CoreModel, timing computed at issue) against the cycle-stepped reference
// (hw/reference/core_ref.h): identical issue, start and done for every executed instruction and
// the same finish cycle, on random instruction streams over small and default configs; plus
// hand-checked cases with the arithmetic in comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hw/board_config.h"
#include "hw/core/core_model.h"
#include "hw/mem/sparse_memory.h"
#include "hw/reference/core_ref.h"
#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "tests/common/paths.h"

namespace tpu::hw {

/// Readable records in GoogleTest messages (found by argument-dependent lookup).
static void PrintTo(const InstrRecord& r, std::ostream* os) {
    *os << "{pc " << r.pc << " " << isa::info(r.op).mnemonic << " issue " << r.issue << " start "
        << r.start << " done " << r.done << "}";
}

namespace {

using isa::Opcode;

/// The small board of the brief: 8 x 8 MXUs, 2 x 8 vector registers, 2 HBM channels.
BoardConfig tiny_config(uint32_t queue_depth = 8, uint32_t dispatch_cycles = 1) {
    BoardConfig cfg;
    cfg.chips = 1;
    cfg.cores_per_chip = 2;
    cfg.core.mxu_rows = 8;
    cfg.core.mxu_cols = 8;
    cfg.core.vpu_sublanes = 2;
    cfg.core.vpu_lanes = 8;
    cfg.core.vmem_bytes = 1 << 20;
    cfg.hbm.bytes_per_core = 64 << 20;
    cfg.hbm.channels = 2;
    cfg.core.queue_depth = queue_depth;
    cfg.core.dispatch_cycles = dispatch_cycles;
    cfg.sim.functional = false;
    cfg.hbm.model = "simple";  // the reference core models the simple HBM pipe
    return cfg;
}

BoardConfig default_config(uint32_t queue_depth = 8, uint32_t dispatch_cycles = 1) {
    BoardConfig cfg;
    cfg.chips = 1;
    cfg.cores_per_chip = 2;
    cfg.hbm.bytes_per_core = 64 << 20;  // only the address range matters: memory is sparse
    cfg.core.queue_depth = queue_depth;
    cfg.core.dispatch_cycles = dispatch_cycles;
    cfg.sim.functional = false;
    cfg.hbm.model = "simple";  // the reference core models the simple HBM pipe
    return cfg;
}

/// The v6e-8 preset's TensorCore (four 256 x 256 MXUs, 128 MiB of VMEM, a 1024-byte DMA port,
/// 1750 MHz) with the simple HBM pipe the reference models.
BoardConfig v6e_config(uint32_t queue_depth = 8, uint32_t dispatch_cycles = 1) {
    BoardConfig cfg = BoardConfig::load(test::source_dir() + "/configs/v6e-8.json", {});
    cfg.chips = 1;
    cfg.hbm.bytes_per_core = 64 << 20;
    cfg.core.queue_depth = queue_depth;
    cfg.core.dispatch_cycles = dispatch_cycles;
    cfg.sim.functional = false;
    cfg.hbm.model = "simple";
    return cfg;
}

/// What CoreModel reported.
struct FastRun {
    CoreModel::Status status;          ///< how run_alone() ended
    std::vector<InstrRecord> records;  ///< one per executed instruction
};

/// CoreModel with no board around it.
FastRun run_fast(const BoardConfig& cfg, const isa::Program& prog, uint64_t start = 0) {
    SparseMemory hbm("hbm", cfg.hbm.bytes_per_core), vmem("vmem", cfg.core.vmem_bytes);
    CoreModel core(0, cfg, hbm, vmem, nullptr);
    core.record(true);
    core.load(prog);
    core.start(start, {});
    // run_alone, not run(UINT64_MAX): with `now` that far ahead a wait on a completion that is
    // still in flight would end the run with WaitFlag instead of advancing to the increment.
    const CoreModel::Status st = core.run_alone();
    return {st, core.records()};
}

std::string show(const InstrRecord& r) {
    std::ostringstream s;
    PrintTo(r, &s);
    return s.str();
}

/// What the random streams exercised, so a generator that stops producing stalls is noticed.
struct Coverage {
    uint64_t records = 0;       ///< instructions executed
    uint64_t queue_stalls = 0;  ///< unit instructions whose issue was delayed by a full queue
    uint64_t late_starts = 0;   ///< unit instructions that started after they were ready
    uint64_t waits_held = 0;    ///< waits and fences that stalled the sequencer
};
Coverage g_coverage;

/// Compares CoreModel with the reference; on a difference reports the stream and the first
/// differing record and returns false.
bool same_timing(const BoardConfig& cfg, const isa::Program& prog, const std::string& what,
                 uint64_t start = 0) {
    const FastRun fast = run_fast(cfg, prog, start);
    uint64_t prev_issue = start;
    for (size_t i = 0; i < fast.records.size(); ++i) {
        const InstrRecord& r = fast.records[i];
        const isa::Unit unit = isa::info(r.op).unit;
        g_coverage.records += 1;
        if (unit == isa::Unit::Sync && r.start > r.issue) g_coverage.waits_held += 1;
        const bool queued =
            unit == isa::Unit::Dma || unit == isa::Unit::Vpu || unit == isa::Unit::Mxu;
        if (queued && r.start > r.issue + cfg.core.dispatch_cycles) g_coverage.late_starts += 1;
        if (queued && i > 0 && r.issue > prev_issue + 1 &&
            isa::info(fast.records[i - 1].op).unit != isa::Unit::Sync)
            g_coverage.queue_stalls += 1;
        prev_issue = r.issue;
    }
    const CoreRefResult ref = CoreRef(cfg).run(prog, start);
    const auto listing = [&] { return isa::disassemble(prog, {.show_pc = true}); };
    if (fast.status.block != CoreModel::Block::Halted || !ref.halted) {
        ADD_FAILURE() << what << ": did not halt (fast block " << int(fast.status.block)
                      << ", reference halted " << ref.halted << ")\n"
                      << listing();
        return false;
    }
    const size_t n = std::min(fast.records.size(), ref.records.size());
    for (size_t i = 0; i < n; ++i) {
        if (fast.records[i] == ref.records[i]) continue;
        ADD_FAILURE() << what << ": record " << i
                      << " differs\n  CoreModel: " << show(fast.records[i])
                      << "\n  reference: " << show(ref.records[i]) << "\n"
                      << listing();
        return false;
    }
    if (fast.records.size() != ref.records.size() || fast.status.cycle != ref.finish) {
        ADD_FAILURE() << what << ": " << fast.records.size() << " vs " << ref.records.size()
                      << " records, finish " << fast.status.cycle << " vs " << ref.finish << "\n"
                      << listing();
        return false;
    }
    return true;
}

// ---- random streams -------------------------------------------------------------------------

isa::Operand reg(int r, int64_t imm = 0) {
    return {static_cast<uint8_t>(r), static_cast<int32_t>(imm)};
}
isa::Operand imm(int64_t v) {
    return reg(0, v);
}

/// Random programs that never fault and never deadlock: addresses stay in range and aligned,
/// every mxu.mm follows an mxu.lw on its MXU, and every wait asks for at most the count the
/// flag is certain to reach (completion flags of instructions that surely execute, signals,
/// fset values).
class StreamGen {
public:
    StreamGen(std::mt19937& rng, const BoardConfig& cfg) : m_rng(rng), m_cfg(cfg) {
        m_mxu_loaded.assign(cfg.core.mxus, false);
        m_small = cfg.core.mxu_rows <= 16;
    }

    isa::Program make() {
        const int target = pick(20, 200);
        // Constant bases (s1..s4) and a loop-advanced offset s5 that stays below 4 KiB.
        for (int r = 1; r <= 4; ++r) emit(Opcode::Li, {reg(r), imm(kBase[r])});
        emit(Opcode::Li, {reg(5), imm(0)});
        while (static_cast<int>(m_code.size()) < target) item(Ctx::Top);
        emit(Opcode::Halt, {});
        isa::Program p;
        p.code = m_code;
        return p;
    }

private:
    enum class Ctx { Top, Loop, Skip };
    static constexpr std::array<int64_t, 5> kBase = {0, 0, 256, 1024, 4096};
    static constexpr int kFlags = 6;

    int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(m_rng); }
    bool chance(int percent) { return pick(0, 99) < percent; }

    void emit(Opcode op, std::initializer_list<isa::Operand> ops, uint8_t flag = isa::kNoFlag) {
        isa::Instr ins;
        ins.op = op;
        ins.flag = flag;
        int i = 0;
        for (const auto& o : ops) ins.ops[i++] = o;
        m_code.push_back(ins);
    }

    /// An address operand for byte address `a`: an immediate, a base register plus offset, or
    /// (in loops) s5 plus offset, which moves by 64 bytes per iteration.
    isa::Operand addr(int64_t a, Ctx ctx) {
        const int how = pick(0, ctx == Ctx::Loop ? 2 : 1);
        if (how == 2) return reg(5, a);
        if (how == 1) {
            int r = 4;
            while (kBase[r] > a) --r;
            return reg(r, a - kBase[r]);
        }
        return imm(a);
    }
    /// A VMEM address, aligned: often from a few hot spots so that ranges overlap.
    int64_t vmem_addr(int align) {
        static constexpr std::array<int64_t, 6> kHot = {0, 64, 256, 1024, 2048, 4096};
        const int64_t a = chance(60) ? kHot[pick(0, 5)] + 4 * pick(0, 16) : 4 * pick(0, 8191);
        return a / align * align;
    }
    /// A completion flag on half of the unit instructions.
    uint8_t maybe_flag() {
        return chance(50) ? static_cast<uint8_t>(pick(0, kFlags - 1)) : isa::kNoFlag;
    }

    /// Adds the completion flag of a unit instruction to what waits may count on.
    void count_flag(uint8_t flag, Ctx ctx) {
        if (flag == isa::kNoFlag || ctx == Ctx::Skip) return;
        if (ctx == Ctx::Loop)
            ++m_body_flags[flag];
        else
            ++m_sure[flag];
    }

    void item(Ctx ctx) {
        const int k = pick(0, 99);
        if (k < 18)
            scalar();
        else if (k < 36)
            dma(ctx);
        else if (k < 54)
            vpu(ctx);
        else if (k < 72)
            mxu(ctx);
        else if (k < 80 && ctx != Ctx::Skip)
            wait();
        else if (k < 83)
            signal(ctx);
        else if (k < 85 && ctx == Ctx::Top)
            fset();
        else if (k < 88 && ctx != Ctx::Skip)
            emit(Opcode::Fence, {});
        else if (k < 94 && ctx == Ctx::Top)
            loop();
        else if (ctx == Ctx::Top)
            skip();
        else
            scalar();
    }

    void scalar() {
        static constexpr std::array<Opcode, 16> kOps = {
            Opcode::Li,   Opcode::Add,  Opcode::Sub, Opcode::Mul, Opcode::And, Opcode::Or,
            Opcode::Xor,  Opcode::Shl,  Opcode::Shr, Opcode::Sra, Opcode::Slt, Opcode::Sltu,
            Opcode::Divu, Opcode::Remu, Opcode::Lw,  Opcode::Sw};
        const Opcode op = kOps[pick(0, int(kOps.size()) - 1)];
        auto any = [&] { return chance(50) ? reg(pick(10, 15)) : imm(pick(-1000, 1000)); };
        const isa::Operand d = reg(pick(10, 15));
        switch (op) {
            case Opcode::Li:
                emit(op, {d, any()});
                break;
            case Opcode::Divu:
            case Opcode::Remu:
                emit(op, {d, any(), imm(pick(1, 9))});
                break;
            case Opcode::Lw:
                emit(op, {d, imm(4 * pick(0, 63))});
                break;
            case Opcode::Sw:
                emit(op, {any(), imm(4 * pick(0, 63))});
                break;
            default:
                emit(op, {d, any(), any()});
                break;
        }
        if (chance(10)) emit(chance(50) ? Opcode::CoreId : Opcode::NCores, {d});
    }

    void dma(Ctx ctx) {
        const int kind = pick(0, 2);
        const Opcode op = kind == 0 ? Opcode::DmaHv : kind == 1 ? Opcode::DmaVh : Opcode::DmaVv;
        const int rows = pick(1, 4);
        const int row_bytes = m_small ? pick(1, 700) : pick(1, 3000);
        auto stride = [&] { return rows == 1 ? pick(0, 64) : row_bytes + pick(0, 3) * 32; };
        // HBM addresses share the low region too, so vh then hv of the same bytes is a hazard.
        auto hbm = [&] { return int64_t(pick(0, 255)) * 64; };
        const int64_t dst = kind == 1 ? hbm() : vmem_addr(1);
        const int64_t src = kind == 0 ? hbm() : vmem_addr(1);
        const uint8_t flag = maybe_flag();
        emit(op,
             {addr(dst, ctx), addr(src, ctx), imm(rows), imm(row_bytes), imm(stride()),
              imm(stride())},
             flag);
        count_flag(flag, ctx);
    }

    void vpu(Ctx ctx) {
        static constexpr std::array<Opcode, 23> kOps = {
            Opcode::VAdd,    Opcode::VSub,    Opcode::VMul,   Opcode::VMax,  Opcode::VMin,
            Opcode::VCmpGt,  Opcode::VSel,    Opcode::VAddS,  Opcode::VMulS, Opcode::VMaxS,
            Opcode::VExp,    Opcode::VLog,    Opcode::VRsqrt, Opcode::VTanh, Opcode::VF2Bf,
            Opcode::VBf2F,   Opcode::VRand,   Opcode::VRSum,  Opcode::VRMax, Opcode::VCSum,
            Opcode::VAddRow, Opcode::VSubCol, Opcode::VTrans};
        const Opcode op = chance(5) ? Opcode::VMulCol : kOps[pick(0, int(kOps.size()) - 1)];
        const int n = m_small ? pick(1, 120) : pick(1, 6000);
        const int rows = pick(1, 8), cols = m_small ? pick(1, 24) : pick(1, 400);
        auto a4 = [&] { return addr(vmem_addr(4), ctx); };
        const uint8_t flag = maybe_flag();
        switch (op) {
            case Opcode::VSel:
                emit(op, {a4(), a4(), a4(), a4(), imm(n)}, flag);
                break;
            case Opcode::VAddS:
            case Opcode::VMulS:
            case Opcode::VMaxS:
                emit(op, {a4(), a4(), imm(0x3F800000), imm(n)}, flag);
                break;
            case Opcode::VExp:
            case Opcode::VLog:
            case Opcode::VRsqrt:
            case Opcode::VTanh:
            case Opcode::VF2Bf:
            case Opcode::VBf2F:
                emit(op, {a4(), a4(), imm(n)}, flag);
                break;
            case Opcode::VRand:
                emit(op, {a4(), imm(pick(0, 99)), imm(n)}, flag);
                break;
            case Opcode::VRSum:
            case Opcode::VRMax:
            case Opcode::VCSum:
            case Opcode::VTrans:
                emit(op, {a4(), a4(), imm(rows), imm(cols)}, flag);
                break;
            case Opcode::VAddRow:
            case Opcode::VSubCol:
            case Opcode::VMulCol:
                emit(op, {a4(), a4(), a4(), imm(rows), imm(cols)}, flag);
                break;
            default:
                emit(op, {a4(), a4(), a4(), imm(n)}, flag);
                break;
        }
        count_flag(flag, ctx);
    }

    void mxu(Ctx ctx) {
        const uint32_t idx = pick(0, int(m_cfg.core.mxus) - 1);
        const auto R = int(m_cfg.core.mxu_rows), C = int(m_cfg.core.mxu_cols);
        const uint8_t flag = maybe_flag();
        const isa::Operand unit = chance(30) ? reg(0, idx) : imm(idx);
        if (!m_mxu_loaded[idx] || chance(35)) {
            emit(Opcode::MxuLw, {unit, addr(vmem_addr(2), ctx), imm(pick(1, R)), imm(pick(1, C))},
                 flag);
            // A skipped block may not run, so an mm after it cannot count on its weights.
            if (ctx != Ctx::Skip) m_mxu_loaded[idx] = true;
        } else {
            const int T = m_small ? pick(1, 24) : pick(1, 300);
            emit(Opcode::MxuMm,
                 {unit, addr(vmem_addr(4), ctx), addr(vmem_addr(2), ctx), imm(T), imm(pick(0, 1))},
                 flag);
        }
        count_flag(flag, ctx);
    }

    void wait() {
        const int f = pick(0, kFlags - 1);
        const int64_t most = m_sure[f];
        emit(Opcode::Wait, {imm(f), imm(most == 0 ? 0 : pick(0, int(most)))});
    }

    void signal(Ctx ctx) {
        const int f = pick(0, kFlags - 1), v = pick(0, 3);
        emit(Opcode::Signal, {imm(f), imm(v)});
        if (ctx == Ctx::Top) m_sure[f] += v;
        if (ctx == Ctx::Loop) m_body_flags[f] += v;
    }

    void fset() {
        const int f = pick(0, kFlags - 1), v = pick(0, 4);
        emit(Opcode::Fset, {imm(f), imm(v)});
        // Later completions of instructions in flight only add to v.
        m_sure[f] = v;
    }

    /// li s20, n; body; add s5, s5, 64; sub s20, s20, 1; bne s20, 0, body.
    void loop() {
        const int iters = pick(1, 4);
        emit(Opcode::Li, {reg(20), imm(iters)});
        const auto top = static_cast<int32_t>(m_code.size());
        m_body_flags.fill(0);
        const int items = pick(1, 6);
        for (int i = 0; i < items; ++i) item(Ctx::Loop);
        emit(Opcode::Add, {reg(5), reg(5), imm(64)});
        emit(Opcode::Sub, {reg(20), reg(20), imm(1)});
        emit(Opcode::Bne, {reg(20), imm(0), imm(top)});
        for (int f = 0; f < kFlags; ++f) m_sure[f] += iters * m_body_flags[f];
        // s5 only grows; start over before it leaves the 4 KiB it is allowed.
        if (++m_loops % 8 == 0) emit(Opcode::Li, {reg(5), imm(0)});
    }

    /// A forward branch over a few instructions, taken or not depending on scalar state.
    void skip() {
        const auto at = m_code.size();
        emit(chance(50) ? Opcode::Beq : Opcode::Bne, {reg(pick(10, 12)), reg(pick(10, 12)), {}});
        const int items = pick(1, 4);
        for (int i = 0; i < items; ++i) item(Ctx::Skip);
        m_code[at].ops[2] = imm(static_cast<int64_t>(m_code.size()));
    }

    std::mt19937& m_rng;
    const BoardConfig& m_cfg;
    bool m_small = true;
    std::vector<isa::Instr> m_code;
    std::vector<bool> m_mxu_loaded;
    std::array<int64_t, kFlags> m_sure{};        ///< count each flag surely reaches
    std::array<int64_t, kFlags> m_body_flags{};  ///< per iteration of the loop being built
    int m_loops = 0;
};

constexpr std::array<uint32_t, 6> kPorts = {48, 64, 100, 333, 512, 1000};

/// Runs `streams` random streams; stops at the first mismatch (one listing is enough).
enum class Board { Tiny, Default, V6e };
void random_streams(uint32_t seed, int streams, Board board) {
    const bool small_array = board == Board::Tiny;
    std::mt19937 rng(seed);
    for (int i = 0; i < streams; ++i) {
        const uint32_t depth = std::array<uint32_t, 4>{1, 2, 3, 8}[rng() % 4];
        const uint32_t dispatch = rng() % 4;
        BoardConfig cfg = board == Board::Tiny      ? tiny_config(depth, dispatch)
                          : board == Board::Default ? default_config(depth, dispatch)
                                                    : v6e_config(depth, dispatch);
        if (rng() % 4 == 0) cfg.core.vpu_alus = 1 + rng() % 3;
        cfg.core.mxu_swap_drains = i % 2 == 0;  // both MXU swap rules
        // Ports that do not divide a request (fractional send times) and odd shapes.
        if (rng() % 4 == 0) cfg.core.dma_vmem_bytes_per_cycle = kPorts[rng() % kPorts.size()];
        if (rng() % 4 == 0) cfg.core.dma_chunk_bytes = 64u << (rng() % 4);
        if (small_array && rng() % 4 == 0) {
            cfg.core.mxu_rows = 4 + 4 * (rng() % 3);
            cfg.core.mxu_cols = 4 + 4 * (rng() % 3);
            cfg.core.mxus = 1 + rng() % 3;
            cfg.core.vpu_lanes = 5 + rng() % 4;
            cfg.core.vpu_sublanes = 1 + rng() % 3;
        }
        const uint64_t start = rng() % 3 == 0 ? rng() % 1000 : 0;
        StreamGen gen(rng, cfg);
        const isa::Program prog = gen.make();
        const std::string what =
            "seed " + std::to_string(seed) + " stream " + std::to_string(i) + " (queue_depth " +
            std::to_string(depth) + ", dispatch " + std::to_string(dispatch) + ", vpu_alus " +
            std::to_string(cfg.core.vpu_alus) + ", dma port " +
            std::to_string(cfg.core.dma_vmem_bytes_per_cycle) + ", chunk " +
            std::to_string(cfg.core.dma_chunk_bytes) + ", start " + std::to_string(start) + ")";
        if (!same_timing(cfg, prog, what, start)) return;
    }
}

TEST(CoreRef, RandomStreamsTinyConfig) {
    g_coverage = {};
    for (uint32_t seed = 1; seed <= 8; ++seed) random_streams(seed, 100, Board::Tiny);
    // The streams must actually stress the rules, not just run straight through.
    EXPECT_GT(g_coverage.records, 20'000u);
    EXPECT_GT(g_coverage.queue_stalls, 500u);
    EXPECT_GT(g_coverage.late_starts, 2'000u);
    EXPECT_GT(g_coverage.waits_held, 500u);
    std::cout << "coverage: " << g_coverage.records << " instructions, " << g_coverage.queue_stalls
              << " queue stalls, " << g_coverage.late_starts << " late starts, "
              << g_coverage.waits_held << " held waits/fences\n";
}

TEST(CoreRef, RandomStreamsDefaultConfig) {
    g_coverage = {};
    for (uint32_t seed = 101; seed <= 104; ++seed) random_streams(seed, 30, Board::Default);
    EXPECT_GT(g_coverage.records, 5'000u);
    std::cout << "coverage: " << g_coverage.records << " instructions, " << g_coverage.queue_stalls
              << " queue stalls, " << g_coverage.late_starts << " late starts, "
              << g_coverage.waits_held << " held waits/fences\n";
}

TEST(CoreRef, RandomStreamsV6ePreset) {
    // A non-v3 TensorCore: four MXUs of 256 x 256 (configs/v6e-8.json).
    g_coverage = {};
    for (uint32_t seed = 201; seed <= 204; ++seed) random_streams(seed, 30, Board::V6e);
    EXPECT_GT(g_coverage.records, 5'000u);
    EXPECT_GT(g_coverage.late_starts, 500u);
}

// ---- hand-checked cases ---------------------------------------------------------------------

/// Both models must give exactly `want` (issue, start, done per executed instruction).
void expect_records(const BoardConfig& cfg, const char* text,
                    const std::vector<InstrRecord>& want) {
    const isa::Program prog = isa::assemble(text);
    const FastRun fast = run_fast(cfg, prog);
    const CoreRefResult ref = CoreRef(cfg).run(prog);
    EXPECT_EQ(fast.records, want) << "CoreModel";
    EXPECT_EQ(ref.records, want) << "reference";
    ASSERT_TRUE(ref.halted);
    EXPECT_EQ(ref.finish, want.back().done);
    EXPECT_EQ(fast.status.cycle, want.back().done);
}

TEST(CoreRef, QueueFullStallsIssue) {
    // Tiny config: a vector register holds 2 x 8 = 16 elements and 2 ALUs retire 2 per cycle,
    // so 160 elements = 10 vregs = 5 issue cycles; add latency 2. queue_depth 1, dispatch 1.
    //  pc0 issue 0, ready 1, start 1, done 1 + 5 - 1 + 2 = 7; issue slot free at 6.
    //  pc1 issue 1 (pc0 left the queue at its start, 1), ready 2,
    //      start max(2, 1, slot 6) = 6, done 6 + 4 + 2 = 12; slot free at 11.
    //  pc2 at 2 finds pc1 still queued (it starts at 6): issue stalls to 6, ready 7,
    //      start max(7, 6, 11) = 11, done 11 + 4 + 2 = 17.
    //  halt issues at 7 and the core finishes when pc2 is done, 17.
    const BoardConfig cfg = tiny_config(1, 1);
    expect_records(cfg,
                   "v.add [0], [4096], [8192], 160\n"
                   "v.add [12288], [16384], [20480], 160\n"
                   "v.add [24576], [28672], [32768], 160\n"
                   "halt\n",
                   {{0, Opcode::VAdd, 0, 1, 7},
                    {1, Opcode::VAdd, 1, 6, 12},
                    {2, Opcode::VAdd, 6, 11, 17},
                    {3, Opcode::Halt, 7, 7, 17}});
}

TEST(CoreRef, VpuReadAfterWriteWaitsButWriteAfterReadDoesNot) {
    // pc0 v.exp of 32 elements: 2 vregs, 1 issue cycle, transcendental latency 7:
    //     issue 0, start 1, done 1 + 0 + 7 = 8; writes [0, 128).
    // pc1 reads [0, 64) that pc0 writes (RAW): start max(ready 2, slot 2, pc0 done 8) = 8,
    //     done 8 + 0 + 2 = 10.
    // pc2 writes [4096, 4160) that pc0 and pc1 read (WAR): no wait, only in order:
    //     start max(ready 3, prev start 8, slot 9) = 9, mul latency 2, done 11.
    // halt issues at 3, finishes at 11.
    const BoardConfig cfg = tiny_config(8, 1);
    expect_records(cfg,
                   "v.exp [0], [4096], 32\n"
                   "v.add [8192], [0], [4096], 16\n"
                   "v.muls [4096], [12288], 2.0, 16\n"
                   "halt\n",
                   {{0, Opcode::VExp, 0, 1, 8},
                    {1, Opcode::VAdd, 1, 8, 10},
                    {2, Opcode::VMulS, 2, 9, 11},
                    {3, Opcode::Halt, 3, 3, 11}});
}

TEST(CoreRef, DmaWaitsForThePathOfThePreviousDma) {
    // VMEM to VMEM at 512 B/cycle. pc0: 4 x 1000 B = 4000 B, occupancy ceil(4000 / 512) = 8:
    //     start 1, done 1 + 8 + 1 = 10, path free at 9.
    // pc1: 100 B, no overlap: start max(ready 2, 1, path 9) = 9, occupancy 1, done 11.
    // pc2 reads what pc0 writes: start max(ready 3, 9, path 10, pc0 done 10) = 10, done 12.
    const BoardConfig cfg = tiny_config(8, 1);
    expect_records(cfg,
                   "dma.vv [0], [65536], 4, 1000, 1000, 1000\n"
                   "dma.vv [131072], [196608], 1, 100, 100, 100\n"
                   "dma.vv [262144], [2000], 1, 8, 8, 8\n"
                   "halt\n",
                   {{0, Opcode::DmaVv, 0, 1, 10},
                    {1, Opcode::DmaVv, 1, 9, 11},
                    {2, Opcode::DmaVv, 2, 10, 12},
                    {3, Opcode::Halt, 3, 3, 12}});
}

TEST(CoreRef, BackToBackHbmDmasShareThePipe) {
    // Tiny config HBM: B = 2 ch x 16 B x 2 x (10^6 / 1136) MHz / 940 MHz = 59.934 B/cycle, so a
    // byte takes 1136 x 940 / (2 x 128 x 250) / 1000 = 0.016685 cycles; latency
    // ceil(100 ns x 0.94) = 94.
    // pc0: 512 B, one request leaving at 1: pipe 1 .. 1 + 8.54272 = 9.54272, done
    //     ceil(9.54272) + 94 = 104; engine free at ceil(1 + 512 / 512) = 2.
    // pc1: 600 B = requests of 512 and 88 B: start max(ready 2, engine 2) = 2; the first leaves
    //     at 2 and waits for the pipe: 9.54272 .. 18.08544; the second leaves at
    //     floor(2 + 512 / 512) = 3: 18.08544 .. 18.08544 + 1.46828 = 19.55372 -> done 20 + 94
    //     = 114.
    const BoardConfig cfg = tiny_config(8, 1);
    expect_records(cfg,
                   "dma.hv [0], [0], 1, 512, 512, 512\n"
                   "dma.hv [4096], [4096], 1, 600, 600, 600\n"
                   "halt\n",
                   {{0, Opcode::DmaHv, 0, 1, 104},
                    {1, Opcode::DmaHv, 1, 2, 114},
                    {2, Opcode::Halt, 2, 2, 114}});
}

TEST(CoreRef, DmaPortTimeIsExactForFractionalSendTimes) {
    // Regression: CoreModel used to add len / port per request in floating point, so 16
    // requests of 4 x 504 B at 48 B/cycle (128, 128, 128, 120 per row) summed to slightly more
    // than 2016 / 48 = 42 cycles and the engine was free one cycle late.
    // pc0 (port 48 B/cycle, requests of at most 128 B): start 1, engine free 1 + 42 = 43. The
    //     pipe (59.93 B/cycle) outruns the port, so the last request decides: it leaves at
    //     floor(1 + 1896 / 48) = 40 to an idle pipe, ends 40 + 120 x 0.016685 = 42.0022,
    //     done ceil(42.0022) + 94 = 137.
    // pc1: start max(ready 2, engine 43) = 43, one cycle of port, done 43 + 1 + 1 = 45.
    BoardConfig cfg = tiny_config(8, 1);
    cfg.core.dma_vmem_bytes_per_cycle = 48;
    cfg.core.dma_chunk_bytes = 128;
    expect_records(cfg,
                   "dma.vh [0], [8192], 4, 504, 504, 504\n"
                   "dma.vv [65536], [131072], 1, 48, 48, 48\n"
                   "halt\n",
                   {{0, Opcode::DmaVh, 0, 1, 137},
                    {1, Opcode::DmaVv, 1, 43, 45},
                    {2, Opcode::Halt, 2, 2, 137}});
}

/// Two (lw, mm) pairs on one MXU whose second load overlaps the first matmul; R = C = 8,
/// dispatch 0 (ready = issue). mm1 ends at `mm1_done`: the wait holds until then and the halt
/// follows.
void expect_load_under_matmul(bool swap_drains, uint64_t mm1_start) {
    BoardConfig cfg = tiny_config(8, 0);
    cfg.core.mxu_swap_drains = swap_drains;
    const uint64_t mm1_done = mm1_start + 2 + 14;
    expect_records(cfg,
                   "mxu.lw 0, [0], 8, 8\n"
                   "mxu.mm 0, [1024], [2048], 4, 0\n"
                   "mxu.lw 0, [4096], 8, 8\n"
                   "mxu.mm 0, [8192], [2048], 2, 0, f1\n"
                   "wait f1, 1\n"
                   "halt\n",
                   {{0, Opcode::MxuLw, 0, 0, 8},
                    {1, Opcode::MxuMm, 1, 8, 26},
                    {2, Opcode::MxuLw, 2, 8, 16},
                    {3, Opcode::MxuMm, 3, mm1_start, mm1_done},
                    {4, Opcode::Wait, 4, mm1_done, mm1_done + 1},
                    {5, Opcode::Halt, mm1_done + 1, mm1_done + 1, mm1_done + 1}});
}

TEST(CoreRef, ADmaRowAcrossAnHbmWindowBoundaryIsCutThere) {
    // hbm.map (isa/README.md, "HBM windows"): window 1 -> byte 0, window 2 -> byte 16 MiB
    // (65536 x 256). dma.vh writes 2 rows of 512 B from program address 2 x 512 MiB - 256, so
    // row 0 crosses windows 1|2: pieces 256 B at 512 MiB - 256, 256 B at 16 MiB, and row 1
    // (512 B) at 16 MiB + 256, issued one after the other as the port frees (one 512-B port
    // cycle each, HbmWindows::pieces_2d).
    // pc0, pc1 issue at 0, 1; pc2 issues at 2, ready and starts at 3: requests leave at 3, 4
    // and 5 (port free at 6). Tiny HBM pipe: 59.934 B/cycle, latency 94 (see
    // BackToBackHbmDmasShareThePipe): 3 .. 3 + 256 / 59.934 = 7.27136 .. 11.54272 .. 11.54272
    // + 512 / 59.934 = 20.08544, so done = ceil(20.08544) + 94 = 115.
    BoardConfig cfg = tiny_config(8, 1);
    cfg.hbm.bytes_per_core = uint64_t(1) << 30;  // sparse: only the address range matters
    const char* text =
        "hbm.map 1, 0\n"
        "hbm.map 2, 65536\n"
        "dma.vh [0x3fffff00], [0], 2, 512, 512, 512\n"
        "halt\n";
    expect_records(cfg, text,
                   {{0, Opcode::HbmMap, 0, 0, 1},
                    {1, Opcode::HbmMap, 1, 1, 2},
                    {2, Opcode::DmaVh, 2, 3, 115},
                    {3, Opcode::Halt, 3, 3, 115}});
    // The bytes land at the three physical places (functional, race detector on).
    cfg.sim.functional = true;
    cfg.sim.race_detector = true;
    SparseMemory hbm("hbm", cfg.hbm.bytes_per_core), vmem("vmem", cfg.core.vmem_bytes);
    std::vector<uint8_t> rows(1024);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = uint8_t(i * 7 + 1);
    vmem.write(0, rows);
    CoreModel core(0, cfg, hbm, vmem, nullptr);
    core.load(isa::assemble(text));
    core.start(0, {});
    ASSERT_EQ(core.run_alone().block, CoreModel::Block::Halted);
    const auto at = [&](uint64_t addr, size_t n) {
        std::vector<uint8_t> out(n);
        hbm.read(addr, out);
        return out;
    };
    EXPECT_EQ(at((uint64_t(512) << 20) - 256, 256),
              std::vector<uint8_t>(rows.begin(), rows.begin() + 256));
    EXPECT_EQ(at(uint64_t(16) << 20, 256),
              std::vector<uint8_t>(rows.begin() + 256, rows.begin() + 512));
    EXPECT_EQ(at((uint64_t(16) << 20) + 256, 512),
              std::vector<uint8_t>(rows.begin() + 512, rows.end()));
}

TEST(CoreRef, HbmMapOfAWindowThatDoesNotExistIsADeviceFault) {
    const BoardConfig cfg = tiny_config(8, 1);
    const FastRun fast = run_fast(cfg, isa::assemble("hbm.map 8, 0\nhalt\n"));
    EXPECT_EQ(fast.status.block, CoreModel::Block::Faulted);
}

TEST(CoreRef, MxuLoadsUnderAMatmulWithZeroDispatch) {
    //  lw0 issue 0, start 0, done 0 + 8 = 8.
    //  mm0 (T 4) issue 1: waits for lw0: start 8, done 8 + 4 + 8 + 8 - 2 = 26; port free at 12.
    //  lw1 issue 2: start max(2, prev start 8, loader free 8, shadow taken at 8) = 8, done 16:
    //      it loads while mm0 streams.
    //  mm1 (T 2) issue 3, wavefront swap: start max(3, 8, port 12, lw1 done 16) = 16, done
    //  16 + 2 + 14 = 32. wait f1, 1 issues at 4 and holds at 32 (mm1's flag), done 33; halt
    //  issues at 33 and finishes at once (everything is done).
    expect_load_under_matmul(false, 16);
}

TEST(CoreRef, MxuSwapWaitsForTheArrayToDrain) {
    // The same with array-wide swaps (the default): mm1 brings lw1's tile into the array, so it
    // also waits for mm0's done: start max(16, 26) = 26, done 42; the wait ends at 43.
    expect_load_under_matmul(true, 26);
}

}  // namespace
}  // namespace tpu::hw
