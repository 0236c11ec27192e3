// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the code generator's files share (compiler/README.md, "Code generation"): the plans of
// loop and input fusions (codegen_stream.cpp) and of dot output fusions (codegen_dot.cpp), the
// one elementwise lowering both use, and how a fusion finds its buffers. codegen.cpp puts the
// fusions of a step into one program. Internal to the compiler.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compiler/codegen.h"
#include "compiler/compiled_step.h"
#include "driver/kernels/matmul_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler::gen {

using isa::fimm;
using isa::imm;
using isa::Opcode;

/// Throws NotYetGenerated: "<fusion>: <what> not yet generated".
[[noreturn]] void not_generated(const Fusion& f, const std::string& what);

/// How a value of a loop or input fusion lies against the fusion's [R, C] iteration space.
enum class View : uint8_t {
    Unknown,
    Literal,   ///< a literal scalar (a constant area, filled once per slot)
    Scalar,    ///< one value broadcast everywhere
    Col,       ///< one value per row: [R]
    Row,       ///< one value per column: [C]
    Full,      ///< [R, C]
    GroupRow,  ///< one row per group of rows: [G, C] (a reduction over the middle dims)
    Repeat,    ///< [M, C] read again for every M rows: broadcast along new major dims (a mask)
};

inline int64_t product(const std::vector<int64_t>& v, size_t from = 0, size_t to = ~size_t(0)) {
    int64_t p = 1;
    for (size_t i = from; i < std::min(to, v.size()); ++i) p *= v[i];
    return p;
}

/// The plan of one loop or input fusion on the streaming engine.
struct Plan {
    bool rows = false;  ///< a 2-D iteration space (broadcasts, reductions); else flat elementwise
    int64_t R = 1, C = 1;
    uint32_t h = 1;      ///< rows per streamed unit: 8 (a band of T(8,128) tiles) or 1
    int64_t lanes = 1;   ///< elements per reduction chunk: min(C, vpu_lanes); vpu_lanes tiled
    int64_t chunks = 1;  ///< chunks per row: C / lanes, rounded up in tiles (padded lanes)
    int64_t Cp = 1;      ///< values per row in VMEM: C, or whole chunks in T(8,128) tiles
    bool major = false;  ///< its reductions are over the rows (major dims), each result a [C] row
    bool total = false;  ///< major, then over the row: to a scalar (all dims of a tiled array)
    int64_t G = 1;       ///< groups of R / G rows: [G, R / G, C] (kept dims above reduced ones)
    /// With G = 1 under a major reduction: a [Gb, C] array broadcast over groups of R / Gb rows
    /// (GroupRow; the global average pool's gradient beside its bias gradient's sum), the
    /// groups not aligned with the bands.
    int64_t Gb = 1;
    /// Rows of each matrix of [M, Rg, C] arrays in T(8,128) tiles whose Rg is not a multiple of
    /// the band (each matrix padded to whole bands); 0 if none. R then counts the padded rows.
    int64_t Rg = 0;
    uint64_t units = 0;  ///< units streamed
    uint32_t full = 1;   ///< values per unit of a Full array
    /// h rows of an untiled row-major array per unit (a major reduction's bands), in row order:
    /// [row][C] rather than a tile's [chunk][row][lane]
    bool row_bands = false;
    /// Untiled rows of C values, C above a lane chunk and not whole chunks (ViT's [B 17, 192]
    /// activations): in VMEM each row is padded to whole chunks (Cp), as a T(1,128) tile would
    /// lie, the padding computed on and masked like a tiled row's; the rows move by strided
    /// DMAs (C values in HBM, Cp apart in VMEM).
    bool padded_rows = false;
    std::map<ValueId, View> view;
    /// Col values whose array is [G, S] in T(8,128) tiles (a rank-2 reduction result): S.
    std::map<ValueId, int64_t> tiled_col;
    /// Tiled Col values whose array is [B, H, S]: H (each matrix of H rows padded to tiles).
    std::map<ValueId, int64_t> tiled_col_rows;
    /// Repeat operands (loaded whole once, each band read from band index mod M / h).
    std::vector<ValueId> repeat;
};

inline bool inside_fusion(const Fusion& f, const Graph& g, ValueId v) {
    const OpId p = g.value(v).producer;
    return std::find(f.ops.begin(), f.ops.end(), p) != f.ops.end();
}

