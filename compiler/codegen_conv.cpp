// SPDX-License-Identifier: Apache-2.0
// Convolution and pooling fusions (compiler/README.md, "Convolution and pooling fusions"):
// output fusions rooted at a convolution run driver::emit_conv2d with the fusion's epilogue,
// reduce-window fusions the pooling kernel, and the global average pool's reduction over H and W
// a column-sum kernel, each emitted into the step's one program.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"
#include "compiler/stages.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/epilogue.h"
#include "driver/kernels/matmul_kernel.h"
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

/// The fusion operand a kernel reads for `v`: `v` itself, or the operand a chain of reshapes in
/// the fusion starts from when that operand is untiled row-major (a row-major reshape moves no
/// data: the stem's [B, H W C] batch viewed as NHWC). With `views`, also through transposes
/// that are the same bytes in the operand's layout (an NCHW leaf laid out as NHWC, read
/// through the transpose to NHWC: layout assignment's conv_pool_preference): then a view of the
/// operand as `v`, row-major, kept in `views`. Null when `v` is computed otherwise.
const FusionValue* operand_through_reshapes(const Fusion& f, const Graph& g, ValueId v,
                                            std::deque<FusionValue>* views = nullptr) {
    const ValueId read = v;
    std::vector<const Op*> chain;  // from `read` back to the operand
    while (inside_fusion(f, g, v)) {
        const Op& op = g.op(g.value(v).producer);
        if (op.kind != OpKind::Reshape && !(views && op.kind == OpKind::Transpose)) return nullptr;
        chain.push_back(&op);
        v = op.operands[0];
    }
    const FusionValue* fv = operand_of(f, v);
    if (!fv || chain.empty()) return fv;
    if (!fv->layout.tile.empty()) return nullptr;
    // The layout each op's result has when it moves no data.
    Layout l = fv->layout;
    bool transposed = false;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        const Op& op = **it;
        if (op.kind == OpKind::Reshape) {
            if (!(l == row_major(g.shape(op.operands[0]).rank()))) return nullptr;
            l = row_major(g.shape(op.results[0]).rank());
            continue;
        }
        // Result dim i is operand dim perm[i]: the operand's minor dims become the result's
        // dims that read them.
        const std::vector<int64_t>& perm = op.attrs.dims;
        std::vector<int64_t> inv(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inv[size_t(perm[i])] = int64_t(i);
        for (int64_t& d : l.minor_to_major) d = inv[size_t(d)];
        transposed = true;
    }
    if (!(l == row_major(g.shape(read).rank()))) return nullptr;
    if (!transposed) return fv;
    views->push_back(FusionValue{read, g.shape(read), l, fv->buffer});
    return &views->back();
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
/// The Column sides are copied there too (NT C values each), so the kernel reaches every
/// per-channel operand through the arena's register and reads no padding past a [Cout] buffer.
struct ConvScratch {
    uint64_t x = 0, w = 0, bias = 0, column = 0, columns = 0;
    uint64_t total() const { return x + w + bias + columns; }
};
/// Column sides a convolution fusion may have: its f32 [Cout] operands.
uint32_t column_operands(const Graph& g, const Fusion& f, int64_t cout) {
    uint32_t n = 0;
    for (const FusionValue& fv : f.operands)
        n += fv.shape.dtype == DType::F32 && fv.shape.dims == std::vector<int64_t>{cout};
    return n;
}
uint64_t packed_w_bytes(const driver::Conv2dShape& s, const driver::Conv2dTiling& t) {
    return align512(uint64_t(t.NT) * s.kernel * s.kernel * t.CT * t.R * t.C * 2);
}

/// A 1 x 1 convolution of stride 1 without padding is a dot of the NHWC rows: XLA's algebraic
/// simplifier replaces such a convolution by a kDot (xla/service/algebraic_simplifier.cc,
/// SimplifyConvToDot). The dot kernel streams the `[N H W, Cin]` rows as they lie (each fp32
/// tile rounded to bf16 in VMEM) against the `[Cin, Cout]` filter, so the activation is not
/// re-packed into phase planes (a pass over it with one DMA round trip per plane row).
bool pointwise(const driver::Conv2dShape& s) {
    return s.kernel == 1 && s.stride == 1 && s.pad == 0;
}

/// Fewer output pixels than the MXU has rows (ResNet's 7 x 7 layer4 at batch 1): the implicit
/// GEMM holds each weight tile for fewer rows than it takes to push it, so it is weight-load
/// bound (144 tiles for a 3 x 3 512 -> 512 convolution, each for 49 rows). Folded into one dot
/// of im2col(x) (small: fewer than R rows), the dot planner can hold the pixels and stream the
/// filter instead, as it streams the longer side of any dot ("The stationary operand"). With
/// Cin a multiple of R each K tile of the folded dot is one tap's Cin tile, in the implicit
/// GEMM's order, so the bits are the same (the evaluator's conv2d_reference stays valid).
bool small_m(const driver::Conv2dShape& s, uint32_t R) {
    return s.cin % R == 0 && uint64_t(s.batch) * s.out_height() * s.out_width() < R;
}

/// The convolution is one dot kernel: of im2col(x) (folded taps, few pixels) or of x's rows.
bool as_dot(const driver::Conv2dShape& s, uint32_t R) {
    return detail::conv_folds_taps(s, R) || pointwise(s) || small_m(s, R);
}

/// Folded (conv2d_folds_taps): x is im2col(x), N Ho Wo x k k Cin fp32, and no w or bias; a
/// pointwise convolution's x is its operand (no scratch).
ConvScratch folded_scratch(const driver::Conv2dShape& s, uint32_t C, uint32_t columns) {
    ConvScratch c;
    if (!pointwise(s))
        c.x = align512(uint64_t(s.batch) * s.out_height() * s.out_width() * s.kernel * s.kernel *
                       s.cin * 4);
    c.column = align512(uint64_t((s.cout + C - 1) / C) * C * 4);
    c.columns = c.column * columns;
    return c;
}
ConvScratch conv_scratch(const driver::Conv2dShape& s, const driver::Conv2dTiling& t,
                         uint32_t columns) {
    ConvScratch c;
    c.column = align512(uint64_t(t.NT) * t.C * 4);
    c.columns = c.column * columns;
    c.x = align512(driver::conv2d_packed_x_bytes(s, t));
    // The packed filter keeps room here even when it is a derived buffer: a segment with more
    // than kMaxDerived of those packs the rest here on every launch.
    c.w = packed_w_bytes(s, t);
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
    return {};
}

/// An elementwise value against the [pixels, C] tiles an epilogue works on: the result tile,
/// a tile of a Full side (an NHWC array read from memory), a tile area of its own, one value
/// per channel (a Column side read from memory, or a column area computed from them), or a
/// literal.
struct Val {
    enum class K : uint8_t { Full, Column, Scalar } k = K::Full;
    int area = -1;     ///< Full: -1 the result tile, -2 - i Full side i, >= 0 a tile area;
                       ///< Column: -1 Column side `side`, >= 0 a column area
    size_t side = 0;   ///< Column side
    float scalar = 0;  ///< Scalar
};

/// One placed elementwise op.
struct Step {
    OpKind kind = OpKind::Add;
    Comparison comparison = Comparison::Gt;
    std::vector<Val> in;
    Val out;
};

/// Elementwise ops of a fusion placed against NHWC tiles (a convolution's epilogue, or a
/// streaming pass before a pooling kernel): ops on [C] vectors (the inference batch-norm's
/// scale and shift) run on column areas, ops on NHWC arrays on tile areas.
/// Column sides at or past this index are image rows (Placed::rows): one `[N, C]` row per image,
/// broadcast over its pixels (a streaming pass's tiles never straddle two images).
constexpr size_t kRowSide = 1 << 20;

struct Placed {
    std::vector<const FusionValue*> columns, fulls;  ///< sides, in their index order
    std::vector<const FusionValue*> rows;            ///< [N, C] sides (passes only)
    std::vector<Step> steps;
    int areas = 0;        ///< tile areas: results, then scratch
    int scratch = 0;      ///< of which scratch (materialised operands)
    int col_areas = 0;    ///< column areas: results, then one scratch per operand
    int col_scratch = 0;  ///< of which scratch
};

/// The ops of `f` that values `targets` need, walking back through ops of the fusion and
/// stopping at `stops` (values the pass already has) and at the fusion's operands.
std::set<OpId> needed_ops(const Graph& g, const Fusion& f, const std::vector<ValueId>& targets,
                          const std::set<ValueId>& stops) {
    std::set<OpId> ops;
    std::vector<ValueId> stack = targets;
    while (!stack.empty()) {
        const ValueId v = stack.back();
        stack.pop_back();
        if (stops.count(v) || !inside_fusion(f, g, v)) continue;
        const OpId p = g.value(v).producer;
        if (!ops.insert(p).second) continue;
        for (ValueId x : g.op(p).operands) stack.push_back(x);
    }
    return ops;
}

/// Places the ops `ops` of `f` (in fusion order) that compute `target` of dims `D` into the
/// result tile; `seeds` are values the tile already holds (the convolution's result). Full
/// operands must lie in `layout`.
Placed place(const Graph& g, const Fusion& f, const std::set<OpId>& ops, std::map<ValueId, Val> val,
             const std::vector<const FusionValue*>& seeded_fulls, ValueId target,
             const std::vector<int64_t>& D, const Layout& layout) {
    Placed p;
    for (const FusionValue* fv : seeded_fulls) {
        p.fulls.push_back(fv);
        val[fv->value] = {Val::K::Full, -1 - int(p.fulls.size())};
    }
    const int64_t C = D.back();
    const std::vector<int64_t> col_dims{C};
    // [N, C] values broadcast over H and W (dims {0, 3}): per image, so per column area.
    const std::vector<int64_t> row_dims =
        D.size() == 4 ? std::vector<int64_t>{D[0], C} : std::vector<int64_t>{};
    const auto per_channel = [&](const std::vector<int64_t>& d) {
        return d == col_dims || (!row_dims.empty() && d == row_dims);
    };
    int results = 0, col_results = 0;
    bool scratch = false, divide = false, col_divide = false;
    size_t col_operands = 0;
    for (OpId id : f.ops) {
        if (!ops.count(id)) continue;
        const Op& op = g.op(id);
        const ValueId res = op.results[0];
        const Shape& rs = g.shape(res);
        const auto in = [&](size_t i) -> Val {
            const ValueId v = op.operands[i];
            if (auto it = val.find(v); it != val.end()) return it->second;
            if (inside_fusion(f, g, v)) not_generated(f, fmt::format("%{} in the epilogue", v));
            const FusionValue* fv = operand_of(f, v);
            if (fv && fv->shape.dtype == DType::F32 && fv->shape.dims == col_dims) {
                p.columns.push_back(fv);
                return val[v] = {Val::K::Column, -1, p.columns.size() - 1};
            }
            if (fv && fv->shape.dtype == DType::F32 && !row_dims.empty() &&
                fv->shape.dims == row_dims) {
                p.rows.push_back(fv);
                return val[v] = {Val::K::Column, -1, kRowSide + p.rows.size() - 1};
            }
            if (!fv || fv->shape.dims != D || !(fv->layout == layout) ||
                fv->shape.dtype != DType::F32)
                not_generated(f,
                              fmt::format("a side {} in layout {} (the result's is {})",
                                          g.shape(v).to_string(), fv ? fv->layout.to_string() : "?",
                                          layout.to_string()));
            p.fulls.push_back(fv);
            return val[v] = {Val::K::Full, -1 - int(p.fulls.size())};
        };
        switch (op.kind) {
            case OpKind::Literal:
                val[res] = {Val::K::Scalar, 0, 0, float(op.attrs.scalar)};
                continue;
            case OpKind::Broadcast: {
                const ValueId x = op.operands[0];
                const Shape& xs = g.shape(x);
                if (xs.elements() == 1 && (rs.dims == D || per_channel(rs.dims))) {
                    const Val v = in(0);
                    if (v.k != Val::K::Scalar)
                        not_generated(f, "a broadcast of a computed scalar in the epilogue");
                    val[res] = v;
                } else if (rs.dims == D && xs.dims == col_dims &&
                           op.attrs.dims == std::vector<int64_t>{int64_t(D.size()) - 1}) {
                    const Val v = in(0);
                    if (v.k != Val::K::Column)
                        not_generated(f, "a broadcast of a per-channel value not in a column");
                    val[res] = v;
                } else if (rs.dims == D && !row_dims.empty() && xs.dims == row_dims &&
                           op.attrs.dims == std::vector<int64_t>{0, 3}) {
                    const Val v = in(0);
                    if (v.k != Val::K::Column)
                        not_generated(f, "a broadcast of a per-image value not in a column");
                    val[res] = v;
                } else {
                    not_generated(f, fmt::format("a broadcast {} -> {} in the epilogue",
                                                 xs.to_string(), rs.to_string()));
                }
                continue;
            }
            case OpKind::Reshape:
            case OpKind::Transpose:
                if (op.kind == OpKind::Reshape && rs.dims == D && !val.count(op.operands[0]) &&
                    layout == row_major(int64_t(D.size()))) {
                    // A fusion operand viewed as the result's dims (the [B, H W C] gradient of
                    // a flatten): untiled row-major on both sides, so the same bytes.
                    const FusionValue* fv = operand_of(f, op.operands[0]);
                    if (fv && !inside_fusion(f, g, op.operands[0]) && untiled_row_major(*fv) &&
                        fv->shape.dtype == DType::F32) {
                        p.fulls.push_back(fv);
                        val[res] = {Val::K::Full, -1 - int(p.fulls.size())};
                        continue;
                    }
                }
                if (rs.dims != g.shape(op.operands[0]).dims)
                    not_generated(f, fmt::format("{} in the epilogue", op_name(op.kind)));
                val[res] = in(0);
                continue;
            case OpKind::Convert:
                if (op.attrs.dtype == g.shape(op.operands[0]).dtype) {
                    val[res] = in(0);
                    continue;
                }
                not_generated(
                    f, fmt::format("a convert to {} in the epilogue", dtype_name(op.attrs.dtype)));
            case OpKind::Compare:
                if (op.attrs.comparison != Comparison::Gt && op.attrs.comparison != Comparison::Lt)
                    not_generated(f, "a comparison other than > and <");
                break;
            case OpKind::Div:
                break;
            default:
                if (!has_vpu_lowering(op.kind))
                    not_generated(f, fmt::format("op {} in the epilogue", op_name(op.kind)));
        }
        Step step{op.kind, op.attrs.comparison, {}, {}};
        bool any_full = false, any_column = false;
        for (size_t i = 0; i < op.operands.size(); ++i) {
            step.in.push_back(in(i));
            any_full |= step.in.back().k == Val::K::Full;
            any_column |= step.in.back().k == Val::K::Column;
        }
        if (per_channel(rs.dims) && !any_full && any_column) {
            // A per-channel op: C values into a column area of its own.
            step.out = {Val::K::Column, col_results++};
            col_operands = std::max(col_operands, step.in.size());
            col_divide |= op.kind == OpKind::Div;
        } else if (rs.dims == D && any_full) {
            divide |= op.kind == OpKind::Div;
            const bool bin = step.in.size() == 2;
            const size_t fi = bin && step.in[0].k != Val::K::Full ? 1 : 0;
            const Val& o = bin ? step.in[1 - fi] : step.in[0];
            const bool direct =
                bin && ((o.k == Val::K::Scalar &&
                         (op.kind == OpKind::Add || op.kind == OpKind::Mul ||
                          op.kind == OpKind::Max || (op.kind == OpKind::Sub && fi == 0))) ||
                        (o.k == Val::K::Column && op.kind == OpKind::Add));
            for (const Val& v : step.in) scratch |= v.k != Val::K::Full && !direct;
            step.out = res == target ? Val{Val::K::Full, -1} : Val{Val::K::Full, results++};
        } else {
            not_generated(
                f, fmt::format("{} of {} in the epilogue", op_name(op.kind), rs.to_string()));
        }
        val[res] = step.out;
        p.steps.push_back(std::move(step));
    }
    // A result that is a broadcast (a per-image or per-channel value over the pixels): written
    // into the result tile (-0.0, plus the value: exact).
    if (val.count(target) && val[target].k != Val::K::Full) {
        p.steps.push_back({OpKind::Broadcast, Comparison::Gt, {val[target]}, {Val::K::Full, -1}});
        val[target] = {Val::K::Full, -1};
    }
    if (!val.count(target) || val[target].k != Val::K::Full || val[target].area != -1)
        not_generated(f, "a result the epilogue does not leave in the result tile");
    for (size_t i = 0; i + 1 < p.steps.size(); ++i)
        if (p.steps[i].out.k == Val::K::Full && p.steps[i].out.area == -1)
            not_generated(f, "an epilogue that writes its result before its last op");
    // Materialised operands take scratch 0 and 1, a divide's temporaries 2 to 4.
    p.scratch = divide ? 5 : scratch ? 3 : 0;
    p.areas = results + p.scratch;
    p.col_scratch = col_divide ? 5 : int(col_operands);
    p.col_areas = col_results + p.col_scratch;
    return p;
}

/// Where an epilogue finds its tiles: the conv kernel's EpilogueTile or a streaming body.
struct TileCtx {
    isa::Builder& b;
    std::function<void(Opcode, std::initializer_list<isa::Arg>)> vpu;
    isa::Arg out;                   ///< the result tile
    std::vector<isa::Arg> columns;  ///< Column sides (C values of the tile's channels)
    std::vector<isa::Arg> fulls;    ///< Full sides' tiles
    std::vector<isa::Arg> areas;    ///< tile areas
    std::vector<isa::Arg> col_areas;
    isa::Arg rows;                    ///< pixels in this tile
    uint32_t cols = 0;                ///< channels per pixel in the tile
    isa::Arg n;                       ///< rows x cols
    std::vector<isa::Arg> rows_of{};  ///< image rows: the tile's image's C values of each
};

/// Emits placed ops on one tile (the same fp32 ops in the evaluator's order, so bit-exact).
void emit_steps(const TileCtx& t, const Placed& p) {
    const isa::Arg C = imm(t.cols);
    const auto at = [&](const Val& v) -> isa::Arg {
        if (v.k == Val::K::Column)
            return v.area >= 0          ? t.col_areas[size_t(v.area)]
                   : v.side >= kRowSide ? t.rows_of[v.side - kRowSide]
                                        : t.columns[v.side];
        if (v.area == -1) return t.out;
        if (v.area <= -2) return t.fulls[size_t(-2 - v.area)];
        return t.areas[size_t(v.area)];
    };
    // `v` as a whole tile (or column) in scratch `dst`: -0.0 everywhere (v.cmpgt x, x, x is
    // +0.0 whatever x holds), plus the value: exact for every value.
    const auto direct = [](const Val& v, bool tile) {
        return v.k == Val::K::Full || (!tile && v.k == Val::K::Column);
    };
    const auto materialise = [&](const Val& v, const isa::Arg& dst, const isa::Arg& n,
                                 bool tile) -> isa::Arg {
        if (direct(v, tile)) return at(v);
        t.vpu(Opcode::VCmpGt, {dst, dst, dst, n});
        t.vpu(Opcode::VMulS, {dst, dst, fimm(-1.0f), n});
        if (v.k == Val::K::Scalar)
            t.vpu(Opcode::VAddS, {dst, dst, fimm(v.scalar), n});
        else
            t.vpu(Opcode::VAddRow, {dst, dst, at(v), t.rows, C});
        return dst;
    };
    const int tile_scratch = p.areas - p.scratch, col_scratch = p.col_areas - p.col_scratch;
    for (const Step& s : p.steps) {
        const bool tile = s.out.k == Val::K::Full;
        const isa::Arg n = tile ? t.n : C;
        const std::vector<Val>& x = s.in;
        const isa::Arg out = at(s.out);
        const bool bin = x.size() == 2;
        const size_t fi = bin && x[0].k == Val::K::Scalar         ? 1
                          : bin && tile && x[0].k != Val::K::Full ? 1
                                                                  : 0;
        const Val& o = bin ? x[1 - fi] : x[0];
        const bool scalar = o.k == Val::K::Scalar;
        if (bin && scalar && s.kind == OpKind::Add) {
            t.vpu(Opcode::VAddS, {out, at(x[fi]), fimm(o.scalar), n});
            continue;
        }
        if (bin && tile && o.k == Val::K::Column && s.kind == OpKind::Add) {
            t.vpu(Opcode::VAddRow, {out, at(x[fi]), at(o), t.rows, C});
            continue;
        }
        if (bin && scalar && s.kind == OpKind::Sub && fi == 0) {
            t.vpu(Opcode::VAddS, {out, at(x[0]), fimm(-o.scalar), n});
            continue;
        }
        if (bin && scalar && (s.kind == OpKind::Mul || s.kind == OpKind::Max)) {
            t.vpu(s.kind == OpKind::Mul ? Opcode::VMulS : Opcode::VMaxS,
                  {out, at(x[fi]), fimm(o.scalar), n});
            continue;
        }
        // A scratch area is reserved only for an operand that needs materialising.
        const auto F = [&](size_t i) {
            if (direct(x[i], tile)) return at(x[i]);
            return materialise(
                x[i],
                tile ? t.areas[size_t(tile_scratch) + i] : t.col_areas[size_t(col_scratch) + i], n,
                tile);
        };
        if (s.kind == OpKind::Broadcast) {
            materialise(x[0], out, n, true);
            continue;
        }
        if (s.kind == OpKind::Div) {
            // vpu_divide (evaluator.h), as the loop emitter and the dot's epilogue: q = x
            // rsqrt(|y|)^2, negated where 0 > y.
            const auto area = [&](int i) {
                return tile ? t.areas[size_t(tile_scratch + i)]
                            : t.col_areas[size_t(col_scratch + i)];
            };
            const isa::Arg xa = F(0), ya = F(1);
            const isa::Arg r = area(2), m = area(3), zero = area(4);
            t.vpu(Opcode::VCmpGt, {zero, zero, zero, n});
            t.vpu(Opcode::VMulS, {r, ya, fimm(-1.0f), n});
            t.vpu(Opcode::VMax, {r, ya, r, n});
            t.vpu(Opcode::VRsqrt, {r, r, n});
            t.vpu(Opcode::VMul, {r, r, r, n});
            t.vpu(Opcode::VCmpGt, {m, zero, ya, n});
            t.vpu(Opcode::VMul, {r, xa, r, n});
            t.vpu(Opcode::VMulS, {zero, r, fimm(-1.0f), n});
            t.vpu(Opcode::VSel, {out, m, zero, r, n});
            continue;
        }
        if (!emit_elementwise(t.vpu, s.kind, s.comparison, out, F, n))
            throw CompileError(fmt::format("epilogue op {} not generated", op_name(s.kind)));
    }
}

}  // namespace

