// SPDX-License-Identifier: Apache-2.0
// Output fusions rooted at a dot: the fused dot kernel with the fusion's epilogue
// (compiler/README.md, "Output fusions of a dot"; driver/kernels/matmul_kernel.h).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"
#include "compiler/stages.h"
#include "driver/kernels/epilogue.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler::gen {
namespace {

namespace st = driver::streaming;

/// Bytes of one epilogue area: the largest result tile of `k` (block_rows x C fp32; with the
/// LHS stationary at most C rows of block_rows).
uint64_t epilogue_area_bytes(const driver::DotKey& k) {
    return (uint64_t(k.block_rows) * k.C * 4 + 511) / 512 * 512;
}

/// The dot kernel's layout of a rank-2 fusion operand or result whose dim `rows_dim` is the
/// problem's rows (A: M of M x K, W: K of K x N, C: M of M x N), or nullopt.
std::optional<driver::DotLayout> dot_layout_of(const FusionValue& fv, int64_t rows_dim, bool is_w,
                                               bool is_c, const hw::BoardConfig& b) {
    const Layout& l = fv.layout;
    if (fv.shape.rank() != 2 || l.minor_to_major.size() != 2) return std::nullopt;
    const bool rows_major = l.minor_to_major[1] == rows_dim;  // stored as (rows, cols)
    if (l.tile.empty()) {
        if (rows_major) return driver::DotLayout::RowMajor;
        if (!is_c) return driver::DotLayout::Transposed;
        return std::nullopt;
    }
    if (!rows_major) return std::nullopt;
    if (is_w && l.tile == std::vector<int64_t>{b.core.mxu_rows, b.core.mxu_cols})
        return driver::DotLayout::Tiles;
    if (l.tile == std::vector<int64_t>{8, 128}) return driver::DotLayout::VpuTiles;
    return std::nullopt;
}

const FusionValue* operand_of(const Fusion& f, ValueId v) {
    for (const FusionValue& fv : f.operands)
        if (fv.value == v) return &fv;
    return nullptr;
}

}  // namespace

