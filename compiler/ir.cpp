// SPDX-License-Identifier: Apache-2.0
#include "compiler/ir.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace tpu::compiler {

// ---- Types -----------------------------------------------------------------------------------

std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::F32:
            return "f32";
        case DType::BF16:
            return "bf16";
        case DType::S32:
            return "s32";
        case DType::Pred:
            return "pred";
    }
    return "?";
}

uint32_t dtype_bytes(DType t) {
    switch (t) {
        case DType::F32:
        case DType::S32:
            return 4;
        case DType::BF16:
            return 2;
        case DType::Pred:
            return 1;
    }
    return 4;
}

namespace {

bool is_float(DType t) {
    return t == DType::F32 || t == DType::BF16;
}

std::string join(const std::vector<int64_t>& v) {
    return fmt::format("{}", fmt::join(v, ","));
}

}  // namespace

int64_t Shape::elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
}

std::string Shape::to_string() const {
    return fmt::format("{}[{}]", dtype_name(dtype), join(dims));
}

std::string Layout::to_string() const {
    if (!assigned()) return "{}";
    if (tile.empty()) return fmt::format("{{{}}}", join(minor_to_major));
    return fmt::format("{{{}:T({})}}", join(minor_to_major), join(tile));
}

Layout row_major(int64_t rank) {
    Layout l;
    for (int64_t d = rank - 1; d >= 0; --d) l.minor_to_major.push_back(d);
    return l;
}

void check_layout(const Shape& s, const Layout& l, const std::string& where) {
    if (!l.assigned()) {
        if (!l.tile.empty())
            throw CompileError(fmt::format("{}: a layout with a tile needs its dim order", where));
        return;
    }
    std::vector<int64_t> sorted = l.minor_to_major;
    std::sort(sorted.begin(), sorted.end());
    bool perm = int64_t(sorted.size()) == s.rank();
    for (size_t i = 0; perm && i < sorted.size(); ++i) perm = sorted[i] == int64_t(i);
    if (!perm)
        throw CompileError(fmt::format("{}: layout {} is not an order of the {} dims of {}", where,
                                       l.to_string(), s.rank(), s.to_string()));
    if (int64_t(l.tile.size()) > s.rank())
        throw CompileError(fmt::format("{}: layout {} tiles more dims than {} has", where,
                                       l.to_string(), s.to_string()));
    for (int64_t t : l.tile)
        if (t <= 0)
            throw CompileError(
                fmt::format("{}: layout {} has a tile dim of {}", where, l.to_string(), t));
}

std::vector<int64_t> padded_physical_dims(const Shape& s, const Layout& l) {
    const Layout& lay = l.assigned() || s.rank() == 0 ? l : row_major(s.rank());
    std::vector<int64_t> phys;
    for (auto it = lay.minor_to_major.rbegin(); it != lay.minor_to_major.rend(); ++it)
        phys.push_back(s.dims[size_t(*it)]);
    const size_t k = lay.tile.size(), r = phys.size();
    for (size_t i = 0; i < k && i < r; ++i) {
        int64_t& d = phys[r - k + i];
        const int64_t t = lay.tile[i];
        d = (d + t - 1) / t * t;
    }
    return phys;
}

uint64_t layout_bytes(const Shape& s, const Layout& l) {
    uint64_t n = 1;
    for (int64_t d : padded_physical_dims(s, l)) n *= uint64_t(d);
    return n * dtype_bytes(s.dtype);
}

uint64_t physical_index(const Shape& s, const Layout& l, const std::vector<int64_t>& idx) {
    const Layout& lay = l.assigned() || s.rank() == 0 ? l : row_major(s.rank());
    const std::vector<int64_t> pdims = padded_physical_dims(s, lay);
    const size_t r = pdims.size(), k = std::min(lay.tile.size(), r);
    std::vector<int64_t> pidx(r);
    for (size_t i = 0; i < r; ++i) pidx[i] = idx[size_t(lay.minor_to_major[r - 1 - i])];
    // XLA's tiling: the array is viewed as (untiled dims, tile counts, within-tile dims) with the
    // within-tile dims most minor.
    uint64_t outer = 0;
    for (size_t i = 0; i < r; ++i) {
        const bool tiled = i >= r - k;
        const int64_t t = tiled ? lay.tile[i - (r - k)] : 1;
        outer = outer * uint64_t(pdims[i] / t) + uint64_t(pidx[i] / t);
    }
    uint64_t inner = 0, tile_elems = 1;
    for (size_t i = r - k; i < r; ++i) {
        const int64_t t = lay.tile[i - (r - k)];
        inner = inner * uint64_t(t) + uint64_t(pidx[i] % t);
        tile_elems *= uint64_t(t);
    }
    return outer * tile_elems + inner;
}

// ---- The op table ----------------------------------------------------------------------------