/// A streaming pass of placed elementwise ops over NHWC arrays, [pixels, C] tile by tile: a
/// pooling or H W reduction's fused producers (into the fusion's scratch, which the kernel then
/// reads), or a convolution fusion's results other than the kernel's own.
struct Pass {
    Placed ep;
    BufferRef out;  ///< where the result goes (row-major NHWC)
    uint64_t pixels = 0;
    uint32_t C = 0;
    uint32_t image = 0;  ///< pixels per image (a tile never straddles two with image rows)
    uint32_t tile = 0;   ///< pixels per tile
};

/// A planned convolution or pooling fusion.
struct ConvPoolFusion {
    enum class Kind : uint8_t { Conv, ConvGrad, Pool, GlobalSum } kind = Kind::Conv;
    BufferRef scratch_buf;           ///< the fusion's own HBM (Fusion::scratch)
    const FusionValue* x = nullptr;  ///< the kernel's input (unless a pass writes it to scratch)
    const FusionValue* y = nullptr;  ///< the kernel's result
    /// An input gradient whose fusion goes on (input_grad_passes): dx in the scratch, behind dcol
    FusionValue dx{};
    std::optional<Pass> before;  ///< Pool, GlobalSum: fused producers, into the scratch
    std::vector<Pass> befores;   ///< a pooling gradient's computed operands, into the scratch
    std::vector<Pass> after;     ///< Conv: the other results
    // Conv: the implicit GEMM, or (folded) im2col into the scratch and the dot kernel
    bool folded = false;
    bool pointwise = false;  ///< folded without im2col: the dot reads x's NHWC rows
    /// The filter is a parameter: its packed tiles are a derived buffer the backend keeps
    /// (ProgramSegment::derived), packed only when stale.
    std::optional<DerivedBuffer> packed_w;
    driver::Conv2dAuxKey im2col;
    driver::DotKey dot;
    driver::Conv2dKey key;
    driver::Conv2dAuxKey pack_x, pack_w, zero;
    ConvScratch scratch;
    const FusionValue* w = nullptr;
    /// x or w as the convolution reads them, where a transpose in the fusion is the same bytes
    std::deque<FusionValue> views;
    Placed ep;
    uint64_t area_bytes = 0;
    // ConvGrad: the input's gradient (dcol = dy w^T into the scratch, then col2im) or the
    // filter's (im2col(x) into the scratch, then dw = col^T dy), as conv2d_grad lowers them
    bool input_grad = false;
    driver::Conv2dAuxKey grad_aux;
    const FusionValue* grad_a = nullptr;  ///< dy (input grad) or x (filter grad)
    const FusionValue* grad_b = nullptr;  ///< w (input grad) or dy (filter grad)
    /// A filter gradient's dot over K blocks (filter_grad_block_steps): `dot` is a block's
    /// (k_block pixels), the last block has k_last; 1: one dot over every pixel.
    uint32_t k_blocks = 1, k_block = 0, k_last = 0;
    /// Where the blocks' partial results are (the scratch behind col), with k_blocks > 1.
    uint64_t partial_offset = 0;
    // Pool
    driver::PoolKey pool;
    std::vector<BufferRef> grad_operands;  ///< a gradient's (x, dy) or (dy), read or computed
    // GlobalSum
    std::optional<driver::Conv2dAuxKey> zero_out;  ///< zeroes a padded result first
    uint32_t images = 0, hw = 0, channels = 0, lanes = 128, out_tile_rows = 0, tile = 0;
    uint32_t parts = 8;  ///< partial sums: vpu_sublanes (pixel i goes to partial i mod parts)
};

