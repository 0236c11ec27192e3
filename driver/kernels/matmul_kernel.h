// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "driver/kernels/epilogue.h"
#include "driver/kernels/gemm.h"
#include "driver/kernels/stationary.h"

/// The fused dot kernel: C = A x W on one core with operands in HBM, fp32 operands read in
/// tiles and converted (and transposed) to bf16 parts in VMEM, or bf16 operands in the library
/// GEMM's layouts read as they are, an epilogue on each result tile, either operand stationary.
/// tensor_ops::matmul runs it stand-alone (MatmulKey); the compiler emits it into a step's
/// program (DotKey, emit_dot).
namespace tpu::driver {

/// How a dot operand or its result lies in HBM (each layout's byte offsets below; R x C is the
/// MXU, KT = ceil(K / R), NT = ceil(N / C), Kp = KT R, Np = NT C, P = the precision's parts).
enum class DotLayout : uint8_t {
    /// fp32 row-major: A M x K, W K x N, C M x N (C bf16 with Epilogue::store_bf16).
    RowMajor,
    /// fp32 stored transposed (operands only): A as K x M, W as N x K (a dot contracting W's
    /// minor dim, as the backward pass's dX = dY W^T).
    Transposed,
    /// W only: fp32 R x C tiles, zero-padded, tile (k, n) row-major at (k NT + n) R C 4 bytes
    /// (the compiler's T(128,128) layout of a stationary fp32 weight).
    Tiles,
    /// The library GEMM's tile-major layouts (GemmKey): A as KT panels of M x R bf16 (panel k
    /// at k M R 2 bytes), W as R x C bf16 tiles (tile (k, n) at (k NT + n) R C 2), each in P
    /// parts M Kp 2 (Kp Np 2) bytes apart, zero-padded; C as NT column panels of M x C values
    /// (fp32, or bf16 with store_bf16; panel n at n M C 4 (2) bytes), the columns of the last
    /// panel past N not written. Stationary::Rhs only.
    Gemm,
    /// fp32 in the VPU's 8 x 128 tiles, the compiler's default layout of an activation
    /// ({1,0:T(8,128)}; A M x K, W K x N, C M x N): tile (b, t) of rows 8b.. and columns 128t..
    /// at (b ceil(cols / 128) + t) 4096 bytes, each tile row-major. A block of 8k rows is then k
    /// runs of 4 KiB per 128-column panel, one DMA; a W tile 16 runs. Stationary::Rhs, a
    /// 128 x 128 MXU, M a multiple of 8 (A, C), and K (A, W) and N (W, C fp32) multiples of 128.
    VpuTiles,
    /// fp32 stored transposed in the VPU's 8 x 128 tiles (A as K x M, W as N x K; the
    /// compiler's {0,1:T(8,128)} of a rank-2 operand): with the LHS stationary, the layouts
    /// under which the kernel's problem C^T = W^T A^T reads W^T and A^T in VpuTiles. A in
    /// it needs M, W in it N a multiple of 128; K a multiple of 128.
    TransposedVpuTiles,
    /// fp32 stored transposed in the MXU's R x C tiles (R = C), zero-padded: W as N x K
    /// (tile (n, k) at (n KT + k) R C 4 bytes), a stationary weight of `[out, in]` read by
    /// dX = dY W; C as N x M (tile (n, m) at (n MT + m) R C 4, MT = ceil(M / C)), a weight
    /// gradient written in its parameter's layout. The RHS stationary only.
    TransposedTiles,
};
/// "row-major", "transposed", "tiles", "gemm", "vpu-tiles", "transposed-vpu-tiles",
/// "transposed-tiles".
std::string_view dot_layout_name(DotLayout l);

/// The fused dot kernel's key: every input its code depends on besides the epilogue's body.
struct DotKey {
    uint32_t M = 0, K = 0, N = 0;  ///< C (M x N) = A (M x K) x W (K x N)
    Precision precision = Precision::Bf16;
    DotLayout a = DotLayout::RowMajor;        ///< A's layout
    DotLayout w = DotLayout::RowMajor;        ///< W's layout
    DotLayout c = DotLayout::RowMajor;        ///< C's layout (RowMajor, Gemm or VpuTiles)
    Stationary stationary = Stationary::Rhs;  ///< which operand the arrays hold
    uint32_t R = 128, C = 128;                ///< MXU array
    uint32_t mxus = 2;                        ///< MXUs used (column panels per group, 1-8)
    uint32_t block_rows = 0;  ///< streamed rows per block: of A (Rhs) or of W^T (Lhs)
    /// Column panels each MXU takes per K step (a group is mxus x group_panels panels, panel p
    /// on MXU p % mxus). With more than one and a single group, each staged panel of the
    /// streamed operand is read once, used in its step and dropped (two slots, not a block's
    /// KT kept panels), so the fp32 stream spreads evenly over every step of the block.
    uint32_t group_panels = 1;
    uint32_t column_sides = 0;  ///< the epilogue's Column sides (VMEM they take)
    uint32_t full_sides = 0;    ///< the epilogue's Full sides
    bool store_bf16 = false;    ///< C stored as bf16 (Epilogue::store_bf16)
    /// A window of a wider 8 x 128-tiled array (an attention head of a [seq, heads x d]
    /// projection): the array's tiles per band (0: the operand's own) and the window's first
    /// lane in its tile (the operand's address is the window's first tile). Whole-tile reads
    /// need lane 0; a window of up to 128 lanes within one tile: A in VpuTiles with K <= 128,
    /// W in VpuTiles of one narrow panel, either in TransposedVpuTiles.
    uint32_t a_band_tiles = 0, w_band_tiles = 0;
    uint32_t a_lane = 0, w_lane = 0;
    /// C row-major with rows this many values apart (0: N): one matrix of a batch whose rows
    /// interleave with the others' (attention's heads stored as [seq, heads x d]).
    uint32_t c_row = 0;
    /// Each result panel's epilogue and stores go after a step of the next group of their own
    /// (when the group has a step per panel to spare) instead of all before its second step,
    /// so the MXUs keep running while the VPU works on a long epilogue (the compiler's fused
    /// GELU); the stand-alone matmul's bias-only epilogue keeps the one flush.
    bool overlap_epilogue = false;
    /// A batch's (DotBatch) operands read ahead (compiler/README.md "The attention's batched
    /// dots"; outside a batch ignored). A held operand in 8 x 128 tiles (W^T stored so:
    /// attention's P in the values dot), one block and one column group of whole 128 x 128
    /// tiles, not a window: read a batch ahead, each panel's K steps one after the other, into
    /// a staging area per tile (twice the batch's held tiles). Else, with one block and one
    /// column group a batch: of one K step, the streamed operand in 8 x 128 tiles and the held
    /// one W^T stored so (the scores), each batch's operands a batch ahead into the staging slot
    /// the batch before does not use, with three C buffers ("Each head's operands a head
    /// ahead"); of an even number of K steps, the next batch's first step beside the last.
    bool band_loads = false;
    /// A group's Full side tiles are loaded once the previous group's epilogue is done with
    /// their area (early in the group's steps) instead of after the group's last matmul, so the
    /// MXUs do not wait for them (the compiler's residual; the stand-alone matmul has none).
    bool prefetch_sides = false;
    /// Dots of this key over other matrices that the kernel runs after the first, each block
    /// pipeline going on into the next's (a merged dot's parts, Q, K and V: emit_dot_parts);
    /// the Column sides' area is then double-buffered. 1: one dot.
    uint32_t parts = 1;
    /// C starts from the fp32 values already in HBM (emit_dot: at C, emit_dot_accumulate: at
    /// its `c_in`) instead of from zero: each group loads its C panels before its first step,
    /// whose matmuls then accumulate, so dots over consecutive K blocks whose boundaries fall
    /// on the R-row K steps add up as one dot over all of K does (the same mxu.mm
    /// accumulations in the same order; compiler/README.md "Filter gradients over K blocks").
    /// The RHS stationary, C fp32 row-major, one dot (no batch or parts).
    bool accumulate = false;
    /// C's panels in one buffer instead of two (the LHS stationary, C row-major or in 8 x 128
    /// tiles, a staged held operand, one dot or merged parts, not a batch, no prologue on the
    /// streamed operand): a group's result panels are transposed out of C (into the c_trans area
    /// its epilogue and stores read) before the next group's first matmuls; a prefetched Full
    /// side takes two panel slots and a weight streamed from its MXU tiles a transposed copy of
    /// two tiles. For plan_dot the caller's permission: kept only where the VMEM it frees takes
    /// fewer blocks of streamed rows (compiler/README.md "C in one buffer").
    bool one_c_buffer = false;
    auto operator<=>(const DotKey&) const = default;
    std::string name() const { return "dot"; }
    friend size_t hash_value(const DotKey& k);
};

/// An fp32 operand tile in VMEM that the kernel is about to round to bf16: `rows` x `cols`
/// values, row-major at `x`, in the problem's orientation (emit_dot: with the LHS stationary the
/// streamed tile is rows of W^T, the held one of A^T). What a dot fusion computes on its operand
/// as it is loaded (compiler/README.md, "The attention's softmax in the values dot").
struct PrologueTile {
    isa::Builder& b;
    isa::Arg x;         ///< VMEM address of the tile (fp32, rewritten in place)
    isa::Arg rows;      ///< its rows (a register or an immediate)
    uint32_t cols = 0;  ///< its columns
    /// Emits `dst = 4 x` the index of the tile's first value along the operand's free dim:
    /// the streamed tile's first row, the held tile's first column.
    std::function<void(const isa::Reg& dst)> first_x4;
    EpilogueTile::VpuFn vpu;  ///< a VPU instruction, waited for before the MXUs read the tile
    /// Emits `dst = ` the tile's batch (its matrices' index in a DotBatch), or is empty for a
    /// single dot.
    std::function<void(const isa::Reg& dst)> batch;
};
/// Work on the fp32 tiles of the operands before their conversion (empty: none).
struct Prologue {
    std::function<void(const PrologueTile&)> streamed;  ///< on each streamed block's K step
    std::function<void(const PrologueTile&)> held;      ///< on each held tile
};

/// Where emit_dot's tensors are: HBM addresses (Operand::hbm) or VMEM regions of the caller
/// holding the whole tensor in the key's layout (Operand::vmem; moved with dma.vv).
struct DotOperands {
    streaming::Operand a;  ///< A in key.a's layout
    streaming::Operand w;  ///< W in key.w's layout
    streaming::Operand c;  ///< C in key.c's layout
};

/// A batch of dots of one key in one kernel (attention's heads, compiler/README.md "The
/// attention's batched dots"): the kernel's block pipeline runs over the batches' blocks one
/// after the other, as over one dot's, so a batch's first loads go out while the previous one's
/// last MXU steps run and its results are stored while the next one computes. The batches come
/// in passes of a period of members that may differ in their windows' lanes (heads of 64
/// lanes alternate between lane 0 and lane 64 of a tile); each member's code is emitted once
/// and a loop over the passes moves the operands' registers on by the pass's strides.
struct DotBatch {
    /// One batch of a period: its matrices' byte offsets from the period's first (A, W, C) and
    /// its windows' lanes (DotKey::a_lane, w_lane).
    struct Member {
        int64_t a = 0, w = 0, c = 0;
        uint32_t a_lane = 0, w_lane = 0;
    };
    std::vector<Member> period;   ///< the members of a pass, in order (empty: one dot)
    uint32_t passes = 1;          ///< passes over the period (batches = passes x members)
    int64_t a = 0, w = 0, c = 0;  ///< bytes from a pass's matrices to the next pass's
};

/// Why the kernel cannot run `key` (a layout the orientation does not allow, an empty shape,
/// a tiling it does not have), or "" when it can. The compiler falls back on a reason.
std::string dot_unsupported(const DotKey& key);
/// VMEM bytes the kernel for `key` takes (its areas, each 512-byte aligned).
uint64_t dot_vmem_bytes(const DotKey& key);
/// The planner's cost of `key` in cycles: gemm_estimate_cycles of the same schedule (the
/// streamed dim's rows in blocks of block_rows, A kept) with the dot's own traffic (fp32
/// operands, side inputs, a bf16 C; GemmTraffic).
double dot_estimate_cycles(const hw::BoardConfig& cfg, const DotKey& key);
/// `shape` (M, K, N, precision, layouts, stationary, sides, store_bf16 set; the rest ignored)
/// tiled for the board's MXUs: among even cuts of the streamed rows into blocks of at most 4096
/// whose areas fit in `vmem_bytes` (a composing caller passes Builder::vmem_free()), the one
/// with the smallest dot_estimate_cycles (ties: fewer blocks); with `shape.one_c_buffer` set and
/// applicable, the plan with C in one buffer where it takes fewer blocks than with two. nullopt
/// when even 8 rows do not fit; throws DeviceError(Usage) with dot_unsupported's reason.
std::optional<DotKey> plan_dot(const hw::BoardConfig& cfg, DotKey shape, uint64_t vmem_bytes);

/// Emits the dot for `key` into `b` (driver/README.md "The fused dot kernel"): resources from
/// b's pools in its own scope; on return every instruction it issued has completed. The
/// epilogue runs on each result tile (rows x cols fp32 in VMEM) after the last pass and before
/// the store; its sides must match key.column_sides, key.full_sides and key.store_bf16. With
/// Stationary::Lhs the kernel runs C^T = W^T A^T (passes in the order of C = A W, so the values
/// are the same bits) and transposes each result tile back (v.trans) before the epilogue: the
/// epilogue's tile is then nn rows of C (a register) by block_rows columns (the columns past the
/// block's last row hold garbage and are not stored). With a `batch` (DotBatch) the kernel runs
/// every batch: A, W and C are then in HBM, addressed by registers the kernel moves on (their
/// values on return are unspecified), and the epilogue has no Full sides. Throws
/// isa::BuildError naming the problem (an unsupported key, sides that do not match it).
void emit_dot(isa::Builder& b, const DotKey& key, const DotOperands& ops,
              const Epilogue& epilogue = {}, const Prologue& prologue = {},
              const DotBatch& batch = {});
/// emit_dot of a key with DotKey::accumulate whose C starts from the values at `c_in` (an
/// fp32 row-major M x N in HBM, read before the results are written) rather than at ops.c:
/// the last of a sequence of K blocks, whose epilogue writes its result elsewhere. Throws
/// isa::BuildError as emit_dot, or for a key without accumulate.
void emit_dot_accumulate(isa::Builder& b, const DotKey& key, const DotOperands& ops,
                         const streaming::Operand& c_in, const Epilogue& epilogue = {});
/// Runs key.parts dots of one key in one kernel (a merged dot's parts): part 0 on `ops` and
/// `epilogue` as emit_dot does, then `rebind(i)` emits the loads of part i's addresses into the
/// same registers (A, W, C and the sides', all in HBM) and part i's blocks follow part i - 1's
/// in the kernel's pipeline (part i - 1's last results are stored while part i computes). No
/// Full sides, prologue or batch. Throws isa::BuildError as emit_dot.
void emit_dot_parts(isa::Builder& b, const DotKey& key, const DotOperands& ops,
                    const Epilogue& epilogue, const std::function<void(uint32_t part)>& rebind);
/// The stand-alone kernel of a key without sides: launch arguments a, w, c, then emit_dot
/// (store_bf16 as the key says), then halt.
isa::Program generate(const DotKey& key);

/// tensor_ops::matmul's kernel: C = op(a) op(b), fp32 row-major operands (op = optional
/// transpose), C fp32 row-major, an optional bias row, weights stationary. A DotKey in the
/// trainer's terms, cached under the name "matmul".
struct MatmulKey {
    uint32_t M = 0, K = 0, N = 0;  ///< op(a) is M x K, op(b) K x N
    bool ta = false, tb = false;   ///< a, b stored transposed
    Precision precision = Precision::Bf16;
    uint32_t R = 128, C = 128;  ///< MXU array
    uint32_t mxus = 2;          ///< MXUs used (column panels per group, 1-8)
    uint32_t block_rows = 0;    ///< LHS rows per block (T)
    bool bias = false;          ///< C += a 1 x N fp32 row before it leaves
    auto operator<=>(const MatmulKey&) const = default;
    std::string name() const { return "matmul"; }
    friend size_t hash_value(const MatmulKey& k);
    /// The dot it runs (the bias a Column side).
    DotKey dot() const;
};

/// The fused kernel's tiling: the longest even blocks of rows (at most 4096, as plan_gemm) whose
/// VMEM areas fit; nullopt when even 8 rows do not fit. `bias`: the kernel adds a bias row.
std::optional<MatmulKey> plan_matmul(const hw::BoardConfig& cfg, uint32_t M, uint32_t K, uint32_t N,
                                     bool ta, bool tb, Precision precision, bool bias = false);
/// The kernel, its K loop unrolled (each step's slot, flags and K tile fixed) in up to three
/// column-group variants: about 40 instructions per K step and variant, so K beyond about 6 000
/// outgrows core.imem_bytes. Launch arguments: a, b, c (HBM, fp32 row-major, compact), and with
/// `bias` the 1 x N fp32 bias, added to each C panel in VMEM (one fp32 add after the last pass,
/// as bias_add would) just before it is stored.
isa::Program generate(const MatmulKey& key);

}  // namespace tpu::driver
