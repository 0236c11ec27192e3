// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// The text-emitting streaming engine that conv2d.cpp and pool.cpp still use (issue 25): the same
/// schedule as driver/kernels/stream_kernel.h, written as assembly text. Delete this file when
/// those two are migrated to streaming::emit. Not a stable API.
namespace tpu::driver::detail {

struct Layout;

/// Emits kernel text for one tile. Registers: s16 tile index, s18 units in the tile, s19 slot
/// base; s15 is free for the body (s13-s15 for custom transfers). Flags f5-f7 are free for
/// prologues and epilogues.
class Body {
public:
    Body(std::string& s, const Layout& l) : m_s(s), m_l(l) {}
    /// Slot area k of the current tile.
    std::string a(int k) const;
    /// Slot area k of the slot whose base is in register `slot` (custom transfers).
    std::string at(const std::string& slot, int k) const;
    /// Slot area k of slot 0 or 1, absolute (prologues).
    std::string slot(int which, int k) const;
    /// Fixed area k.
    std::string f(int k) const;
    /// Bytes from a slot base to slot area k (for operands at an offset inside an area).
    uint64_t off(int k) const;
    /// Absolute VMEM address of fixed area k.
    uint64_t fixed_addr(int k) const;
    /// Units per full tile.
    uint32_t tile_units() const;
    /// A VPU instruction of the body: gets completion flag f2 and is counted in s26, which the
    /// loop waits on before reusing the slot or storing results.
    void vpu(const std::string& ins);
    /// Any other line (labels, branches, scalar arithmetic, waits).
    void line(const std::string& text);
    /// A label unique to this copy of the body (the loop is unrolled twice).
    std::string label(const std::string& name) const;
    /// Sets the suffix label() appends.
    void set_tag(std::string tag) { m_tag = std::move(tag); }

private:
    std::string& m_s;
    const Layout& m_l;
    std::string m_tag;
};

/// A custom transfer of one tile: emits exactly one DMA with completion flag `flag`.
/// Arguments: registers holding the tile's first unit, its units and its slot base.
using TransferFn = std::function<void(Body&, const std::string& first, const std::string& units,
                                      const std::string& slot, const std::string& flag)>;

/// An HBM tensor moved tile by tile (`dma` set: a custom transfer instead of a contiguous one).
struct Stream {
    Stream(int arg_reg, int area_index, TransferFn transfer = {})
        : arg(arg_reg), area(area_index), dma(std::move(transfer)) {}
    int arg;         ///< s-register with the HBM address
    int area;        ///< index into Spec::areas
    TransferFn dma;  ///< optional custom transfer
};

/// A tensor loaded once before the loop (or stored once after it) from a fixed VMEM area.
struct FixedIo {
    int arg;    ///< s-register with the HBM address
    int fixed;  ///< index into Spec::fixed
};

/// A streamed kernel: `units` units (elements or rows) of `areas[k]` fp32 values each per slot
/// area, `ins` loaded and `outs` stored per tile, `body` emitting the VPU work of one tile.
struct Spec {
    std::string name;  ///< also the cache key prefix: must name everything the code depends on
    uint64_t units = 0;
    std::vector<uint32_t> areas;  ///< fp32 values per unit of each slot area
    std::vector<uint32_t> fixed;  ///< fp32 values of each fixed area
    std::vector<Stream> ins, outs;
    std::vector<FixedIo> fixed_ins, fixed_outs;
    std::function<void(Body&)> body;
    /// Before any load; must finish its own work on the slots before returning.
    std::function<void(Body&)> prologue;
    /// After every store has completed (flags f5-f7).
    std::function<void(Body&)> epilogue;
    uint64_t max_tile_units = 0;  ///< 0: no limit beyond the VMEM and tile-value bounds
};

/// Launch arguments of core set index i.
using ArgsFn = std::function<std::vector<uint32_t>(size_t index)>;
/// Plans, compiles (or fetches) and launches `sp` on `cores`, core i with args(i) in s1, ...
Event run(Device& dev, ProgramCache& cache, const Spec& sp, const std::vector<uint32_t>& cores,
          const ArgsFn& args);
/// run() on the tensors' core set: s1.. = the tensors' replica addresses, then `scalars`.
Event run(Device& dev, ProgramCache& cache, const Spec& sp,
          const std::vector<const Tensor*>& tensors, const std::vector<uint32_t>& scalars = {});
/// Units per tile `sp` gets on this configuration.
uint32_t tile_units(const Spec& sp, const hw::BoardConfig& cfg);
}  // namespace tpu::driver::detail