namespace {

/// Values of a global sum's result row in VMEM: C, or whole lane chunks when tiled.
uint32_t padded_channels(const ConvPoolFusion& p) {
    return p.out_tile_rows > 1 ? (p.channels + p.lanes - 1) / p.lanes * p.lanes : p.channels;
}

/// Plans a streaming pass computing `target` (NHWC, row-major) into `out`.
Pass plan_pass(const Graph& g, const Fusion& f, const std::set<OpId>& ops,
               const std::vector<const FusionValue*>& seeded, ValueId target, BufferRef out,
               const hw::BoardConfig& board) {
    Pass ps;
    const Shape& ts = g.shape(target);
    if (ts.rank() != 4 || ts.dtype != DType::F32)
        not_generated(f, fmt::format("a fused value {} (NHWC f32 only)", ts.to_string()));
    ps.ep = place(g, f, ops, {}, seeded, target, ts.dims, row_major(4));
    ps.out = out;
    ps.C = uint32_t(ts.dims[3]);
    ps.pixels = uint64_t(ts.elements() / ts.dims[3]);
    ps.image = uint32_t(ts.dims[1] * ts.dims[2]);
    for (const FusionValue* fv : ps.ep.rows)
        if (!(fv->layout == row_major(2)) &&
            !(fv->layout == Layout{{1, 0}, {board.core.vpu_sublanes, board.core.vpu_lanes}} &&
              ps.C % board.core.vpu_lanes == 0))
            not_generated(f, fmt::format("a per-image operand {} in layout {}",
                                         fv->shape.to_string(), fv->layout.to_string()));
    st::Footprint fp;
    fp.name = f.name;
    fp.units = ps.pixels;
    fp.areas.assign(1 + ps.ep.fulls.size() + size_t(ps.ep.areas) + ps.ep.rows.size(), ps.C);
    fp.fixed.assign(ps.ep.columns.size() + size_t(ps.ep.col_areas), ps.C);
    try {
        ps.tile = st::plan(fp, board.core.vmem_bytes - 64 * 1024);
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("an elementwise pass that does not fit ({})", e.what()));
    }
    // With image rows, tiles of a divisor of the image's pixels stay inside one image.
    if (!ps.ep.rows.empty())
        while (ps.image % ps.tile) --ps.tile;
    return ps;
}

/// The value a pooling or reduction kernel reads: its operand from memory, or, when the fusion
/// computes it, the scratch a pass writes it to.
void plan_input(ConvPoolFusion& p, const Graph& g, const Fusion& f, ValueId v,
                const hw::BoardConfig& board) {
    if (!inside_fusion(f, g, v)) {
        p.x = operand_of(f, v);
        return;
    }
    const uint64_t bytes = uint64_t(g.shape(v).elements()) * 4;
    if (f.scratch.bytes < bytes)
        not_generated(f, fmt::format("fused producers without their {} bytes of scratch", bytes));
    p.before =
        plan_pass(g, f, needed_ops(g, f, {v}, {}), {}, v,
                  BufferRef{f.scratch.space, f.scratch.index, f.scratch.offset, bytes}, board);
}