DotFusion plan_dot_fusion(const Graph& g, const Fusion& f, const hw::BoardConfig& board) {
    DotFusion p;
    const Op& dot = g.op(f.hero);
    if (dot.kind != OpKind::Dot)
        not_generated(f, fmt::format("an output fusion of {}", op_name(dot.kind)));
    const DotDims& d = dot.attrs.dot;
    if (!d.lhs_batch.empty() || d.lhs_contracting.size() != 1 || d.rhs_contracting.size() != 1 ||
        g.shape(dot.operands[0]).rank() != 2 || g.shape(dot.operands[1]).rank() != 2)
        not_generated(f, "a dot with batch dims or operands of rank other than 2");
    if (f.dots.empty()) not_generated(f, "a dot without a plan");
    const driver::Precision prec =
        detail::mxu_precision(dot.attrs.precision, g.shape(dot.operands[0]).dtype);
    std::set<OpId> prologue;
    // Each operand back through conversions to the array the fusion reads.
    const auto source = [&](ValueId v) -> const FusionValue* {
        while (inside_fusion(f, g, v)) {
            const Op& op = g.producer(v);
            if (op.kind != OpKind::Convert)
                not_generated(f, fmt::format("{} before the dot", op_name(op.kind)));
            // The kernel rounds to bf16 itself in one pass; a rounding before more passes
            // would change the parts it splits.
            if (op.attrs.dtype == DType::BF16 && prec != driver::Precision::Bf16)
                not_generated(f, "an operand rounded to bf16 before a multi-pass dot");
            prologue.insert(g.value(v).producer);
            v = op.operands[0];
        }
        const FusionValue* fv = operand_of(f, v);
        if (!fv) not_generated(f, fmt::format("dot operand %{} not read from memory", v));
        if (fv->shape.dtype != DType::F32)
            not_generated(
                f, fmt::format("a {} dot operand (the kernel reads f32)", fv->shape.to_string()));
        return fv;
    };
    p.a = source(dot.operands[0]);
    p.w = source(dot.operands[1]);
    const int64_t lc = d.lhs_contracting[0], rc = d.rhs_contracting[0];
    const auto la = dot_layout_of(*p.a, 1 - lc, false, false, board);
    const auto lw = dot_layout_of(*p.w, rc, true, false, board);
    if (!la || !lw)
        not_generated(f, fmt::format("dot operands in layouts {} and {}", p.a->layout.to_string(),
                                     p.w->layout.to_string()));
    if (f.results.size() != 1)
        not_generated(f, fmt::format("an output fusion with {} results", f.results.size()));
    p.c = &f.results[0];
    if (p.c->shape.dtype != DType::F32)
        not_generated(f, fmt::format("a {} result (f32 only)", p.c->shape.to_string()));
    const auto lcv = dot_layout_of(*p.c, 0, false, true, board);
    if (!lcv) not_generated(f, fmt::format("a dot result in layout {}", p.c->layout.to_string()));
    const Shape& ls = g.shape(dot.operands[0]);
    const int64_t M = ls.dims[size_t(1 - lc)], K = ls.dims[size_t(lc)];
    const int64_t N = g.shape(dot.operands[1]).dims[size_t(1 - rc)];
    const std::vector<int64_t> mn{M, N};
    if (p.c->shape.dims != mn)
        not_generated(f, fmt::format("a result {} that is not the dot's [{}, {}]",
                                     p.c->shape.to_string(), M, N));
    if (M > UINT32_MAX || K > UINT32_MAX || N > UINT32_MAX)
        not_generated(f, "a dot beyond 32-bit dims");

    // The epilogue: every other op, placed against the result tile.
    std::map<ValueId, EpValue> val;
    val[dot.results[0]] = {EpKind::Full, -1};
    std::vector<const FusionValue*> columns, fulls;
    int results = 0;
    const auto full_operand = [&](ValueId v) -> EpValue {
        const FusionValue* fv = operand_of(f, v);
        if (fv->shape.dims != mn || !(fv->layout == p.c->layout) || fv->shape.dtype != DType::F32)
            not_generated(
                f, fmt::format("a side {} in layout {} (the result's is {})", fv->shape.to_string(),
                               fv->layout.to_string(), p.c->layout.to_string()));
        fulls.push_back(fv);
        return {EpKind::Full, -1 - int(fulls.size())};
    };
    for (OpId id : f.ops) {
        if (id == f.hero || prologue.count(id)) continue;
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        const auto in = [&](size_t i) -> EpValue {
            const ValueId v = op.operands[i];
            if (auto it = val.find(v); it != val.end()) return it->second;
            if (!inside_fusion(f, g, v)) return val[v] = full_operand(v);
            not_generated(f, fmt::format("%{} in the epilogue", v));
        };
        switch (op.kind) {
            case OpKind::Literal:
                val[res] = {EpKind::Scalar, 0, 0, float(op.attrs.scalar)};
                continue;
            case OpKind::Broadcast: {
                const ValueId x = op.operands[0];
                const Shape& xs = g.shape(x);
                if (g.shape(res).dims != mn)
                    not_generated(f, fmt::format("a broadcast to {}", g.shape(res).to_string()));
                if (xs.elements() == 1 && val.count(x) && val[x].kind == EpKind::Scalar) {
                    val[res] = val[x];
                } else if (xs.rank() == 1 && xs.dims[0] == N &&
                           op.attrs.dims == std::vector<int64_t>{1} && !inside_fusion(f, g, x) &&
                           xs.dtype == DType::F32) {
                    columns.push_back(operand_of(f, x));
                    val[res] = {EpKind::Column, 0, columns.size() - 1};
                } else {
                    not_generated(f, fmt::format("a broadcast {} -> {} in the epilogue",
                                                 xs.to_string(), g.shape(res).to_string()));
                }
                continue;
            }
            case OpKind::Reshape:
            case OpKind::Transpose:
                if (g.shape(res).dims != g.shape(op.operands[0]).dims)
                    not_generated(f, fmt::format("{} in the epilogue", op_name(op.kind)));
                val[res] = in(0);
                continue;
            case OpKind::Convert:
                if (op.attrs.dtype == g.shape(op.operands[0]).dtype) {
                    val[res] = in(0);
                    continue;
                }
                // f32 -> bf16 -> f32 rounds: the pair is one step, the second an alias.
                if (op.attrs.dtype == DType::F32 && val.count(op.operands[0])) {
                    val[res] = in(0);
                    continue;
                }
                if (op.attrs.dtype != DType::BF16)
                    not_generated(f, fmt::format("a convert to {}", dtype_name(op.attrs.dtype)));
                break;
            case OpKind::Div:
                break;
            case OpKind::Compare:
                if (op.attrs.comparison != Comparison::Gt && op.attrs.comparison != Comparison::Lt)
                    not_generated(f, "a comparison other than > and <");
                break;
            default:
                if (!has_vpu_lowering(op.kind))
                    not_generated(f, fmt::format("op {} in the epilogue", op_name(op.kind)));
        }
        EpStep step{op.kind, op.attrs.comparison, {}, {}};
        bool any_full = false;
        for (size_t i = 0; i < op.operands.size(); ++i) {
            step.in.push_back(in(i));
            any_full |= step.in.back().kind == EpKind::Full;
        }
        if (!any_full)
            not_generated(f,
                          fmt::format("{} of broadcast values in the epilogue", op_name(op.kind)));
        step.out = res == p.c->value ? EpValue{EpKind::Full, -1} : EpValue{EpKind::Full, results++};
        val[res] = step.out;
        p.steps.push_back(std::move(step));
    }
    if (!val.count(p.c->value) || val[p.c->value].kind != EpKind::Full ||
        val[p.c->value].area != -1)
        not_generated(f, "a result the epilogue does not leave in the result tile");
    // The result tile is written last: no later step may read the dot's own result from it.
    for (size_t i = 0; i + 1 < p.steps.size(); ++i)
        if (p.steps[i].out.area == -1)
            not_generated(f, "an epilogue that writes its result before its last op");
    for (const FusionValue* fv : columns) p.sides.push_back(fv);
    for (const FusionValue* fv : fulls) p.sides.push_back(fv);
    p.areas = p.steps.empty() ? 0 : results + kScratch;

    driver::DotKey shape;
    shape.M = uint32_t(M);
    shape.K = uint32_t(K);
    shape.N = uint32_t(N);
    shape.precision = prec;
    shape.a = *la;
    shape.w = *lw;
    shape.c = *lcv;
    shape.stationary = f.dots[0].stationary;
    shape.column_sides = uint32_t(columns.size());
    shape.full_sides = uint32_t(fulls.size());
    driver::DotKey probe = shape;
    probe.R = board.core.mxu_rows;
    probe.C = board.core.mxu_cols;
    probe.mxus = std::min<uint32_t>(board.core.mxus, 2);
    probe.block_rows = 8;
    if (const std::string why = driver::dot_unsupported(probe); !why.empty())
        not_generated(f, "the dot kernel: " + why);
    // The kernel's tiling in what the epilogue's areas leave of VMEM.
    uint64_t budget = board.core.vmem_bytes;
    for (int tries = 0; tries < 32; ++tries) {
        const auto k = driver::plan_dot(board, shape, budget);
        if (!k) break;
        const uint64_t need =
            driver::dot_vmem_bytes(*k) + uint64_t(p.areas) * epilogue_area_bytes(*k) + 4096;
        if (need <= board.core.vmem_bytes) {
            p.key = *k;
            return p;
        }
        const uint64_t over = need - board.core.vmem_bytes;
        if (driver::dot_vmem_bytes(*k) <= over) break;
        budget = driver::dot_vmem_bytes(*k) - over;
    }
    not_generated(f, "a dot whose epilogue does not fit in VMEM beside it");
}

