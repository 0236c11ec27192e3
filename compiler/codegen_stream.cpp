// SPDX-License-Identifier: Apache-2.0
// Loop and input fusions on the streaming engine (compiler/README.md, "Loop and input
// fusions"; driver/kernels/stream_kernel.h).
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
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler::gen {
namespace {

namespace st = driver::streaming;

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

}  // namespace

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

bool has_vpu_lowering(OpKind kind) {
    using Table = std::span<const std::pair<OpKind, Opcode>>;
    for (const Table table : {Table(kBinary), Table(kUnary)})
        for (const auto& [k, op] : table)
            if (k == kind) return true;
    return kind == OpKind::Neg || kind == OpKind::Select || kind == OpKind::Compare;
}

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

}  // namespace tpu::compiler::gen