std::unique_ptr<ConvPoolFusion> plan_conv(const Graph& g, const Fusion& f,
                                          const hw::BoardConfig& board) {
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::Conv;
    const Op& conv = g.op(f.hero);
    if (const std::string why = conv_unsupported(g, conv, board); !why.empty())
        not_generated(f, why);
    p->x = operand_through_reshapes(f, g, conv.operands[0], &p->views);
    p->w = operand_through_reshapes(f, g, conv.operands[1], &p->views);
    if (!p->x || !p->w) not_generated(f, "a convolution of operands computed in its fusion");
    if (!untiled_row_major(*p->x) || !untiled_row_major(*p->w))
        not_generated(f, fmt::format("convolution operands in layouts {} and {} (the packing "
                                     "kernels read row-major NHWC and HWIO)",
                                     p->x->layout.to_string(), p->w->layout.to_string()));
    const ValueId cy = conv.results[0];
    const std::vector<int64_t>& D = g.shape(cy).dims;
    for (const FusionValue& r : f.results)
        if (r.shape.dtype != DType::F32 || !untiled_row_major(r) || r.shape.dims != D)
            not_generated(f, fmt::format("a convolution fusion result {} in layout {} (the "
                                         "kernel writes row-major NHWC f32)",
                                         r.shape.to_string(), r.layout.to_string()));
    // The kernel writes one result; the others must follow from it without the convolution's
    // own value (a ReLU after a residual sum that is also a result: a pass after the kernel).
    for (const FusionValue& r : f.results) {
        bool ok = true;
        for (const FusionValue& o : f.results)
            if (&o != &r && needed_ops(g, f, {o.value}, {r.value}).count(f.hero)) ok = false;
        if (ok) {
            p->y = &r;
            break;
        }
    }
    if (!p->y) not_generated(f, "convolution fusion results that each need the convolution");
    std::map<ValueId, Val> seeds{{cy, {Val::K::Full, -1}}};
    p->ep =
        place(g, f, needed_ops(g, f, {p->y->value}, {cy}), seeds, {}, p->y->value, D, p->y->layout);
    if (!p->ep.rows.empty()) not_generated(f, "a per-image operand in a convolution's epilogue");
    for (const FusionValue& r : f.results)
        if (&r != p->y)
            p->after.push_back(plan_pass(g, f, needed_ops(g, f, {r.value}, {p->y->value}), {p->y},
                                         r.value, r.buffer, board));

    const driver::Conv2dShape s = conv_shape_of(g, conv);
    const auto cols = uint32_t(p->ep.columns.size()), fulls = uint32_t(p->ep.fulls.size());
    const uint64_t margin = 64 * 1024;
    // emit_conv2d keeps 26 of the 31 registers: the arena's (scratch and temps) and one per
    // other allocation the kernel reads.
    std::set<std::pair<uint8_t, uint32_t>> held;
    for (const FusionValue* fv : p->ep.fulls)
        if (fv->buffer.space != BufferRef::Space::Temp) held.insert(alloc_key(fv->buffer));
    if (p->y->buffer.space != BufferRef::Space::Temp) held.insert(alloc_key(p->y->buffer));
    if (held.size() > 3)
        not_generated(f, fmt::format("a convolution reading {} allocations besides the temp arena "
                                     "(the kernels leave registers for 3)",
                                     held.size()));
    p->scratch_buf = f.scratch;
    if (as_dot(s, board.core.mxu_rows)) {
        // Small Cin: the taps folded into K as conv2d does (driver/README.md, "Convolution"),
        // im2col(x) into the scratch and the dot kernel, so the evaluator's reference (the
        // same test) gives the same bits. A pointwise convolution is the dot of its rows: one
        // tap, so the implicit GEMM's order (each Cin tile's pass from +0.0, added in order) is
        // the dot's.
        p->folded = true;
        p->pointwise = pointwise(s);
        p->key.shape = s;
        p->scratch = folded_scratch(s, board.core.mxu_cols, cols);
        if (f.scratch.bytes < p->scratch.total())
            not_generated(f, fmt::format("a convolution without its {} bytes of scratch",
                                         p->scratch.total()));
        if (!p->pointwise) try {
                p->im2col = driver::plan_conv2d_aux(driver::Conv2dAux::Im2colRows, s,
                                                    board.core.mxu_rows, board.core.mxu_cols, 0, 0,
                                                    0, board.core.vmem_bytes - margin);
            } catch (const driver::DeviceError& e) {
                not_generated(f,
                              fmt::format("a folded convolution whose im2col rows do not fit ({})",
                                          e.what()));
            }
        driver::DotKey shape;
        shape.M = s.batch * s.out_height() * s.out_width();
        shape.K = s.kernel * s.kernel * s.cin;
        shape.N = s.cout;
        shape.precision = driver::Precision::Bf16;
        shape.column_sides = cols;
        shape.full_sides = fulls;
        // As a 2-D dot fusion's (codegen_dot.cpp): the residual's tiles load while the MXUs
        // run, and a long epilogue goes beside the next group's steps.
        shape.prefetch_sides = fulls > 0;
        shape.overlap_epilogue = !p->ep.steps.empty();
        const uint64_t col_bytes =
            uint64_t(p->ep.col_areas) * align512(uint64_t(board.core.mxu_cols) * 4);
        // Stream the longer side, as for any dot ("The stationary operand"): fewer pixels than
        // output channels (ResNet's layer3 and layer4 at batch 1, where the filter held would
        // be pushed into the array for fewer rows than the push takes) hold the pixels (the
        // LHS) and stream the filter, so each weight value passes through the array once.
        // dot_estimate_cycles does not rank these shapes as they measure (it prefers the held
        // filter for ResNet-50's layer4 1 x 1 convolutions, which then take 1.5x as long), so
        // the shape decides. The epilogue's ops on [Cout] vectors (an unfolded batch norm's
        // scale and shift) are placed against an M x N tile; with the LHS stationary the
        // kernel's tile is N x M, so such a fusion holds the filter.
        shape.stationary =
            shape.M < shape.N && p->ep.col_areas == 0 ? Stationary::Lhs : Stationary::Rhs;
        uint64_t budget = board.core.vmem_bytes - margin - col_bytes;
        for (int tries = 0; tries < 32; ++tries) {
            std::optional<driver::DotKey> k;
            try {
                k = driver::plan_dot(board, shape, budget);
            } catch (const driver::DeviceError& e) {
                not_generated(f, fmt::format("the dot kernel: {}", e.what()));
            }
            if (!k) break;
            const uint64_t area = align512(uint64_t(k->block_rows) * k->C * 4);
            const uint64_t need =
                driver::dot_vmem_bytes(*k) + uint64_t(p->ep.areas) * area + col_bytes + margin;
            if (need <= board.core.vmem_bytes) {
                p->dot = *k;
                p->area_bytes = area;
                return p;
            }
            const uint64_t over = need - board.core.vmem_bytes;
            if (driver::dot_vmem_bytes(*k) <= over) break;
            budget = driver::dot_vmem_bytes(*k) - over;
        }
        not_generated(f, "a folded convolution whose epilogue does not fit in VMEM beside it");
    }
    // The kernel's tiling in what the epilogue's areas (one image tile each) leave of VMEM.
    const uint64_t col_bytes =
        uint64_t(p->ep.col_areas) * align512(uint64_t(board.core.mxu_cols) * 4);
    hw::BoardConfig cfg = board;
    cfg.core.vmem_bytes = board.core.vmem_bytes - margin - col_bytes;
    std::optional<driver::Conv2dTiling> t;
    for (int tries = 0; tries < 16 && !t; ++tries) {
        driver::Conv2dTiling cand;
        try {
            cand = driver::plan_conv2d(cfg, s, s.batch, cols, fulls);
        } catch (const driver::DeviceError&) {
            break;
        }
        const uint64_t area = align512(uint64_t(cand.band_rows) * s.out_width() * cand.C * 4);
        const uint64_t need = uint64_t(p->ep.areas) * area + margin + col_bytes;
        if (need >= board.core.vmem_bytes) break;
        if (cfg.core.vmem_bytes <= board.core.vmem_bytes - need) {
            t = cand;
            p->area_bytes = area;
        } else {
            cfg.core.vmem_bytes = board.core.vmem_bytes - need;
        }
    }
    if (!t) not_generated(f, "a convolution whose epilogue does not fit in VMEM beside it");
    p->key.shape = s;
    p->key.tiling = *t;
    const bool param_w = p->w->buffer.space == BufferRef::Space::Parameter;
    p->scratch = conv_scratch(s, *t, uint32_t(p->ep.columns.size()));
    const uint64_t aux_vmem = board.core.vmem_bytes - margin;
    const uint32_t R = board.core.mxu_rows, C = board.core.mxu_cols;
    try {
        p->pack_x =
            driver::plan_conv2d_aux(driver::Conv2dAux::PackInput, s, R, C, 0, 0, 0, aux_vmem);
        p->pack_w =
            driver::plan_conv2d_aux(driver::Conv2dAux::PackWeight, s, R, C, 0, 0, 0, aux_vmem);
        p->zero = driver::plan_conv2d_aux(driver::Conv2dAux::Zero, s, R, C, 0, 0,
                                          uint64_t(t->NT) * t->C, aux_vmem);
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("a convolution whose packing does not fit ({})", e.what()));
    }
    if (param_w) {
        DerivedBuffer d;
        d.parameter = p->w->buffer.index;
        d.key = hash_value(p->pack_w);
        d.bytes = packed_w_bytes(s, *t);
        p->packed_w = d;
    }
    if (f.scratch.bytes < p->scratch.total())
        not_generated(
            f, fmt::format("a convolution without its {} bytes of scratch", p->scratch.total()));
    return p;
}

/// The shape of a convolution gradient's forward convolution.
driver::Conv2dShape grad_shape(const Graph& g, const Op& op) {
    const std::vector<int64_t>& xd = op.attrs.window.input_dims;
    driver::Conv2dShape s;
    s.batch = uint32_t(xd[0]);
    s.height = uint32_t(xd[1]);
    s.width = uint32_t(xd[2]);
    s.cin = uint32_t(xd[3]);
    s.cout = uint32_t(g.shape(op.operands[1]).dims[3]);
    s.kernel = uint32_t(op.attrs.window.kernel);
    s.stride = uint32_t(op.attrs.window.stride);
    s.pad = uint32_t(op.attrs.window.pad);
    return s;
}

/// Bytes of a convolution gradient's scratch: the N Ho Wo x k k Cin fp32 matrix (dcol or col).
uint64_t grad_scratch_bytes(const driver::Conv2dShape& s) {
    return align512(uint64_t(s.batch) * s.out_height() * s.out_width() * s.kernel * s.kernel *
                    s.cin * 4);
}

/// K steps times column-group variants of a filter gradient's dot emitted unrolled in one
/// program: the dot kernel's group (driver/kernels/matmul_kernel.cpp) emits 23 to 27
/// instructions per K step and variant (the first, middle and last column group of a block
/// each have theirs; measured on ResNet-50's filter gradients at 32 images per core: conv1's
/// 3 136 steps of one variant were 72 730 instructions, layer2's 1 x 1 to 512 channels 196
/// steps of two 10 586), and the instruction memory holds core.imem_bytes / 32 of them, with
/// room left for the im2col loop and an epilogue: 28 a step.
uint64_t max_unrolled_dot_steps(const hw::BoardConfig& board) {
    constexpr uint64_t kInstrsPerStep = 28;
    return board.core.imem_bytes / isa::kInstrBytes / kInstrsPerStep;
}