void emit_dot_fusion(isa::Builder& b, const DotFusion& p,
                     const std::function<void(const isa::Reg&, const BufferRef&)>& load) {
    // Each address in a register of its own, straight from the argument table (the kernel
    // needs most registers for itself).
    const auto addr = [&](const FusionValue& fv, const std::string& name) {
        isa::Reg r = b.reg(name);
        load(r, fv.buffer);
        return r;
    };
    const isa::Reg ra = addr(*p.a, "dot.a"), rw = addr(*p.w, "dot.w"), rc = addr(*p.c, "dot.c");
    std::vector<isa::Reg> side_regs;
    driver::Epilogue ep;
    for (size_t i = 0; i < p.sides.size(); ++i) {
        side_regs.push_back(addr(*p.sides[i], fmt::format("side{}", i)));
        ep.sides.push_back({i < p.key.column_sides ? driver::EpilogueSide::Kind::Column
                                                   : driver::EpilogueSide::Kind::Full,
                            st::Operand::hbm(side_regs.back())});
    }
    std::vector<isa::Vmem> areas;
    for (int i = 0; i < p.areas; ++i)
        areas.push_back(b.vmem(fmt::format("epilogue{}", i), epilogue_area_bytes(p.key), 512));
    const int scratch = p.areas - kScratch;
    if (!p.steps.empty())
        ep.body = [&](driver::EpilogueTile& t) {
            isa::Builder& bb = t.builder();
            const isa::Reg n = bb.reg("epilogue.values");
            bb.emit(Opcode::Mul, {n, t.rows(), imm(t.cols())});
            const isa::Arg cols = imm(t.cols());
            const auto area = [&](int i) { return areas[size_t(i)].at(0); };
            const auto at = [&](const EpValue& v) -> isa::Arg {
                if (v.area == -1) return t.out();
                if (v.area <= -2) return t.side(p.key.column_sides + size_t(-2 - v.area));
                return area(v.area);
            };
            // A broadcast into scratch area `s`: -0.0 everywhere, plus the value (x + -0.0 is x
            // for every x, signed zeros included).
            const auto tile_of = [&](const EpValue& v, int s) -> isa::Arg {
                if (v.kind == EpKind::Full) return at(v);
                const isa::Arg dst = area(scratch + s);
                t.vpu(Opcode::VCmpGt, {dst, t.out(), t.out(), n});
                t.vpu(Opcode::VMulS, {dst, dst, fimm(-1.0f), n});
                if (v.kind == EpKind::Scalar)
                    t.vpu(Opcode::VAddS, {dst, dst, fimm(v.scalar), n});
                else
                    t.vpu(Opcode::VAddRow, {dst, dst, t.side(v.side), t.rows(), cols});
                return dst;
            };
            for (const EpStep& s : p.steps) {
                const std::vector<EpValue>& x = s.in;
                const isa::Arg out = at(s.out);
                const auto F = [&](size_t i) { return tile_of(x[i], int(i)); };
                // A binary op with one Full operand and a scalar or column: the VPU's
                // scalar and row forms (commutative ops only, so the bits are the same).
                const bool bin = x.size() == 2;
                const size_t fi = bin && x[0].kind != EpKind::Full ? 1 : 0;
                const EpValue& o = bin ? x[1 - fi] : x[0];
                // The scalar and row forms first (x - c is x + (-c) in IEEE arithmetic).
                const bool scalar = o.kind == EpKind::Scalar, column = o.kind == EpKind::Column;
                if (bin && s.kind == OpKind::Add && scalar) {
                    t.vpu(Opcode::VAddS, {out, at(x[fi]), fimm(o.scalar), n});
                    continue;
                }
                if (bin && s.kind == OpKind::Add && column) {
                    t.vpu(Opcode::VAddRow, {out, at(x[fi]), t.side(o.side), t.rows(), cols});
                    continue;
                }
                if (bin && s.kind == OpKind::Sub && scalar && fi == 0) {
                    t.vpu(Opcode::VAddS, {out, at(x[0]), fimm(-o.scalar), n});
                    continue;
                }
                if (bin && (s.kind == OpKind::Mul || s.kind == OpKind::Max) && scalar) {
                    t.vpu(s.kind == OpKind::Mul ? Opcode::VMulS : Opcode::VMaxS,
                          {out, at(x[fi]), fimm(o.scalar), n});
                    continue;
                }
                switch (s.kind) {
                    case OpKind::Convert: {  // f32 -> bf16 -> f32: round, keep as f32
                        const isa::Arg h = area(scratch + 3);
                        t.vpu(Opcode::VF2Bf, {h, F(0), n});
                        t.vpu(Opcode::VBf2F, {out, h, n});
                        break;
                    }
                    case OpKind::Div: {
                        // vpu_divide (evaluator.h), as the loop emitter: q = x rsqrt(|y|)^2,
                        // negated where 0 > y.
                        const isa::Arg xa = F(0), ya = F(1);
                        const isa::Arg r = area(scratch + 2), m = area(scratch + 3),
                                       zero = area(scratch + 4);
                        t.vpu(Opcode::VCmpGt, {zero, t.out(), t.out(), n});
                        t.vpu(Opcode::VMulS, {r, ya, fimm(-1.0f), n});
                        t.vpu(Opcode::VMax, {r, ya, r, n});
                        t.vpu(Opcode::VRsqrt, {r, r, n});
                        t.vpu(Opcode::VMul, {r, r, r, n});
                        t.vpu(Opcode::VCmpGt, {m, zero, ya, n});
                        t.vpu(Opcode::VMul, {r, xa, r, n});
                        t.vpu(Opcode::VMulS, {zero, r, fimm(-1.0f), n});
                        t.vpu(Opcode::VSel, {out, m, zero, r, n});
                        break;
                    }
                    default: {
                        const auto vpu = [&](Opcode o, std::initializer_list<isa::Arg> args) {
                            t.vpu(o, args);
                        };
                        if (!emit_elementwise(vpu, s.kind, s.comparison, out, F, n))
                            throw CompileError(
                                fmt::format("epilogue op {} not generated", op_name(s.kind)));
                    }
                }
            }
        };
    driver::emit_dot(b, p.key, {st::Operand::hbm(ra), st::Operand::hbm(rw), st::Operand::hbm(rc)},
                     ep);
}

}  // namespace tpu::compiler::gen