namespace {

struct OpInfo {
    std::string_view name;
    OpClass cls;
    int arity;
    bool expensive;
};

constexpr OpInfo kOps[] = {
#define OP(e, name, cls, arity, expensive, doc) {name, OpClass::cls, arity, expensive},
#include "compiler/ops.def"
#undef OP
};

const OpInfo& info(OpKind k) {
    return kOps[size_t(k)];
}

std::string_view reducer_name(Reducer r) {
    return r == Reducer::Sum ? "sum" : "max";
}

std::string_view comparison_name(Comparison c) {
    static constexpr std::string_view kNames[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
    return kNames[size_t(c)];
}

std::string_view precision_name(Precision p) {
    static constexpr std::string_view kNames[] = {"default", "high", "highest"};
    return kNames[size_t(p)];
}

}  // namespace

std::string_view op_name(OpKind k) {
    return info(k).name;
}

OpClass op_class(OpKind k) {
    return info(k).cls;
}

int op_arity(OpKind k) {
    return info(k).arity;
}

bool op_expensive(OpKind k) {
    return info(k).expensive;
}

// ---- Shape inference -------------------------------------------------------------------------

namespace {

[[noreturn]] void fail(OpKind k, const std::string& what) {
    throw CompileError(fmt::format("{}: {}", op_name(k), what));
}

void need_float(OpKind k, const Shape& s, const char* what) {
    if (!is_float(s.dtype))
        fail(k, fmt::format("{} is {}, expected f32 or bf16", what, s.to_string()));
}

void same(OpKind k, const Shape& a, const Shape& b, const char* what) {
    if (!(a == b)) fail(k, fmt::format("{} differ: {} and {}", what, a.to_string(), b.to_string()));
}

void check_dims_unique(OpKind k, const std::vector<int64_t>& dims, int64_t rank, const char* what) {
    std::set<int64_t> seen;
    for (int64_t d : dims) {
        if (d < 0 || d >= rank) fail(k, fmt::format("{} dim {} is outside rank {}", what, d, rank));
        if (!seen.insert(d).second) fail(k, fmt::format("{} dim {} appears twice", what, d));
    }
}

/// NHWC output size of a window.
int64_t window_out(OpKind k, int64_t in, const Window& w) {
    if (w.kernel < 1 || w.stride < 1 || w.pad < 0)
        fail(k, fmt::format("window kernel {} stride {} pad {} is not valid", w.kernel, w.stride,
                            w.pad));
    if (in + 2 * w.pad < w.kernel)
        fail(k, fmt::format("a {}x{} window does not fit {} pixels padded by {}", w.kernel,
                            w.kernel, in, w.pad));
    return (in + 2 * w.pad - w.kernel) / w.stride + 1;
}

void need_rank(OpKind k, const Shape& s, int64_t rank, const char* what) {
    if (s.rank() != rank)
        fail(k, fmt::format("{} is {}, expected rank {}", what, s.to_string(), rank));
}

void need_scalar(OpKind k, const Shape& s, const char* what) {
    if (s.rank() != 0) fail(k, fmt::format("{} is {}, expected a scalar", what, s.to_string()));
}

Shape vector_of(DType t, int64_t n) {
    return Shape{t, {n}};
}

}  // namespace

std::vector<Shape> infer_shapes(OpKind k, const std::vector<Shape>& in, const Attrs& a) {
    const int arity = op_arity(k);
    if (arity >= 0 && int(in.size()) != arity)
        fail(k, fmt::format("takes {} operands, got {}", arity, in.size()));
    switch (op_class(k)) {
        case OpClass::Leaf:
            fail(k, "leaves are made with Graph::parameter, input or constant");
        case OpClass::Literal:
            return {Shape{a.dtype, {}}};
        case OpClass::Elementwise: {
            if (k == OpKind::Select) {
                if (in[0].dtype != DType::Pred)
                    fail(k, fmt::format("the predicate is {}, expected pred", in[0].to_string()));
                if (in[0].dims != in[1].dims) same(k, in[0], in[1], "predicate and value shapes");
                same(k, in[1], in[2], "operand shapes");
                return {in[1]};
            }
            if (in.size() == 2) same(k, in[0], in[1], "operand shapes");
            switch (k) {
                case OpKind::Exp:
                case OpKind::Log:
                case OpKind::Rsqrt:
                case OpKind::Sqrt:
                case OpKind::Tanh:
                case OpKind::Erf:
                case OpKind::Div:
                case OpKind::Pow:
                    need_float(k, in[0], "the operand");
                    break;
                default:
                    break;
            }
            if (k == OpKind::Convert) return {Shape{a.dtype, in[0].dims}};
            if (k == OpKind::Compare) return {Shape{DType::Pred, in[0].dims}};
            if (in[0].dtype == DType::Pred && k != OpKind::Max && k != OpKind::Min)
                fail(k, fmt::format("arithmetic on {}", in[0].to_string()));
            return {in[0]};
        }
        case OpClass::Movement:
            switch (k) {
                case OpKind::Broadcast: {
                    const Shape& x = in[0];
                    if (int64_t(a.dims.size()) != x.rank())
                        fail(k, fmt::format("{} operand dims but {} in dims={{{}}}", x.rank(),
                                            a.dims.size(), join(a.dims)));
                    const int64_t r = int64_t(a.out_dims.size());
                    for (size_t i = 0; i < a.dims.size(); ++i) {
                        const int64_t d = a.dims[i];
                        if (d < 0 || d >= r || (i > 0 && d <= a.dims[i - 1]))
                            fail(k, fmt::format("dims={{{}}} must be increasing dims of the "
                                                "rank-{} result",
                                                join(a.dims), r));
                        if (a.out_dims[size_t(d)] != x.dims[i])
                            fail(k, fmt::format("operand dim {} has {} elements, result dim {} "
                                                "has {}",
                                                i, x.dims[i], d, a.out_dims[size_t(d)]));
                    }
                    return {Shape{x.dtype, a.out_dims}};
                }
                case OpKind::Reshape: {
                    const Shape out{in[0].dtype, a.out_dims};
                    for (int64_t d : a.out_dims)
                        if (d < 0) fail(k, fmt::format("dim {} is negative", d));
                    if (out.elements() != in[0].elements())
                        fail(k, fmt::format("{} has {} elements, [{}] has {}", in[0].to_string(),
                                            in[0].elements(), join(a.out_dims), out.elements()));
                    return {out};
                }
                case OpKind::Transpose: {
                    if (int64_t(a.dims.size()) != in[0].rank())
                        fail(k, fmt::format("permutation {{{}}} for {}", join(a.dims),
                                            in[0].to_string()));
                    check_dims_unique(k, a.dims, in[0].rank(), "permutation");
                    Shape out{in[0].dtype, {}};
                    for (int64_t d : a.dims) out.dims.push_back(in[0].dims[size_t(d)]);
                    return {out};
                }
                case OpKind::Slice: {
                    const Shape& x = in[0];
                    if (int64_t(a.dims.size()) != x.rank() || int64_t(a.limits.size()) != x.rank())
                        fail(k,
                             fmt::format("{} needs {} starts and limits", x.to_string(), x.rank()));
                    Shape out{x.dtype, {}};
                    for (int64_t i = 0; i < x.rank(); ++i) {
                        const int64_t s = a.dims[size_t(i)], e = a.limits[size_t(i)];
                        if (s < 0 || s > e || e > x.dims[size_t(i)])
                            fail(k, fmt::format("dim {}: [{}, {}) is outside [0, {})", i, s, e,
                                                x.dims[size_t(i)]));
                        out.dims.push_back(e - s);
                    }
                    return {out};
                }
                case OpKind::Concatenate: {
                    if (in.empty()) fail(k, "needs at least one operand");
                    Shape out = in[0];
                    if (a.axis < 0 || a.axis >= out.rank())
                        fail(k, fmt::format("axis {} outside rank {}", a.axis, out.rank()));
                    for (size_t i = 1; i < in.size(); ++i) {
                        bool ok = in[i].dtype == out.dtype && in[i].rank() == out.rank();
                        for (int64_t d = 0; ok && d < out.rank(); ++d)
                            ok = d == a.axis || in[i].dims[size_t(d)] == out.dims[size_t(d)];
                        if (!ok)
                            fail(k, fmt::format("{} does not join {} along dim {}",
                                                in[i].to_string(), in[0].to_string(), a.axis));
                        out.dims[size_t(a.axis)] += in[i].dims[size_t(a.axis)];
                    }
                    return {out};
                }
                case OpKind::Iota:
                    if (a.axis < 0 || a.axis >= int64_t(a.out_dims.size()))
                        fail(k, fmt::format("axis {} outside rank {}", a.axis, a.out_dims.size()));
                    return {Shape{a.dtype, a.out_dims}};
                default:
                    break;
            }
            break;
        case OpClass::Reduce: {
            check_dims_unique(k, a.dims, in[0].rank(), "reduced");
            if (in[0].dtype == DType::Pred) fail(k, "cannot reduce pred");
            Shape out{in[0].dtype, {}};
            for (int64_t d = 0; d < in[0].rank(); ++d)
                if (std::find(a.dims.begin(), a.dims.end(), d) == a.dims.end())
                    out.dims.push_back(in[0].dims[size_t(d)]);
            return {out};
        }
        case OpClass::Contraction: {
            const Shape &x = in[0], &y = in[1];
            need_float(k, x, "the lhs");
            need_float(k, y, "the rhs");
            if (x.dtype != y.dtype)
                fail(k,
                     fmt::format("operand types differ: {} and {}", x.to_string(), y.to_string()));
            if (k == OpKind::Dot) {
                const DotDims& d = a.dot;
                if (d.lhs_batch.size() != d.rhs_batch.size() ||
                    d.lhs_contracting.size() != d.rhs_contracting.size())
                    fail(k, "lhs and rhs need as many batch and as many contracting dims");
                std::vector<int64_t> lused = d.lhs_batch, rused = d.rhs_batch;
                lused.insert(lused.end(), d.lhs_contracting.begin(), d.lhs_contracting.end());
                rused.insert(rused.end(), d.rhs_contracting.begin(), d.rhs_contracting.end());
                check_dims_unique(k, lused, x.rank(), "lhs batch/contracting");
                check_dims_unique(k, rused, y.rank(), "rhs batch/contracting");
                auto pair = [&](const std::vector<int64_t>& l, const std::vector<int64_t>& r,
                                const char* what) {
                    for (size_t i = 0; i < l.size(); ++i)
                        if (x.dims[size_t(l[i])] != y.dims[size_t(r[i])])
                            fail(k, fmt::format("lhs {} dim {} has {} elements, rhs {} dim {} "
                                                "has {}",
                                                what, l[i], x.dims[size_t(l[i])], what, r[i],
                                                y.dims[size_t(r[i])]));
                };
                pair(d.lhs_batch, d.rhs_batch, "batch");
                pair(d.lhs_contracting, d.rhs_contracting, "contracting");
                Shape out{x.dtype, {}};
                for (int64_t b : d.lhs_batch) out.dims.push_back(x.dims[size_t(b)]);
                for (int64_t i = 0; i < x.rank(); ++i)
                    if (std::find(lused.begin(), lused.end(), i) == lused.end())
                        out.dims.push_back(x.dims[size_t(i)]);
                for (int64_t i = 0; i < y.rank(); ++i)
                    if (std::find(rused.begin(), rused.end(), i) == rused.end())
                        out.dims.push_back(y.dims[size_t(i)]);
                return {out};
            }
            need_rank(k, x, 4, "the first operand");
            need_rank(k, y, 4, "the second operand");
            const Window& w = a.window;
            if (k == OpKind::Conv2d) {
                if (y.dims[0] != w.kernel || y.dims[1] != w.kernel || y.dims[2] != x.dims[3])
                    fail(k, fmt::format("filter {} does not fit a {}x{} window over {} channels",
                                        y.to_string(), w.kernel, w.kernel, x.dims[3]));
                return {Shape{x.dtype,
                              {x.dims[0], window_out(k, x.dims[1], w), window_out(k, x.dims[2], w),
                               y.dims[3]}}};
            }
            if (w.input_dims.size() != 4)
                fail(k, "window.input_dims must hold the forward input's NHWC dims");
            const int64_t N = w.input_dims[0], H = w.input_dims[1], W = w.input_dims[2],
                          C = w.input_dims[3];
            const int64_t Ho = window_out(k, H, w), Wo = window_out(k, W, w);
            if (k == OpKind::Conv2dInputGrad) {
                // dy [N, Ho, Wo, Co], w [k, k, C, Co]
                if (x.dims != std::vector<int64_t>{N, Ho, Wo, y.dims[3]} || y.dims[0] != w.kernel ||
                    y.dims[1] != w.kernel || y.dims[2] != C)
                    fail(k, fmt::format("dy {} and filter {} do not match the input [{}]",
                                        x.to_string(), y.to_string(), join(w.input_dims)));
                return {Shape{x.dtype, w.input_dims}};
            }
            // x [N, H, W, C], dy [N, Ho, Wo, Co]
            if (x.dims != w.input_dims || y.dims[0] != N || y.dims[1] != Ho || y.dims[2] != Wo)
                fail(k, fmt::format("x {} and dy {} do not match the input [{}]", x.to_string(),
                                    y.to_string(), join(w.input_dims)));
            return {Shape{x.dtype, {w.kernel, w.kernel, C, y.dims[3]}}};
        }
        case OpClass::Window: {
            if (k == OpKind::ScatterAdd) {
                const Shape &idx = in[0], &upd = in[1];
                if (idx.dtype != DType::S32)
                    fail(k, fmt::format("indices are {}, expected s32", idx.to_string()));
                need_float(k, upd, "the updates");
                if (a.out_dims.empty()) fail(k, "the result needs at least one dim (rows)");
                std::vector<int64_t> want = idx.dims;
                want.insert(want.end(), a.out_dims.begin() + 1, a.out_dims.end());
                if (upd.dims != want)
                    fail(k,
                         fmt::format("updates are {}, expected [{}]", upd.to_string(), join(want)));
                return {Shape{upd.dtype, a.out_dims}};
            }
            const Window& w = a.window;
            if (w.pad * 2 > w.kernel)
                fail(k, fmt::format("padding {} is more than half the {}x{} window", w.pad,
                                    w.kernel, w.kernel));
            if (k == OpKind::AvgPoolGrad) {
                if (w.input_dims.size() != 4) fail(k, "window.input_dims must hold the NHWC input");
                const std::vector<int64_t> want{w.input_dims[0], window_out(k, w.input_dims[1], w),
                                                window_out(k, w.input_dims[2], w), w.input_dims[3]};
                if (in[0].dims != want)
                    fail(k, fmt::format("dy is {}, expected [{}]", in[0].to_string(), join(want)));
                return {Shape{in[0].dtype, w.input_dims}};
            }
            const Shape& x = in[0];
            need_rank(k, x, 4, "the input");
            need_float(k, x, "the input");
            const Shape out{
                x.dtype,
                {x.dims[0], window_out(k, x.dims[1], w), window_out(k, x.dims[2], w), x.dims[3]}};
            if (k == OpKind::MaxPoolGrad) {
                same(k, in[1], out, "dy and the pooled shape");
                return {x};
            }
            return {out};
        }
        case OpClass::Gather: {
            const Shape &table = in[0], &idx = in[1];
            if (idx.dtype != DType::S32)
                fail(k, fmt::format("indices are {}, expected s32", idx.to_string()));
            if (table.rank() < 1) fail(k, "the table needs at least one dim (rows)");
            Shape out{table.dtype, idx.dims};
            out.dims.insert(out.dims.end(), table.dims.begin() + 1, table.dims.end());
            return {out};
        }
        case OpClass::Rng:
            if (in[0].dtype != DType::S32) fail(k, "the seed must be s32");
            need_scalar(k, in[0], "the seed");
            return {Shape{DType::F32, a.out_dims}};
        case OpClass::Collective:
            need_float(k, in[0], "the operand");
            return {in[0]};
        case OpClass::Custom:
            if (a.target.empty()) fail(k, "needs a target name");
            return {Shape{a.dtype, a.out_dims}};
        case OpClass::Composite:
            switch (k) {
                case OpKind::Relu:
                case OpKind::Gelu:
                    need_float(k, in[0], "the operand");
                    return {in[0]};
                case OpKind::GeluGrad:
                case OpKind::SoftmaxGrad:
                case OpKind::LogSoftmaxGrad:
                    same(k, in[0], in[1], "operand shapes");
                    [[fallthrough]];
                case OpKind::Softmax:
                case OpKind::LogSoftmax:
                    need_float(k, in[0], "the operand");
                    if (k != OpKind::GeluGrad && (a.axis < 0 || a.axis >= in[0].rank()))
                        fail(k, fmt::format("axis {} outside rank {}", a.axis, in[0].rank()));
                    return {in[0]};
                case OpKind::LayerNorm: {
                    const Shape& x = in[0];
                    need_float(k, x, "the input");
                    if (x.rank() < 1) fail(k, "the input needs at least one dim");
                    const Shape feat = vector_of(x.dtype, x.dims.back());
                    same(k, in[1], feat, "gamma and the normalized dim");
                    same(k, in[2], feat, "beta and the normalized dim");
                    Shape stat = x;
                    stat.dims.back() = 1;
                    return {x, stat, stat};
                }
                case OpKind::BatchNormTraining:
                case OpKind::BatchNormInference:
                case OpKind::BatchNormGrad: {
                    const Shape& x = in[0];
                    need_float(k, x, "the input");
                    if (a.axis < 0 || a.axis >= x.rank())
                        fail(k, fmt::format("feature dim {} outside rank {}", a.axis, x.rank()));
                    const Shape feat = vector_of(x.dtype, x.dims[size_t(a.axis)]);
                    for (size_t i = 1; i < in.size(); ++i)
                        if (!(k == OpKind::BatchNormGrad && i == 4))
                            same(k, in[i], feat, "a per-feature operand and the feature dim");
                    if (k == OpKind::BatchNormInference) return {x};
                    if (k == OpKind::BatchNormGrad) same(k, in[4], x, "dy and x");
                    return {x, feat, feat};
                }
                case OpKind::CrossEntropy:
                    need_rank(k, in[0], 2, "the logits");
                    same(k, in[0], in[1], "logits and labels");
                    need_float(k, in[0], "the logits");
                    return {Shape{in[0].dtype, {}}};
                case OpKind::SgdMomentum:
                    same(k, in[0], in[1], "weight and gradient");
                    same(k, in[0], in[2], "weight and momentum buffer");
                    need_scalar(k, in[3], "lr");
                    return {in[0], in[2]};
                case OpKind::Adam:
                    same(k, in[0], in[1], "weight and gradient");
                    same(k, in[0], in[2], "weight and first moment");
                    same(k, in[0], in[3], "weight and second moment");
                    need_scalar(k, in[4], "lr_c1");
                    need_scalar(k, in[5], "c2");
                    return {in[0], in[2], in[3]};
                default:
                    break;
            }
            break;
    }
    fail(k, "has no shape rule");
}

std::string attrs_to_string(OpKind k, const Attrs& a) {
    std::vector<std::string> p;
    const auto dims = [&](const char* name, const std::vector<int64_t>& v) {
        p.push_back(fmt::format("{}={{{}}}", name, join(v)));
    };
    const auto window = [&] {
        p.push_back(fmt::format("window={{size={}x{} stride={} pad={}}}", a.window.kernel,
                                a.window.kernel, a.window.stride, a.window.pad));
        if (!a.window.input_dims.empty()) dims("input", a.window.input_dims);
    };
    switch (k) {
        case OpKind::Literal:
            p.push_back(fmt::format("{}", a.scalar));
            break;
        case OpKind::Convert:
            p.push_back(fmt::format("to={}", dtype_name(a.dtype)));
            break;
        case OpKind::Compare:
            p.push_back(fmt::format("direction={}", comparison_name(a.comparison)));
            break;
        case OpKind::Broadcast:
            dims("dims", a.dims);
            break;
        case OpKind::Transpose:
            dims("dims", a.dims);
            break;
        case OpKind::Slice: {
            std::vector<std::string> r;
            for (size_t i = 0; i < a.dims.size(); ++i)
                r.push_back(fmt::format("[{}:{}]", a.dims[i], a.limits[i]));
            p.push_back(fmt::format("slice={{{}}}", fmt::join(r, ",")));
            break;
        }
        case OpKind::Concatenate:
        case OpKind::Iota:
            p.push_back(fmt::format("dimensions={{{}}}", a.axis));
            break;
        case OpKind::Reduce:
            dims("dimensions", a.dims);
            p.push_back(fmt::format("to_apply={}", reducer_name(a.reducer)));
            break;
        case OpKind::Dot:
            if (!a.dot.lhs_batch.empty()) dims("lhs_batch_dims", a.dot.lhs_batch);
            dims("lhs_contracting_dims", a.dot.lhs_contracting);
            if (!a.dot.rhs_batch.empty()) dims("rhs_batch_dims", a.dot.rhs_batch);
            dims("rhs_contracting_dims", a.dot.rhs_contracting);
            if (a.precision != Precision::Default)
                p.push_back(fmt::format("precision={}", precision_name(a.precision)));
            break;
        case OpKind::Conv2d:
        case OpKind::Conv2dInputGrad:
        case OpKind::Conv2dFilterGrad:
            window();
            p.push_back("dim_labels=b01f_01io->b01f");
            if (a.precision != Precision::Default)
                p.push_back(fmt::format("precision={}", precision_name(a.precision)));
            break;
        case OpKind::Pool:
            p.push_back(a.pool == PoolKind::Max ? "to_apply=max" : "to_apply=avg");
            window();
            break;
        case OpKind::MaxPoolGrad:
        case OpKind::AvgPoolGrad:
            window();
            break;
        case OpKind::AllReduce:
            p.push_back("to_apply=sum");
            if (a.scalar != 1.0) p.push_back(fmt::format("scale={}", a.scalar));
            break;
        case OpKind::CustomCall:
            p.push_back(fmt::format("custom_call_target=\"{}\"", a.target));
            break;
        case OpKind::Gelu:
        case OpKind::GeluGrad:
            p.push_back(fmt::format("approximate={}", a.approximate ? "tanh" : "none"));
            break;
        case OpKind::Softmax:
        case OpKind::SoftmaxGrad:
        case OpKind::LogSoftmax:
        case OpKind::LogSoftmaxGrad:
            p.push_back(fmt::format("dim={}", a.axis));
            break;
        case OpKind::LayerNorm:
            p.push_back(fmt::format("epsilon={}", a.eps));
            break;
        case OpKind::BatchNormTraining:
        case OpKind::BatchNormInference:
        case OpKind::BatchNormGrad:
            p.push_back(fmt::format("epsilon={}", a.eps));
            p.push_back(fmt::format("feature_index={}", a.axis));
            break;
        case OpKind::SgdMomentum:
            p.push_back(fmt::format("momentum={}", a.momentum));
            break;
        case OpKind::Adam:
            p.push_back(fmt::format("beta1={}", a.beta1));
            p.push_back(fmt::format("beta2={}", a.beta2));
            p.push_back(fmt::format("epsilon={}", a.eps));
            break;
        default:
            break;
    }
    return fmt::format("{}", fmt::join(p, ", "));
}

// ---- Graph -----------------------------------------------------------------------------------

ValueId Graph::leaf(OpKind kind, const Shape& s, std::string name, Layout layout) {
    for (int64_t d : s.dims)
        if (d < 0)
            throw CompileError(fmt::format("{} '{}': dim {} is negative", op_name(kind), name, d));
    check_layout(s, layout, fmt::format("{} '{}'", op_name(kind), name));
    const size_t slot = kind == OpKind::Parameter ? 0 : kind == OpKind::Input ? 1 : 2;
    Op op;
    op.kind = kind;
    op.attrs.axis = m_leaf_count[slot]++;
    op.name = std::move(name);
    const ValueId v = ValueId(m_values.size());
    m_values.push_back(Value{s, std::move(layout), OpId(m_ops.size()), 0});
    op.results = {v};
    m_ops.push_back(std::move(op));
    return v;
}

ValueId Graph::parameter(const Shape& s, std::string name, Layout layout) {
    return leaf(OpKind::Parameter, s, std::move(name), std::move(layout));
}

ValueId Graph::input(const Shape& s, std::string name, Layout layout) {
    return leaf(OpKind::Input, s, std::move(name), std::move(layout));
}

ValueId Graph::constant(const Shape& s, std::vector<float> data, std::string name) {
    if (int64_t(data.size()) != s.elements())
        throw CompileError(fmt::format("constant '{}': {} needs {} values, got {}", name,
                                       s.to_string(), s.elements(), data.size()));
    const ValueId v = leaf(OpKind::Constant, s, std::move(name), {});
    m_constants.push_back(std::move(data));
    return v;
}

std::vector<ValueId> Graph::add(OpKind kind, std::vector<ValueId> operands, Attrs attrs) {
    std::vector<Shape> shapes;
    for (ValueId v : operands) {
        if (v >= m_values.size())
            throw CompileError(
                fmt::format("{}: operand %{} is not a value of this graph", op_name(kind), v));
        shapes.push_back(m_values[v].shape);
    }
    std::vector<Shape> results;
    try {
        results = infer_shapes(kind, shapes, attrs);
    } catch (const CompileError& e) {
        if (m_scope.empty()) throw;
        throw CompileError(fmt::format("{} (in {})", e.what(), m_scope));
    }
    Op op;
    op.kind = kind;
    op.operands = std::move(operands);
    op.attrs = std::move(attrs);
    op.name = m_scope;
    const OpId id = OpId(m_ops.size());
    for (uint32_t i = 0; i < results.size(); ++i) {
        op.results.push_back(ValueId(m_values.size()));
        m_values.push_back(Value{std::move(results[i]), {}, id, i});
    }
    m_ops.push_back(std::move(op));
    return m_ops.back().results;
}

ValueId Graph::add1(OpKind kind, std::vector<ValueId> operands, Attrs attrs) {
    const auto r = add(kind, std::move(operands), std::move(attrs));
    if (r.size() != 1)
        throw CompileError(fmt::format("{} has {} results, not one", op_name(kind), r.size()));
    return r[0];
}

void Graph::add_output(ValueId v, std::string name, int64_t updates_parameter) {
    if (v >= m_values.size())
        throw CompileError(fmt::format("output '{}': %{} is not a value of this graph", name, v));
    if (updates_parameter >= 0) {
        const auto params = leaves(OpKind::Parameter);
        if (updates_parameter >= int64_t(params.size()))
            throw CompileError(fmt::format("output '{}' updates parameter {}, but the graph has {}",
                                           name, updates_parameter, params.size()));
        const Shape& ps = m_values[params[size_t(updates_parameter)]].shape;
        if (!(ps == m_values[v].shape))
            throw CompileError(fmt::format("output '{}' ({}) cannot update parameter {} ({})", name,
                                           m_values[v].shape.to_string(), updates_parameter,
                                           ps.to_string()));
        for (const Output& o : m_outputs)
            if (o.updates_parameter == updates_parameter)
                throw CompileError(fmt::format("parameter {} is updated twice ('{}' and '{}')",
                                               updates_parameter, o.name, name));
    }
    m_outputs.push_back(Output{v, std::move(name), updates_parameter});
}

std::string Graph::set_scope(std::string scope) {
    return std::exchange(m_scope, std::move(scope));
}

ScopeGuard::ScopeGuard(Graph& g, const std::string& name) : m_g(g), m_previous(g.scope()) {
    if (!name.empty()) g.set_scope(m_previous.empty() ? name : m_previous + "." + name);
}

std::vector<ValueId> Graph::leaves(OpKind kind) const {
    std::vector<ValueId> out;
    for (const Op& op : m_ops)
        if (op.kind == kind) out.push_back(op.results[0]);
    return out;
}

std::vector<std::vector<OpId>> Graph::users() const {
    std::vector<std::vector<OpId>> u(m_values.size());
    for (OpId id = 0; id < m_ops.size(); ++id)
        for (ValueId v : m_ops[id].operands) u[v].push_back(id);
    return u;
}

namespace {

std::string hex(double x) {
    return fmt::format("{:a}", x);
}

void fingerprint_attrs(std::string& s, const Attrs& a) {
    s += fmt::format("d{}|l{}|o{}|x{}|", join(a.dims), join(a.limits), join(a.out_dims), a.axis);
    s += fmt::format("dot{};{};{};{}|", join(a.dot.lhs_batch), join(a.dot.rhs_batch),
                     join(a.dot.lhs_contracting), join(a.dot.rhs_contracting));
    s += fmt::format("p{}w{},{},{},{}|", int(a.precision), a.window.kernel, a.window.stride,
                     a.window.pad, join(a.window.input_dims));
    s += fmt::format("k{}{}{}{}|", int(a.pool), int(a.reducer), int(a.comparison), int(a.dtype));
    s += fmt::format("f{},{},{},{},{}|{}|{}", hex(a.scalar), hex(a.eps), hex(a.momentum),
                     hex(a.beta1), hex(a.beta2), a.approximate, a.target);
}

}  // namespace

std::string Graph::fingerprint() const {
    std::string s;
    for (const Op& op : m_ops) {
        s += fmt::format("{}(", int(op.kind));
        for (ValueId v : op.operands) s += fmt::format("{},", v);
        s += ")->";
        for (ValueId v : op.results) {
            const Value& val = m_values[v];
            s += val.shape.to_string() + val.layout.to_string() + ";";
        }
        fingerprint_attrs(s, op.attrs);
        s += "\n";
    }
    for (const Output& o : m_outputs) s += fmt::format("out {} {}\n", o.value, o.updates_parameter);
    return s;
}

uint64_t Graph::hash() const {
    uint64_t h = 14695981039346656037ull;
    for (unsigned char c : fingerprint()) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

std::string Graph::to_string() const {
    std::string s = fmt::format("graph {:016x} {{\n", hash());
    for (const Op& op : m_ops) {
        std::vector<std::string> names, types;
        for (ValueId v : op.results) {
            names.push_back(fmt::format("%{}", v));
            const Value& val = m_values[v];
            types.push_back(val.shape.to_string() +
                            (val.layout.assigned() ? val.layout.to_string() : ""));
        }
        std::string line = fmt::format("  {} = ", fmt::join(names, ", "));
        line += types.size() == 1 ? types[0] : fmt::format("({})", fmt::join(types, ", "));
        line += fmt::format(" {}(", op_name(op.kind));
        std::vector<std::string> args;
        if (op_class(op.kind) == OpClass::Leaf) args.push_back(fmt::format("{}", op.attrs.axis));
        for (ValueId v : op.operands) args.push_back(fmt::format("%{}", v));
        line += fmt::format("{})", fmt::join(args, ", "));
        const std::string attrs = attrs_to_string(op.kind, op.attrs);
        if (!attrs.empty()) line += ", " + attrs;
        if (!op.name.empty())
            line += op_class(op.kind) == OpClass::Leaf ? fmt::format(" \"{}\"", op.name)
                                                       : fmt::format("  # {}", op.name);
        s += line + "\n";
    }
    for (const Output& o : m_outputs) {
        s += fmt::format("  output %{}", o.value);
        if (!o.name.empty()) s += fmt::format(" \"{}\"", o.name);
        if (o.updates_parameter >= 0) s += fmt::format(" -> parameter({})", o.updates_parameter);
        s += "\n";
    }
    return s + "}\n";
}

Graph Graph::extract(const std::vector<Output>& outputs, std::vector<ValueId>* value_map) const {
    std::vector<char> needed(m_ops.size(), 0);
    std::vector<OpId> stack;
    for (const Output& o : outputs) {
        if (o.value >= m_values.size())
            throw CompileError(
                fmt::format("extract: output %{} is not a value of this graph", o.value));
        stack.push_back(m_values[o.value].producer);
        if (o.updates_parameter >= 0) {
            const auto params = leaves(OpKind::Parameter);
            if (o.updates_parameter >= int64_t(params.size()))
                throw CompileError(
                    fmt::format("extract: output '{}' updates parameter {}, but "
                                "the graph has {}",
                                o.name, o.updates_parameter, params.size()));
            stack.push_back(m_values[params[size_t(o.updates_parameter)]].producer);
        }
    }
    while (!stack.empty()) {
        const OpId id = stack.back();
        stack.pop_back();
        if (needed[id]) continue;
        needed[id] = 1;
        for (ValueId v : m_ops[id].operands) stack.push_back(m_values[v].producer);
    }
    Graph g;
    std::vector<ValueId> map(m_values.size(), ~ValueId(0));
    if (value_map) value_map->clear();
    // Parameter numbers: updates_parameter refers to the old numbering.
    std::vector<int64_t> param_map;
    for (OpId id = 0; id < m_ops.size(); ++id) {
        if (!needed[id]) continue;
        const Op& op = m_ops[id];
        std::vector<ValueId> res;
        if (op_class(op.kind) == OpClass::Leaf) {
            const Value& v = m_values[op.results[0]];
            if (op.kind == OpKind::Parameter) {
                res = {g.parameter(v.shape, op.name, v.layout)};
                if (param_map.size() <= size_t(op.attrs.axis))
                    param_map.resize(size_t(op.attrs.axis) + 1, -1);
                param_map[size_t(op.attrs.axis)] = g.m_leaf_count[0] - 1;
            } else if (op.kind == OpKind::Input) {
                res = {g.input(v.shape, op.name, v.layout)};
            } else {
                res = {g.constant(v.shape, m_constants[size_t(op.attrs.axis)], op.name)};
            }
        } else {
            std::vector<ValueId> operands;
            for (ValueId v : op.operands) operands.push_back(map[v]);
            const std::string saved = g.set_scope(op.name);
            res = g.add(op.kind, std::move(operands), op.attrs);
            g.set_scope(saved);
        }
        for (size_t i = 0; i < res.size(); ++i) {
            map[op.results[i]] = res[i];
            g.m_values[res[i]].layout = m_values[op.results[i]].layout;
        }
    }
    for (const Output& o : outputs) {
        int64_t p = -1;
        if (o.updates_parameter >= 0) {
            p = param_map.at(size_t(o.updates_parameter));
        }
        g.add_output(map[o.value], o.name, p);
    }
    if (value_map) {
        value_map->assign(g.m_values.size(), ~ValueId(0));
        for (ValueId old = 0; old < map.size(); ++old)
            if (map[old] != ~ValueId(0)) (*value_map)[map[old]] = old;
    }
    return g;
}

}  // namespace tpu::compiler