/// A filter gradient `dw = col^T dy` whose contraction over every pixel (K = N Ho Wo) would
/// unroll beyond max_unrolled_dot_steps runs as dots over K blocks (compiler/README.md "Filter
/// gradients over K blocks"): the K steps of each block (0: one dot). A block's dot is emitted
/// three times (the first block, the middle ones in a loop, the last), so each takes a quarter
/// of the steps (the rest: each dot's set-up and drain, the im2col loop, the epilogue).
uint32_t filter_grad_block_steps(const driver::Conv2dShape& s, const hw::BoardConfig& board) {
    const uint64_t K = uint64_t(s.batch) * s.out_height() * s.out_width();
    const uint64_t KT = (K + board.core.mxu_rows - 1) / board.core.mxu_rows;
    const uint64_t NT = (s.cout + board.core.mxu_cols - 1) / board.core.mxu_cols;
    const uint64_t groups = (NT + board.core.mxus - 1) / board.core.mxus;
    const uint64_t variants = std::min<uint64_t>(groups, 3);
    const uint64_t budget = max_unrolled_dot_steps(board);
    if (KT * variants <= budget) return 0;
    return uint32_t(std::max<uint64_t>(1, budget / (4 * variants)));
}

/// Bytes a filter gradient over K blocks keeps its partial results in (the scratch behind col):
/// the fp32 k k Cin x Cout; 0 for one dot.
uint64_t filter_grad_partial_bytes(const driver::Conv2dShape& s, const hw::BoardConfig& board) {
    if (!filter_grad_block_steps(s, board)) return 0;
    return align512(uint64_t(s.kernel) * s.kernel * s.cin * s.cout * 4);
}

/// Bytes of the dx an input gradient's fusion keeps in its scratch (behind dcol) when other
/// ops follow the gradient in its fusion and dx itself is not one of its results; else 0.
uint64_t dx_scratch_bytes(const Graph& g, const Fusion& f) {
    const Op& op = g.op(f.hero);
    if (op.kind != OpKind::Conv2dInputGrad || (f.ops.size() == 1 && f.results.size() == 1))
        return 0;
    for (const FusionValue& r : f.results)
        if (r.value == op.results[0]) return 0;
    return align512(uint64_t(g.shape(op.results[0]).elements()) * 4);
}

/// An input gradient with consumers in its fusion (the residual's gradient added, ReLU's mask):
/// col2im accumulates overlapping windows into dx, so no element is final before its last tap
/// and an epilogue cannot run per tile as XLA's output fusion of a convolution does. The
/// kernel writes dx (into the scratch behind dcol, or into dx's own result), then each result
/// is a streaming pass from it, as the forward convolution's further results are.
void input_grad_passes(ConvPoolFusion& p, const Graph& g, const Fusion& f,
                       const hw::BoardConfig& board) {
    const ValueId hy = g.op(f.hero).results[0];
    for (const FusionValue& r : f.results)
        if (r.value == hy) p.y = &r;
    if (!p.y) {
        const uint64_t bytes = dx_scratch_bytes(g, f);
        p.dx.value = hy;
        p.dx.shape = g.shape(hy);
        p.dx.layout = row_major(p.dx.shape.rank());
        p.dx.buffer =
            BufferRef{f.scratch.space, f.scratch.index,
                      f.scratch.offset + grad_scratch_bytes(grad_shape(g, g.op(f.hero))), bytes};
        p.y = &p.dx;
    }
    for (const FusionValue& r : f.results)
        if (r.value != hy)
            p.after.push_back(plan_pass(g, f, needed_ops(g, f, {r.value}, {hy}), {p.y}, r.value,
                                        r.buffer, board));
}

std::unique_ptr<ConvPoolFusion> plan_conv_grad(const Graph& g, const Fusion& f,
                                               const hw::BoardConfig& board) {
    const Op& op = g.op(f.hero);
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::ConvGrad;
    p->input_grad = op.kind == OpKind::Conv2dInputGrad;
    const bool dx_passes = p->input_grad && (f.ops.size() != 1 || f.results.size() != 1);
    if (detail::mxu_precision(op.attrs.precision, g.shape(op.operands[0]).dtype) !=
        driver::Precision::Bf16)
        not_generated(f, "a convolution gradient above default precision");
    p->grad_a = operand_through_reshapes(f, g, op.operands[0]);
    p->grad_b = operand_through_reshapes(f, g, op.operands[1]);
    // The filter's gradient takes an epilogue in the dot kernel (an optimizer's update of the
    // filter, placed as a conv's epilogue on [k k Cin, Cout] tiles, HWIO row-major); the kernel
    // writes the result the others follow from, a pass the rest.
    const ValueId hy = op.results[0];
    if (dx_passes)
        input_grad_passes(*p, g, f, board);
    else
        for (const FusionValue& r : f.results) {
            bool ok = r.shape.dims == g.shape(hy).dims;
            for (const FusionValue& o : f.results)
                if (&o != &r && needed_ops(g, f, {o.value}, {r.value}).count(f.hero)) ok = false;
            if (ok) {
                p->y = &r;
                break;
            }
        }
    if (!p->y) not_generated(f, "convolution gradient results that each need the gradient");
    for (const FusionValue& r : f.results)
        if (!untiled_row_major(r))
            not_generated(f, fmt::format("a result in layout {}", r.layout.to_string()));
    if (!p->input_grad) {
        p->ep = place(g, f, needed_ops(g, f, {p->y->value}, {hy}), {{hy, {Val::K::Full, -1}}}, {},
                      p->y->value, g.shape(hy).dims, p->y->layout);
        if (!p->ep.columns.empty() || p->ep.col_areas || !p->ep.rows.empty())
            not_generated(f, "a per-channel operand in a filter gradient's epilogue");
        for (const FusionValue& r : f.results)
            if (&r != p->y)
                p->after.push_back(plan_pass(g, f, needed_ops(g, f, {r.value}, {p->y->value}),
                                             {p->y}, r.value, r.buffer, board));
    }
    for (const FusionValue* fv : {p->grad_a, p->grad_b, p->y})
        if (!fv || !untiled_row_major(*fv) || fv->shape.dtype != DType::F32)
            not_generated(f, fmt::format("{} of arrays not in row-major f32", op_name(op.kind)));
    const driver::Conv2dShape s = grad_shape(g, op);
    try {
        s.validate();
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("a convolution gradient the kernels refuse ({})", e.what()));
    }
    const uint32_t M = s.batch * s.out_height() * s.out_width(), KC = s.kernel * s.kernel * s.cin;
    const uint64_t margin = 64 * 1024;
    try {
        p->grad_aux = driver::plan_conv2d_aux(
            p->input_grad ? driver::Conv2dAux::Col2imRows : driver::Conv2dAux::Im2colRows, s,
            board.core.mxu_rows, board.core.mxu_cols, 0, 0, 0, board.core.vmem_bytes - margin);
    } catch (const driver::DeviceError& e) {
        not_generated(f,
                      fmt::format("a convolution gradient whose rows do not fit ({})", e.what()));
    }
    driver::DotKey shape;
    shape.precision = driver::Precision::Bf16;
    shape.stationary = Stationary::Rhs;
    if (p->input_grad) {
        // dcol [M, KC] = dy [M, Cout] x w^T: w [KC, Cout] row-major is W transposed.
        shape.M = M;
        shape.K = s.cout;
        shape.N = KC;
        shape.w = driver::DotLayout::Transposed;
    } else {
        // dw [KC, Cout] = col^T x dy: col [M, KC] row-major is A transposed.
        shape.M = KC;
        shape.K = M;
        shape.N = s.cout;
        shape.a = driver::DotLayout::Transposed;
        if (const uint32_t steps = filter_grad_block_steps(s, board)) {
            // The blocks' dots (their K a multiple of the MXU's rows, so each block's steps
            // are the one dot's); planned as a middle block's, with the epilogue's sides.
            p->k_block = steps * board.core.mxu_rows;
            p->k_blocks = (M + p->k_block - 1) / p->k_block;
            p->k_last = M - (p->k_blocks - 1) * p->k_block;
            p->partial_offset = grad_scratch_bytes(s);
            shape.K = p->k_block;
            shape.accumulate = true;
        }
    }
    shape.full_sides = uint32_t(p->ep.fulls.size());
    uint64_t budget = board.core.vmem_bytes - margin;
    for (int tries = 0; tries < 32 && !p->dot.M; ++tries) {
        std::optional<driver::DotKey> k;
        try {
            k = driver::plan_dot(board, shape, budget);
        } catch (const driver::DeviceError& e) {
            not_generated(f, fmt::format("the dot kernel: {}", e.what()));
        }
        if (!k) break;
        const uint64_t area = align512(uint64_t(k->block_rows) * k->C * 4);
        const uint64_t need = driver::dot_vmem_bytes(*k) + uint64_t(p->ep.areas) * area + margin;
        if (need <= board.core.vmem_bytes) {
            p->dot = *k;
            p->area_bytes = area;
            break;
        }
        const uint64_t over = need - board.core.vmem_bytes;
        if (driver::dot_vmem_bytes(*k) <= over) break;
        budget = driver::dot_vmem_bytes(*k) - over;
    }
    if (!p->dot.M) not_generated(f, "a convolution gradient's dot that does not fit in VMEM");
    if (f.scratch.bytes < grad_scratch_bytes(s) + (dx_passes ? p->dx.buffer.bytes : 0) +
                              (p->input_grad ? 0 : filter_grad_partial_bytes(s, board)))
        not_generated(f, "a convolution gradient without its scratch");
    p->scratch_buf = f.scratch;
    return p;
}

