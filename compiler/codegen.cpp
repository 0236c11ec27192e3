// SPDX-License-Identifier: Apache-2.0
// Code generation (compiler/README.md, "Code generation"): each device fusion of a compiled step
// is emitted with the program builder into one program, in execution order; loop and input
// fusions run on the streaming engine (driver/kernels/stream_kernel.h).
#include "compiler/codegen.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>

#include <fmt/format.h>

#include "compiler/stages.h"
#include "driver/kernels/allreduce.h"
#include "driver/kernels/epilogue.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler {
namespace {

using isa::fimm;
using isa::imm;
using isa::Opcode;
namespace st = driver::streaming;

[[noreturn]] void not_generated(const Fusion& f, const std::string& what) {
    throw NotYetGenerated(fmt::format("{}: {} not yet generated", f.name, what));
}

/// How a value of a loop or input fusion lies against the fusion's [R, C] iteration space.
enum class View : uint8_t {
    Unknown,
    Literal,  ///< a literal scalar (a constant area, filled once per slot)
    Scalar,   ///< one value broadcast everywhere
    Col,      ///< one value per row: [R]
    Row,      ///< one value per column: [C]
    Full,     ///< [R, C]
};

std::vector<int64_t> nonunit(const std::vector<int64_t>& dims) {
    std::vector<int64_t> r;
    for (int64_t d : dims)
        if (d != 1) r.push_back(d);
    return r;
}

int64_t product(const std::vector<int64_t>& v, size_t from = 0, size_t to = ~size_t(0)) {
    int64_t p = 1;
    for (size_t i = from; i < std::min(to, v.size()); ++i) p *= v[i];
    return p;
}

/// The plan of one loop or input fusion on the streaming engine.
struct Plan {
    bool rows = false;  ///< a 2-D iteration space (broadcasts, reductions); else flat elementwise
    int64_t R = 1, C = 1;
    uint32_t h = 1;      ///< rows per streamed unit: 8 (a band of T(8,128) tiles) or 1
    int64_t lanes = 1;   ///< elements per reduction chunk: min(C, vpu_lanes)
    int64_t chunks = 1;  ///< chunks per row: C / lanes
    uint64_t units = 0;  ///< units streamed
    uint32_t full = 1;   ///< values per unit of a Full array
    std::map<ValueId, View> view;
};

bool inside_fusion(const Fusion& f, const Graph& g, ValueId v) {
    const OpId p = g.value(v).producer;
    return std::find(f.ops.begin(), f.ops.end(), p) != f.ops.end();
}

/// Rows per unit of a Full array in `l`: 1 untiled, the tile's rows for T(h, lanes).
uint32_t band_of(const Fusion& f, const Shape& s, const Layout& l, const Plan& p, int64_t lanes) {
    const int64_t rank = s.rank();
    if (!l.assigned()) return 1;
    for (int64_t i = 0; i + 1 < int64_t(l.minor_to_major.size()); ++i)
        if (l.minor_to_major[size_t(i)] < l.minor_to_major[size_t(i + 1)] &&
            s.dims[size_t(l.minor_to_major[size_t(i)])] != 1 &&
            s.dims[size_t(l.minor_to_major[size_t(i + 1)])] != 1)
            not_generated(f, fmt::format("a {} array in layout {} (not row-major)", s.to_string(),
                                         l.to_string()));
    if (l.tile.empty()) return 1;
    if (!p.rows) return 1;
    if (l.tile.size() == 2 && rank >= 2 && l.tile[1] == lanes && s.dims[size_t(rank - 1)] == p.C &&
        p.C % lanes == 0 && s.dims[size_t(rank - 2)] % l.tile[0] == 0)
        return uint32_t(l.tile[0]);
    not_generated(
        f, fmt::format("a {} array in layout {} (padded tiles)", s.to_string(), l.to_string()));
}

/// Classifies every value of `f` against its iteration space.
Plan plan_fusion(const Graph& g, const Fusion& f, const hw::BoardConfig& board) {
    Plan p;
    const int64_t vlanes = board.core.vpu_lanes;
    // The iteration space: a reduction's operand, else a broadcast's result, else flat.
    for (OpId id : f.ops) {
        const Op& op = g.op(id);
        if (op.kind == OpKind::Reduce) {
            const Shape& s = g.shape(op.operands[0]);
            std::vector<int64_t> kept, red;
            bool seen_reduced = false;
            for (int64_t d = 0; d < s.rank(); ++d) {
                if (s.dims[size_t(d)] == 1) continue;
                const bool r =
                    std::find(op.attrs.dims.begin(), op.attrs.dims.end(), d) != op.attrs.dims.end();
                if (!r && seen_reduced)
                    not_generated(f,
                                  fmt::format("a reduction over major dims of {}", s.to_string()));
                seen_reduced |= r;
                (r ? red : kept).push_back(s.dims[size_t(d)]);
            }
            const int64_t R = product(kept), C = product(red);
            if (p.rows && (p.R != R || p.C != C))
                not_generated(f, "reductions of different shapes in one fusion");
            p.rows = true;
            p.R = R;
            p.C = C;
        }
    }
    if (!p.rows)
        for (OpId id : f.ops) {
            const Op& op = g.op(id);
            if (op.kind == OpKind::Broadcast && g.shape(op.operands[0]).elements() > 1) {
                const auto d = nonunit(g.shape(op.results[0]).dims);
                p.rows = true;
                p.C = d.empty() ? 1 : d.back();
                p.R = d.empty() ? 1 : product(d, 0, d.size() - 1);
                break;
            }
        }
    // Views: by element count where unambiguous, then propagated through the ops.
    std::vector<ValueId> values;
    for (const FusionValue& fv : f.operands) values.push_back(fv.value);
    for (OpId id : f.ops)
        for (ValueId v : g.op(id).results) values.push_back(v);
    const auto by_count = [&](ValueId v) {
        if (g.producer(v).kind == OpKind::Literal) return View::Literal;
        const int64_t n = g.shape(v).elements();
        // Flat: a rank-0 array is a scalar when broadcast, else the whole (one-value) space.
        if (!p.rows) return g.shape(v).rank() == 0 ? View::Unknown : View::Full;
        const bool full = n == p.R * p.C, col = n == p.R, row = n == p.C;
        if (full && !col && !row) return View::Full;
        if (col && !full && !row) return View::Col;
        if (row && !full && !col) return View::Row;
        if (n == 1 && !full && !col && !row) return View::Scalar;
        return View::Unknown;
    };
    for (ValueId v : values) p.view[v] = by_count(v);
    for (bool changed = true; changed;) {
        changed = false;
        const auto set = [&](ValueId v, View w) {
            View& cur = p.view[v];
            if (cur == View::Literal || w == View::Unknown || cur == w) return;
            if (cur != View::Unknown)
                not_generated(f, fmt::format("%{} used both as a row and as a column vector", v));
            cur = w;
            changed = true;
        };
        for (OpId id : f.ops) {
            const Op& op = g.op(id);
            const ValueId res = op.results[0];
            switch (op.kind) {
                case OpKind::Literal:
                    break;
                case OpKind::Reduce:
                    set(op.operands[0], View::Full);
                    set(res, p.view[res] == View::Unknown && g.shape(res).elements() == p.R
                                 ? View::Col
                                 : View::Unknown);
                    break;
                case OpKind::Broadcast: {
                    const Shape& in = g.shape(op.operands[0]);
                    const Shape& out = g.shape(res);
                    set(res, View::Full);
                    if (in.elements() == 1) {
                        set(op.operands[0], View::Scalar);
                        break;
                    }
                    // Which of the result's non-unit dims the operand covers.
                    std::vector<int64_t> covered(size_t(out.rank()), 0);
                    for (size_t d = 0; d < op.attrs.dims.size(); ++d)
                        if (in.dims[d] != 1) covered[size_t(op.attrs.dims[d])] = 1;
                    std::vector<int64_t> nz;
                    for (int64_t d = 0; d < out.rank(); ++d)
                        if (out.dims[size_t(d)] != 1) nz.push_back(covered[size_t(d)]);
                    const bool last = !nz.empty() && nz.back();
                    const int64_t others =
                        std::count(nz.begin(), nz.end() - (nz.empty() ? 0 : 1), 1);
                    const int64_t nothers = nz.empty() ? 0 : int64_t(nz.size()) - 1;
                    if (last && others == 0)
                        set(op.operands[0], View::Row);
                    else if (!last && others == nothers)
                        set(op.operands[0], View::Col);
                    else if (last && others == nothers)
                        set(op.operands[0], View::Full);
                    else
                        not_generated(f, fmt::format("a broadcast {} -> {}", in.to_string(),
                                                     out.to_string()));
                    break;
                }
                default: {
                    View w = p.view[res];
                    for (ValueId v : op.operands)
                        if (p.view[v] != View::Literal && p.view[v] != View::Unknown) w = p.view[v];
                    if (w == View::Unknown) break;
                    set(res, w);
                    for (ValueId v : op.operands) set(v, w);
                }
            }
        }
    }
    for (ValueId v : values)
        if (!p.rows && p.view[v] == View::Unknown) p.view[v] = View::Full;
    for (ValueId v : values)
        if (p.view[v] == View::Unknown)
            not_generated(f,
                          fmt::format("%{} ({}) that is neither [R, C], [R], [C] nor a scalar of "
                                      "the fusion's {} x {} iteration space",
                                      v, g.shape(v).to_string(), p.R, p.C));
    // Layouts and dtypes of the arrays in HBM.
    p.lanes = std::min<int64_t>(p.C, vlanes);
    p.chunks = p.C > vlanes ? p.C / vlanes : 1;
    if (p.rows && p.C > vlanes && p.C % vlanes != 0) {
        bool reduces = false;
        for (OpId id : f.ops) reduces |= g.op(id).kind == OpKind::Reduce;
        if (reduces)
            not_generated(f, fmt::format("a reduction of rows of {} (not a multiple of {} lanes)",
                                         p.C, vlanes));
    }
    std::optional<uint32_t> h;
    std::optional<Layout> flat_layout;
    uint64_t flat_bytes = 0;
    const auto check_hbm = [&](const FusionValue& fv) {
        if (fv.shape.dtype != DType::F32)
            not_generated(
                f, fmt::format("a {} array in HBM (only f32 is streamed)", fv.shape.to_string()));
        const View w = p.view[fv.value];
        if (w == View::Full) {
            if (!p.rows) {
                const bool plain =
                    fv.layout.tile.empty() && (!flat_layout || flat_layout->tile.empty());
                if (plain) band_of(f, fv.shape, fv.layout, p, vlanes);  // row-major
                if (flat_layout && !(*flat_layout == fv.layout) && !plain)
                    not_generated(f, fmt::format("elementwise arrays in layouts {} and {}",
                                                 flat_layout->to_string(), fv.layout.to_string()));
                flat_layout = fv.layout;
                flat_bytes = layout_bytes(fv.shape, fv.layout);
                return;
            }
            const uint32_t b = band_of(f, fv.shape, fv.layout, p, vlanes);
            if (h && *h != b) not_generated(f, "arrays of one fusion in tiled and untiled layouts");
            h = b;
        } else if (w == View::Col || w == View::Row || w == View::Scalar) {
            if (layout_bytes(fv.shape, fv.layout) != uint64_t(fv.shape.elements()) * 4)
                not_generated(f, fmt::format("a vector {} in padded layout {}",
                                             fv.shape.to_string(), fv.layout.to_string()));
        } else {
            not_generated(
                f, fmt::format("a {} array read or written as a literal", fv.shape.to_string()));
        }
    };
    for (const FusionValue& fv : f.operands) check_hbm(fv);
    for (const FusionValue& fv : f.results) check_hbm(fv);
    if (p.rows) {
        p.h = h.value_or(1);
        if (p.R % p.h) not_generated(f, fmt::format("{} rows in bands of {}", p.R, p.h));
        p.units = uint64_t(p.R / p.h);
        p.full = uint32_t(p.h * p.C);
    } else {
        p.units = flat_bytes ? flat_bytes / 4 : 1;
        for (const FusionValue& fv : f.results)
            if (p.view[fv.value] == View::Full) p.units = layout_bytes(fv.shape, fv.layout) / 4;
        p.full = 1;
    }
    return p;
}

/// Registers holding the base address of each allocation a fusion uses, loaded from the
/// program's scalar-memory argument table.
struct Bases {
    std::map<std::pair<uint8_t, uint32_t>, isa::Reg> regs;
    isa::Arg of(const BufferRef& r) const {
        const isa::Reg& base = regs.at({uint8_t(r.space), r.index});
        return base + (r.space == BufferRef::Space::Temp ? int64_t(r.offset) : 0);
    }
};

std::pair<uint8_t, uint32_t> alloc_key(const BufferRef& r) {
    return {uint8_t(r.space), r.space == BufferRef::Space::Temp ? 0u : r.index};
}

/// Elementwise ops that are one VPU instruction on whole tiles (emit_elementwise).
constexpr std::pair<OpKind, Opcode> kBinary[] = {{OpKind::Add, Opcode::VAdd},
                                                 {OpKind::Sub, Opcode::VSub},
                                                 {OpKind::Mul, Opcode::VMul},
                                                 {OpKind::Max, Opcode::VMax},
                                                 {OpKind::Min, Opcode::VMin}};
constexpr std::pair<OpKind, Opcode> kUnary[] = {{OpKind::Exp, Opcode::VExp},
                                                {OpKind::Log, Opcode::VLog},
                                                {OpKind::Rsqrt, Opcode::VRsqrt},
                                                {OpKind::Tanh, Opcode::VTanh}};

/// Whether emit_elementwise lowers `kind` (a comparison: only > and <, checked by the caller,
/// which names it).
bool has_vpu_lowering(OpKind kind) {
    using Table = std::span<const std::pair<OpKind, Opcode>>;
    for (const Table table : {Table(kBinary), Table(kUnary)})
        for (const auto& [k, op] : table)
            if (k == kind) return true;
    return kind == OpKind::Neg || kind == OpKind::Select || kind == OpKind::Compare;
}

/// The one VPU instruction of an elementwise op whose operands are all whole tiles (`in(i)`),
/// emitted with `vpu` (a streaming body's or an epilogue tile's). False for an op that takes
/// more (divide, convert) or that the VPU does not have (has_vpu_lowering is the same set).
template <class Vpu, class In>
bool emit_elementwise(Vpu&& vpu, OpKind kind, Comparison comparison, const isa::Arg& out, In&& in,
                      const isa::Arg& n) {
    for (const auto& [k, op] : kBinary)
        if (k == kind) {
            vpu(op, {out, in(0), in(1), n});
            return true;
        }
    for (const auto& [k, op] : kUnary)
        if (k == kind) {
            vpu(op, {out, in(0), n});
            return true;
        }
    switch (kind) {
        case OpKind::Neg:
            vpu(Opcode::VMulS, {out, in(0), fimm(-1.0f), n});
            return true;
        case OpKind::Select:
            vpu(Opcode::VSel, {out, in(0), in(1), in(2), n});
            return true;
        case OpKind::Compare:
            // a < b is b > a: the VPU compares one way.
            if (comparison == Comparison::Gt)
                vpu(Opcode::VCmpGt, {out, in(0), in(1), n});
            else
                vpu(Opcode::VCmpGt, {out, in(1), in(0), n});
            return true;
        default:
            return false;
    }
}

/// Emits one loop or input fusion on the streaming engine.
void emit_stream_fusion(isa::Builder& b, const Graph& g, const Fusion& f, const Plan& p,
                        const Bases& bases, const hw::BoardConfig& board) {
    st::Spec sp;
    sp.fp.name = f.name;
    sp.fp.units = p.units;
    const uint32_t full = p.full, col = p.h;
    const auto area = [&](uint32_t per) {
        sp.fp.areas.push_back(per);
        return int(sp.fp.areas.size() - 1);
    };
    std::map<ValueId, int> at;  // value -> slot area
    std::map<ValueId, int> fixed_of;
    // Inputs.
    for (const FusionValue& fv : f.operands) {
        const View w = p.view.at(fv.value);
        const isa::Arg addr = bases.of(fv.buffer);
        if (w == View::Full || w == View::Col) {
            at[fv.value] = area(w == View::Full ? full : col);
            sp.ins.emplace_back(st::Operand::hbm(addr), at[fv.value]);
        } else {
            const uint32_t n = w == View::Row ? uint32_t(p.C) : 1;
            sp.fp.fixed.push_back(n);
            fixed_of[fv.value] = int(sp.fp.fixed.size() - 1);
            sp.fixed_ins.push_back({st::Operand::hbm(addr), fixed_of[fv.value]});
        }
    }
    // Constant areas, filled once per slot: literals, -0.0, +0.0, 1.0, row and scalar patterns.
    struct Fill {
        int area;
        float value;
    };
    std::vector<Fill> fills;
    std::map<double, int> literal_area;
    const auto constant = [&](float v) {
        const double key = std::signbit(v) && v == 0 ? -1e300 : double(v);
        auto it = literal_area.find(key);
        if (it != literal_area.end()) return it->second;
        const int a = area(full);
        fills.push_back({a, v});
        literal_area[key] = a;
        return a;
    };
    bool tiled = p.h > 1;
    const int64_t Ct = p.chunks;
    // Scratch areas per op, planned while walking the ops.
    struct Step {
        OpId op;
        std::vector<int> tmp;
    };
    std::vector<Step> steps;
    for (OpId id : f.ops) {
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        const View w = p.view.at(res);
        Step s{id, {}};
        const auto per = [&] { return w == View::Col ? col : full; };
        switch (op.kind) {
            case OpKind::Literal: {
                if (!(g.shape(res).dtype == DType::F32 || g.shape(res).dtype == DType::Pred))
                    not_generated(f, fmt::format("a {} literal", g.shape(res).to_string()));
                at[res] = constant(float(op.attrs.scalar));
                break;
            }
            case OpKind::Reshape:
            case OpKind::Convert:
                if (op.kind == OpKind::Convert && op.attrs.dtype == DType::BF16 &&
                    g.shape(op.operands[0]).dtype == DType::F32) {
                    at[res] = area(per());
                    s.tmp = {area(per())};
                    break;
                }
                if (op.kind == OpKind::Convert && op.attrs.dtype == DType::S32)
                    not_generated(f, "a convert to s32");
                at[res] = at.at(op.operands[0]);
                s.tmp = {-1};  // an alias: nothing to emit
                break;
            case OpKind::Broadcast: {
                const ValueId in = op.operands[0];
                const View wi = p.view.at(in);
                if (wi == View::Full || wi == View::Literal || (wi == w)) {
                    at[res] = at.at(in);
                    s.tmp = {-1};
                } else if (wi == View::Col) {
                    at[res] = area(full);
                    if (tiled) s.tmp = {area(uint32_t(Ct * p.h))};
                } else {  // Row or Scalar: a pattern built once per slot
                    at[res] = area(full);
                    s.tmp = {-2};
                }
                break;
            }
            case OpKind::Transpose: {
                bool identity = true;
                for (size_t d = 0; d < op.attrs.dims.size(); ++d)
                    identity &= op.attrs.dims[d] == int64_t(d);
                if (!identity) not_generated(f, "a transpose that moves data");
                at[res] = at.at(op.operands[0]);
                s.tmp = {-1};
                break;
            }
            case OpKind::Reduce:
                at[res] = area(col);
                if (Ct > 1) {
                    s.tmp = {area(uint32_t(Ct * p.h))};
                    if (tiled) s.tmp.push_back(area(uint32_t(Ct * p.h)));
                }
                break;
            case OpKind::Div:
                at[res] = area(per());
                s.tmp = {area(per()), area(per()), constant(0.0f)};
                break;
            case OpKind::Compare:
                if (op.attrs.comparison != Comparison::Gt && op.attrs.comparison != Comparison::Lt)
                    not_generated(f, "a comparison other than > and <");
                at[res] = area(per());
                break;
            default:
                if (!has_vpu_lowering(op.kind))
                    not_generated(f, fmt::format("op {} (in a {} fusion)", op_name(op.kind),
                                                 fusion_kind_name(f.kind)));
                at[res] = area(per());
        }
        if (w == View::Row || w == View::Scalar)
            if (op.kind != OpKind::Literal && !(s.tmp.size() == 1 && s.tmp[0] == -1))
                not_generated(f, fmt::format("{} computed on a {} vector", op_name(op.kind),
                                             w == View::Row ? "row" : "scalar"));
        steps.push_back(std::move(s));
    }
    bool need_negzero = false, need_ones = false;
    for (const Step& s : steps) {
        if (g.op(s.op).kind != OpKind::Broadcast || (!s.tmp.empty() && s.tmp[0] == -1)) continue;
        const bool pattern = !s.tmp.empty() && s.tmp[0] == -2;
        need_negzero |= pattern || tiled;
        need_ones |= !pattern;
    }
    const int negzero = need_negzero ? constant(-0.0f) : -1;
    const int ones = need_ones ? constant(1.0f) : -1;
    // Outputs.
    for (const FusionValue& fv : f.results) {
        const View w = p.view.at(fv.value);
        if (w != View::Full && w != View::Col)
            not_generated(f, fmt::format("a {} result", fv.shape.to_string()));
        sp.outs.emplace_back(st::Operand::hbm(bases.of(fv.buffer)), at.at(fv.value));
    }
    const uint32_t tile = st::plan(sp.fp, b.vmem_free());

    sp.body = [&](st::Body& body) {
        isa::Builder& bb = body.builder();
        const isa::Reg nf = bb.reg("n.full"), nc = bb.reg("n.col");
        bb.emit(Opcode::Mul, {nf, body.units(), imm(full)});
        bb.emit(Opcode::Mul, {nc, body.units(), imm(col)});
        const int64_t tile_full = int64_t(tile) * full;
        // Constants and patterns, once in each slot (tiles 0 and 1).
        bb.if_(isa::Cond::Ltu, body.tile(), imm(2), [&] {
            std::vector<int> zeroed;
            for (const Fill& fl : fills) {
                const isa::Arg a = body.a(fl.area);
                body.vpu(Opcode::VCmpGt, {a, a, a, imm(tile_full)});
                if (fl.value == 0 && std::signbit(fl.value))
                    body.vpu(Opcode::VMulS, {a, a, fimm(-1.0f), imm(tile_full)});
                else if (fl.value != 0)
                    body.vpu(Opcode::VAddS, {a, a, fimm(fl.value), imm(tile_full)});
            }
            for (const Step& s : steps) {
                const Op& op = g.op(s.op);
                if (op.kind != OpKind::Broadcast || s.tmp.empty() || s.tmp[0] != -2) continue;
                const ValueId in = op.operands[0];
                const isa::Arg out = body.a(at.at(op.results[0]));
                const isa::Arg src = body.f(fixed_of.at(in));
                if (p.view.at(in) == View::Scalar) {
                    body.vpu(Opcode::VAddRow, {out, body.a(negzero), src, imm(tile_full), imm(1)});
                } else if (!tiled) {
                    body.vpu(Opcode::VAddRow,
                             {out, body.a(negzero), src, imm(tile * p.h), imm(p.C)});
                } else {
                    for (uint32_t u = 0; u < tile; ++u)
                        for (int64_t t = 0; t < Ct; ++t)
                            body.vpu(
                                Opcode::VAddRow,
                                {out + int64_t((u * Ct + t) * p.h * p.lanes * 4), body.a(negzero),
                                 src + int64_t(t * p.lanes * 4), imm(p.h), imm(p.lanes)});
                }
            }
        });
        const isa::Reg t0 = bb.reg("t0");
        // A loop over the tile's bands: `fn(dst_reg, src_reg)` with the two addresses set.
        const auto per_band = [&](isa::Arg dst, int64_t dst_stride, isa::Arg src,
                                  int64_t src_stride,
                                  const std::function<void(const isa::Reg&, const isa::Reg&)>& fn) {
            const isa::Reg k = bb.reg("band"), d = bb.reg("band.dst"), s = bb.reg("band.src");
            bb.loop(k, imm(0), body.units(), 1, [&] {
                bb.emit(Opcode::Mul, {d, k, imm(dst_stride)});
                bb.emit(Opcode::Add, {d, d, dst});
                bb.emit(Opcode::Mul, {s, k, imm(src_stride)});
                bb.emit(Opcode::Add, {s, s, src});
                fn(d, s);
            });
        };
        for (const Step& s : steps) {
            const Op& op = g.op(s.op);
            if (!s.tmp.empty() && s.tmp[0] == -1) continue;
            const ValueId res = op.results[0];
            const View w = p.view.at(res);
            const isa::Reg& n = w == View::Col ? nc : nf;
            const auto A = [&](size_t i) { return body.a(at.at(op.operands[i])); };
            const isa::Arg out = body.a(at.at(res));
            switch (op.kind) {
                case OpKind::Literal:
                    break;
                case OpKind::Convert:  // f32 -> bf16: round, keep as f32 in VMEM
                    body.vpu(Opcode::VF2Bf, {body.a(s.tmp[0]), A(0), n});
                    body.vpu(Opcode::VBf2F, {out, body.a(s.tmp[0]), n});
                    break;
                case OpKind::Broadcast: {
                    if (s.tmp.empty() || s.tmp[0] == -2) {
                        if (s.tmp.empty()) {  // Col, untiled: rows of C
                            body.vpu(Opcode::VMulCol,
                                     {out, body.a(ones), A(0), body.units(), imm(p.C)});
                        }
                        break;
                    }
                    // Col, tiled: per band, each row's value for every lane chunk, then x 1.0.
                    const isa::Arg e = body.a(s.tmp[0]);
                    const int64_t eb = Ct * p.h * 4;
                    per_band(
                        e, eb, A(0), int64_t(p.h) * 4, [&](const isa::Reg& d, const isa::Reg& src) {
                            body.vpu(Opcode::VAddRow, {d, body.a(negzero), src, imm(Ct), imm(p.h)});
                        });
                    bb.emit(Opcode::Mul, {t0, body.units(), imm(Ct * p.h)});
                    body.vpu(Opcode::VMulCol, {out, body.a(ones), e, t0, imm(p.lanes)});
                    break;
                }
                case OpKind::Reduce: {
                    const bool sum = op.attrs.reducer == Reducer::Sum;
                    const Opcode red = sum ? Opcode::VRSum : Opcode::VRMax;
                    if (Ct == 1) {
                        bb.emit(Opcode::Mul, {t0, body.units(), imm(p.h)});
                        body.vpu(red, {out, A(0), t0, imm(p.C)});
                        break;
                    }
                    const isa::Arg part = body.a(s.tmp[0]);
                    bb.emit(Opcode::Mul, {t0, body.units(), imm(Ct * p.h)});
                    body.vpu(red, {part, A(0), t0, imm(p.lanes)});
                    if (!tiled) {
                        body.vpu(red, {out, part, body.units(), imm(Ct)});
                        break;
                    }
                    // partial[band][chunk][row] -> per band [row][chunk], reduced per row.
                    const isa::Arg tr = body.a(s.tmp[1]);
                    const int64_t pb = Ct * p.h * 4;
                    per_band(tr, pb, part, pb, [&](const isa::Reg& d, const isa::Reg& src) {
                        body.vpu(Opcode::VTrans, {d, src, imm(Ct), imm(p.h)});
                    });
                    per_band(out, int64_t(p.h) * 4, tr, pb,
                             [&](const isa::Reg& d, const isa::Reg& src) {
                                 body.vpu(red, {d, src, imm(p.h), imm(Ct)});
                             });
                    break;
                }
                case OpKind::Div: {
                    // vpu_divide (evaluator.h): q = x * rsqrt(max(y, -y))^2, negated if 0 > y.
                    const isa::Arg r = body.a(s.tmp[0]), m = body.a(s.tmp[1]),
                                   zero = body.a(s.tmp[2]);
                    body.vpu(Opcode::VMulS, {r, A(1), fimm(-1.0f), n});
                    body.vpu(Opcode::VMax, {r, A(1), r, n});
                    body.vpu(Opcode::VRsqrt, {r, r, n});
                    body.vpu(Opcode::VMul, {r, r, r, n});
                    body.vpu(Opcode::VMul, {out, A(0), r, n});
                    body.vpu(Opcode::VMulS, {r, out, fimm(-1.0f), n});
                    body.vpu(Opcode::VCmpGt, {m, zero, A(1), n});
                    body.vpu(Opcode::VSel, {out, m, r, out, n});
                    break;
                }
                default: {
                    const auto vpu = [&](Opcode o, std::initializer_list<isa::Arg> args) {
                        body.vpu(o, args);
                    };
                    if (!emit_elementwise(vpu, op.kind, op.attrs.comparison, out, A, n))
                        not_generated(f, fmt::format("op {}", op_name(op.kind)));
                }
            }
        }
    };
    st::emit(b, sp, tile);
}

/// How an epilogue value lies against the dot's [M, N] result tile.
enum class EpKind : uint8_t {
    Full,    ///< a tile: the result tile, a Full side's or a temp area
    Column,  ///< one value per result column: a Column side, broadcast over the rows
    Scalar,  ///< a literal
};

/// An epilogue value: where the body finds it.
struct EpValue {
    EpKind kind = EpKind::Full;
    int area = -1;     ///< Full: a result area (>= 0), the result tile (-1), Full side i (-2 - i)
    size_t side = 0;   ///< Column: the side's index among Epilogue::sides
    float scalar = 0;  ///< Scalar: the value
};

/// One epilogue op with its operands and result placed.
struct EpStep {
    OpKind kind = OpKind::Add;
    Comparison comparison = Comparison::Gt;  ///< Compare
    std::vector<EpValue> in;
    EpValue out;
};

/// Scratch areas every epilogue op may use (materialised operands, a divide's temporaries).
constexpr int kScratch = 5;

/// Bytes of one epilogue area: the largest result tile of `k` (block_rows x C fp32; with the
/// LHS stationary at most C rows of block_rows).
uint64_t epilogue_area_bytes(const driver::DotKey& k) {
    return (uint64_t(k.block_rows) * k.C * 4 + 511) / 512 * 512;
}

/// The plan of an output fusion rooted at a dot: the dot kernel's key, where its operands,
/// result and epilogue sides are, and the epilogue's ops on the result tile.
struct DotFusion {
    driver::DotKey key;
    const FusionValue* a = nullptr;
    const FusionValue* w = nullptr;
    const FusionValue* c = nullptr;
    std::vector<const FusionValue*> sides;  ///< in Epilogue::sides order (Columns first)
    std::vector<EpStep> steps;              ///< the epilogue, in order
    int areas = 0;                          ///< tile-sized VMEM areas: results, then scratch
};

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

/// Plans an output fusion rooted at a 2-D dot (no batch dims): operands through in-fusion
/// conversions, the epilogue's ops and sides, the kernel's tiling in the VMEM the epilogue's
/// areas leave.
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

/// Emits an output fusion rooted at a dot: the dot kernel with the epilogue's ops on each
/// result tile (bit-exact with the evaluator: the same fp32 ops in the same order).
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

/// Spends `cycles` in the sequencer: a count-down loop of two one-cycle instructions.
void emit_delay(isa::Builder& b, uint32_t cycles) {
    if (cycles < 3) return;
    const isa::Reg d = b.reg("boundary");
    b.emit(Opcode::Li, {d, imm((cycles - 1) / 2)});
    const isa::Label top = b.label("boundary");
    b.bind(top);
    b.emit(Opcode::Sub, {d, d, imm(1)});
    b.emit(Opcode::Bne, {d, imm(0), top});
}

/// The plan of a collective fusion: an all-reduce of one array over the replicas, in place in
/// its result buffer (the operand copied there first when they differ).
struct CollectiveFusion {
    const FusionValue* x = nullptr;  ///< the operand
    const FusionValue* y = nullptr;  ///< the result
    float scale = 1;                 ///< applied after the sum (scale == 1: none)
    uint32_t values = 0;             ///< fp32 values in the buffer (tile padding included)
    std::optional<driver::AllReduceHbmPlan> ring;  ///< the ring kernel (replicas > 1)
    uint32_t copy_tile = 0;  ///< streaming copy (or scale) of x into y: values per tile
    bool copy = false;       ///< x and y are different buffers
};

CollectiveFusion plan_collective(const Graph& g, const Fusion& f, const CodegenOptions& o) {
    CollectiveFusion p;
    const Op& op = g.op(f.hero);
    if (op.kind != OpKind::AllReduce || f.ops.size() != 1 || f.operands.size() != 1 ||
        f.results.size() != 1)
        not_generated(f, "a collective fusion other than one all-reduce");
    p.x = &f.operands[0];
    p.y = &f.results[0];
    if (p.x->shape.dtype != DType::F32 || !(p.x->shape == p.y->shape) ||
        !(p.x->layout == p.y->layout))
        not_generated(f, fmt::format("an all-reduce of {} in {} into {} in {}",
                                     p.x->shape.to_string(), p.x->layout.to_string(),
                                     p.y->shape.to_string(), p.y->layout.to_string()));
    const uint64_t values = layout_bytes(p.x->shape, p.x->layout) / 4;
    if (values == 0 || values > UINT32_MAX) not_generated(f, "an all-reduce of this size");
    p.values = uint32_t(values);
    p.scale = float(op.attrs.scalar);
    p.copy = !(p.x->buffer == p.y->buffer);
    if (p.copy || o.replicas == 1) {
        st::Footprint fp;
        fp.name = f.name;
        fp.units = p.values;
        fp.areas = {1};
        p.copy_tile = st::plan(fp, o.board.core.vmem_bytes);
    }
    if (o.replicas > 1)
        p.ring =
            driver::plan_allreduce_hbm(o.replicas, p.values, o.board,
                                       driver::AllReduceSchedule::Auto, o.board.core.vmem_bytes);
    return p;
}

/// Emits a collective fusion: the ring all-reduce in place (driver::emit_allreduce), the ring in
/// replica order as the evaluator's reference sums. Neighbours shake hands on `ready` (never
/// reset, `count` handshakes so far) before anything is sent: a core may still be in the
/// previous fusion, whose flags and VMEM the all-reduce takes over.
void emit_collective(isa::Builder& b, const CollectiveFusion& p, const isa::Reg& x,
                     const isa::Reg& y, const std::array<isa::Reg, 3>& ring, const isa::Flag* ready,
                     uint32_t count) {
    const bool scale_here = !p.ring && p.scale != 1.0f;
    if (p.copy || scale_here) {
        st::Spec sp;
        sp.fp.name = "copy";
        sp.fp.units = p.values;
        sp.fp.areas = {1};
        sp.ins.emplace_back(st::Operand::hbm(x), 0);
        sp.outs.emplace_back(st::Operand::hbm(y), 0);
        // One replica: the all-reduce is the scale alone (allreduce_reference's x * scale).
        sp.body = [&](st::Body& body) {
            if (scale_here)
                body.vpu(Opcode::VMulS, {body.a(0), body.a(0), fimm(p.scale), body.units()});
        };
        st::emit(b, sp, p.copy_tile);
    }
    if (!p.ring) return;
    const isa::Reg scale = b.reg("scale");
    b.emit(Opcode::Li, {scale, imm(int64_t(std::bit_cast<uint32_t>(p.scale)))});
    auto ops = driver::AllReduceOperands::ring(y, scale, ring[0], ring[1], ring[2]);
    ops.ready = [&] { driver::emit_ring_ready(b, ring[1], ring[2], *ready, count); };
    driver::emit_allreduce(b, *p.ring, ops);
}

std::string arg_name(const ProgramArg& a) {
    switch (a.what) {
        case ProgramArg::What::Position:
            return "ring.position";
        case ProgramArg::What::Next:
            return "ring.next";
        case ProgramArg::What::Prev:
            return "ring.prev";
        case ProgramArg::What::Base:
            break;
    }
    switch (a.space) {
        case BufferRef::Space::Parameter:
            return fmt::format("param{}", a.index);
        case BufferRef::Space::Input:
            return fmt::format("input{}", a.index);
        case BufferRef::Space::Constant:
            return fmt::format("const{}", a.index);
        case BufferRef::Space::Output:
            return fmt::format("out{}", a.index);
        case BufferRef::Space::Temp:
            return "temp";
    }
    return "?";
}

ProgramSegment device_segment(const CompiledStep& step, const std::vector<size_t>& fusions,
                              const CodegenOptions& o) {
    ProgramSegment seg;
    seg.fusions = fusions;
    const Graph& g = step.graph;
    // Plans first: a fusion that cannot be generated fails before anything is emitted.
    std::vector<Plan> plans;
    std::vector<std::optional<DotFusion>> dots;
    std::vector<std::optional<CollectiveFusion>> collectives;
    std::map<std::pair<uint8_t, uint32_t>, size_t> slot;
    bool rings = false;
    for (size_t i : fusions) {
        const Fusion& f = step.fusions[i];
        plans.emplace_back();
        dots.emplace_back();
        collectives.emplace_back();
        if (f.kind == FusionKind::Collective) {
            collectives.back() = plan_collective(g, f, o);
            rings |= collectives.back()->ring.has_value();
        } else if (f.kind == FusionKind::Output) {
            dots.back() = plan_dot_fusion(g, f, o.board);
        } else {
            plans.back() = plan_fusion(g, f, o.board);
        }
        for (const auto* list : {&f.operands, &f.results})
            for (const FusionValue& fv : *list) {
                const auto key = alloc_key(fv.buffer);
                if (slot.count(key)) continue;
                slot[key] = seg.args.size();
                seg.args.push_back({ProgramArg::What::Base, fv.buffer.space, key.second});
            }
    }
    // Each core's place in the ring, for the all-reduces.
    const size_t ring_args = seg.args.size();
    if (rings)
        for (auto w : {ProgramArg::What::Position, ProgramArg::What::Next, ProgramArg::What::Prev})
            seg.args.push_back({w, BufferRef::Space::Temp, 0});
    if (seg.args.size() >= size_t(isa::kNumSregs))
        throw CompileError(fmt::format(
            "step: {} buffers in one program, but a launch carries at most {} addresses",
            seg.args.size(), isa::kNumSregs - 1));
    isa::Builder b("compiled_step",
                   {.vmem_bytes = o.board.core.vmem_bytes, .smem_bytes = o.board.core.smem_bytes});
    // The launch arguments go to scalar memory, so every register is free for the kernels.
    std::optional<isa::Smem> table;
    {
        std::vector<isa::Reg> args;
        for (const ProgramArg& a : seg.args) args.push_back(b.arg(arg_name(a)));
        if (!args.empty()) table.emplace(b.smem("args", args.size()));
        for (size_t i = 0; i < args.size(); ++i) b.emit(Opcode::Sw, {args[i], table->word(i)});
    }
    // The all-reduces' handshake flag: held for the whole program, never reset, so a
    // neighbour's signal cannot be lost to a reset (codegen.h, emit_collective).
    std::optional<isa::Flag> ready;
    if (rings) ready.emplace(b.flag("ring.ready"));
    uint32_t handshakes = 0;
    for (size_t k = 0; k < fusions.size(); ++k) {
        const Fusion& f = step.fusions[fusions[k]];
        if (k > 0) emit_delay(b, o.board.core.fusion_setup_cycles);
        const auto scope = b.scope(f.name);
        const auto load = [&](const isa::Reg& r, const BufferRef& buf) {
            if (buf.space == BufferRef::Space::Temp && buf.offset > 0x7fffffffu)
                throw CompileError(
                    fmt::format("{}: temp offset {} beyond 2 GiB", f.name, buf.offset));
            b.emit(Opcode::Lw, {r, table->word(slot.at(alloc_key(buf)))});
            if (buf.space == BufferRef::Space::Temp && buf.offset > 0)
                b.emit(Opcode::Add, {r, r, imm(int64_t(buf.offset))});
        };
        if (collectives[k]) {
            const CollectiveFusion& c = *collectives[k];
            const isa::Reg x = b.reg("x"), y = b.reg("y");
            load(x, c.x->buffer);
            load(y, c.y->buffer);
            std::array<isa::Reg, 3> ring;
            if (c.ring) {
                const char* names[] = {"position", "next", "prev"};
                for (size_t j = 0; j < 3; ++j) {
                    ring[j] = b.reg(names[j]);
                    b.emit(Opcode::Lw, {ring[j], table->word(ring_args + j)});
                }
                ++handshakes;
            }
            emit_collective(b, c, x, y, ring, ready ? &*ready : nullptr, handshakes);
            continue;
        }
        if (dots[k]) {
            emit_dot_fusion(b, *dots[k], load);
            continue;
        }
        Bases bases;
        for (const auto* list : {&f.operands, &f.results})
            for (const FusionValue& fv : *list) {
                const auto key = alloc_key(fv.buffer);
                if (bases.regs.count(key)) continue;
                if (fv.buffer.space == BufferRef::Space::Temp && fv.buffer.offset > 0x7fffffffu)
                    throw CompileError(
                        fmt::format("{}: temp offset {} beyond 2 GiB", f.name, fv.buffer.offset));
                isa::Reg r = b.reg(arg_name(seg.args[slot.at(key)]));
                b.emit(Opcode::Lw, {r, table->word(slot.at(key))});
                bases.regs.emplace(key, std::move(r));
            }
        emit_stream_fusion(b, g, f, plans[k], bases, o.board);
    }
    b.emit(Opcode::Halt, {});
    seg.program = b.finish();
    return seg;
}

}  // namespace

StepProgram generate_step(const CompiledStep& step, const CodegenOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    StepProgram out;
    std::vector<size_t> run;
    const auto flush = [&] {
        if (run.empty()) return;
        out.segments.push_back(device_segment(step, run, options));
        run.clear();
    };
    for (size_t i = 0; i < step.fusions.size(); ++i) {
        if (step.fusions[i].kind == FusionKind::Custom) {
            flush();
            ProgramSegment host;
            host.host_fusion = int64_t(i);
            out.segments.push_back(std::move(host));
        } else {
            run.push_back(i);
        }
    }
    flush();
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

}  // namespace tpu::compiler
