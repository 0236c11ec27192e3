// SPDX-License-Identifier: Apache-2.0
// Convolution and pooling fusions (compiler/README.md, "Convolution and pooling fusions"):
// output fusions rooted at a convolution run driver::emit_conv2d with the fusion's epilogue,
// reduce-window fusions the pooling kernel, and the global average pool's reduction over H and W
// a column-sum kernel, each emitted into the step's one program.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"
#include "compiler/stages.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/epilogue.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler {
namespace gen {
namespace {

namespace st = driver::streaming;

uint64_t align512(uint64_t x) {
    return (x + 511) / 512 * 512;
}

const FusionValue* operand_of(const Fusion& f, ValueId v) {
    for (const FusionValue& fv : f.operands)
        if (fv.value == v) return &fv;
    return nullptr;
}

bool untiled_row_major(const FusionValue& fv) {
    return fv.layout.tile.empty() && fv.layout == row_major(fv.shape.rank());
}

/// The driver's shape of convolution `op` (NHWC x HWIO, one core's images).
driver::Conv2dShape conv_shape_of(const Graph& g, const Op& op) {
    const Shape& xs = g.shape(op.operands[0]);
    const Shape& ws = g.shape(op.operands[1]);
    driver::Conv2dShape s;
    s.batch = uint32_t(xs.dims[0]);
    s.height = uint32_t(xs.dims[1]);
    s.width = uint32_t(xs.dims[2]);
    s.cin = uint32_t(xs.dims[3]);
    s.cout = uint32_t(ws.dims[3]);
    s.kernel = uint32_t(op.attrs.window.kernel);
    s.stride = uint32_t(op.attrs.window.stride);
    s.pad = uint32_t(op.attrs.window.pad);
    return s;
}

/// Bytes of the kernel's packed operands in HBM (conv2d.h, Conv2dKey): phase planes, weight
/// tiles and a zero bias of NT C values.
struct ConvScratch {
    uint64_t x = 0, w = 0, bias = 0;
    uint64_t total() const { return x + w + bias; }
};
ConvScratch conv_scratch(const driver::Conv2dShape& s, const driver::Conv2dTiling& t) {
    ConvScratch c;
    c.x = align512(uint64_t(s.batch) * t.phases * t.phases * t.CT * t.Hq * t.Wq * t.R * 2);
    c.w = align512(uint64_t(t.NT) * s.kernel * s.kernel * t.CT * t.R * t.C * 2);
    c.bias = align512(uint64_t(t.NT) * t.C * 4);
    return c;
}

/// Why convolution `op` of fusion `f` is not generated, or empty.
std::string conv_unsupported(const Graph& g, const Op& op, const hw::BoardConfig& board) {
    const Shape& xs = g.shape(op.operands[0]);
    if (xs.dtype != DType::F32 || g.shape(op.operands[1]).dtype != DType::F32)
        return "a convolution of non-f32 operands";
    if (detail::mxu_precision(op.attrs.precision, xs.dtype) != driver::Precision::Bf16)
        return "a convolution above default precision";
    const driver::Conv2dShape s = conv_shape_of(g, op);
    try {
        s.validate();
    } catch (const driver::DeviceError& e) {
        return fmt::format("a convolution the kernel refuses ({})", e.what());
    }
    // The folded lowering (im2col and one GEMM, conv2d_folds_taps) is what the evaluator's
    // reference computes for small Cin; its im2col into the dot kernel is not wired yet.
    if (driver::conv2d_folds_taps(s, board.core.mxu_rows))
        return "a convolution whose taps fold into K (small Cin: im2col and a dot)";
    return {};
}

/// How an epilogue value lies against the convolution's NHWC result tile.
struct Placed {
    std::map<ValueId, EpValue> val;
    std::vector<const FusionValue*> columns, fulls;
    std::vector<EpStep> steps;
    int results = 0;
    bool needs_scratch = false;
};

}  // namespace

/// A planned convolution or pooling fusion.
struct ConvPoolFusion {
    enum class Kind : uint8_t { Conv, Pool, GlobalSum } kind = Kind::Conv;
    // Conv
    driver::Conv2dKey key;
    driver::Conv2dAuxKey pack_x, pack_w, zero;
    ConvScratch scratch;
    const FusionValue* x = nullptr;
    const FusionValue* w = nullptr;
    const FusionValue* y = nullptr;
    std::vector<const FusionValue*> sides;  ///< Column sides first
    std::vector<EpStep> steps;
    int areas = 0, scratch_areas = 0;
    uint64_t area_bytes = 0;
    BufferRef scratch_buf;
    // Pool
    driver::PoolKey pool;
    // GlobalSum: images, H W, C, rows per chunk (vpu_lanes)
    uint32_t images = 0, hw = 0, channels = 0, lanes = 128, out_tile_rows = 0;
    uint32_t tile = 0;
};

namespace {

/// The epilogue of conv fusion `f`: every op but the convolution, placed against the result
/// tile as the dot's epilogue places them (codegen_dot.cpp): a broadcast of a [Cout] array is
/// a Column side, an array of the result's dims and layout a Full side, a broadcast literal a
/// scalar.
Placed place_epilogue(const Graph& g, const Fusion& f, const Op& conv, const FusionValue& y) {
    Placed p;
    const std::vector<int64_t>& D = y.shape.dims;
    const int64_t cout = D.back();
    p.val[conv.results[0]] = {EpKind::Full, -1};
    for (OpId id : f.ops) {
        if (id == f.hero) continue;
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        const auto in = [&](size_t i) -> EpValue {
            const ValueId v = op.operands[i];
            if (auto it = p.val.find(v); it != p.val.end()) return it->second;
            if (inside_fusion(f, g, v)) not_generated(f, fmt::format("%{} in the epilogue", v));
            const FusionValue* fv = operand_of(f, v);
            if (!fv || fv->shape.dims != D || !(fv->layout == y.layout) ||
                fv->shape.dtype != DType::F32)
                not_generated(f, fmt::format("a side {} in layout {} (the result's is {})",
                                             g.shape(v).to_string(),
                                             fv ? fv->layout.to_string() : "?",
                                             y.layout.to_string()));
            p.fulls.push_back(fv);
            return p.val[v] = {EpKind::Full, -1 - int(p.fulls.size())};
        };
        switch (op.kind) {
            case OpKind::Literal:
                p.val[res] = {EpKind::Scalar, 0, 0, float(op.attrs.scalar)};
                continue;
            case OpKind::Broadcast: {
                const ValueId x = op.operands[0];
                const Shape& xs = g.shape(x);
                if (g.shape(res).dims != D)
                    not_generated(f, fmt::format("a broadcast to {}", g.shape(res).to_string()));
                if (xs.elements() == 1 && p.val.count(x) && p.val[x].kind == EpKind::Scalar) {
                    p.val[res] = p.val[x];
                } else if (xs.rank() == 1 && xs.dims[0] == cout &&
                           op.attrs.dims == std::vector<int64_t>{int64_t(D.size()) - 1} &&
                           !inside_fusion(f, g, x) && xs.dtype == DType::F32) {
                    p.columns.push_back(operand_of(f, x));
                    p.val[res] = {EpKind::Column, 0, p.columns.size() - 1};
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
                p.val[res] = in(0);
                continue;
            case OpKind::Convert:
                if (op.attrs.dtype == g.shape(op.operands[0]).dtype) {
                    p.val[res] = in(0);
                    continue;
                }
                not_generated(f, fmt::format("a convert to {} in the epilogue",
                                             dtype_name(op.attrs.dtype)));
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
        // The scalar and row forms need no scratch tile (emit_epilogue_step).
        const bool bin = step.in.size() == 2;
        const size_t fi = bin && step.in[0].kind != EpKind::Full ? 1 : 0;
        const EpValue& o = bin ? step.in[1 - fi] : step.in[0];
        const bool direct =
            bin && ((o.kind == EpKind::Scalar &&
                     (op.kind == OpKind::Add || op.kind == OpKind::Mul || op.kind == OpKind::Max ||
                      (op.kind == OpKind::Sub && fi == 0))) ||
                    (o.kind == EpKind::Column && op.kind == OpKind::Add));
        for (const EpValue& v : step.in) p.needs_scratch |= v.kind != EpKind::Full && !direct;
        step.out = res == y.value ? EpValue{EpKind::Full, -1} : EpValue{EpKind::Full, p.results++};
        p.val[res] = step.out;
        p.steps.push_back(std::move(step));
    }
    if (!p.val.count(y.value) || p.val[y.value].kind != EpKind::Full || p.val[y.value].area != -1)
        not_generated(f, "a result the epilogue does not leave in the result tile");
    for (size_t i = 0; i + 1 < p.steps.size(); ++i)
        if (p.steps[i].out.area == -1)
            not_generated(f, "an epilogue that writes its result before its last op");
    return p;
}

std::unique_ptr<ConvPoolFusion> plan_conv(const Graph& g, const Fusion& f,
                                          const hw::BoardConfig& board) {
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::Conv;
    const Op& conv = g.op(f.hero);
    if (const std::string why = conv_unsupported(g, conv, board); !why.empty())
        not_generated(f, why);
    p->x = operand_of(f, conv.operands[0]);
    p->w = operand_of(f, conv.operands[1]);
    if (!p->x || !p->w) not_generated(f, "a convolution of operands computed in its fusion");
    if (!untiled_row_major(*p->x) || !untiled_row_major(*p->w))
        not_generated(f, fmt::format("convolution operands in layouts {} and {} (the packing "
                                     "kernels read row-major NHWC and HWIO)",
                                     p->x->layout.to_string(), p->w->layout.to_string()));
    if (f.results.size() != 1)
        not_generated(f, fmt::format("an output fusion with {} results", f.results.size()));
    p->y = &f.results[0];
    if (p->y->shape.dtype != DType::F32 || !untiled_row_major(*p->y) ||
        p->y->shape.dims != g.shape(conv.results[0]).dims)
        not_generated(f, fmt::format("a convolution result {} in layout {} (the kernel writes "
                                     "row-major NHWC f32)",
                                     p->y->shape.to_string(), p->y->layout.to_string()));
    const Placed ep = place_epilogue(g, f, conv, *p->y);
    for (const FusionValue* fv : ep.columns) p->sides.push_back(fv);
    for (const FusionValue* fv : ep.fulls) p->sides.push_back(fv);
    p->steps = ep.steps;
    p->scratch_areas = ep.needs_scratch ? kScratch : 0;
    p->areas = p->steps.empty() ? 0 : ep.results + p->scratch_areas;

    const driver::Conv2dShape s = conv_shape_of(g, conv);
    const auto cols = uint32_t(ep.columns.size()), fulls = uint32_t(ep.fulls.size());
    // The kernel's tiling in what the epilogue's areas (one image tile each) leave of VMEM.
    hw::BoardConfig cfg = board;
    const uint64_t margin = 64 * 1024;
    std::optional<driver::Conv2dTiling> t;
    for (int tries = 0; tries < 16; ++tries) {
        driver::Conv2dTiling cand;
        try {
            cand = driver::plan_conv2d(cfg, s, s.batch, cols, fulls);
        } catch (const driver::DeviceError& e) {
            break;
        }
        const uint64_t area = align512(uint64_t(cand.band_rows) * s.out_width() * cand.C * 4);
        const uint64_t need = uint64_t(p->areas) * area + margin;
        if (cfg.core.vmem_bytes + need <= board.core.vmem_bytes + margin * 0 + need &&
            cfg.core.vmem_bytes <= board.core.vmem_bytes - std::min(need, board.core.vmem_bytes)) {
            t = cand;
            p->area_bytes = area;
            break;
        }
        if (need >= board.core.vmem_bytes) break;
        cfg.core.vmem_bytes = board.core.vmem_bytes - need;
    }
    if (!t) not_generated(f, "a convolution whose epilogue does not fit in VMEM beside it");
    p->key.shape = s;
    p->key.tiling = *t;
    p->scratch = conv_scratch(s, *t);
    const uint64_t aux_vmem = board.core.vmem_bytes - margin;
    const uint32_t R = board.core.mxu_rows, C = board.core.mxu_cols;
    try {
        p->pack_x = driver::plan_conv2d_aux(driver::Conv2dAux::PackInput, s, R, C, 0, 0, 0,
                                            aux_vmem);
        p->pack_w = driver::plan_conv2d_aux(driver::Conv2dAux::PackWeight, s, R, C, 0, 0, 0,
                                            aux_vmem);
        p->zero = driver::plan_conv2d_aux(driver::Conv2dAux::Zero, s, R, C, 0, 0,
                                          uint64_t(t->NT) * t->C, aux_vmem);
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("a convolution whose packing does not fit ({})", e.what()));
    }
    if (f.scratch.bytes < p->scratch.total())
        not_generated(f, fmt::format("a convolution without its {} bytes of scratch",
                                     p->scratch.total()));
    p->scratch_buf = f.scratch;
    return p;
}

std::unique_ptr<ConvPoolFusion> plan_pool(const Graph& g, const Fusion& f,
                                          const hw::BoardConfig& board) {
    const Op& op = g.op(f.hero);
    if (f.ops.size() != 1 || f.operands.size() != 1 || f.results.size() != 1)
        not_generated(f, "a pooling fusion with other ops");
    const FusionValue& x = f.operands[0];
    const FusionValue& y = f.results[0];
    if (x.shape.dtype != DType::F32 || x.shape.rank() != 4 || !untiled_row_major(x) ||
        !untiled_row_major(y))
        not_generated(f, fmt::format("pooling of {} in {} into {} (the kernel reads and writes "
                                     "row-major NHWC f32)",
                                     x.shape.to_string(), x.layout.to_string(),
                                     y.layout.to_string()));
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::Pool;
    p->x = &x;
    p->y = &y;
    driver::PoolShape s;
    s.batch = uint32_t(x.shape.dims[0]);
    s.height = uint32_t(x.shape.dims[1]);
    s.width = uint32_t(x.shape.dims[2]);
    s.channels = uint32_t(x.shape.dims[3]);
    s.kernel = uint32_t(op.attrs.window.kernel);
    s.stride = uint32_t(op.attrs.window.stride);
    s.pad = uint32_t(op.attrs.window.pad);
    try {
        p->pool = driver::plan_pool(op.attrs.pool == PoolKind::Max ? driver::PoolOp::Max
                                                                   : driver::PoolOp::Avg,
                                    s, board.core.vmem_bytes - 64 * 1024);
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("pooling the kernel refuses ({})", e.what()));
    }
    return p;
}

/// A sum over H and W of an NHWC array (the global average pool's reduction): `v.csum` over
/// each chunk of vpu_lanes pixels, then over the chunk sums, the evaluator's order.
std::unique_ptr<ConvPoolFusion> plan_global_sum(const Graph& g, const Fusion& f,
                                                const hw::BoardConfig& board) {
    if (f.ops.size() != 1 || f.operands.size() != 1 || f.results.size() != 1)
        not_generated(f, "a reduction over H and W with other ops in its fusion");
    const FusionValue& x = f.operands[0];
    const FusionValue& y = f.results[0];
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::GlobalSum;
    p->x = &x;
    p->y = &y;
    p->images = uint32_t(x.shape.dims[0]);
    p->hw = uint32_t(x.shape.dims[1] * x.shape.dims[2]);
    p->channels = uint32_t(x.shape.dims[3]);
    p->lanes = board.core.vpu_lanes;
    if (x.shape.dtype != DType::F32 || !untiled_row_major(x))
        not_generated(f, fmt::format("a reduction over H and W of {} in layout {}",
                                     x.shape.to_string(), x.layout.to_string()));
    // The result [N, C]: row-major, or T(8, 128) tiles of whole bands and lane chunks.
    const int64_t lanes = board.core.vpu_lanes, sub = board.core.vpu_sublanes;
    if (untiled_row_major(y)) {
        p->out_tile_rows = 1;
    } else if (y.layout == Layout{{1, 0}, {sub, lanes}} && p->images % sub == 0 &&
               p->channels % lanes == 0) {
        p->out_tile_rows = uint32_t(sub);
    } else {
        not_generated(f, fmt::format("a reduction result {} in layout {} (padded tiles)",
                                     y.shape.to_string(), y.layout.to_string()));
    }
    const uint32_t chunks = (p->hw + p->lanes - 1) / p->lanes;
    st::Footprint fp;
    fp.name = f.name;
    fp.units = p->images;
    fp.areas = {p->hw * p->channels, chunks * p->channels, p->channels};
    fp.max_tile_units = 1;
    try {
        p->tile = st::plan(fp, board.core.vmem_bytes - 64 * 1024);
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("a reduction over H and W whose image does not fit ({})",
                                     e.what()));
    }
    return p;
}

/// The epilogue body on one result tile (the dot's, codegen_dot.cpp, on the conv's tile).
void emit_epilogue(driver::EpilogueTile& t, const ConvPoolFusion& p,
                   const std::vector<isa::Vmem>& areas) {
    isa::Builder& bb = t.builder();
    const isa::Reg n = bb.reg("epilogue.values");
    bb.emit(Opcode::Mul, {n, t.rows(), imm(t.cols())});
    const isa::Arg cols = imm(t.cols());
    const int scratch = p.areas - p.scratch_areas;
    const size_t column_sides = p.key.tiling.column_sides;
    const auto area = [&](int i) { return areas[size_t(i)].at(0); };
    const auto at = [&](const EpValue& v) -> isa::Arg {
        if (v.area == -1) return t.out();
        if (v.area <= -2) return t.side(column_sides + size_t(-2 - v.area));
        return area(v.area);
    };
    // A broadcast into scratch area `s`: -0.0 everywhere, plus the value (exact for every value).
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
        const bool bin = x.size() == 2;
        const size_t fi = bin && x[0].kind != EpKind::Full ? 1 : 0;
        const EpValue& o = bin ? x[1 - fi] : x[0];
        const bool scalar = o.kind == EpKind::Scalar, column = o.kind == EpKind::Column;
        // The scalar and row forms (commutative ops only; x - c is x + (-c) in IEEE).
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
        const auto vpu = [&](Opcode op, std::initializer_list<isa::Arg> args) { t.vpu(op, args); };
        if (!emit_elementwise(vpu, s.kind, s.comparison, out, F, n))
            throw CompileError(fmt::format("epilogue op {} not generated", op_name(s.kind)));
    }
}

void emit_conv(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load) {
    // The scratch (and every temp) shares the arena's register.
    const isa::Reg arena = b.reg("conv.arena");
    BufferRef arena_ref = p.scratch_buf;
    arena_ref.offset = 0;
    load(arena, arena_ref);
    const int64_t so = int64_t(p.scratch_buf.offset);
    const isa::Arg xs = arena + so, ws = arena + (so + int64_t(p.scratch.x)),
                   bs = arena + (so + int64_t(p.scratch.x + p.scratch.w));
    {
        // The packing kernels read the fusion's operands in their row-major layouts.
        const auto scope = b.scope("pack");
        const isa::Reg x = b.reg("conv.x");
        load(x, p.x->buffer);
        driver::emit(b, p.pack_x, std::vector<st::Operand>{st::Operand::hbm(x), st::Operand::hbm(xs)});
        const isa::Reg w = b.reg("conv.w");
        load(w, p.w->buffer);
        driver::emit(b, p.pack_w, std::vector<st::Operand>{st::Operand::hbm(w), st::Operand::hbm(ws)});
        driver::emit(b, p.zero, std::vector<st::Operand>{st::Operand::hbm(bs)});
    }
    // One register per allocation the kernel reads besides the arena (it keeps 26 for itself).
    std::map<std::pair<uint8_t, uint32_t>, isa::Reg> regs;
    const auto where = [&](const BufferRef& r) -> isa::Arg {
        if (r.space == BufferRef::Space::Temp) return arena + int64_t(r.offset);
        const auto key = alloc_key(r);
        auto it = regs.find(key);
        if (it == regs.end()) {
            isa::Reg reg = b.reg(fmt::format("conv.buf{}", regs.size()));
            load(reg, BufferRef{r.space, r.index, 0, r.bytes});
            it = regs.emplace(key, std::move(reg)).first;
        }
        return it->second;
    };
    const isa::Arg y = where(p.y->buffer);
    driver::Epilogue ep;
    for (size_t i = 0; i < p.sides.size(); ++i)
        ep.sides.push_back({i < p.key.tiling.column_sides ? driver::EpilogueSide::Kind::Column
                                                          : driver::EpilogueSide::Kind::Full,
                            st::Operand::hbm(where(p.sides[i]->buffer))});
    std::vector<isa::Vmem> areas;
    for (int i = 0; i < p.areas; ++i)
        areas.push_back(b.vmem(fmt::format("epilogue{}", i), p.area_bytes, 512));
    if (!p.steps.empty()) ep.body = [&](driver::EpilogueTile& t) { emit_epilogue(t, p, areas); };
    driver::Conv2dOperands ops{
        st::Operand::hbm(xs), st::Operand::hbm(ws), st::Operand::hbm(bs), st::Operand::hbm(y),
        st::Operand::scalar(imm(driver::conv2d_blocks(p.key.shape, p.key.tiling)))};
    driver::emit_conv2d(b, p.key, ops, ep);
}

void emit_global_sum(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load) {
    const isa::Reg x = b.reg("gsum.x"), y = b.reg("gsum.y");
    load(x, p.x->buffer);
    load(y, p.y->buffer);
    enum { X, Part, Y };
    const uint32_t C = p.channels, hw = p.hw, L = p.lanes;
    const uint32_t chunks = (hw + L - 1) / L;
    st::Spec sp;
    sp.fp.name = "global_sum";
    sp.fp.units = p.images;
    sp.fp.areas = {hw * C, chunks * C, C};
    sp.fp.max_tile_units = 1;
    sp.ins.emplace_back(st::Operand::hbm(x), X);
    if (p.out_tile_rows == 1) {
        sp.outs.emplace_back(st::Operand::hbm(y), Y);
    } else {
        // Image n's C values go to row n % 8 of its band's T(8,128) tiles: one strided DMA.
        const uint32_t rows = p.out_tile_rows, CT = C / L;
        const isa::Reg& yr = y;
        sp.outs.emplace_back(
            st::Operand::hbm(y), Y,
            [=, &yr](st::Body& bd, const isa::Reg& first, const isa::Reg& units,
                     const isa::Reg& slot, const isa::Flag& flag) {
                const isa::Reg& a = bd.tmp(0);
                const isa::Reg& r = bd.tmp(1);
                // (first / 8) * CT * 8 * L * 4 + (first % 8) * L * 4
                bd.emit(Opcode::Remu, {r, first, imm(rows)});
                bd.emit(Opcode::Mul, {r, r, imm(int64_t(L) * 4)});
                bd.emit(Opcode::Divu, {a, first, imm(rows)});
                bd.emit(Opcode::Mul, {a, a, imm(int64_t(CT) * rows * L * 4)});
                bd.emit(Opcode::Add, {a, a, r});
                bd.emit(Opcode::Add, {a, a, yr});
                bd.emit(Opcode::DmaVh, {a, bd.at(slot, Y), imm(CT), imm(int64_t(L) * 4),
                                        imm(int64_t(rows) * L * 4), imm(int64_t(L) * 4), flag});
            });
    }
    sp.body = [=](st::Body& bd) {
        if (chunks == 1) {
            bd.vpu(Opcode::VCSum, {bd.a(Y), bd.a(X), imm(hw), imm(C)});
            return;
        }
        for (uint32_t c = 0; c < chunks; ++c)
            bd.vpu(Opcode::VCSum, {bd.a(Part) + int64_t(c) * C * 4,
                                   bd.a(X) + int64_t(c) * L * C * 4,
                                   imm(std::min(L, hw - c * L)), imm(C)});
        bd.vpu(Opcode::VCSum, {bd.a(Y), bd.a(Part), imm(chunks), imm(C)});
    };
    st::emit(b, sp, p.tile);
}

void emit_pool(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load) {
    const isa::Reg x = b.reg("pool.x"), y = b.reg("pool.y");
    load(x, p.x->buffer);
    load(y, p.y->buffer);
    driver::emit(b, p.pool, std::vector<st::Operand>{st::Operand::hbm(x), st::Operand::hbm(y)});
}

}  // namespace