std::unique_ptr<ConvPoolFusion> plan_pool(const Graph& g, const Fusion& f,
                                          const hw::BoardConfig& board) {
    const Op& op = g.op(f.hero);
    if (f.results.size() != 1 || f.results[0].value != op.results[0])
        not_generated(f, "a pooling fusion with results other than the pool's");
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::Pool;
    p->y = &f.results[0];
    // The forward reads x (its fused producers first, into the scratch); the gradients read
    // x and dy (max) or dy (avg) from memory.
    const bool forward = op.kind == OpKind::Pool;
    if (forward) {
        plan_input(*p, g, f, op.operands[0], board);
    } else {
        // Operands computed in the fusion are passes into the scratch, one after another.
        uint64_t at = 0;
        for (ValueId v : op.operands) {
            // A reshape of an untiled row-major operand (the flattened features' gradient
            // viewed as NHWC) is the operand's bytes: the kernel reads it where it lies.
            if (const FusionValue* fv = operand_through_reshapes(f, g, v);
                fv && inside_fusion(f, g, v) && fv->shape.dtype == DType::F32) {
                p->grad_operands.push_back(fv->buffer);
                continue;
            }
            if (inside_fusion(f, g, v)) {
                const uint64_t bytes = align512(uint64_t(g.shape(v).elements()) * 4);
                if (f.scratch.bytes < at + bytes)
                    not_generated(f, "fused producers without their scratch");
                const BufferRef out{f.scratch.space, f.scratch.index, f.scratch.offset + at, bytes};
                p->befores.push_back(plan_pass(g, f, needed_ops(g, f, {v}, {}), {}, v, out, board));
                p->grad_operands.push_back(out);
                at += bytes;
                continue;
            }
            const FusionValue* fv = operand_of(f, v);
            if (!untiled_row_major(*fv) || fv->shape.dtype != DType::F32)
                not_generated(f, fmt::format("{} of {} in layout {}", op_name(op.kind),
                                             fv->shape.to_string(), fv->layout.to_string()));
            p->grad_operands.push_back(fv->buffer);
        }
    }
    const std::vector<int64_t> xd =
        op.kind == OpKind::AvgPoolGrad ? op.attrs.window.input_dims : g.shape(op.operands[0]).dims;
    const Shape& xs = g.shape(op.operands[0]);
    if (xs.dtype != DType::F32 || xd.size() != 4 || (p->x && !untiled_row_major(*p->x)) ||
        !untiled_row_major(*p->y))
        not_generated(f, fmt::format("pooling of {} into {} (the kernel reads and writes "
                                     "row-major NHWC f32)",
                                     xs.to_string(), p->y->layout.to_string()));
    driver::PoolShape s;
    s.batch = uint32_t(xd[0]);
    s.height = uint32_t(xd[1]);
    s.width = uint32_t(xd[2]);
    s.channels = uint32_t(xd[3]);
    s.kernel = uint32_t(op.attrs.window.kernel);
    s.stride = uint32_t(op.attrs.window.stride);
    s.pad = uint32_t(op.attrs.window.pad);
    const driver::PoolOp kind = op.kind == OpKind::MaxPoolGrad   ? driver::PoolOp::MaxGrad
                                : op.kind == OpKind::AvgPoolGrad ? driver::PoolOp::AvgGrad
                                : op.attrs.pool == PoolKind::Max ? driver::PoolOp::Max
                                                                 : driver::PoolOp::Avg;
    try {
        p->pool = driver::plan_pool(kind, s, board.core.vmem_bytes - 64 * 1024);
    } catch (const driver::DeviceError& e) {
        not_generated(f, fmt::format("pooling the kernel refuses ({})", e.what()));
    }
    return p;
}

/// A sum over H and W of an NHWC array (the global average pool's reduction), in the
/// evaluator's order for reductions over major dims: each band of vpu_sublanes pixels is added
/// (`v.add`) into one band of partial sums from +0.0, pixel i into partial i mod vpu_sublanes,
/// then `v.csum` adds the partials from +0.0 in order.
std::unique_ptr<ConvPoolFusion> plan_global_sum(const Graph& g, const Fusion& f,
                                                const hw::BoardConfig& board) {
    const Op& op = g.op(f.hero);
    if (f.results.size() != 1 || f.results[0].value != op.results[0])
        not_generated(f, "a reduction over H and W with results other than the sum");
    auto p = std::make_unique<ConvPoolFusion>();
    p->kind = ConvPoolFusion::Kind::GlobalSum;
    p->y = &f.results[0];
    plan_input(*p, g, f, op.operands[0], board);
    const Shape& xs = g.shape(op.operands[0]);
    const FusionValue& y = *p->y;
    p->images = uint32_t(xs.dims[0]);
    p->hw = uint32_t(xs.dims[1] * xs.dims[2]);
    p->channels = uint32_t(xs.dims[3]);
    p->lanes = board.core.vpu_lanes;
    p->parts = board.core.vpu_sublanes;
    if (xs.dtype != DType::F32 || (p->x && !untiled_row_major(*p->x)))
        not_generated(f, fmt::format("a reduction over H and W of {} in layout {}", xs.to_string(),
                                     p->x->layout.to_string()));
    // The result [N, C]: row-major, or T(8, 128) tiles; padded tiles (N not a multiple of 8,
    // as at batch 1, or C of 128) are zeroed first, then each image's row is written.
    const int64_t lanes = board.core.vpu_lanes, sub = board.core.vpu_sublanes;
    if (untiled_row_major(y)) {
        p->out_tile_rows = 1;
    } else if (y.layout == Layout{{1, 0}, {sub, lanes}}) {
        p->out_tile_rows = uint32_t(sub);
        const uint64_t values = layout_bytes(y.shape, y.layout) / 4;
        if (values != uint64_t(y.shape.elements())) {
            try {
                p->zero_out = driver::plan_conv2d_aux(driver::Conv2dAux::Zero, {}, 0, 0, 0, 0,
                                                      values, board.core.vmem_bytes - 64 * 1024);
            } catch (const driver::DeviceError& e) {
                not_generated(f,
                              fmt::format("a padded result that cannot be zeroed ({})", e.what()));
            }
        }
    } else {
        not_generated(f, fmt::format("a reduction result {} in layout {} (padded tiles)",
                                     y.shape.to_string(), y.layout.to_string()));
    }
    st::Footprint fp;
    fp.name = f.name;
    fp.units = p->images;
    fp.areas = {p->hw * p->channels, p->parts * p->channels, padded_channels(*p)};
    fp.max_tile_units = 1;
    try {
        p->tile = st::plan(fp, board.core.vmem_bytes - 64 * 1024);
    } catch (const driver::DeviceError& e) {
        not_generated(
            f, fmt::format("a reduction over H and W whose image does not fit ({})", e.what()));
    }
    return p;
}

/// Registers for the allocations a kernel reads: temps share the arena's register, every
/// other allocation gets one (a kernel that keeps most registers for itself can hold few).
class Addresses {
public:
    /// `wide`: a wide program's temp addresses (null: offsets in the arena).
    Addresses(isa::Builder& b, const LoadFn& load, const TempAddrFn* wide)
        : b(b), load(load), wide(wide), parent(nullptr) {}
    /// Temps use `parent`'s arena register when it has one.
    Addresses(isa::Builder& b, const LoadFn& load, const Addresses* parent)
        : b(b), load(load), wide(parent->wide), parent(parent) {}
    isa::Arg of(const BufferRef& r) {
        if (r.space == BufferRef::Space::Temp) {
            // A wide program's temps at their window addresses, the arena register holding 0.
            int64_t off = int64_t(r.offset);
            if (wide) {
                const auto at = (*wide)(r);
                if (!at)
                    throw CompileError(
                        fmt::format("temp at {} lies in none of the fusion's HBM "
                                    "windows",
                                    r.offset));
                off = int64_t(*at);
            }
            if (parent && parent->arena) return *parent->arena + off;
            if (!arena) {
                arena.emplace(b.reg("arena"));
                load(*arena, BufferRef{BufferRef::Space::Temp, 0, 0, 0});
            }
            return *arena + off;
        }
        const auto key = alloc_key(r);
        auto it = regs.find(key);
        if (it == regs.end()) {
            isa::Reg reg = b.reg(fmt::format("buf{}", regs.size()));
            load(reg, BufferRef{r.space, r.index, 0, r.bytes});
            it = regs.emplace(key, std::move(reg)).first;
        }
        return it->second;
    }

private:
    isa::Builder& b;
    const LoadFn& load;
    const TempAddrFn* wide;
    const Addresses* parent;
    std::optional<isa::Reg> arena;
    std::map<std::pair<uint8_t, uint32_t>, isa::Reg> regs;
};

void emit_pass(isa::Builder& b, const Pass& ps, const LoadFn& load, const TempAddrFn* wide) {
    const auto scope = b.scope("pass");
    Addresses ad(b, load, wide);
    const Placed& ep = ps.ep;
    st::Spec sp;
    sp.fp.name = "elementwise";
    sp.fp.units = ps.pixels;
    sp.fp.areas.assign(1 + ep.fulls.size() + size_t(ep.areas) + ep.rows.size(), ps.C);
    sp.fp.fixed.assign(ep.columns.size() + size_t(ep.col_areas), ps.C);
    for (size_t i = 0; i < ep.fulls.size(); ++i)
        sp.ins.emplace_back(st::Operand::hbm(ad.of(ep.fulls[i]->buffer)), int(1 + i));
    sp.outs.emplace_back(st::Operand::hbm(ad.of(ps.out)), 0);
    for (size_t i = 0; i < ep.columns.size(); ++i)
        sp.fixed_ins.push_back({st::Operand::hbm(ad.of(ep.columns[i]->buffer)), int(i)});
    // Image rows: the C values of the tile's image, row-major or in T(8, 128) tiles.
    const int row_area0 = int(1 + ep.fulls.size()) + ep.areas;
    for (size_t i = 0; i < ep.rows.size(); ++i) {
        const isa::Arg base = ad.of(ep.rows[i]->buffer);
        const bool tiled = !ep.rows[i]->layout.tile.empty();
        const int64_t sub = tiled ? ep.rows[i]->layout.tile[0] : 1, lanes = tiled ? 128 : ps.C;
        const int64_t chunks = ps.C / lanes, image = ps.image, area = row_area0 + int(i);
        sp.ins.emplace_back(st::Operand::hbm(base), area,
                            [=](st::Body& bd, const isa::Reg& first, const isa::Reg&,
                                const isa::Reg& slot, const isa::Flag& flag) {
                                const isa::Reg& a = bd.tmp(0);
                                const isa::Reg& r = bd.tmp(1);
                                bd.emit(Opcode::Divu, {a, first, imm(image)});  // the image
                                bd.emit(Opcode::Remu, {r, a, imm(sub)});
                                bd.emit(Opcode::Mul, {r, r, imm(lanes * 4)});
                                bd.emit(Opcode::Divu, {a, a, imm(sub)});
                                bd.emit(Opcode::Mul, {a, a, imm(chunks * sub * lanes * 4)});
                                bd.emit(Opcode::Add, {a, a, r});
                                bd.emit(Opcode::Add, {a, a, base});
                                bd.emit(Opcode::DmaHv,
                                        {bd.at(slot, area), a, imm(chunks), imm(lanes * 4),
                                         imm(lanes * 4), imm(sub * lanes * 4), flag});
                            });
    }
    sp.body = [&](st::Body& bd) {
        const isa::Reg& n = bd.scratch();
        bd.emit(Opcode::Mul, {n, bd.units(), imm(ps.C)});
        TileCtx t{
            bd.builder(), [&](Opcode op, std::initializer_list<isa::Arg> a) { bd.vpu(op, a); },
            bd.a(0),      {},
            {},           {},
            {},           bd.units(),
            ps.C,         n};
        for (size_t i = 0; i < ep.columns.size(); ++i) t.columns.push_back(bd.f(int(i)));
        for (size_t i = 0; i < ep.fulls.size(); ++i) t.fulls.push_back(bd.a(int(1 + i)));
        for (int i = 0; i < ep.areas; ++i) t.areas.push_back(bd.a(int(1 + ep.fulls.size()) + i));
        for (int i = 0; i < ep.col_areas; ++i)
            t.col_areas.push_back(bd.f(int(ep.columns.size()) + i));
        for (size_t i = 0; i < ep.rows.size(); ++i) t.rows_of.push_back(bd.a(row_area0 + int(i)));
        emit_steps(t, ep);
    };
    st::emit(b, sp, ps.tile);
}

