// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

/// The compiler layer (compiler/README.md): an HLO-like IR of one step, the passes XLA runs on
/// it, and the compiled step a code generator emits. No SystemC, Eigen or device types here.
namespace tpu::compiler {

/// A graph that cannot be built or compiled: the message names the op and what is wrong.
class CompileError : public std::invalid_argument {
public:
    explicit CompileError(const std::string& what) : std::invalid_argument(what) {}
};

/// Element types.
enum class DType : uint8_t {
    F32,   ///< IEEE binary32
    BF16,  ///< bfloat16 (values rounded to nearest even)
    S32,   ///< 32-bit signed integer (indices, seeds)
    Pred,  ///< boolean (compare results)
};
/// "f32", "bf16", "s32", "pred".
std::string_view dtype_name(DType t);
/// Bytes of one element in HBM.
uint32_t dtype_bytes(DType t);

/// An array type: element type and dims (rank 0 is a scalar).
struct Shape {
    DType dtype = DType::F32;     ///< element type
    std::vector<int64_t> dims{};  ///< sizes, major to minor in logical (row-major) order

    /// Product of the dims (1 for a scalar).
    int64_t elements() const;
    /// Number of dims.
    int64_t rank() const { return int64_t(dims.size()); }
    /// Unpadded bytes: elements x dtype_bytes.
    uint64_t bytes() const { return uint64_t(elements()) * dtype_bytes(dtype); }
    /// "f32[512,768]".
    std::string to_string() const;
    friend bool operator==(const Shape&, const Shape&) = default;
};

/// How an array lies in memory, as XLA writes it (openxla.org/xla/tiled_layout): the dims from
/// most minor to most major, then an optional tile over the most-minor physical dims (the
/// array is cut into tiles that are each contiguous, tiles in row-major order, every dim
/// covered by the tile padded to a multiple of it). An empty minor_to_major is "not assigned
/// yet" (the layout pass chooses); a leaf's preset layout is a constraint the pass keeps.
struct Layout {
    std::vector<int64_t> minor_to_major{};  ///< logical dim indices, most minor first
    std::vector<int64_t> tile{};            ///< tile dims, outer to inner; empty = untiled

