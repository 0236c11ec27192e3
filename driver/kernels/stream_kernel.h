// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "isa/builder.h"

/// Streaming kernels: tensors moved tile by tile between HBM (or VMEM) and two VMEM tile slots
/// while the VPU works on the tile in between. The elementwise, row and softmax kernels of
/// vector_ops.h, tensor_ops.h and softmax.h are bodies on this engine.
namespace tpu::driver::streaming {

/// A kernel operand as emitted: where a tensor lives, or a scalar's value.
struct Operand {
    /// Where the value is.
    enum class Kind : uint8_t {
        Hbm,     ///< a tensor in HBM; `value` is its byte address (a launch argument register)
        Vmem,    ///< a tensor in VMEM at the address `value` (an immediate; a caller's region)
        Scalar,  ///< a 32-bit scalar (integer or fp32 bits) in `value`
    };
    Kind kind = Kind::Hbm;  ///< where
    isa::Arg value;         ///< address or value
    /// A tensor in HBM at the address `addr` holds.
    static Operand hbm(isa::Arg addr) { return {Kind::Hbm, addr}; }
    /// A tensor already in VMEM, in `region` (a producer left it there).
    static Operand vmem(const isa::Vmem& region) { return {Kind::Vmem, region.at(0)}; }
    /// A scalar.
    static Operand scalar(isa::Arg v) { return {Kind::Scalar, v}; }
};

/// One parameter of a kernel signature: its launch-argument name and whether it is a scalar.
struct Param {
    std::string_view name;  ///< launch-argument name ("x", "lr")
    bool scalar = false;    ///< a 32-bit value, not a tensor address
};

/// Declares `params` as the launch arguments s1, s2, ... (in order) of a stand-alone program and
/// returns them as operands: tensors in HBM at the addresses they hold, scalars as values.
/// `regs` keeps the registers held.
std::vector<Operand> declare_args(isa::Builder& b, std::span<const Param> params,
                                  std::vector<isa::Reg>& regs);
/// Throws isa::BuildError naming `kernel` unless `ops` match `params` in number and kind.
void check_operands(std::string_view kernel, std::span<const Param> params,
                    std::span<const Operand> ops);
/// Operands that only fill the places of `params`, for planning a kernel's footprint (which
/// needs no addresses).
std::vector<Operand> placeholders(std::span<const Param> params);

/// The VMEM shape of a streaming kernel: everything its tiling depends on.
struct Footprint {
    std::string name;             ///< kernel name (errors)
    uint64_t units = 0;           ///< units streamed: elements, or rows of the row kernels
    std::vector<uint32_t> areas;  ///< fp32 values per unit of each slot area
    std::vector<uint32_t> fixed;  ///< fp32 values of each fixed area (loaded or stored once)
    uint64_t max_tile_units = 0;  ///< 0: no limit beyond VMEM and the tile-value cap
};

/// Values of the widest area per tile: large enough that the DMA's fixed latency is small
/// against the transfer, small enough that a 70 000-value tensor still runs as a pipeline.
inline constexpr uint32_t kMaxTileValues = 32768;
/// Alignment of tile slots and fixed areas in VMEM.
inline constexpr uint64_t kVmemAlign = 256;

/// Units per tile of `fp` when `vmem_bytes` of VMEM are free: two slots plus the fixed areas
/// must fit. Throws DeviceError(Usage) naming the kernel when not even one unit fits.
uint32_t plan(const Footprint& fp, uint64_t vmem_bytes);
/// Bytes of one tile slot of `fp` with `tile` units (areas aligned to kVmemAlign).
uint64_t slot_bytes(const Footprint& fp, uint32_t tile);

class Body;

/// A custom transfer of one tile: emits exactly one DMA with completion flag `flag`. Arguments:
/// registers holding the tile's first unit, its units and its slot base; Body::tmp(0..1) are
/// free for the address arithmetic.
using Transfer = std::function<void(Body& b, const isa::Reg& first, const isa::Reg& units,
                                    const isa::Reg& slot, const isa::Flag& flag)>;

/// A tensor moved tile by tile: slot area `area` per tile (a custom transfer if `custom`).
struct Stream {
    Stream(Operand where, int area_index, Transfer transfer = {})
        : place(where), area(area_index), custom(std::move(transfer)) {}
    Operand place;    ///< the tensor (HBM or VMEM)
    int area;         ///< index into Footprint::areas
    Transfer custom;  ///< optional custom transfer (HBM tensors only)
};

/// A tensor loaded into fixed area `fixed` before the loop, or stored from it after the loop.
struct FixedIo {
    Operand place;        ///< the tensor (HBM or VMEM)
    int fixed;            ///< index into Footprint::fixed
    uint32_t values = 0;  ///< values moved: 0 for the whole area (an area padded for the VPU)
    /// Rows of `values` values each (rows > 1), contiguous in the tensor and `area_row` values
    /// apart in the area: rows padded to whole lane chunks for the VPU, moved by one DMA.
    uint32_t rows = 1;
    uint32_t area_row = 0;  ///< values from one row's start to the next's in the area
};

/// A streaming kernel: `ins` loaded and `outs` stored per tile, `body` emitting the VPU work of
/// one tile.
struct Spec {
    Footprint fp;                                ///< areas and units
    std::vector<Stream> ins, outs;               ///< per-tile transfers
    std::vector<FixedIo> fixed_ins, fixed_outs;  ///< one-time transfers
    std::function<void(Body&)> body;             ///< the VPU work of one tile
    /// Before any load; must finish its own work on the slots before returning.
    std::function<void(Body&)> prologue;
    /// After the last tile's VPU work, before the fixed results are stored (results accumulated
    /// over the tiles: its VPU work is waited for).
    std::function<void(Body&)> finish;
    /// After every store has completed.
    std::function<void(Body&)> epilogue;
};

/// Emits `sp` with `tile` units per tile into `b` (no halt), taking its registers, flags and
/// VMEM from b's pools in its own scope and returning them at the end. Standalone programs
/// keep the numbering of the original text kernels: s13-s30 and f1-f10 (hints).
void emit(isa::Builder& b, const Spec& sp, uint32_t tile);
/// A stand-alone program named `name`: `params` declared as its launch arguments, the kernel
/// `spec(operands)` emitted with `tile` units per tile, then halt.
isa::Program standalone(const std::string& name, std::span<const Param> params, uint32_t tile,
                        const std::function<Spec(std::span<const Operand>)>& spec);

/// What a body (and prologue, epilogue, custom transfer) emits with: the tile's slot areas,
/// the fixed areas, the tile registers and the VPU's counted flag.
class Body {
public:
    /// The builder (for labels, branches, scalar arithmetic, other resources).
    isa::Builder& builder() const { return m_b; }
    /// Slot area k of the current tile: [slot + offset].
    isa::Arg a(int k) const;
    /// Slot area k of the slot whose base is in `slot` (custom transfers).
    isa::Arg at(const isa::Reg& slot, int k) const;
    /// Slot area k of slot 0 or 1, absolute (prologues).
    isa::Arg slot(int which, int k) const;
    /// Fixed area k, absolute.
    isa::Arg f(int k) const;
    /// Bytes from a slot base to slot area k.
    uint64_t off(int k) const;
    /// Units per full tile.
    uint32_t tile_units() const;
    /// Units in the current tile (the last one is ragged).
    const isa::Reg& units() const;
    /// The current tile's first unit.
    const isa::Reg& first() const;
    /// Index of the current tile (0, 1, ...).
    const isa::Reg& tile() const;
    /// A register free for the body.
    const isa::Reg& scratch() const;
    /// Registers free for a custom transfer's address arithmetic (i = 0, 1).
    const isa::Reg& tmp(int i) const;
    /// A VPU instruction of the body, counted on the VPU flag that the loop waits on before
    /// reusing a slot or storing results.
    void vpu(isa::Opcode op, std::initializer_list<isa::Arg> args);
    /// The VPU's counted flag (for CountedFlag::issue_deferred: a body of hundreds of VPU ops
    /// counts them once; it must count_deferred() before it returns).
    isa::CountedFlag& vpu_flag() const;
    /// Any other instruction.
    void emit(isa::Opcode op, std::initializer_list<isa::Arg> args);

    struct State;
    Body(isa::Builder& b, const State& s) : m_b(b), m_s(s) {}

private:
    isa::Builder& m_b;
    const State& m_s;
};

}  // namespace tpu::driver::streaming