void emit_conv(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load,
               const LoadArgFn& load_arg, std::optional<DerivedSlot> slot, const TempAddrFn* wide) {
    {
        const auto scope = b.scope("conv");
        Addresses ad(b, load, wide);
        const isa::Arg xs = ad.of(p.scratch_buf);
        // The packed filter: a derived buffer kept across launches, or the scratch.
        std::optional<isa::Reg> derived, stale;
        if (slot) {
            // The argument is the arena's base plus the stale mask below kDerivedAlign.
            derived.emplace(b.reg("conv.derived"));
            stale.emplace(b.reg("conv.stale"));
            load_arg(*derived);
            b.emit(Opcode::And, {*stale, *derived, imm(kDerivedAlign - 1)});
            b.emit(Opcode::Sub, {*derived, *derived, *stale});
        }
        const isa::Arg ws = derived ? *derived + int64_t(slot->offset) : xs + int64_t(p.scratch.x);
        const isa::Arg bs = xs + int64_t(p.scratch.x + p.scratch.w);
        if (p.folded) {
            // A pointwise convolution's dot reads x's rows where they lie: no im2col.
            if (!p.pointwise) {
                const auto pack = b.scope("im2col");
                Addresses in(b, load, &ad);
                driver::emit(b, p.im2col,
                             std::vector<st::Operand>{st::Operand::hbm(in.of(p.x->buffer)),
                                                      st::Operand::hbm(xs)});
            }
        } else {
            // The packing kernels read the fusion's operands in their row-major layouts.
            const auto pack = b.scope("pack");
            Addresses in(b, load, &ad);
            const isa::Arg x = in.of(p.x->buffer);
            driver::emit(b, p.pack_x,
                         std::vector<st::Operand>{st::Operand::hbm(x), st::Operand::hbm(xs)});
            const isa::Arg w = in.of(p.w->buffer);
            const auto pack_w = [&] {
                driver::emit(b, p.pack_w,
                             std::vector<st::Operand>{st::Operand::hbm(w), st::Operand::hbm(ws)});
            };
            if (slot) {
                // Packed by the first launch and again only after the parameter is rewritten.
                b.emit(Opcode::And, {*stale, *stale, imm(int64_t(1) << slot->bit)});
                b.if_(isa::Cond::Ne, *stale, imm(0), pack_w);
            } else {
                pack_w();
            }
            driver::emit(b, p.zero, std::vector<st::Operand>{st::Operand::hbm(bs)});
        }
        stale.reset();  // the kernel needs the register
        // The Column sides into the scratch, behind the bias.
        const int64_t cols_at = int64_t(p.scratch.x + p.scratch.w + p.scratch.bias);
        const auto column = [&](size_t i) {
            return xs + (cols_at + int64_t(i * p.scratch.column));
        };
        if (!p.ep.columns.empty()) {
            const auto copy = b.scope("columns");
            Addresses in(b, load, &ad);
            st::Spec sp;
            sp.fp.name = "columns";
            sp.fp.units = p.key.shape.cout;
            sp.body = [](st::Body&) {};  // a copy
            for (size_t i = 0; i < p.ep.columns.size(); ++i) {
                sp.fp.areas.push_back(1);
                sp.ins.emplace_back(st::Operand::hbm(in.of(p.ep.columns[i]->buffer)), int(i));
                sp.outs.emplace_back(st::Operand::hbm(column(i)), int(i));
            }
            st::emit(b, sp, st::plan(sp.fp, b.vmem_free()));
        }
        const isa::Arg y = ad.of(p.y->buffer);
        driver::Epilogue ep;
        for (size_t i = 0; i < p.ep.columns.size(); ++i)
            ep.sides.push_back({driver::EpilogueSide::Kind::Column, st::Operand::hbm(column(i))});
        for (const FusionValue* fv : p.ep.fulls)
            ep.sides.push_back(
                {driver::EpilogueSide::Kind::Full, st::Operand::hbm(ad.of(fv->buffer))});
        std::vector<isa::Vmem> areas, col_areas;
        for (int i = 0; i < p.ep.areas; ++i)
            areas.push_back(b.vmem(fmt::format("epilogue{}", i), p.area_bytes, 512));
        for (int i = 0; i < p.ep.col_areas; ++i)
            col_areas.push_back(b.vmem(fmt::format("epilogue.col{}", i),
                                       align512(uint64_t(p.folded ? p.dot.C : p.key.tiling.C) * 4),
                                       512));
        if (!p.ep.steps.empty())
            ep.body = [&](driver::EpilogueTile& et) {
                isa::Builder& bb = et.builder();
                const isa::Reg n = bb.reg("epilogue.values");
                bb.emit(Opcode::Mul, {n, et.rows(), imm(et.cols())});
                TileCtx t{
                    bb,        [&](Opcode op, std::initializer_list<isa::Arg> a) { et.vpu(op, a); },
                    et.out(),  {},
                    {},        {},
                    {},        et.rows(),
                    et.cols(), n};
                const size_t nc = p.ep.columns.size();
                for (size_t i = 0; i < nc; ++i) t.columns.push_back(et.side(i));
                for (size_t i = 0; i < p.ep.fulls.size(); ++i) t.fulls.push_back(et.side(nc + i));
                for (const isa::Vmem& a : areas) t.areas.push_back(a.at(0));
                for (const isa::Vmem& a : col_areas) t.col_areas.push_back(a.at(0));
                emit_steps(t, p.ep);
            };
        if (p.folded) {
            const isa::Reg w = b.reg("conv.w");
            load(w, p.w->buffer);
            const isa::Arg a = p.pointwise ? ad.of(p.x->buffer) : xs;
            driver::emit_dot(b, p.dot,
                             {st::Operand::hbm(a), st::Operand::hbm(w), st::Operand::hbm(y)}, ep);
        } else {
            driver::Conv2dOperands ops{
                st::Operand::hbm(xs), st::Operand::hbm(ws), st::Operand::hbm(bs),
                st::Operand::hbm(y),
                st::Operand::scalar(imm(driver::conv2d_blocks(p.key.shape, p.key.tiling)))};
            driver::emit_conv2d(b, p.key, ops, ep);
        }
    }
    for (const Pass& ps : p.after) emit_pass(b, ps, load, wide);
}

void emit_global_sum(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load,
                     const TempAddrFn* wide) {
    if (p.before) emit_pass(b, *p.before, load, wide);
    const auto scope = b.scope("global_sum");
    Addresses ad(b, load, wide);
    const isa::Arg x = ad.of(p.before ? p.before->out : p.x->buffer);
    const isa::Arg y = ad.of(p.y->buffer);
    if (p.zero_out) driver::emit(b, *p.zero_out, std::vector<st::Operand>{st::Operand::hbm(y)});
    enum { X, Part, Y };
    const uint32_t C = p.channels, hw = p.hw, L = p.lanes, P = p.parts;
    st::Spec sp;
    sp.fp.name = "global_sum";
    sp.fp.units = p.images;
    sp.fp.areas = {hw * C, P * C, padded_channels(p)};
    sp.fp.max_tile_units = 1;
    sp.ins.emplace_back(st::Operand::hbm(x), X);
    if (p.out_tile_rows == 1) {
        sp.outs.emplace_back(st::Operand::hbm(y), Y);
    } else {
        // Image n's C values go to row n % 8 of its band's T(8,128) tiles: one strided DMA.
        const uint32_t rows = p.out_tile_rows, CT = (C + L - 1) / L;
        sp.outs.emplace_back(st::Operand::hbm(y), Y,
                             [=](st::Body& bd, const isa::Reg& first, const isa::Reg&,
                                 const isa::Reg& slot, const isa::Flag& flag) {
                                 const isa::Reg& a = bd.tmp(0);
                                 const isa::Reg& r = bd.tmp(1);
                                 bd.emit(Opcode::Remu, {r, first, imm(rows)});
                                 bd.emit(Opcode::Mul, {r, r, imm(int64_t(L) * 4)});
                                 bd.emit(Opcode::Divu, {a, first, imm(rows)});
                                 bd.emit(Opcode::Mul, {a, a, imm(int64_t(CT) * rows * L * 4)});
                                 bd.emit(Opcode::Add, {a, a, r});
                                 bd.emit(Opcode::Add, {a, a, y});
                                 bd.emit(Opcode::DmaVh,
                                         {a, bd.at(slot, Y), imm(CT), imm(int64_t(L) * 4),
                                          imm(int64_t(rows) * L * 4), imm(int64_t(L) * 4), flag});
                             });
    }
    const uint32_t padded = padded_channels(p);
    sp.body = [=](st::Body& bd) {
        // The padding lanes of a tiled row: +0.0 (v.cmpgt x, x, x), the sums over them.
        if (padded != C) bd.vpu(Opcode::VCmpGt, {bd.a(Y), bd.a(Y), bd.a(Y), imm(padded)});
        bd.vpu(Opcode::VCmpGt, {bd.a(Part), bd.a(Part), bd.a(Part), imm(P * C)});
        for (uint32_t r = 0; r < hw; r += P)
            bd.vpu(Opcode::VAdd, {bd.a(Part), bd.a(Part), bd.a(X) + int64_t(r) * C * 4,
                                  imm(std::min(P, hw - r) * C)});
        bd.vpu(Opcode::VCSum, {bd.a(Y), bd.a(Part), imm(P), imm(C)});
    };
    st::emit(b, sp, p.tile);
}