    /// Assigned (minor_to_major set).
    bool assigned() const { return !minor_to_major.empty(); }
    /// "{1,0:T(8,128)}", "{}" when unassigned, "{1,0}" when untiled.
    std::string to_string() const;
    friend bool operator==(const Layout&, const Layout&) = default;
};
/// Row-major, untiled: {rank-1, ..., 0} (rank 0: empty).
Layout row_major(int64_t rank);
/// The layout's physical dim sizes, major to minor, each padded to its tile.
std::vector<int64_t> padded_physical_dims(const Shape& s, const Layout& l);
/// Bytes the array takes in this layout (padding included); a scalar takes dtype_bytes.
uint64_t layout_bytes(const Shape& s, const Layout& l);
/// Element offset (not bytes) of the element at logical index `idx` under `l`.
uint64_t physical_index(const Shape& s, const Layout& l, const std::vector<int64_t>& idx);
/// The multi-index of row-major linear index `i` in `dims`, into `idx` (a dim of 0 gives 0).
/// Inline: the evaluator calls it per element.
inline void unravel(int64_t i, const std::vector<int64_t>& dims, std::vector<int64_t>& idx) {
    idx.resize(dims.size());
    for (size_t d = dims.size(); d-- > 0;) {
        idx[d] = dims[d] ? i % dims[d] : 0;
        if (dims[d]) i /= dims[d];
    }
}
/// `dims` without its dims of one element (what a reshape that only inserts or drops them keeps).
inline std::vector<int64_t> nonunit(const std::vector<int64_t>& dims) {
    std::vector<int64_t> r;
    for (int64_t d : dims)
        if (d != 1) r.push_back(d);
    return r;
}
/// Where a reduction over `reduced` of an array of `dims` reduces, among the non-unit dims
/// counted from the most minor (0): the position of its one non-unit reduced dim, or -1 when it
/// reduces none or several.
inline int64_t reduced_nonunit_position(const std::vector<int64_t>& dims,
                                        const std::vector<int64_t>& reduced) {
    int64_t at = -1, pos = 0;
    for (int64_t d = int64_t(dims.size()) - 1; d >= 0; --d) {
        if (dims[size_t(d)] == 1) continue;
        bool r = false;
        for (int64_t x : reduced) r |= x == d;
        if (r) {
            if (at >= 0) return -1;
            at = pos;
        }
        ++pos;
    }
    return at;
}
/// The row-major linear index of multi-index `idx` in `dims` (unravel's inverse).
inline int64_t row_major_index(const std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
    int64_t i = 0;
    for (size_t d = 0; d < dims.size(); ++d) i = i * dims[d] + idx[d];
    return i;
}
/// Throws CompileError unless `l` is a permutation of s's dims with a tile of at most rank dims.
void check_layout(const Shape& s, const Layout& l, const std::string& where);

/// Op kinds; ops.def is the table.
enum class OpKind : uint16_t {
#define OP(e, name, cls, arity, expensive, doc) e,
#include "compiler/ops.def"
#undef OP
};
/// What fusion and the evaluator do with a kind of op.
enum class OpClass : uint8_t {
    Leaf,         ///< parameter, input, constant: a buffer, never fused
    Literal,      ///< a scalar known at compile time: fused into every consumer
    Elementwise,  ///< same shape in and out
    Movement,     ///< broadcast, reshape, transpose, slice, concatenate, iota
    Reduce,       ///< roots an input (reduction) fusion
    Contraction,  ///< dot, convolution: roots an output fusion on the MXU
    Window,       ///< pooling, its gradients, scatter: a loop fusion of its own
    Gather,       ///< indexed read: fused into consumers like an elementwise op
    Rng,          ///< random numbers: fused like an elementwise op
    Collective,   ///< across replicas: a fusion of its own
    Custom,       ///< host or library call: a fusion of its own
    Composite,    ///< recorded by front ends, lowered by the decomposition pass
};
/// The printed name ("dot", "multiply").
std::string_view op_name(OpKind k);
/// The op's class.
OpClass op_class(OpKind k);
/// Operand count, -1 for variadic ops.
int op_arity(OpKind k);
/// XLA's InstructionFusion::IsExpensive for this kind.
bool op_expensive(OpKind k);

/// Reduction functions.
enum class Reducer : uint8_t { Sum, Max };
/// Comparison directions.
enum class Comparison : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
/// Contraction precision, as PyTorch/XLA's torch_xla._XLAC._xla_set_mat_mul_precision:
/// default = one bf16 MXU pass, high = three (bf16x3), highest = six (bf16x6).
enum class Precision : uint8_t { Default, High, Highest };
/// Pooling reductions.
enum class PoolKind : uint8_t { Max, Avg };

/// Dimension numbers of a general dot (XLA's DotDimensionNumbers). Result dims: batch dims
/// (lhs order), then lhs free dims, then rhs free dims, each in operand order.
struct DotDims {
    std::vector<int64_t> lhs_batch{}, rhs_batch{};              ///< paired batch dims
    std::vector<int64_t> lhs_contracting{}, rhs_contracting{};  ///< paired contracted dims
    friend bool operator==(const DotDims&, const DotDims&) = default;
};

/// A square 2-D window over NHWC images (convolution, pooling and their gradients).
struct Window {
    int64_t kernel = 1;                 ///< window rows = columns
    int64_t stride = 1;                 ///< step in both dims
    int64_t pad = 0;                    ///< zero (pooling max: -inf) padding on every side
    std::vector<int64_t> input_dims{};  ///< gradients: the forward input's NHWC dims
    friend bool operator==(const Window&, const Window&) = default;
};

/// Every attribute an op can carry; each kind reads the fields its ops.def entry names. All
/// fields are part of the structural hash.
struct Attrs {
    /// Reduce: reduced dims; Broadcast: the result dim of each operand dim; Transpose: the
    /// permutation; Slice: start indices.
    std::vector<int64_t> dims{};
    std::vector<int64_t> limits{};  ///< Slice: end indices (exclusive)
    /// Broadcast, Reshape, Iota, RngUniform, ScatterAdd, CustomCall: the result dims.
    std::vector<int64_t> out_dims{};
    /// Concatenate, Iota: the dim; Softmax family: the dim; BatchNorm*: the feature dim;
    /// Parameter, Input, Constant: the leaf's number among leaves of its kind.
    int64_t axis = 0;
    DotDims dot{};                             ///< Dot
    Precision precision = Precision::Default;  ///< Dot, convolutions
    Window window{};                           ///< convolutions, pooling
    PoolKind pool = PoolKind::Max;             ///< Pool
    Reducer reducer = Reducer::Sum;            ///< Reduce
    Comparison comparison = Comparison::Eq;    ///< Compare
    DType dtype = DType::F32;  ///< Convert: the target; Literal, Iota, CustomCall: the type
    double scalar = 0;         ///< Literal: its value; AllReduce: the scale applied after the sum
    double eps = 0;            ///< LayerNorm, BatchNorm*, Adam
    double momentum = 0;       ///< SgdMomentum
    double beta1 = 0, beta2 = 0;  ///< Adam
    bool approximate = false;     ///< Gelu, GeluGrad: the tanh form
    std::string target{};         ///< CustomCall: the function's name
    friend bool operator==(const Attrs&, const Attrs&) = default;
};

using ValueId = uint32_t;  ///< index into Graph::values()
using OpId = uint32_t;     ///< index into Graph::ops()
inline constexpr OpId kNoOp = ~OpId(0);

/// One result of one op.
struct Value {
    Shape shape{};          ///< type
    Layout layout{};        ///< assigned by the layout pass (a preset leaf layout is kept)
    OpId producer = kNoOp;  ///< the op that defines it
    uint32_t index = 0;     ///< which of its results
};

/// One op: kind, operands, results, attributes and a name for provenance (the layer scope it
/// was recorded in, like XLA's op_name metadata; not hashed).
struct Op {
    OpKind kind = OpKind::Literal;
    std::vector<ValueId> operands{};
    std::vector<ValueId> results{};
    Attrs attrs{};
    std::string name{};
};

/// A graph output: a value the host or the next step needs.
struct Output {
    ValueId value = 0;   ///< the value
    std::string name{};  ///< for listings
    /// The Parameter number this output replaces at the end of the step (an in-place update
    /// such as an optimizer's, XLA's input/output alias), or -1.
    int64_t updates_parameter = -1;
};

/// The ops of one step in recording order (always a topological order: operands come first),
/// its leaves and outputs. Recording infers and checks every shape, so a bad op fails where it
/// is recorded, with the op and the mismatch in the message.
class Graph {
public:
    /// Device data that lives across steps (`layout` may be preset: the layout it already has).
    ValueId parameter(const Shape& s, std::string name, Layout layout = {});
    /// Data the host sends for this step.
    ValueId input(const Shape& s, std::string name, Layout layout = {});
    /// Data recorded with the graph (`data` holds s.elements() values; not hashed).
    ValueId constant(const Shape& s, std::vector<float> data, std::string name = {});
    /// Records an op; returns its results. Throws CompileError naming the op.
    std::vector<ValueId> add(OpKind kind, std::vector<ValueId> operands, Attrs attrs = {});
    /// add() for ops with one result.
    ValueId add1(OpKind kind, std::vector<ValueId> operands, Attrs attrs = {});
    /// Marks `v` as an output; `updates_parameter` >= 0 replaces that Parameter after the step.
    void add_output(ValueId v, std::string name = {}, int64_t updates_parameter = -1);