/// Registers holding the base address of each allocation a fusion uses, loaded from the
/// program's scalar-memory argument table.
struct Bases {
    std::map<std::pair<uint8_t, uint32_t>, isa::Reg> regs;
    /// Temps at offsets past 2 GiB, by offset: their own address in a register, so that the
    /// kernels' further immediates stay within 32 bits.
    std::map<uint64_t, isa::Reg> far;
    isa::Arg of(const BufferRef& r) const {
        if (r.space == BufferRef::Space::Temp && far.count(r.offset)) return far.at(r.offset) + 0;
        const isa::Reg& base = regs.at({uint8_t(r.space), r.index});
        return base + (r.space == BufferRef::Space::Temp ? int64_t(r.offset) : 0);
    }
};

inline std::pair<uint8_t, uint32_t> alloc_key(const BufferRef& r) {
    return {uint8_t(r.space), r.space == BufferRef::Space::Temp ? 0u : r.index};
}

/// Elementwise ops that are one VPU instruction on whole tiles (emit_elementwise).
inline constexpr std::pair<OpKind, Opcode> kBinary[] = {{OpKind::Add, Opcode::VAdd},
                                                        {OpKind::Sub, Opcode::VSub},
                                                        {OpKind::Mul, Opcode::VMul},
                                                        {OpKind::Max, Opcode::VMax},
                                                        {OpKind::Min, Opcode::VMin}};
inline constexpr std::pair<OpKind, Opcode> kUnary[] = {{OpKind::Exp, Opcode::VExp},
                                                       {OpKind::Log, Opcode::VLog},
                                                       {OpKind::Rsqrt, Opcode::VRsqrt},
                                                       {OpKind::Tanh, Opcode::VTanh}};

/// The integer exponent (0 .. kVpuPowMax) of a power whose exponent is a broadcast literal, or
/// -1: the powers the VPU multiplies out (vpu_pow).
int literal_exponent(const Graph& g, ValueId v);

/// Whether emit_elementwise lowers `kind` (a comparison: only > and <, checked by the caller,
/// which names it).
bool has_vpu_lowering(OpKind kind);

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

/// Classifies every value of loop or input fusion `f` against its iteration space.
Plan plan_fusion(const Graph& g, const Fusion& f, const hw::BoardConfig& board);

/// Emits one loop or input fusion on the streaming engine.
void emit_stream_fusion(isa::Builder& b, const Graph& g, const Fusion& f, const Plan& p,
                        const Bases& bases, const hw::BoardConfig& board);

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
    int exponent = 0;                        ///< Pow: the literal integer exponent (>= 2)
    std::vector<EpValue> in;
    EpValue out;
};

/// Scratch areas every epilogue op may use (materialised operands, a divide's temporaries).
constexpr int kScratch = 5;

/// The plan of an output fusion rooted at a dot: the dot kernel's key, where its operands,
/// result and epilogue sides are, and the epilogue's ops on the result tile.
struct DotFusion {
    driver::DotKey key;
    const FusionValue* a = nullptr;
    const FusionValue* w = nullptr;
    const FusionValue* c = nullptr;
    std::vector<const FusionValue*> sides;     ///< in Epilogue::sides order (Columns first)
    std::vector<EpStep> steps;                 ///< the epilogue, in order
    int areas = 0;                             ///< tile-sized VMEM areas: results, then scratch
    uint64_t a_off = 0, w_off = 0, c_off = 0;  ///< a batch's matrices within a, w and c (bytes)
    std::vector<std::shared_ptr<FusionValue>> views;  ///< operands read through a reshape
    /// Ops computed on an operand's tiles as the kernel loads them (codegen_dot.cpp), shared by
    /// the batches of a batched dot; null: none.
    std::shared_ptr<const struct DotPrologue> prologue;
    int64_t batch = 0;  ///< which batch of a batched dot this plan runs
    /// Reductions of the result the kernel computes as it stores each tile (codegen_dot.cpp,
    /// plan_dot_reduction), shared by the batches; null: none.
    std::shared_ptr<const struct DotReduction> reduction;
};

/// Reductions merged into a dot's fusion (fusion.cpp, reductions_into_dots), split for code
/// generation: the dot's fusion without them, and the reductions alone as a stream fusion that
/// reads the dot's result back (what runs where the dot kernel cannot reduce them itself, and
/// what compile() keeps apart where the dot is not generated).
struct DotReductionSplit {
    Fusion core;  ///< the dot's fusion without the reductions (every other result)
    Fusion pass;  ///< the reductions: read the dot's result, write theirs
};

/// The split of output fusion `f`, or nullptr when no reduction is merged into it.
std::shared_ptr<const DotReductionSplit> split_dot_reduction(const Graph& g, const Fusion& f);

/// Plans the reduction of `split` in the epilogue of `plans` (plan_dot_fusion's of its core):
/// true when the kernel computes it (each plan's `reduction` set), false when the reduction
/// runs as its own pass after the kernel (split.pass).
bool plan_dot_reduction(const Graph& g, const DotReductionSplit& split,
                        std::vector<DotFusion>& plans, const hw::BoardConfig& board);