/// A filter gradient over K blocks: dots over consecutive blocks of col's and dy's rows (the
/// pixels) that add into one result as the one dot over every pixel would (DotKey::accumulate):
/// the first block's dot starts from zero, the middle ones (a loop) and the last accumulate from
/// the partial results (the scratch behind col), and the last writes the result through the
/// epilogue. Each block's dot is the kernel's whole pipeline; its rows advance per block.
void emit_filter_grad_blocks(isa::Builder& b, const ConvPoolFusion& p, const isa::Arg& col,
                             const isa::Arg& dy, const isa::Arg& y, const driver::Epilogue& ep) {
    const auto scope = b.scope("k_blocks");
    const isa::Arg partial = col + int64_t(p.partial_offset);
    const int64_t kc = p.dot.M, cout = p.dot.N;
    const int64_t a_step = int64_t(p.k_block) * kc * 4, w_step = int64_t(p.k_block) * cout * 4;
    const isa::Reg a = b.reg("block.col"), w = b.reg("block.dy");
    b.emit(Opcode::Add, {a, col, imm(0)});
    b.emit(Opcode::Add, {w, dy, imm(0)});
    driver::DotKey first = p.dot, mid = p.dot, last = p.dot;
    first.accumulate = false;
    mid.accumulate = last.accumulate = true;
    first.full_sides = mid.full_sides = 0;
    last.K = p.k_last;
    const driver::Epilogue none;
    driver::emit_dot(b, first,
                     {st::Operand::hbm(a), st::Operand::hbm(w), st::Operand::hbm(partial)}, none);
    const auto next = [&] {
        b.emit(Opcode::Add, {a, a, imm(a_step)});
        b.emit(Opcode::Add, {w, w, imm(w_step)});
    };
    if (p.k_blocks > 2) {
        const isa::Smem counter = b.smem("block.count", 1);
        b.emit(Opcode::Sw, {imm(0), counter.word(0)});
        const isa::Label loop = b.label("k_block");
        b.bind(loop);
        next();
        driver::emit_dot(
            b, mid, {st::Operand::hbm(a), st::Operand::hbm(w), st::Operand::hbm(partial)}, none);
        const isa::Reg t = b.reg("block.index");
        b.emit(Opcode::Lw, {t, counter.word(0)});
        b.emit(Opcode::Add, {t, t, imm(1)});
        b.emit(Opcode::Sw, {t, counter.word(0)});
        b.emit(Opcode::Bltu, {t, imm(int64_t(p.k_blocks) - 2), loop});
    }
    next();
    driver::emit_dot_accumulate(b, last,
                                {st::Operand::hbm(a), st::Operand::hbm(w), st::Operand::hbm(y)},
                                st::Operand::hbm(partial), ep);
}

void emit_conv_grad(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load,
                    const TempAddrFn* wide) {
    const auto scope = b.scope("conv_grad");
    Addresses ad(b, load, wide);
    const isa::Arg col = ad.of(p.scratch_buf);
    if (p.input_grad) {
        {
            const auto dot = b.scope("dcol");
            Addresses in(b, load, &ad);
            driver::emit_dot(b, p.dot,
                             {st::Operand::hbm(in.of(p.grad_a->buffer)),
                              st::Operand::hbm(in.of(p.grad_b->buffer)), st::Operand::hbm(col)});
        }
        driver::emit(
            b, p.grad_aux,
            std::vector<st::Operand>{st::Operand::hbm(col), st::Operand::hbm(ad.of(p.y->buffer))});
    } else {
        {
            const auto im2col = b.scope("im2col");
            Addresses in(b, load, &ad);
            driver::emit(b, p.grad_aux,
                         std::vector<st::Operand>{st::Operand::hbm(in.of(p.grad_a->buffer)),
                                                  st::Operand::hbm(col)});
        }
        driver::Epilogue ep;
        for (const FusionValue* fv : p.ep.fulls)
            ep.sides.push_back(
                {driver::EpilogueSide::Kind::Full, st::Operand::hbm(ad.of(fv->buffer))});
        std::vector<isa::Vmem> areas;
        for (int i = 0; i < p.ep.areas; ++i)
            areas.push_back(b.vmem(fmt::format("epilogue{}", i), p.area_bytes, 512));
        if (!p.ep.steps.empty())
            ep.body = [&](driver::EpilogueTile& et) {
                isa::Builder& bb = et.builder();
                const isa::Reg n = bb.reg("epilogue.values");
                bb.emit(Opcode::Mul, {n, et.rows(), imm(et.cols())});
                TileCtx t{
                    bb,        [&](Opcode op, std::initializer_list<isa::Arg> a) { et.vpu(op, a); },
                    et.out(),  {},
                    {},        {},
                    {},        et.rows(),
                    et.cols(), n};
                for (size_t i = 0; i < p.ep.fulls.size(); ++i) t.fulls.push_back(et.side(i));
                for (const isa::Vmem& a : areas) t.areas.push_back(a.at(0));
                emit_steps(t, p.ep);
            };
        if (p.k_blocks == 1)
            driver::emit_dot(b, p.dot,
                             {st::Operand::hbm(col), st::Operand::hbm(ad.of(p.grad_b->buffer)),
                              st::Operand::hbm(ad.of(p.y->buffer))},
                             ep);
        else
            emit_filter_grad_blocks(b, p, col, ad.of(p.grad_b->buffer), ad.of(p.y->buffer), ep);
    }
    for (const Pass& ps : p.after) emit_pass(b, ps, load, wide);
}

void emit_pool(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load,
               const TempAddrFn* wide) {
    if (p.before) emit_pass(b, *p.before, load, wide);
    for (const Pass& ps : p.befores) emit_pass(b, ps, load, wide);
    const auto scope = b.scope("pool");
    Addresses ad(b, load, wide);
    std::vector<st::Operand> ops;
    if (p.grad_operands.empty())
        ops.push_back(st::Operand::hbm(ad.of(p.before ? p.before->out : p.x->buffer)));
    for (const BufferRef& r : p.grad_operands) ops.push_back(st::Operand::hbm(ad.of(r)));
    ops.push_back(st::Operand::hbm(ad.of(p.y->buffer)));
    driver::emit(b, p.pool, ops);
}

}  // namespace

std::shared_ptr<const ConvPoolFusion> plan_conv_pool_fusion(const Graph& g, const Fusion& f,
                                                            const hw::BoardConfig& board) {
    if (f.hero == kNoOp) return nullptr;
    const Op& hero = g.op(f.hero);
    if (f.kind == FusionKind::Output && hero.kind == OpKind::Conv2d) return plan_conv(g, f, board);
    if (f.kind == FusionKind::Output &&
        (hero.kind == OpKind::Conv2dInputGrad || hero.kind == OpKind::Conv2dFilterGrad))
        return plan_conv_grad(g, f, board);
    if (hero.kind == OpKind::Pool || hero.kind == OpKind::MaxPoolGrad ||
        hero.kind == OpKind::AvgPoolGrad)
        return plan_pool(g, f, board);
    if (f.kind == FusionKind::Input && hero.kind == OpKind::Reduce &&
        hero.attrs.reducer == Reducer::Sum && g.shape(hero.operands[0]).rank() == 4 &&
        hero.attrs.dims == std::vector<int64_t>{1, 2})
        return plan_global_sum(g, f, board);
    return nullptr;
}

std::optional<DerivedBuffer> conv_pool_derived(const ConvPoolFusion& p) {
    return p.packed_w;
}

void emit_conv_pool_fusion(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load,
                           const LoadArgFn& load_arg, std::optional<DerivedSlot> slot,
                           const TempAddrFn* wide_temps) {
    switch (p.kind) {
        case ConvPoolFusion::Kind::Conv:
            return emit_conv(b, p, load, load_arg, slot, wide_temps);
        case ConvPoolFusion::Kind::ConvGrad:
            return emit_conv_grad(b, p, load, wide_temps);
        case ConvPoolFusion::Kind::Pool:
            return emit_pool(b, p, load, wide_temps);
        case ConvPoolFusion::Kind::GlobalSum:
            return emit_global_sum(b, p, load, wide_temps);
    }
}

}  // namespace gen

bool detail::conv_folds_taps(const driver::Conv2dShape& s, uint32_t R) {
    return s.kernel == s.stride && s.pad == 0 && driver::conv2d_folds_taps(s, R);
}

namespace detail {

void plan_convolution_scratch(CompiledStep& step, const CompileOptions& options) {
    const Graph& g = step.graph;
    for (Fusion& f : step.fusions) {
        f.scratch = {};
        if (f.hero == kNoOp) continue;
        const Op& op = g.op(f.hero);
        // A pooling or H W reduction fusion that computes its kernel's input first (its fused
        // producers) writes it to scratch, which the kernel reads.
        if (op.kind == OpKind::MaxPoolGrad || op.kind == OpKind::AvgPoolGrad) {
            for (ValueId v : op.operands)
                if (gen::inside_fusion(f, g, v))
                    f.scratch.bytes += gen::align512(uint64_t(g.shape(v).elements()) * 4);
            continue;
        }
        if (op.kind == OpKind::Pool || op.kind == OpKind::Reduce) {
            const ValueId x = op.operands[0];
            const Shape& xs = g.shape(x);
            if (xs.rank() == 4 && gen::inside_fusion(f, g, x) &&
                (op.kind == OpKind::Pool || op.attrs.dims == std::vector<int64_t>{1, 2}))
                f.scratch.bytes = uint64_t(xs.elements()) * 4;
            continue;
        }
        if (f.kind != FusionKind::Output) continue;
        if (op.kind == OpKind::Conv2dInputGrad || op.kind == OpKind::Conv2dFilterGrad) {
            const driver::Conv2dShape s = gen::grad_shape(g, op);
            f.scratch.bytes = gen::grad_scratch_bytes(s) + gen::dx_scratch_bytes(g, f);
            if (op.kind == OpKind::Conv2dFilterGrad)
                f.scratch.bytes += gen::filter_grad_partial_bytes(s, options.board);
            continue;
        }
        if (op.kind != OpKind::Conv2d || !gen::conv_unsupported(g, op, options.board).empty())
            continue;
        const driver::Conv2dShape s = gen::conv_shape_of(g, op);
        // Sides do not change the packed layouts (only the blocking), so none are counted here.
        const uint32_t columns = gen::column_operands(g, f, s.cout);
        if (gen::as_dot(s, options.board.core.mxu_rows)) {
            f.scratch.bytes = gen::folded_scratch(s, options.board.core.mxu_cols, columns).total();
            continue;
        }
        driver::Conv2dTiling t;
        try {
            t = driver::plan_conv2d(options.board, s, s.batch);
        } catch (const driver::DeviceError&) {
            continue;
        }
        f.scratch.bytes = gen::conv_scratch(s, t, columns).total();
    }
}

}  // namespace detail
}  // namespace tpu::compiler
