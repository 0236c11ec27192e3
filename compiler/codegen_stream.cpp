// SPDX-License-Identifier: Apache-2.0
// Loop and input fusions on the streaming engine (compiler/README.md, "Loop and input
// fusions"; driver/kernels/stream_kernel.h).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compiler/codegen_internal.h"
#include "compiler/evaluator.h"
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
    // Padded lanes are computed on and never stored as data; padded rows only at the end of the
    // array (the rows above its two tiled dims are one), or each matrix's (pad_matrix_rows).
    if (l.tile.size() == 2 && rank >= 2 && l.tile[1] == lanes && s.dims[size_t(rank - 1)] == p.C &&
        (s.dims[size_t(rank - 2)] % l.tile[0] == 0 || product(s.dims, 0, size_t(rank - 2)) == 1 ||
         (p.Rg && s.dims[size_t(rank - 2)] == p.Rg)))
        return uint32_t(l.tile[0]);
    not_generated(
        f, fmt::format("a {} array in layout {} (padded tiles)", s.to_string(), l.to_string()));
}

/// `r` = the address of row `q` (a register, clobbered) of a [G, C] array in T(h,128) tiles at
/// `base`: band q / h of `chunks` lane chunks of `chunk` bytes, row q % h in each.
void group_row(isa::Builder& bb, const isa::Reg& r, const isa::Reg& q, const isa::Arg& base,
               int64_t h, int64_t chunks, int64_t chunk) {
    bb.emit(Opcode::Divu, {r, q, imm(h)});
    bb.emit(Opcode::Mul, {r, r, imm(chunks * chunk)});
    bb.emit(Opcode::Remu, {q, q, imm(h)});
    bb.emit(Opcode::Mul, {q, q, imm(chunk / h)});
    bb.emit(Opcode::Add, {r, r, q});
    bb.emit(Opcode::Add, {r, r, base});
}

/// The load (or store) of a tile of row bands of a Full array at `addr` (an untiled [R, C] whose R
/// is not a multiple of the band): one DMA of the tile's rows, clamped to the array's last row.
st::Transfer row_band_transfer(const Plan& p, const isa::Arg& addr, int area, bool load) {
    const int64_t h = p.h, R = p.R, row = p.Cp * 4;
    return [=](st::Body& bd, const isa::Reg& first, const isa::Reg& units, const isa::Reg& slot,
               const isa::Flag& flag) {
        isa::Builder& bb = bd.builder();
        const isa::Reg &t0 = bd.tmp(0), &t1 = bd.tmp(1);
        bb.emit(Opcode::Mul, {t0, first, imm(h)});  // the tile's first row
        bb.emit(Opcode::Li, {t1, imm(R)});
        bb.emit(Opcode::Sub, {t1, t1, t0});         // rows left
        bb.emit(Opcode::Mul, {t0, units, imm(h)});  // the tile's rows
        bb.if_(isa::Cond::Ltu, t0, t1, [&] { bb.emit(Opcode::Add, {t1, t0, imm(0)}); });
        bb.emit(Opcode::Mul, {t1, t1, imm(row)});
        bb.emit(Opcode::Mul, {t0, first, imm(h * row)});
        bb.emit(Opcode::Add, {t0, t0, addr});
        if (load)
            bb.emit(Opcode::DmaHv, {bd.at(slot, area), t0, imm(1), t1, t1, t1, flag});
        else
            bb.emit(Opcode::DmaVh, {t0, bd.at(slot, area), imm(1), t1, t1, t1, flag});
    };
}

/// The load (or store) of a tile of untiled rows padded to whole lane chunks in VMEM
/// (Plan::padded_rows): one DMA of the tile's rows, C values each in HBM, Cp apart in VMEM.
st::Transfer padded_row_transfer(const Plan& p, const isa::Arg& addr, int area, bool load) {
    const int64_t row = p.C * 4, vrow = p.Cp * 4;
    return [=](st::Body& bd, const isa::Reg& first, const isa::Reg& units, const isa::Reg& slot,
               const isa::Flag& flag) {
        isa::Builder& bb = bd.builder();
        const isa::Reg& t0 = bd.tmp(0);
        bb.emit(Opcode::Mul, {t0, first, imm(row)});
        bb.emit(Opcode::Add, {t0, t0, addr});
        if (load)
            bb.emit(Opcode::DmaHv,
                    {bd.at(slot, area), t0, units, imm(row), imm(vrow), imm(row), flag});
        else
            bb.emit(Opcode::DmaVh,
                    {t0, bd.at(slot, area), units, imm(row), imm(row), imm(vrow), flag});
    };
}

/// Views that name the same values when the iteration space has one row (a column value is the
/// scalar, the whole space is the row: a batch of one) or one column.
bool same_at_unit_dims(const Plan& p, View a, View b) {
    const auto pair = [&](View x, View y) { return (a == x && b == y) || (a == y && b == x); };
    return (p.R == 1 && (pair(View::Col, View::Scalar) || pair(View::Full, View::Row))) ||
           (p.C == 1 && (pair(View::Row, View::Scalar) || pair(View::Full, View::Col)));
}

/// A reduction over the major dims of untiled row-major rows (a bias or batch-norm gradient's
/// sums over NHWC activations, which the convolution kernels write untiled): 8 consecutive rows
/// are one contiguous run, so they stream as a band of 8 rows in row order, and row i still
/// goes to sublane partial i mod 8 (the evaluator's order). The band's values are in row order
/// ([row][C], not a tile's [chunk][row][lane]): row patterns and column broadcasts take the
/// untiled forms over all the band's rows, and the partials are transposed whole at the end.
/// Rows not a multiple of 8: the last band's loads and stores stop at the array's end
/// (row_band_transfer) and only its rows of data are added.
/// Matrices of rows padded to whole bands: a fusion over [M, Rg, C] arrays in T(8,128) tiles
/// whose Rg is not a multiple of the band's rows (ViT's [heads, 17, 17] scores: 16 patches and
/// the class token) streams them as the [M Rp, C] array of the same bytes, Rp = Rg rounded up
/// to the band: the padded rows are computed on and stored like padded lanes, never read as
/// data (XLA pads a tiled array's two minor dims the same way). Its [M, Rg] row vectors (a
/// softmax's statistics, in T(8,128) tiles) map padded row r to [r / Rp][r % Rp]: lanes Rg ..
/// Rp - 1 of that tile row are its padding ([B, H, Rg] ones: matrix r / Rp of B x H, below). Only
/// for minor reductions and elementwise ops (no iota, no untiled vector: their rows would shift).
void pad_matrix_rows(const Graph& g, const Fusion& f, Plan& p, const hw::BoardConfig& board) {
    const int64_t h = board.core.vpu_sublanes, lanes = board.core.vpu_lanes;
    if (!p.rows || p.major || p.G != 1) return;
    for (OpId id : f.ops)
        if (g.op(id).kind == OpKind::Iota) return;
    const std::vector<int64_t> tile{h, lanes};
    int64_t Rg = 0;
    const auto rows_of = [&](int64_t r) {
        if (Rg && Rg != r) return false;
        Rg = r;
        return true;
    };
    for (const auto* list : {&f.operands, &f.results})
        for (const FusionValue& fv : *list) {
            const View w = p.view.at(fv.value);
            const auto d = nonunit(fv.shape.dims);
            const int64_t rank = fv.shape.rank();
            if (w == View::Full) {
                if (fv.layout.tile != tile || d.size() < 3 || fv.shape.dims.back() != p.C ||
                    !rows_of(fv.shape.dims[size_t(rank - 2)]))
                    return;
            } else if (w == View::Col) {
                // [M, Rg] or, over a batch of sequences' heads, [B, H, Rg] (check_hbm maps its
                // matrices of H rows).
                if (fv.layout.tile != tile || (d.size() != 2 && d.size() != 3) ||
                    fv.shape.dims.back() != d.back() || !rows_of(d.back()))
                    return;
            } else if (w != View::Row && w != View::Scalar && w != View::Literal) {
                return;
            }
        }
    if (!Rg || Rg % h == 0 || p.R % Rg) return;
    // The vectors' padded rows stay within their rows' lane chunks (lanes is a multiple of h).
    const int64_t Rp = (Rg + h - 1) / h * h;
    if ((Rp + lanes - 1) / lanes != (Rg + lanes - 1) / lanes) return;
    p.Rg = Rg;
    p.R = p.R / Rg * Rp;
}