std::shared_ptr<const ConvPoolFusion> plan_conv_pool_fusion(const Graph& g, const Fusion& f,
                                                            const hw::BoardConfig& board) {
    if (f.hero == kNoOp) return nullptr;
    const Op& hero = g.op(f.hero);
    if (f.kind == FusionKind::Output && hero.kind == OpKind::Conv2d)
        return plan_conv(g, f, board);
    if (hero.kind == OpKind::Pool) return plan_pool(g, f, board);
    if (f.kind == FusionKind::Input && hero.kind == OpKind::Reduce &&
        hero.attrs.reducer == Reducer::Sum && g.shape(hero.operands[0]).rank() == 4 &&
        hero.attrs.dims == std::vector<int64_t>{1, 2})
        return plan_global_sum(g, f, board);
    return nullptr;
}

void emit_conv_pool_fusion(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load) {
    switch (p.kind) {
        case ConvPoolFusion::Kind::Conv:
            return emit_conv(b, p, load);
        case ConvPoolFusion::Kind::Pool:
            return emit_pool(b, p, load);
        case ConvPoolFusion::Kind::GlobalSum:
            return emit_global_sum(b, p, load);
    }
}

}  // namespace gen

namespace detail {

void plan_convolution_scratch(CompiledStep& step, const CompileOptions& options) {
    const Graph& g = step.graph;
    for (Fusion& f : step.fusions) {
        f.scratch = {};
        if (f.kind != FusionKind::Output || f.hero == kNoOp) continue;
        const Op& op = g.op(f.hero);
        if (op.kind != OpKind::Conv2d || !gen::conv_unsupported(g, op, options.board).empty())
            continue;
        const driver::Conv2dShape s = gen::conv_shape_of(g, op);
        // Sides do not change the packed layouts (only the blocking), so none are counted here.
        driver::Conv2dTiling t;
        try {
            t = driver::plan_conv2d(options.board, s, s.batch);
        } catch (const driver::DeviceError&) {
            continue;
        }
        f.scratch.bytes = gen::conv_scratch(s, t).total();
    }
}

}  // namespace detail
}  // namespace tpu::compiler