    /// Ops recorded from now on get names under `scope` ("block.attn"); returns the previous
    /// scope for restoring (see ScopeGuard).
    std::string set_scope(std::string scope);
    /// The current scope.
    const std::string& scope() const { return m_scope; }

    /// Ops and values sit in deques: references stay valid while more are recorded.
    const std::deque<Op>& ops() const { return m_ops; }
    const std::deque<Value>& values() const { return m_values; }
    const Op& op(OpId id) const { return m_ops.at(id); }
    const Value& value(ValueId id) const { return m_values.at(id); }
    /// Mutable value (passes set layouts).
    Value& value_mut(ValueId id) { return m_values.at(id); }
    const std::vector<Output>& outputs() const { return m_outputs; }
    /// The op producing `v`.
    const Op& producer(ValueId v) const { return m_ops.at(m_values.at(v).producer); }
    /// Shape of `v`.
    const Shape& shape(ValueId v) const { return m_values.at(v).shape; }
    /// Leaves of a kind in number order.
    std::vector<ValueId> leaves(OpKind kind) const;
    /// Recorded data of constant number `n`.
    const std::vector<float>& constant_data(int64_t n) const { return m_constants.at(size_t(n)); }
    /// Per value, the ops that read it (in op order, an op once per operand slot).
    std::vector<std::vector<OpId>> users() const;

    /// Structural hash (FNV-1a over kinds, operand wiring, shapes, dtypes, layouts, attributes
    /// and outputs; never constant values or names): the compile cache's key.
    uint64_t hash() const;
    /// The hashed structure as text: equal fingerprints compile to the same program.
    std::string fingerprint() const;
    /// HLO-like listing: one line per op, "%7 = f32[512,768]{1,0} add(%5, %6)".
    std::string to_string() const;
    /// The graph restricted to what `outputs` need, leaves renumbered in first-use order;
    /// `leaf_map` (optional) receives, per new value, the old value (for binding data).
    Graph extract(const std::vector<Output>& outputs, std::vector<ValueId>* value_map) const;

private:
    ValueId leaf(OpKind kind, const Shape& s, std::string name, Layout layout);
    std::deque<Op> m_ops;
    std::deque<Value> m_values;
    std::vector<Output> m_outputs;
    std::vector<std::vector<float>> m_constants;
    int64_t m_leaf_count[3] = {0, 0, 0};
    std::string m_scope;
};

/// Sets a Graph's scope while alive (nested scopes join with '.').
class ScopeGuard {
public:
    ScopeGuard(Graph& g, const std::string& name);
    ~ScopeGuard() { m_g.set_scope(std::move(m_previous)); }
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;

private:
    Graph& m_g;
    std::string m_previous;
};

/// Result shapes of `kind` on operands of `shapes`; throws CompileError naming the kind.
std::vector<Shape> infer_shapes(OpKind kind, const std::vector<Shape>& shapes, const Attrs& a);
/// The attributes an op prints ("dims={1}, reducer=sum"); empty if none.
std::string attrs_to_string(OpKind kind, const Attrs& a);

}  // namespace tpu::compiler