/// Plans an output fusion rooted at a 2-D dot (no batch dims): operands through in-fusion
/// conversions, the epilogue's ops and sides, the kernel's tiling in the VMEM the epilogue's
/// areas leave. One plan per dot the fusion runs: a dot of a concatenated operand (merged
/// Q, K, V) runs one dot per part, each over the slice of the result it makes.
std::vector<DotFusion> plan_dot_fusion(const Graph& g, const Fusion& f,
                                       const hw::BoardConfig& board);

/// Emits an output fusion rooted at a dot: the dot kernel with the epilogue's ops on each
/// result tile (bit-exact with the evaluator: the same fp32 ops in the same order). `load`
/// puts a buffer's address into a register.
void emit_dot_fusion(isa::Builder& b, const DotFusion& p,
                     const std::function<void(const isa::Reg&, const BufferRef&)>& load);

/// Emits a fusion's dots (plan_dot_fusion's plans) in order; a batched dot's batches that
/// repeat with a period of one or two kernels, their matrices a constant stride apart, run as
/// a loop over one period of kernels (compiler/README.md, "The attention's batched dots").
void emit_dot_fusions(isa::Builder& b, const std::vector<DotFusion>& plans,
                      const std::function<void(const isa::Reg&, const BufferRef&)>& load);

/// Puts a buffer's address into a register (the program's argument table, plus a temp's offset).
using LoadFn = std::function<void(const isa::Reg&, const BufferRef&)>;

/// A planned convolution output fusion, reduce-window fusion or reduction over H and W
/// (codegen_conv.cpp).
struct ConvPoolFusion;

/// The plan of `f` when it is a convolution output fusion, a pooling fusion or a sum over the
/// H and W of an NHWC array (global average pooling); nullptr for other fusions. Throws
/// NotYetGenerated for such a fusion the emitters do not cover.
std::shared_ptr<const ConvPoolFusion> plan_conv_pool_fusion(const Graph& g, const Fusion& f,
                                                            const hw::BoardConfig& board);

/// Puts the segment's Derived launch argument (the derived arena's base plus its stale mask)
/// into a register.
using LoadArgFn = std::function<void(const isa::Reg&)>;

/// A buffer a fusion computes from a parameter and would keep across launches (a convolution's
/// packed filter): parameter, key and bytes of a DerivedBuffer.
std::optional<DerivedBuffer> conv_pool_derived(const ConvPoolFusion& p);

/// Where device_segment put that buffer: its offset in the derived arena and its stale bit.
struct DerivedSlot {
    uint64_t offset = 0;
    uint32_t bit = 0;
};

/// A wide program's address of a temp (CodegenOptions::wide_addresses): where the fusion's HBM
/// windows put it; the arena itself (offset 0, 0 bytes) at 0.
using TempAddrFn = std::function<std::optional<uint32_t>(const BufferRef&)>;

/// Emits a fusion planned by plan_conv_pool_fusion; `slot` when its derived buffer has one
/// (else the fusion computes it into its scratch on every launch); `wide_temps` in a wide
/// program (temps are not at the arena's base plus their offset there).
void emit_conv_pool_fusion(isa::Builder& b, const ConvPoolFusion& p, const LoadFn& load,
                           const LoadArgFn& load_arg, std::optional<DerivedSlot> slot,
                           const TempAddrFn* wide_temps = nullptr);

/// A planned gather fusion: rows of a table copied by DMA at ids read from scalar memory
/// (codegen_gather.cpp).
struct GatherFusion;

/// The plan of `f` when it holds a gather (nullptr otherwise); throws NotYetGenerated for a
/// gather fusion the emitter does not cover.
std::shared_ptr<const GatherFusion> plan_gather_fusion(const Graph& g, const Fusion& f,
                                                       const hw::BoardConfig& board);

/// Emits a fusion planned by plan_gather_fusion.
void emit_gather_fusion(isa::Builder& b, const GatherFusion& p, const LoadFn& load);

/// A planned concatenation fusion: its result's rows copied by DMA from where its parts' values
/// lie (codegen_concat.cpp).
struct ConcatFusion;

/// The plan of `f` when it holds a concatenation (nullptr otherwise); throws NotYetGenerated
/// for one the emitter does not cover.
std::shared_ptr<const ConcatFusion> plan_concat_fusion(const Graph& g, const Fusion& f,
                                                       const hw::BoardConfig& board);

/// Emits a fusion planned by plan_concat_fusion.
void emit_concat_fusion(isa::Builder& b, const ConcatFusion& p, const LoadFn& load);

}  // namespace tpu::compiler::gen