void row_bands(Plan& p, const hw::BoardConfig& board) {
    const int64_t sub = board.core.vpu_sublanes;
    if (p.total || p.G != 1 || p.C != p.Cp) return;
    p.h = uint32_t(sub);
    p.row_bands = true;
}

}  // namespace

int literal_exponent(const Graph& g, ValueId v) {
    const Op* op = &g.producer(v);
    while (op->kind == OpKind::Broadcast || op->kind == OpKind::Reshape)
        op = &g.producer(op->operands[0]);
    if (op->kind != OpKind::Literal) return -1;
    const double e = op->attrs.scalar;
    return e >= 0 && e <= kVpuPowMax && e == std::floor(e) ? int(e) : -1;
}

Plan plan_fusion(const Graph& g, const Fusion& f, const hw::BoardConfig& board) {
    Plan p;
    const int64_t vlanes = board.core.vpu_lanes;
    // The iteration space: a reduction's operand, else a broadcast's result, else flat.
    for (OpId id : f.ops) {
        const Op& op = g.op(id);
        if (op.kind == OpKind::Reduce) {
            const Shape& s = g.shape(op.operands[0]);
            // Minor: [kept..., reduced...]; major: [reduced..., kept...] (rows reduced).
            std::vector<int64_t> kept, red;
            std::vector<bool> order;
            for (int64_t d = 0; d < s.rank(); ++d) {
                if (s.dims[size_t(d)] == 1) continue;
                const bool r =
                    std::find(op.attrs.dims.begin(), op.attrs.dims.end(), d) != op.attrs.dims.end();
                if (order.empty() || order.back() != r) order.push_back(r);
                (r ? red : kept).push_back(s.dims[size_t(d)]);
            }
            // Total: every dim of an array of rank 2 or more (T(8,128) tiles): over the rows
            // first, then over the row of column results.
            // Grouped: [kept G, reduced, kept C], per group a major reduction (attention's
            // softmax over dim -2).
            const bool total = kept.empty() && red.size() >= 2;
            const bool grouped = order.size() == 3 && !order[0];
            // Only unit dims reduced (a bias gradient over a batch of one): one row, reduced
            // over the rows, as the evaluator orders it.
            const bool major = red.empty() || total || grouped ||
                               (!order.empty() && !order.back() && !red.empty());
            if (order.size() > 3 || (order.size() == 3 && order[0]))
                not_generated(f, fmt::format("a reduction over dims {} of {}",
                                             fmt::join(op.attrs.dims, ","), s.to_string()));
            int64_t G = 1;
            if (grouped) {
                size_t lead = 0;  // kept dims before the first reduced one
                for (int64_t d = 0; d < s.rank(); ++d) {
                    if (s.dims[size_t(d)] == 1) continue;
                    if (std::find(op.attrs.dims.begin(), op.attrs.dims.end(), d) !=
                        op.attrs.dims.end())
                        break;
                    ++lead;
                }
                G = product(kept, 0, lead);
            }
            const int64_t R = total     ? product(red, 0, red.size() - 1)
                              : grouped ? G * product(red)
                              : major   ? product(red)
                                        : product(kept);
            const int64_t C = total ? red.back() : major ? product(kept) / G : product(red);
            if (p.rows &&
                (p.R != R || p.C != C || p.major != major || p.total != total || p.G != G))
                not_generated(f, "reductions of different shapes in one fusion");
            p.G = G;
            p.rows = true;
            p.major = major;
            p.total = total;
            p.R = R;
            p.C = C;
        }
    }
    // The [G, C] broadcast over the middle dims, in a space a major reduction (not grouped)
    // set: its groups of R / Gb rows (Plan::Gb).
    if (p.rows && p.major && !p.total && p.G == 1)
        for (OpId id : f.ops) {
            const Op& op = g.op(id);
            if (op.kind != OpKind::Broadcast) continue;
            const Shape& in = g.shape(op.operands[0]);
            const Shape& out = g.shape(op.results[0]);
            if (in.elements() <= 1 || out.elements() != p.R * p.C || nonunit(in.dims).size() != 2)
                continue;
            const auto d = nonunit(out.dims);
            std::vector<int64_t> cov;
            for (int64_t k = 0; k < out.rank(); ++k) {
                if (out.dims[size_t(k)] == 1) continue;
                bool c = false;
                for (size_t j = 0; j < op.attrs.dims.size(); ++j)
                    c |= op.attrs.dims[j] == k && in.dims[j] != 1;
                cov.push_back(c);
            }
            if (cov.size() >= 3 && cov.front() && cov.back() && d.back() == p.C &&
                std::count(cov.begin() + 1, cov.end() - 1, 1) == 0 &&
                d.front() * p.C == in.elements())
                p.Gb = d.front();
        }
    if (!p.rows)
        for (OpId id : f.ops) {
            const Op& op = g.op(id);
            if (op.kind == OpKind::Broadcast && g.shape(op.operands[0]).elements() > 1) {
                const auto d = nonunit(g.shape(op.results[0]).dims);
                p.rows = true;
                p.C = d.empty() ? 1 : d.back();
                p.R = d.empty() ? 1 : product(d, 0, d.size() - 1);
                // [G, C] broadcast over the middle dims: covered leading dims, then uncovered.
                const Shape& out = g.shape(op.results[0]);
                std::vector<int64_t> cov;
                for (int64_t k = 0; k < out.rank(); ++k) {
                    if (out.dims[size_t(k)] == 1) continue;
                    bool c = false;
                    for (size_t j = 0; j < op.attrs.dims.size(); ++j)
                        c |= op.attrs.dims[j] == k && g.shape(op.operands[0]).dims[j] != 1;
                    cov.push_back(c);
                }
                size_t lead = 0;
                while (lead < cov.size() && cov[lead]) ++lead;
                if (cov.size() >= 3 && cov.back() && lead > 0 && lead + 1 < cov.size() &&
                    std::count(cov.begin() + lead, cov.end() - 1, 1) == 0)
                    p.G = product(d, 0, lead);
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
        // (A one-value array too: broadcast, it is a scalar, a batch of one's [1] sum.)
        if (!p.rows) return g.shape(v).rank() == 0 || n == 1 ? View::Unknown : View::Full;
        const bool full = n == p.R * p.C, col = n == p.R, row = n == p.C;
        const int64_t groups = p.G > 1 ? p.G : p.Gb;
        const bool grow = groups > 1 && n == groups * p.C;
        if (full && !col && !row && !grow) return View::Full;
        if (col && !full && !row && !grow) return View::Col;
        if (row && !full && !col && !grow) return View::Row;
        if (grow && !full && !col && !row) return View::GroupRow;
        if (n == 1 && !full && !col && !row && !grow) return View::Scalar;
        return View::Unknown;
    };
    for (ValueId v : values) p.view[v] = by_count(v);
    for (bool changed = true; changed;) {
        changed = false;
        const auto set = [&](ValueId v, View w) {
            View& cur = p.view[v];
            if (cur == View::Literal || w == View::Unknown || cur == w) return;
            if (cur != View::Unknown) {
                if (same_at_unit_dims(p, cur, w)) return;
                not_generated(f, fmt::format("%{} used both as a row and as a column vector", v));
            }
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
                    set(res, p.total   ? View::Scalar
                             : p.G > 1 ? View::GroupRow
                             : p.major ? View::Row
                             : p.view[res] == View::Unknown && g.shape(res).elements() == p.R
                                 ? View::Col
                                 : View::Unknown);
                    break;
                case OpKind::Broadcast: {
                    const Shape& in = g.shape(op.operands[0]);
                    const Shape& out = g.shape(res);
                    if (in.elements() == 1) {  // a scalar to the space, or to a row or a column
                        set(op.operands[0], View::Scalar);
                        if (out.elements() == p.R * p.C) set(res, View::Full);
                        break;
                    }
                    set(res, View::Full);
                    // Which of the result's non-unit dims the operand covers.
                    std::vector<int64_t> covered(size_t(out.rank()), 0);
                    for (size_t d = 0; d < op.attrs.dims.size(); ++d)
                        if (in.dims[d] != 1) covered[size_t(op.attrs.dims[d])] = 1;
                    std::vector<int64_t> nz;
                    for (int64_t d = 0; d < out.rank(); ++d)
                        if (out.dims[size_t(d)] != 1) nz.push_back(covered[size_t(d)]);
                    const bool last = !nz.empty() && nz.back();
                    if ((p.G > 1 || p.Gb > 1) && in.elements() == std::max(p.G, p.Gb) * p.C &&
                        last) {
                        set(op.operands[0], View::GroupRow);
                        break;
                    }
                    const int64_t others =
                        std::count(nz.begin(), nz.end() - (nz.empty() ? 0 : 1), 1);
                    const int64_t nothers = nz.empty() ? 0 : int64_t(nz.size()) - 1;
                    if (last && others == 0)
                        set(op.operands[0], View::Row);
                    else if (!last && others == nothers)
                        set(op.operands[0], View::Col);
                    else if (last && others == nothers)
                        set(op.operands[0], View::Full);
                    else if (last && std::is_sorted(nz.begin(), nz.end()) && others > 0 &&
                             p.R % (in.elements() / p.C) == 0 && p.G == 1)
                        // New major dims only (a causal mask over the heads): the same rows
                        // again for each major index, the operand's address not advancing.
                        set(op.operands[0], View::Repeat);
                    else
                        not_generated(f, fmt::format("a broadcast {} -> {}", in.to_string(),
                                                     out.to_string()));
                    break;
                }
                default: {
                    View w = p.view[res];
                    // A reshape that only drops or inserts unit dims (PyTorch's [1, S, D] table
                    // viewed as [S, D] before its broadcast over the batch) names the same rows.
                    if (op.kind == OpKind::Reshape &&
                        nonunit(g.shape(op.operands[0]).dims) == nonunit(g.shape(res).dims) &&
                        (w == View::Repeat || p.view[op.operands[0]] == View::Repeat)) {
                        set(res, View::Repeat);
                        set(op.operands[0], View::Repeat);
                        break;
                    }
                    for (ValueId v : op.operands)
                        if (p.view[v] == View::Repeat)
                            not_generated(f, fmt::format("{} of a tile repeated along major dims",
                                                         op_name(op.kind)));
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
    pad_matrix_rows(g, f, p, board);
    // Layouts and dtypes of the arrays in HBM.
    p.lanes = std::min<int64_t>(p.C, vlanes);
    p.chunks = p.C > vlanes ? p.C / vlanes : 1;
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
        } else if (w == View::Repeat) {
            // Bands like a Full array's (checked once the band is known, below).
            const uint32_t b = band_of(f, fv.shape, fv.layout, p, vlanes);
            if (h && *h != b) not_generated(f, "arrays of one fusion in tiled and untiled layouts");
            h = b;
            p.repeat.push_back(fv.value);
        } else if (w == View::GroupRow) {
            // [G, C] in T(8,128) tiles (layout assignment tiles a rank-2 reduction result).
            const auto d = nonunit(fv.shape.dims);
            if (d.size() != 2 ||
                fv.layout.tile != std::vector<int64_t>{int64_t(board.core.vpu_sublanes), vlanes} ||
                fv.layout.minor_to_major.empty() ||
                fv.layout.minor_to_major[0] != fv.shape.rank() - 1)
                not_generated(f, fmt::format("a [groups, columns] array {} in layout {}",
                                             fv.shape.to_string(), fv.layout.to_string()));
        } else if (w == View::Col && !fv.layout.tile.empty()) {
            // [G, S] in T(8,128) tiles: loaded or stored whole, each band's 8 values found in it.
            // Or [B, H, S] (a softmax's statistics over a batch of sequences' heads): B
            // matrices of H rows, each padded to whole tiles, so the vector's row g is row
            // (g / H) Hp + g % H of the tiles (Hp: H rounded up to the tile's rows).
            const auto d = nonunit(fv.shape.dims);
            const int64_t rank = fv.shape.rank();
            bool row_major = true;
            for (size_t i = 0; i < fv.layout.minor_to_major.size(); ++i)
                row_major &= fv.layout.minor_to_major[i] == rank - 1 - int64_t(i);
            const bool batched = d.size() == 3 && row_major &&
                                 fv.shape.dims[size_t(rank - 1)] == d[2] &&
                                 fv.shape.dims[size_t(rank - 2)] == d[1];
            if ((d.size() != 2 && !batched) || fv.layout.minor_to_major.empty() ||
                fv.layout.minor_to_major[0] != fv.shape.rank() - 1 ||
                fv.layout.tile != std::vector<int64_t>{int64_t(board.core.vpu_sublanes), vlanes})
                not_generated(f, fmt::format("a vector {} in layout {}", fv.shape.to_string(),
                                             fv.layout.to_string()));
            const int64_t sub = board.core.vpu_sublanes;
            p.tiled_col[fv.value] = p.Rg ? (p.Rg + sub - 1) / sub * sub : d.back();
            if (batched) p.tiled_col_rows[fv.value] = d[1];
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
        bool reduces = false;
        for (OpId id : f.ops) reduces |= g.op(id).kind == OpKind::Reduce;
        if (p.h > 1) {
            // T(8,128) tiles: whole lane chunks, the padding computed on like data.
            p.lanes = vlanes;
            p.chunks = (p.C + vlanes - 1) / vlanes;
        } else if (p.C > vlanes && p.C % vlanes != 0) {
            // Untiled rows of partial chunks: each row padded to whole chunks in VMEM (the
            // evaluator's chunks of a minor reduction are the lane chunks, the padding masked).
            if (p.major || p.G > 1 || !p.tiled_col.empty() || p.Rg)
                not_generated(f, fmt::format("untiled rows of {} (not a multiple of {} lanes) "
                                             "beside groups or tiled vectors",
                                             p.C, vlanes));
            p.lanes = vlanes;
            p.chunks = (p.C + vlanes - 1) / vlanes;
            p.padded_rows = true;
        }
        p.Cp = p.lanes * p.chunks;
        if (p.major && p.h == 1) row_bands(p, board);
        if (p.major && p.h != board.core.vpu_sublanes)
            not_generated(f, "a reduction over major dims of untiled rows");
        for (const auto& [v, S] : p.tiled_col)
            if (p.h != board.core.vpu_sublanes || S % p.h)
                not_generated(f, fmt::format("a {} vector in tiles with bands of {} rows",
                                             g.shape(v).to_string(), p.h));
        for (ValueId v : p.repeat) {
            const auto it = std::find_if(f.operands.begin(), f.operands.end(),
                                         [&](const FusionValue& fv) { return fv.value == v; });
            // Padded rows: M untiled rows of C values, each padded to Cp as it is loaded.
            const int64_t M = g.shape(v).elements() / p.C;
            if (it == f.operands.end() || p.row_bands || M % p.h ||
                layout_bytes(it->shape, it->layout) !=
                    uint64_t(M / p.h) * p.h * (p.padded_rows ? p.C : p.Cp) * 4)
                not_generated(f, fmt::format("a {} array repeated over bands of {} x {}",
                                             g.shape(v).to_string(), p.h, p.Cp));
        }
        // Groups a broadcast alone sets may lie across untiled rows (one row a unit); those a
        // broadcast under a major reduction sets across its row bands (Plan::Gb): each row
        // finds its group's row.
        const bool row_groups = p.G > 1 && !reduces && p.h == 1;
        if (p.G > 1 && !row_groups && (p.h != board.core.vpu_sublanes || (p.R / p.G) % p.h))
            not_generated(f, fmt::format("groups of {} rows in bands of {}", p.R / p.G, p.h));
        if (p.Gb > 1 && (!p.row_bands || p.R % p.h || p.R % p.Gb))
            not_generated(f, fmt::format("groups of {} rows across bands of {}", p.R / p.Gb, p.h));
        // Padded rows: the last band's (a [R] vector's DMA reads and writes the rest of its
        // 256-byte allocation, never another buffer); a minor reduction's results there are
        // never stored as data, a major one masks them (emit_stream_fusion).
        p.units = uint64_t((p.R + p.h - 1) / p.h);
        p.full = uint32_t(p.h * p.Cp);
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
        if (p.tiled_col.count(fv.value)) {
            at[fv.value] = area(col);
            sp.fp.fixed.push_back(uint32_t(layout_bytes(fv.shape, fv.layout) / 4));
            fixed_of[fv.value] = int(sp.fp.fixed.size() - 1);
            sp.fixed_ins.push_back({st::Operand::hbm(addr), fixed_of[fv.value]});
        } else if (w == View::Full && p.row_bands && p.R % p.h) {
            at[fv.value] = area(full);
            sp.ins.emplace_back(st::Operand::hbm(addr), at[fv.value],
                                row_band_transfer(p, addr, at[fv.value], true));
        } else if (w == View::Full && p.padded_rows) {
            at[fv.value] = area(full);
            sp.ins.emplace_back(st::Operand::hbm(addr), at[fv.value],
                                padded_row_transfer(p, addr, at[fv.value], true));
        } else if (w == View::Full || w == View::Col) {
            at[fv.value] = area(w == View::Full ? full : col);
            sp.ins.emplace_back(st::Operand::hbm(addr), at[fv.value]);
        } else if (w == View::Repeat && p.padded_rows) {
            // The table's rows once, each padded to Cp like the rows it is added to.
            const int64_t M = fv.shape.elements() / p.C;
            sp.fp.fixed.push_back(uint32_t(M * p.Cp));
            fixed_of[fv.value] = int(sp.fp.fixed.size() - 1);
            sp.fixed_ins.push_back({st::Operand::hbm(addr), fixed_of[fv.value], uint32_t(p.C),
                                    uint32_t(M), uint32_t(p.Cp)});
        } else if (w == View::GroupRow || w == View::Repeat) {  // the whole array, once
            sp.fp.fixed.push_back(uint32_t(layout_bytes(fv.shape, fv.layout) / 4));
            fixed_of[fv.value] = int(sp.fp.fixed.size() - 1);
            sp.fixed_ins.push_back({st::Operand::hbm(addr), fixed_of[fv.value]});
        } else {
            // A row in whole lane chunks (the pattern reads them), of which C values are data.
            const uint32_t n = w == View::Row ? uint32_t(p.Cp) : 1;
            sp.fp.fixed.push_back(n);
            fixed_of[fv.value] = int(sp.fp.fixed.size() - 1);
            sp.fixed_ins.push_back(
                {st::Operand::hbm(addr), fixed_of[fv.value], w == View::Row ? uint32_t(p.C) : 1u});
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
    bool tiled = p.h > 1 && !p.row_bands;
    const int64_t Ct = p.chunks;
    const int64_t vl = board.core.vpu_lanes;
    bool need_lane_mask = false;  // 1.0 on data lanes, 0.0 on padding (a minor reduction's)
    // Scratch areas per op, planned while walking the ops.
    struct Step {
        OpId op;
        std::vector<int> tmp;
        bool once = false;  ///< a row computed once per slot on its broadcast pattern
    };
    std::vector<std::pair<ValueId, int>> input_patterns;  // row inputs a row op reads
    std::vector<Step> steps;
    std::map<OpId, int> exponent;  // a power's literal integer exponent
    for (OpId id : f.ops) {
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        const View w = p.view.at(res);
        Step s{id, {}};
        const auto per = [&] { return w == View::Col ? col : full; };
        // A [Gb, C] array across row bands (Plan::Gb) is only read by its broadcast.
        if (p.Gb > 1 && w == View::GroupRow)
            not_generated(f, fmt::format("{} computed on a [groups, columns] array",
                                         op_name(op.kind)));
        // An op on rows (var + eps of [C]) runs once per slot on the rows' broadcast patterns,
        // so its result is already the pattern its broadcast reads.
        if (w == View::Row && op.kind != OpKind::Literal && op.kind != OpKind::Broadcast &&
            !(op.kind == OpKind::Reduce && p.major)) {
            s.once = true;
            for (ValueId v : op.operands) {
                const View wv = p.view.at(v);
                if (wv == View::Literal || (wv == View::Row && at.count(v))) continue;
                if (wv != View::Row || !fixed_of.count(v))
                    not_generated(f, fmt::format("{} of a row and a {} value", op_name(op.kind),
                                                 g.shape(v).to_string()));
                at[v] = area(full);
                input_patterns.push_back({v, at[v]});
            }
        }
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
                if (w == View::Repeat) {  // a repeated table's view: its fixed area
                    fixed_of[res] = fixed_of.at(op.operands[0]);
                    s.tmp = {-1};
                    break;
                }
                at[res] = at.at(op.operands[0]);
                s.tmp = {-1};  // an alias: nothing to emit
                break;
            case OpKind::Broadcast: {
                const ValueId in = op.operands[0];
                const View wi = p.view.at(in);
                if (wi == View::Full || wi == View::Literal || (wi == w) ||
                    (wi == View::Row && at.count(in))) {
                    at[res] = at.at(in);
                    s.tmp = {-1};
                } else if (wi == View::GroupRow) {  // its group's row, per band
                    at[res] = area(full);
                    s.tmp = {-4};
                } else if (wi == View::Repeat) {  // its band of the repeated rows, per band
                    at[res] = area(full);
                    s.tmp = {-5};
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
            case OpKind::Reduce: {
                const float ident = op.attrs.reducer == Reducer::Sum
                                        ? 0.0f
                                        : -std::numeric_limits<float>::infinity();
                if (p.major) {
                    // Partials per sublane (a band's registers), their transpose, the row.
                    const auto fixed = [&](uint32_t n) {
                        sp.fp.fixed.push_back(n);
                        return int(sp.fp.fixed.size() - 1);
                    };
                    // A group's row goes into the whole tiled [G, C] result (stored once).
                    fixed_of[res] = fixed(p.total   ? 1u
                                          : p.G > 1 ? uint32_t((p.G + p.h - 1) / p.h * full)
                                                    : uint32_t(p.C));
                    s.tmp = {fixed(full), fixed(full)};
                    if (p.total)  // the column results, the lane chunks' results
                        s.tmp.insert(s.tmp.end(),
                                     {fixed(uint32_t(p.C)), fixed(uint32_t((p.C + vl - 1) / vl))});
                    break;
                }
                at[res] = area(col);
                s.tmp = {-3, -3, -3};
                if (Ct > 1) {
                    s.tmp[0] = area(uint32_t(Ct * p.h));
                    if (tiled) s.tmp[1] = area(uint32_t(Ct * p.h));
                }
                if (p.Cp != p.C) {  // padded lanes read as the identity
                    s.tmp.push_back(area(full));
                    s.tmp.push_back(constant(ident));
                    need_lane_mask = true;
                }
                break;
            }
            case OpKind::Div:
                at[res] = area(per());
                s.tmp = {area(per()), area(per()), constant(0.0f)};
                break;
            case OpKind::Compare:
                at[res] = area(per());
                if (op.attrs.comparison != Comparison::Gt && op.attrs.comparison != Comparison::Lt)
                    s.tmp = {area(per())};  // built from > (vpu_compare order in the evaluator)
                break;
            case OpKind::Abs:
                at[res] = area(per());
                s.tmp = {area(per())};
                break;
            case OpKind::Sqrt:
                at[res] = area(per());
                s.tmp = {area(per()), area(per()), constant(0.0f)};
                break;
            case OpKind::Erf:
                at[res] = area(per());
                s.tmp = {area(per()), area(per()), area(per()), constant(0.0f)};
                break;
            case OpKind::Pow: {
                // XLA's algebraic simplifier rewrites only pow(x, 2) to x * x (and 0, 1, -1):
                // a literal integer exponent is multiplied out here (vpu_pow), so GELU's x^3
                // is two products; any other power has no VPU lowering.
                const int n = literal_exponent(g, op.operands[1]);
                if (n < 0)
                    not_generated(f, "a power whose exponent is not a literal integer in [0, " +
                                         std::to_string(kVpuPowMax) + "]");
                exponent[id] = n;
                if (n == 0) {
                    at[res] = constant(1.0f);
                    s.tmp = {-1};
                } else if (n == 1) {
                    at[res] = at.at(op.operands[0]);
                    s.tmp = {-1};
                } else {
                    at[res] = area(per());
                }
                break;
            }
            default:
                if (!has_vpu_lowering(op.kind))
                    not_generated(f, fmt::format("op {} (in a {} fusion)", op_name(op.kind),
                                                 fusion_kind_name(f.kind)));
                at[res] = area(per());
        }
        if (op.kind == OpKind::Broadcast && p.major && inside_fusion(f, g, op.operands[0]) &&
            g.producer(op.operands[0]).kind == OpKind::Reduce)
            not_generated(f, "a broadcast of a result the fusion reduces over its rows");
        if (w == View::Row || w == View::Scalar)
            if (op.kind != OpKind::Literal && !(s.tmp.size() == 1 && s.tmp[0] == -1) &&
                !(op.kind == OpKind::Reduce && p.major) && !s.once)
                not_generated(f, fmt::format("{} computed on a {} vector", op_name(op.kind),
                                             w == View::Row ? "row" : "scalar"));
        steps.push_back(std::move(s));
    }
    bool need_negzero = false, need_ones = false;
    for (const Step& s : steps) {
        if (g.op(s.op).kind != OpKind::Broadcast || (!s.tmp.empty() && s.tmp[0] == -1)) continue;
        const bool pattern = !s.tmp.empty() && s.tmp[0] == -2;
        const bool repeat = !s.tmp.empty() && s.tmp[0] == -5;
        const bool group = !s.tmp.empty() && s.tmp[0] == -4;
        need_negzero |= pattern || tiled || repeat || group;
        need_ones |= !pattern && !repeat;
    }
    const int negzero =
        need_negzero || need_lane_mask || !input_patterns.empty() ? constant(-0.0f) : -1;
    const int ones = need_ones ? constant(1.0f) : -1;
    // The lane mask: a row of C ones in whole chunks (a fixed area), as a pattern per slot.
    int mask_row = -1, lane_mask = -1;
    if (need_lane_mask) {
        sp.fp.fixed.push_back(uint32_t(p.Cp));
        mask_row = int(sp.fp.fixed.size() - 1);
        lane_mask = area(full);
    }
    // Outputs.
    for (const FusionValue& fv : f.results) {
        const View w = p.view.at(fv.value);
        if ((w == View::Row || w == View::Scalar || w == View::GroupRow) && p.major &&
            g.producer(fv.value).kind == OpKind::Reduce) {
            sp.fixed_outs.push_back({st::Operand::hbm(bases.of(fv.buffer)), fixed_of.at(fv.value)});
            continue;
        }
        if (p.tiled_col.count(fv.value)) {
            sp.fp.fixed.push_back(uint32_t(layout_bytes(fv.shape, fv.layout) / 4));
            fixed_of[fv.value] = int(sp.fp.fixed.size() - 1);
            sp.fixed_outs.push_back({st::Operand::hbm(bases.of(fv.buffer)), fixed_of[fv.value]});
            continue;
        }
        if (w != View::Full && w != View::Col)
            not_generated(f, fmt::format("a {} result", fv.shape.to_string()));
        if (w == View::Full && p.row_bands && p.R % p.h) {
            const isa::Arg addr = bases.of(fv.buffer);
            sp.outs.emplace_back(st::Operand::hbm(addr), at.at(fv.value),
                                 row_band_transfer(p, addr, at.at(fv.value), false));
            continue;
        }
        if (w == View::Full && p.padded_rows) {
            const isa::Arg addr = bases.of(fv.buffer);
            sp.outs.emplace_back(st::Operand::hbm(addr), at.at(fv.value),
                                 padded_row_transfer(p, addr, at.at(fv.value), false));
            continue;
        }
        sp.outs.emplace_back(st::Operand::hbm(bases.of(fv.buffer)), at.at(fv.value));
    }
    // A band that does not fit VMEM twice (rows of tens of thousands of values) is a shape the
    // emitter does not cover yet (a row split into passes), not a device error.
    uint32_t tile = 0;
    try {
        tile = st::plan(sp.fp, b.vmem_free());
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("a band of {} x {} values in VMEM ({})", p.h, p.Cp, e.what()));
    }

    // Once per fusion: the lane mask's row; a major reduction's partials at the identity.
    sp.prologue = [&](st::Body& body) {
        if (mask_row >= 0) {
            const isa::Arg m = body.f(mask_row);
            body.vpu(Opcode::VCmpGt, {m, m, m, imm(p.Cp)});
            body.vpu(Opcode::VAddS, {m, m, fimm(1.0f), imm(p.C)});
        }
        for (const Step& s : steps) {
            const Op& op = g.op(s.op);
            if (op.kind != OpKind::Reduce || !p.major) continue;
            const isa::Arg acc = body.f(s.tmp[0]);
            body.vpu(Opcode::VCmpGt, {acc, acc, acc, imm(full)});
            if (op.attrs.reducer == Reducer::Max)
                body.vpu(Opcode::VAddS,
                         {acc, acc, fimm(-std::numeric_limits<float>::infinity()), imm(full)});
        }
    };
    // After the last band: each column's sublane partials (transposed per lane chunk to
    // [column][sublane]) reduced from the identity, in sublane order.
    if (p.major && p.G == 1)
        sp.finish = [&](st::Body& body) {
            for (const Step& s : steps) {
                const Op& op = g.op(s.op);
                if (op.kind != OpKind::Reduce) continue;
                const isa::Arg acc = body.f(s.tmp[0]), tr = body.f(s.tmp[1]);
                const int64_t chunk = int64_t(p.h) * p.lanes * 4;
                if (p.row_bands)  // [row][C]: to [C][row] at once, as the chunks below give
                    body.vpu(Opcode::VTrans, {tr, acc, imm(p.h), imm(p.Cp)});
                else
                    for (int64_t t = 0; t < Ct; ++t)
                        body.vpu(Opcode::VTrans,
                                 {tr + t * chunk, acc + t * chunk, imm(p.h), imm(p.lanes)});
                const Opcode red = op.attrs.reducer == Reducer::Sum ? Opcode::VRSum : Opcode::VRMax;
                const isa::Arg res = body.f(fixed_of.at(op.results[0]));
                if (!p.total) {
                    body.vpu(red, {res, tr, imm(p.C), imm(p.h)});
                    continue;
                }
                // The row of column results in chunks of vpu_lanes, then the chunks' results.
                const isa::Arg cols = body.f(s.tmp[2]), part = body.f(s.tmp[3]);
                body.vpu(red, {cols, tr, imm(p.C), imm(p.h)});
                const int64_t n = (p.C + vl - 1) / vl;
                for (int64_t t = 0; t < n; ++t)
                    body.vpu(red, {n == 1 ? res : part + t * 4, cols + t * vl * 4, imm(1),
                                   imm(std::min<int64_t>(vl, p.C - t * vl))});
                if (n > 1) body.vpu(red, {res, part, imm(1), imm(n)});
            }
        };

    sp.body = [&](st::Body& body) {
        isa::Builder& bb = body.builder();
        const isa::Reg nf = bb.reg("n.full"), nc = bb.reg("n.col");
        bb.emit(Opcode::Mul, {nf, body.units(), imm(full)});
        bb.emit(Opcode::Mul, {nc, body.units(), imm(col)});
        const int64_t tile_full = int64_t(tile) * full;
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
        const auto emit_step = [&](const Step& s) {
            const Op& op = g.op(s.op);
            if (!s.tmp.empty() && s.tmp[0] == -1) return;
            const ValueId res = op.results[0];
            const View w = p.view.at(res);
            const isa::Arg n = s.once           ? imm(tile_full)
                               : w == View::Col ? isa::Arg(nc)
                                                : isa::Arg(nf);
            const auto A = [&](size_t i) { return body.a(at.at(op.operands[i])); };
            const isa::Arg out = at.count(res) ? body.a(at.at(res)) : imm(0);  // a row: fixed
            switch (op.kind) {
                case OpKind::Literal:
                    break;
                case OpKind::Convert:  // f32 -> bf16: round, keep as f32 in VMEM
                    body.vpu(Opcode::VF2Bf, {body.a(s.tmp[0]), A(0), n});
                    body.vpu(Opcode::VBf2F, {out, body.a(s.tmp[0]), n});
                    break;
                case OpKind::Broadcast: {
                    if (!s.tmp.empty() && s.tmp[0] == -5) {
                        // Band u of the tile is band (first + u) mod M / h of the array, + -0.0
                        // (a copy, bit-exact: x + -0.0 is x for every x, -0.0 included). The
                        // bands from there to the array's end (or the tile's) are contiguous
                        // in both: one copy per run, not per band (a [17, 192] table over
                        // rows of a batch of sequences: a copy per sequence, not per row).
                        const int64_t bpr = g.shape(op.operands[0]).elements() / p.C / p.h;
                        const int64_t band = int64_t(full) * 4;
                        const isa::Reg k = bb.reg("band"), left = bb.reg("left"),
                                       len = bb.reg("len"), d = bb.reg("dst"), q = bb.reg("q");
                        const isa::Arg src = body.f(fixed_of.at(op.operands[0]));
                        const isa::Label run = bb.label("repeat_run");
                        bb.emit(Opcode::Li, {k, imm(0)});
                        bb.emit(Opcode::Add, {left, body.units(), imm(0)});
                        bb.bind(run);
                        bb.emit(Opcode::Add, {q, body.first(), k});
                        bb.emit(Opcode::Remu, {q, q, imm(bpr)});
                        bb.emit(Opcode::Li, {len, imm(bpr)});
                        bb.emit(Opcode::Sub, {len, len, q});  // to the array's last band
                        bb.if_(isa::Cond::Ltu, left, len, [&] {
                            bb.emit(Opcode::Add, {len, left, imm(0)});
                        });
                        bb.emit(Opcode::Mul, {q, q, imm(band)});
                        bb.emit(Opcode::Add, {q, q, src});
                        bb.emit(Opcode::Mul, {d, k, imm(band)});
                        bb.emit(Opcode::Add, {d, d, out});
                        bb.emit(Opcode::Add, {k, k, len});
                        bb.emit(Opcode::Sub, {left, left, len});
                        bb.emit(Opcode::Mul, {len, len, imm(full)});
                        body.vpu(Opcode::VAdd, {d, q, body.a(negzero), len});
                        bb.emit(Opcode::Bne, {left, imm(0), run});
                        break;
                    }
                    if (!s.tmp.empty() && s.tmp[0] == -4 && p.Gb > 1) {
                        // Row bands ([row][C]) over groups of R / Gb rows that the bands cross:
                        // each row its group's row (in the [Gb, C] array's T(8,128) tiles),
                        // chunk by chunk, on a row of -0.0.
                        const int64_t rpg = p.R / p.Gb, gh = board.core.vpu_sublanes;
                        const int64_t gchunk = gh * p.lanes * 4, lane_bytes = p.lanes * 4;
                        const isa::Reg k = bb.reg("band"), i = bb.reg("band_row"),
                                       r = bb.reg("row"), d = bb.reg("dst"), q = bb.reg("q");
                        const isa::Arg src = body.f(fixed_of.at(op.operands[0]));
                        bb.loop(k, imm(0), body.units(), 1, [&] {
                            bb.loop(i, imm(0), imm(p.h), 1, [&] {
                                bb.emit(Opcode::Add, {q, body.first(), k});
                                bb.emit(Opcode::Mul, {q, q, imm(p.h)});
                                bb.emit(Opcode::Add, {q, q, i});
                                bb.emit(Opcode::Divu, {q, q, imm(rpg)});  // the group
                                group_row(bb, r, q, src, gh, Ct, gchunk);
                                bb.emit(Opcode::Mul, {d, k, imm(p.h)});
                                bb.emit(Opcode::Add, {d, d, i});
                                bb.emit(Opcode::Mul, {d, d, imm(p.Cp * 4)});
                                bb.emit(Opcode::Add, {d, d, out});
                                for (int64_t t = 0; t < Ct; ++t)
                                    body.vpu(Opcode::VAddRow,
                                             {d + t * lane_bytes, body.a(negzero), r + t * gchunk,
                                              imm(1), imm(p.lanes)});
                            });
                        });
                        break;
                    }
                    if (!s.tmp.empty() && s.tmp[0] == -4) {
                        // Per band: its group's row, chunk by chunk, on 8 rows of -0.0 (untiled
                        // rows: on one row; the [G, C] array in T(8,128) tiles either way).
                        const int64_t bpg = p.R / p.G / p.h, chunk = int64_t(p.h) * p.lanes * 4;
                        const int64_t gh = board.core.vpu_sublanes, gchunk = gh * p.lanes * 4;
                        const isa::Reg k = bb.reg("band"), r = bb.reg("row"), d = bb.reg("dst"),
                                       q = bb.reg("q");
                        const isa::Arg src = body.f(fixed_of.at(op.operands[0]));
                        bb.loop(k, imm(0), body.units(), 1, [&] {
                            bb.emit(Opcode::Add, {q, body.first(), k});
                            bb.emit(Opcode::Divu, {q, q, imm(bpg)});  // the group
                            group_row(bb, r, q, src, gh, Ct, gchunk);
                            bb.emit(Opcode::Mul, {d, k, imm(int64_t(full) * 4)});
                            bb.emit(Opcode::Add, {d, d, out});
                            for (int64_t t = 0; t < Ct; ++t)
                                body.vpu(Opcode::VAddRow, {d + t * chunk, body.a(negzero),
                                                           r + t * gchunk, imm(p.h), imm(p.lanes)});
                        });
                        break;
                    }
                    if (s.tmp.empty() || s.tmp[0] == -2) {
                        if (s.tmp.empty()) {  // Col, untiled: rows of C
                            body.vpu(Opcode::VMulCol, {out, body.a(ones), A(0), nc, imm(p.Cp)});
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
                    if (p.G > 1) {
                        // Each band into the sublane partials; at a group's last band, its row
                        // of results (as `finish` below) and the partials back to the identity.
                        const Opcode acc_op = sum ? Opcode::VAdd : Opcode::VMax;
                        const Opcode red = sum ? Opcode::VRSum : Opcode::VRMax;
                        const isa::Arg acc = body.f(s.tmp[0]), tr = body.f(s.tmp[1]);
                        const isa::Arg res = body.f(fixed_of.at(op.results[0]));
                        const int64_t bpg = p.R / p.G / p.h, chunk = int64_t(p.h) * p.lanes * 4;
                        const isa::Reg k = bb.reg("band"), a = bb.reg("band.src"), q = bb.reg("q"),
                                       r = bb.reg("row");
                        bb.loop(k, imm(0), body.units(), 1, [&] {
                            bb.emit(Opcode::Mul, {a, k, imm(int64_t(full) * 4)});
                            bb.emit(Opcode::Add, {a, a, A(0)});
                            body.vpu(acc_op, {acc, acc, a, imm(full)});
                            bb.emit(Opcode::Add, {q, body.first(), k});
                            bb.emit(Opcode::Remu, {a, q, imm(bpg)});
                            bb.if_(isa::Cond::Eq, a, imm(bpg - 1), [&] {
                                bb.emit(Opcode::Divu, {q, q, imm(bpg)});
                                group_row(bb, r, q, res, p.h, Ct, chunk);
                                for (int64_t t = 0; t < Ct; ++t)
                                    body.vpu(Opcode::VTrans, {tr + t * chunk, acc + t * chunk,
                                                              imm(p.h), imm(p.lanes)});
                                for (int64_t t = 0; t < Ct; ++t)
                                    body.vpu(red,
                                             {r + t * chunk, tr + t * chunk,
                                              imm(std::min<int64_t>(p.lanes, p.C - t * p.lanes)),
                                              imm(p.h)});
                                body.vpu(Opcode::VCmpGt, {acc, acc, acc, imm(full)});
                                if (!sum)
                                    body.vpu(
                                        Opcode::VAddS,
                                        {acc, acc, fimm(-std::numeric_limits<float>::infinity()),
                                         imm(full)});
                            });
                        });
                        break;
                    }
                    if (p.major) {
                        // Each band into the sublane partials; of the array's last band only
                        // its rows of data (contiguous within each lane chunk).
                        const Opcode acc_op = sum ? Opcode::VAdd : Opcode::VMax;
                        const isa::Arg acc = body.f(s.tmp[0]);
                        const int64_t last_rows = p.R % p.h;
                        const isa::Reg k = bb.reg("band"), a = bb.reg("band.src"),
                                       whole = bb.reg("bands");
                        bb.emit(Opcode::Add, {whole, body.units(), imm(0)});
                        bb.emit(Opcode::Add, {t0, body.first(), body.units()});
                        if (last_rows)
                            bb.if_(isa::Cond::Eq, t0, imm(int64_t(p.units)), [&] {
                                bb.emit(Opcode::Sub, {whole, whole, imm(1)});
                            });
                        bb.if_(isa::Cond::Ne, whole, imm(0), [&] {
                            bb.loop(k, imm(0), whole, 1, [&] {
                                bb.emit(Opcode::Mul, {a, k, imm(int64_t(full) * 4)});
                                bb.emit(Opcode::Add, {a, a, A(0)});
                                body.vpu(acc_op, {acc, acc, a, imm(full)});
                            });
                        });
                        if (last_rows)
                            bb.if_(isa::Cond::Eq, t0, imm(int64_t(p.units)), [&] {
                                bb.emit(Opcode::Mul, {a, whole, imm(int64_t(full) * 4)});
                                bb.emit(Opcode::Add, {a, a, A(0)});
                                const int64_t chunk = int64_t(p.h) * p.lanes * 4;
                                if (p.row_bands)  // [row][C]: the data rows are contiguous
                                    body.vpu(acc_op, {acc, acc, a, imm(last_rows * p.Cp)});
                                else
                                    for (int64_t t = 0; t < Ct; ++t)
                                        body.vpu(acc_op, {acc + t * chunk, acc + t * chunk,
                                                          a + t * chunk, imm(last_rows * p.lanes)});
                            });
                        break;
                    }
                    const Opcode red = sum ? Opcode::VRSum : Opcode::VRMax;
                    isa::Arg src = A(0);
                    if (p.Cp != p.C) {  // padded lanes: the identity
                        const isa::Arg masked = body.a(s.tmp[3]);
                        body.vpu(Opcode::VSel,
                                 {masked, body.a(lane_mask), src, body.a(s.tmp[4]), nf});
                        src = masked;
                    }
                    if (Ct == 1) {
                        bb.emit(Opcode::Mul, {t0, body.units(), imm(p.h)});
                        body.vpu(red, {out, src, t0, imm(p.Cp)});
                        break;
                    }
                    const isa::Arg part = body.a(s.tmp[0]);
                    bb.emit(Opcode::Mul, {t0, body.units(), imm(Ct * p.h)});
                    body.vpu(red, {part, src, t0, imm(p.lanes)});
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
                case OpKind::Compare: {
                    const Comparison c = op.attrs.comparison;
                    if (c == Comparison::Gt || c == Comparison::Lt) {
                        body.vpu(Opcode::VCmpGt, {out, A(c == Comparison::Gt ? 0 : 1),
                                                  A(c == Comparison::Gt ? 1 : 0), n});
                        break;
                    }
                    // a >= b is 1 - (b > a); a <= b is 1 - (a > b); == is 1 - both; != both.
                    const isa::Arg t = body.a(s.tmp[0]);
                    if (c == Comparison::Ge || c == Comparison::Eq)
                        body.vpu(Opcode::VCmpGt, {out, A(1), A(0), n});
                    if (c == Comparison::Le) body.vpu(Opcode::VCmpGt, {out, A(0), A(1), n});
                    if (c == Comparison::Eq || c == Comparison::Ne) {
                        body.vpu(Opcode::VCmpGt, {t, A(0), A(1), n});
                        if (c == Comparison::Ne) body.vpu(Opcode::VCmpGt, {out, A(1), A(0), n});
                        body.vpu(Opcode::VAdd, {out, out, t, n});
                    }
                    if (c != Comparison::Ne) {
                        body.vpu(Opcode::VMulS, {out, out, fimm(-1.0f), n});
                        body.vpu(Opcode::VAddS, {out, out, fimm(1.0f), n});
                    }
                    break;
                }
                case OpKind::Abs: {  // vpu_abs: max(x, -x)
                    const isa::Arg t = body.a(s.tmp[0]);
                    body.vpu(Opcode::VMulS, {t, A(0), fimm(-1.0f), n});
                    body.vpu(Opcode::VMax, {out, A(0), t, n});
                    break;
                }
                case OpKind::Sqrt: {  // vpu_sqrt: x * rsqrt(x) for x > 0, x at +-0, NaN below
                    const isa::Arg t = body.a(s.tmp[0]), m = body.a(s.tmp[1]),
                                   zero = body.a(s.tmp[2]);
                    body.vpu(Opcode::VRsqrt, {t, A(0), n});
                    body.vpu(Opcode::VMul, {out, A(0), t, n});
                    body.vpu(Opcode::VCmpGt, {m, A(0), zero, n});
                    body.vpu(Opcode::VSel, {out, m, out, A(0), n});
                    body.vpu(Opcode::VCmpGt, {m, zero, A(0), n});
                    body.vpu(Opcode::VSel, {out, m, t, out, n});
                    break;
                }
                case OpKind::Erf: {  // vpu_erf: Abramowitz and Stegun 7.1.26
                    const isa::Arg ax = body.a(s.tmp[0]), t = body.a(s.tmp[1]),
                                   e = body.a(s.tmp[2]), zero = body.a(s.tmp[3]);
                    body.vpu(Opcode::VMulS, {ax, A(0), fimm(-1.0f), n});
                    body.vpu(Opcode::VMax, {ax, A(0), ax, n});
                    body.vpu(Opcode::VMulS, {t, ax, fimm(kErfP), n});
                    body.vpu(Opcode::VAddS, {t, t, fimm(1.0f), n});
                    body.vpu(Opcode::VRsqrt, {t, t, n});  // vpu_reciprocal of a positive value
                    body.vpu(Opcode::VMul, {t, t, t, n});
                    body.vpu(Opcode::VMulS, {out, t, fimm(kErfA[4]), n});
                    for (int i = 3; i >= 0; --i) {
                        body.vpu(Opcode::VAddS, {out, out, fimm(kErfA[i]), n});
                        body.vpu(Opcode::VMul, {out, out, t, n});
                    }
                    body.vpu(Opcode::VMul, {e, ax, ax, n});
                    body.vpu(Opcode::VMulS, {e, e, fimm(-1.0f), n});
                    body.vpu(Opcode::VExp, {e, e, n});
                    body.vpu(Opcode::VMul, {out, out, e, n});
                    body.vpu(Opcode::VMulS, {out, out, fimm(-1.0f), n});
                    body.vpu(Opcode::VAddS, {out, out, fimm(1.0f), n});
                    body.vpu(Opcode::VMulS, {t, out, fimm(-1.0f), n});
                    body.vpu(Opcode::VCmpGt, {e, zero, A(0), n});
                    body.vpu(Opcode::VSel, {out, e, t, out, n});
                    break;
                }
                case OpKind::Pow: {  // vpu_pow: x * x * ... left to right
                    const int e = exponent.at(s.op);
                    body.vpu(Opcode::VMul, {out, A(0), A(0), n});
                    for (int i = 2; i < e; ++i) body.vpu(Opcode::VMul, {out, out, A(0), n});
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
        };
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
                             {out, body.a(negzero), src, imm(tile * p.h), imm(p.Cp)});
                } else {
                    for (uint32_t u = 0; u < tile; ++u)
                        for (int64_t t = 0; t < Ct; ++t)
                            body.vpu(
                                Opcode::VAddRow,
                                {out + int64_t((u * Ct + t) * p.h * p.lanes * 4), body.a(negzero),
                                 src + int64_t(t * p.lanes * 4), imm(p.h), imm(p.lanes)});
                }
            }
            if (lane_mask >= 0)
                for (uint32_t u = 0; u < tile; ++u)
                    for (int64_t t = 0; t < Ct; ++t)
                        body.vpu(Opcode::VAddRow,
                                 {body.a(lane_mask) + int64_t((u * Ct + t) * p.h * p.lanes * 4),
                                  body.a(negzero), body.f(mask_row) + int64_t(t * p.lanes * 4),
                                  imm(p.h), imm(p.lanes)});
            // Rows a row op reads (as the broadcasts above), then the row ops, in order.
            for (const auto& [v, a] : input_patterns)
                for (uint32_t u = 0; u < (tiled ? tile : 1u); ++u)
                    for (int64_t t = 0; t < (tiled ? Ct : 1); ++t)
                        body.vpu(
                            Opcode::VAddRow,
                            {body.a(a) + int64_t((u * Ct + t) * p.h * p.lanes * 4), body.a(negzero),
                             body.f(fixed_of.at(v)) + int64_t(t * p.lanes * 4),
                             imm(tiled ? p.h : tile * p.h), imm(tiled ? p.lanes : p.Cp)});
            for (const Step& s : steps)
                if (s.once) emit_step(s);
        });
        // Tiled [G, S] vectors: the tile's values between the slot (row order, 8 per band) and
        // the whole array (row r at [r / S][r % S] in T(8,128) tiles). Rows in one group and one
        // lane chunk are contiguous in both, so the tile moves in runs of up to a lane chunk
        // (one v.adds each, exact), not band by band: the address arithmetic per run is about
        // 25 scalar instructions, which per 8-row band made a softmax over [heads x S] rows of
        // S = 512 bound by the sequencer (two such vectors per band, about 45 cycles against
        // the 34 its 16 KiB take from HBM).
        const auto tiled_cols = [&](bool in) {
            for (const auto& entry : p.tiled_col) {
                // Named copies: a structured binding cannot be captured (clang before 16).
                const ValueId v = entry.first;
                const int64_t S = entry.second;
                if (in != !inside_fusion(f, g, v)) continue;
                const int64_t Sp = (S + p.lanes - 1) / p.lanes * p.lanes;
                const int64_t tile_bytes = int64_t(p.h) * p.lanes * 4;
                const isa::Reg row = bb.reg("row"), left = bb.reg("left"), sv = bb.reg("s"),
                               len = bb.reg("len"), a = bb.reg("at"), t = bb.reg("t"),
                               q = bb.reg("q"), sp = bb.reg("slot.at");
                bb.emit(Opcode::Mul, {row, body.first(), imm(p.h)});
                bb.emit(Opcode::Mul, {left, body.units(), imm(p.h)});
                bb.emit(Opcode::Li, {sp, imm(0)});
                bb.emit(Opcode::Add, {sp, sp, body.a(at.at(v))});
                const isa::Label run = bb.label("tiled_col_run");
                bb.bind(run);
                bb.emit(Opcode::Remu, {sv, row, imm(S)});  // s
                bb.emit(Opcode::Divu, {q, row, imm(S)});   // g
                if (const auto H = p.tiled_col_rows.find(v); H != p.tiled_col_rows.end()) {
                    // g's row of the tiles: its matrix's first, then its row in the matrix.
                    const int64_t Hp = (H->second + p.h - 1) / p.h * p.h;
                    bb.emit(Opcode::Divu, {a, q, imm(H->second)});
                    bb.emit(Opcode::Mul, {a, a, imm(Hp)});
                    bb.emit(Opcode::Remu, {q, q, imm(H->second)});
                    bb.emit(Opcode::Add, {q, q, a});
                }
                // a = (tile row of g * tiles per row + s / lanes) * tile bytes
                //     + (g % 8) * lanes * 4 + (s % lanes) * 4 + the array's base
                bb.emit(Opcode::Divu, {a, q, imm(p.h)});
                bb.emit(Opcode::Mul, {a, a, imm(Sp / p.lanes)});
                bb.emit(Opcode::Divu, {t, sv, imm(p.lanes)});
                bb.emit(Opcode::Add, {a, a, t});
                bb.emit(Opcode::Mul, {a, a, imm(tile_bytes)});
                bb.emit(Opcode::Remu, {q, q, imm(p.h)});
                bb.emit(Opcode::Mul, {q, q, imm(p.lanes * 4)});
                bb.emit(Opcode::Add, {a, a, q});
                bb.emit(Opcode::Add, {a, a, body.f(fixed_of.at(v))});
                bb.emit(Opcode::Remu, {t, sv, imm(p.lanes)});
                bb.emit(Opcode::Li, {len, imm(p.lanes)});
                bb.emit(Opcode::Sub, {len, len, t});  // to the end of the lane chunk
                bb.emit(Opcode::Mul, {t, t, imm(4)});
                bb.emit(Opcode::Add, {a, a, t});
                bb.emit(Opcode::Li, {q, imm(S)});
                bb.emit(Opcode::Sub, {q, q, sv});  // to the end of the group
                bb.if_(isa::Cond::Ltu, q, len, [&] { bb.emit(Opcode::Add, {len, q, imm(0)}); });
                bb.if_(isa::Cond::Ltu, left, len, [&] {
                    bb.emit(Opcode::Add, {len, left, imm(0)});
                });
                if (in)
                    body.vpu(Opcode::VAddS, {sp, a, fimm(-0.0f), len});
                else
                    body.vpu(Opcode::VAddS, {a, sp, fimm(-0.0f), len});
                bb.emit(Opcode::Add, {row, row, len});
                bb.emit(Opcode::Sub, {left, left, len});
                bb.emit(Opcode::Mul, {t, len, imm(4)});
                bb.emit(Opcode::Add, {sp, sp, t});
                bb.emit(Opcode::Bne, {left, imm(0), run});
            }
        };
        tiled_cols(true);
        for (const Step& s : steps)
            if (!s.once) emit_step(s);
        tiled_cols(false);
    };
    st::emit(b, sp, tile);
}

}  // namespace tpu::compiler::gen
