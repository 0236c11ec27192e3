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

#include "compiler/codegen_internal.h"
#include "driver/kernels/allreduce.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::compiler {
namespace gen {

void not_generated(const Fusion& f, const std::string& what) {
    throw NotYetGenerated(fmt::format("{}: {} not yet generated", f.name, what));
}

}  // namespace gen

namespace {

using namespace gen;
namespace st = driver::streaming;

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
/// its result buffer. That is the operand's buffer when nothing reads the operand afterwards
/// (buffer assignment's in-place pair); else (a later reader, a step input or a parameter) the
/// operand is copied there first.
struct CollectiveFusion {
    const FusionValue* x = nullptr;  ///< the operand
    const FusionValue* y = nullptr;  ///< the result
    float scale = 1;                 ///< applied after the sum (scale == 1: none)
    uint32_t values = 0;             ///< fp32 values in the buffer (tile padding included)
    std::optional<driver::AllReduceHbmPlan> ring;  ///< the ring kernel (replicas > 1)
    /// The torus kernel instead (replicas: the whole torus board, the torus's bound smaller).
    std::optional<driver::TorusAllReduceKey> torus;
    /// Whether it sums over replicas (a ring or a torus kernel).
    bool sums() const { return ring || torus; }
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
    // The planner asks the board's cost functions (driver::plan_allreduce_torus): the torus
    // over the whole board in core order where its bound is below the ring's.
    if (o.replicas > 1 && o.replica_cores.size() == o.replicas)
        p.torus = driver::plan_allreduce_torus(o.board, o.replica_cores, p.values);
    if (o.replicas > 1 && !p.torus)
        p.ring =
            driver::plan_allreduce_hbm(o.replicas, p.values, o.board,
                                       driver::AllReduceSchedule::Auto, o.board.core.vmem_bytes);
    return p;
}

/// Emits a collective fusion: the ring all-reduce in place (driver::emit_allreduce), the ring in
/// replica order as the evaluator's reference sums, or the torus all-reduce
/// (driver::emit_allreduce_torus; `ring[0]` is then the core's number). Neighbours shake hands
/// on `ready` (never reset, `count` handshakes so far; the torus: one flag per phase, `count`
/// torus all-reduces so far) before anything is sent: a core may still be in the previous
/// fusion, whose flags and VMEM the all-reduce takes over.
void emit_collective(isa::Builder& b, const CollectiveFusion& p, const isa::Reg& x,
                     const isa::Reg& y, const std::array<isa::Reg, 3>& ring,
                     std::span<const isa::Flag> ready, uint32_t count) {
    const bool scale_here = !p.sums() && p.scale != 1.0f;
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
    if (!p.sums()) return;
    const isa::Reg scale = b.reg("scale");
    b.emit(Opcode::Li, {scale, imm(int64_t(std::bit_cast<uint32_t>(p.scale)))});
    if (p.torus) {
        const isa::Smem dims = b.smem("torus.dims", 3 * p.torus->phases.size());
        driver::emit_torus_coordinates(b, *p.torus, ring[0], dims);
        driver::emit_allreduce_torus(b, *p.torus, y, scale, dims,
                                     [&](size_t phase, const isa::Reg& next, const isa::Reg& prev) {
                                         driver::emit_ring_ready(b, next, prev, ready[phase],
                                                                 count);
                                     });
        return;
    }
    auto ops = driver::AllReduceOperands::ring(y, scale, ring[0], ring[1], ring[2]);
    ops.ready = [&] { driver::emit_ring_ready(b, ring[1], ring[2], ready[0], count); };
    driver::emit_allreduce(b, *p.ring, ops);
}

/// A wide program's windows for one fusion (CodegenOptions::wide_addresses): its buffers in
/// groups, each a span of one allocation mapped to consecutive HBM windows from `first`, so a
/// buffer's program address is static: (first << 29) + its offset from `lo`.
struct WindowGroup {
    size_t arg = 0;      ///< launch argument of the allocation (its address in 256-byte units)
    uint64_t lo = 0;     ///< first byte of the span in the allocation
    uint64_t hi = 0;     ///< one past its last byte
    uint32_t first = 0;  ///< its first window
    uint32_t count() const {
        return uint32_t((hi - lo + isa::kHbmWindowBytes - 1) / isa::kHbmWindowBytes);
    }
};

std::string arg_name(const ProgramArg& a);

/// Groups a fusion's buffers into windows: buffers of one allocation share a group while that
/// costs no more windows than separate groups would. Throws CompileError when they need more
/// than the 8 windows, naming the fusion and its buffers.
std::vector<WindowGroup> plan_windows(const Fusion& f, std::vector<ProgramSegment::WindowRef> refs,
                                      const std::vector<ProgramArg>& args) {
    std::sort(refs.begin(), refs.end(), [](const auto& x, const auto& y) {
        return std::pair{x.arg, x.offset} < std::pair{y.arg, y.offset};
    });
    std::vector<WindowGroup> groups;
    for (const auto& r : refs) {
        const uint64_t hi = r.offset + std::max<uint64_t>(r.bytes, 1);
        if (!groups.empty() && groups.back().arg == r.arg) {
            WindowGroup merged = groups.back();
            merged.hi = std::max(merged.hi, hi);
            const WindowGroup alone{r.arg, r.offset, hi};
            if (merged.count() <= groups.back().count() + alone.count()) {
                groups.back() = merged;
                continue;
            }
        }
        groups.push_back({r.arg, r.offset, hi});
    }
    uint32_t next = 0;
    for (WindowGroup& g : groups) {
        g.first = next;
        next += g.count();
    }
    if (next > isa::kHbmWindows) {
        std::string list;
        for (const auto& r : refs)
            list += fmt::format("{}{}+{}: {} bytes", list.empty() ? "" : ", ",
                                arg_name(args[r.arg]), r.offset, r.bytes);
        throw CompileError(fmt::format(
            "{}: its buffers need {} HBM windows of 512 MiB, a core has {} (isa/README.md, \"HBM "
            "windows\"): {}",
            f.name, next, isa::kHbmWindows, list));
    }
    return groups;
}

/// The program address of `off` in allocation `arg` through `groups`; nullopt if none covers it.
std::optional<uint32_t> window_address(const std::vector<WindowGroup>& groups, size_t arg,
                                       uint64_t off) {
    for (const WindowGroup& g : groups)
        if (g.arg == arg && off >= g.lo && off < g.hi)
            return uint32_t((uint64_t(g.first) << isa::kHbmWindowBits) + (off - g.lo));
    return std::nullopt;
}

/// A wide program's fusion prologue: `hbm.map` for each window whose mapping differs from what
/// the fusions before it left (`mapped`: per window, the allocation and byte it maps, or none).
void emit_window_maps(
    isa::Builder& b, const std::vector<WindowGroup>& groups, const isa::Smem& table,
    std::array<std::optional<std::pair<size_t, uint64_t>>, isa::kHbmWindows>& mapped) {
    const auto scope = b.scope("windows");
    std::optional<isa::Reg> t;
    for (const WindowGroup& g : groups)
        for (uint32_t i = 0; i < g.count(); ++i) {
            const uint32_t w = g.first + i;
            const std::pair<size_t, uint64_t> want{g.arg,
                                                   g.lo + uint64_t(i) * isa::kHbmWindowBytes};
            if (mapped[w] == want) continue;
            if (!t) t.emplace(b.reg("base"));
            b.emit(Opcode::Lw, {*t, table.word(uint32_t(g.arg))});
            const uint64_t units = want.second / isa::kHbmMapUnit;
            if (units) b.emit(Opcode::Add, {*t, *t, imm(int64_t(units))});
            b.emit(Opcode::HbmMap, {imm(int64_t(w)), *t});
            mapped[w] = want;
        }
}

std::string arg_name(const ProgramArg& a) {
    switch (a.what) {
        case ProgramArg::What::Position:
            return "ring.position";
        case ProgramArg::What::Next:
            return "ring.next";
        case ProgramArg::What::Prev:
            return "ring.prev";
        case ProgramArg::What::Derived:
            return "derived";
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
    std::vector<std::vector<DotFusion>> dots;
    std::vector<std::optional<CollectiveFusion>> collectives;
    std::vector<std::shared_ptr<const ConvPoolFusion>> windows;  // codegen_conv.cpp
    std::vector<std::shared_ptr<const GatherFusion>> gathers;    // codegen_gather.cpp
    std::vector<std::shared_ptr<const ConcatFusion>> concats;    // codegen_concat.cpp
    std::vector<std::optional<DerivedSlot>> slots;
    uint64_t derived_bytes = 0;
    std::map<std::pair<uint8_t, uint32_t>, size_t> slot;
    std::vector<std::vector<WindowGroup>> groups;  // wide programs: per fusion
    bool rings = false;  // the launch carries each core's place in the ring
    bool ring_kernels = false;
    size_t torus_phases = 0;  // of the torus all-reduces (one board: all have the same)
    // A reduction merged into a dot's fusion that the dot kernel does not compute: its own
    // stream pass after the kernel (split_dot_reduction).
    std::vector<std::shared_ptr<const DotReductionSplit>> splits;
    std::vector<std::optional<Plan>> passes;
    for (size_t i : fusions) {
        const Fusion& f = step.fusions[i];
        plans.emplace_back();
        dots.emplace_back();
        splits.emplace_back();
        passes.emplace_back();
        collectives.emplace_back();
        windows.push_back(plan_conv_pool_fusion(g, f, o.board));
        gathers.push_back(f.kind == FusionKind::Loop ? plan_gather_fusion(g, f, o.board) : nullptr);
        concats.push_back(f.kind == FusionKind::Loop ? plan_concat_fusion(g, f, o.board) : nullptr);
        if (f.kind == FusionKind::Collective) {
            collectives.back() = plan_collective(g, f, o);
            rings |= collectives.back()->sums();
            ring_kernels |= collectives.back()->ring.has_value();
            if (collectives.back()->torus)
                torus_phases = 2 * collectives.back()->torus->phases.size() - 1;
        } else if (windows.back() || gathers.back() || concats.back()) {
            // a convolution or pooling fusion (codegen_conv.cpp), a gather (codegen_gather.cpp),
            // a concatenation (codegen_concat.cpp)
        } else if (f.kind == FusionKind::Output) {
            splits.back() = split_dot_reduction(g, f);
            const DotReductionSplit* sp = splits.back().get();
            dots.back() = plan_dot_fusion(g, sp ? sp->core : f, o.board);
            if (sp && !plan_dot_reduction(g, *sp, dots.back(), o.board)) {
                passes.back() = plan_fusion(g, sp->pass, o.board);
            }
        } else {
            plans.back() = plan_fusion(g, f, o.board);
        }
        std::vector<BufferRef> bufs;
        for (const auto* list : {&f.operands, &f.results})
            for (const FusionValue& fv : *list) bufs.push_back(fv.buffer);
        if (f.scratch.bytes) bufs.push_back(f.scratch);
        // A buffer computed from a parameter, kept across launches in the derived arena (one
        // per parameter and key; kMaxDerived at most, one stale bit each).
        slots.emplace_back();
        if (const auto d = windows.back() ? conv_pool_derived(*windows.back()) : std::nullopt) {
            auto it = std::find_if(seg.derived.begin(), seg.derived.end(), [&](const auto& x) {
                return x.parameter == d->parameter && x.key == d->key;
            });
            if (it == seg.derived.end() && seg.derived.size() < kMaxDerived) {
                DerivedBuffer nb = *d;
                nb.offset = derived_bytes;
                derived_bytes += (d->bytes + 511) / 512 * 512;
                seg.derived.push_back(nb);
                it = seg.derived.end() - 1;
            }
            if (it != seg.derived.end())
                slots.back() = DerivedSlot{it->offset, uint32_t(it - seg.derived.begin())};
        }
        for (const BufferRef& buf : bufs) {
            const auto key = alloc_key(buf);
            if (slot.count(key)) continue;
            slot[key] = seg.args.size();
            seg.args.push_back({ProgramArg::What::Base, buf.space, key.second});
        }
        if (o.wide_addresses) {
            // The buffers this fusion's window covers, one entry per (allocation, offset).
            std::vector<ProgramSegment::WindowRef> refs;
            for (const BufferRef& buf : bufs) {
                const uint64_t off = buf.space == BufferRef::Space::Temp ? buf.offset : 0;
                if (off % isa::kHbmMapUnit)
                    throw CompileError(fmt::format("{}: temp offset {} is not a multiple of {}",
                                                   f.name, off, isa::kHbmMapUnit));
                auto it = std::find_if(refs.begin(), refs.end(), [&](const auto& r) {
                    return r.arg == slot.at(alloc_key(buf)) && r.offset == off;
                });
                if (it == refs.end())
                    refs.push_back({slot.at(alloc_key(buf)), off, buf.bytes});
                else
                    it->bytes = std::max(it->bytes, buf.bytes);
            }
            groups.push_back(plan_windows(f, refs, seg.args));
            seg.windows.push_back(std::move(refs));
        }
    }
    // A wide program keeps no derived arena: its argument would be a scaled address.
    if (o.wide_addresses) {
        seg.derived.clear();
        for (auto& s : slots) s.reset();
    }
    const size_t derived_args = seg.args.size();
    // The derived arena takes one launch argument; without a free one, each fusion packs its
    // filter into its scratch on every launch instead.
    if (!seg.derived.empty() && seg.args.size() + 1 + (rings ? 3 : 0) >= size_t(isa::kNumSregs)) {
        seg.derived.clear();
        for (auto& s : slots) s.reset();
    }
    if (!seg.derived.empty())
        seg.args.push_back({ProgramArg::What::Derived, BufferRef::Space::Temp, 0});
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
    // Wide programs: what each HBM window maps (nothing known at the launch's start).
    std::array<std::optional<std::pair<size_t, uint64_t>>, isa::kHbmWindows> mapped;
    // The all-reduces' handshake flag: held for the whole program, never reset, so a
    // neighbour's signal cannot be lost to a reset (codegen.h, emit_collective).
    // The torus all-reduces: one such flag per phase, each phase's neighbours being others.
    std::optional<isa::Flag> ready;
    if (ring_kernels) ready.emplace(b.flag("ring.ready"));
    std::vector<isa::Flag> torus_ready;
    for (size_t i = 0; i < torus_phases; ++i)
        torus_ready.push_back(b.flag(fmt::format("torus.ready.{}", i)));
    uint32_t handshakes = 0, torus_handshakes = 0;
    for (size_t k = 0; k < fusions.size(); ++k) {
        const Fusion& f = step.fusions[fusions[k]];
        seg.fusion_pcs.push_back(b.pc());
        if (k > 0) emit_delay(b, o.board.core.fusion_setup_cycles);
        const auto scope = b.scope(f.name);
        if (o.wide_addresses) emit_window_maps(b, groups[k], *table, mapped);
        const auto load = [&](const isa::Reg& r, const BufferRef& buf) {
            if (o.wide_addresses) {
                // The buffer's program address through this fusion's windows.
                const uint64_t off = buf.space == BufferRef::Space::Temp ? buf.offset : 0;
                // The arena itself (codegen_conv.cpp's Addresses): its temps add their window
                // addresses to 0.
                if (buf.space == BufferRef::Space::Temp && buf.bytes == 0 && off == 0) {
                    b.emit(Opcode::Li, {r, imm(0)});
                    return;
                }
                const auto at = window_address(groups[k], slot.at(alloc_key(buf)), off);
                if (!at)
                    throw CompileError(
                        fmt::format("{}: {}+{} lies in none of its HBM windows", f.name,
                                    arg_name(seg.args[slot.at(alloc_key(buf))]), off));
                b.emit(Opcode::Li, {r, imm(int64_t(*at))});
                return;
            }
            // A 32-bit immediate (a core addresses 4 GiB of HBM: hw/README.md).
            if (buf.space == BufferRef::Space::Temp && buf.offset > 0xffffffffu)
                throw CompileError(
                    fmt::format("{}: temp offset {} beyond 4 GiB", f.name, buf.offset));
            b.emit(Opcode::Lw, {r, table->word(slot.at(alloc_key(buf)))});
            if (buf.space == BufferRef::Space::Temp && buf.offset > 0)
                b.emit(Opcode::Add, {r, r, imm(int64_t(buf.offset))});
        };
        // A stream fusion's buffers, each base in a register of its own.
        const auto stream_bases = [&](const Fusion& sf, const auto& load_fn) {
            Bases bases;
            for (const auto* list : {&sf.operands, &sf.results})
                for (const FusionValue& fv : *list) {
                    const auto key = alloc_key(fv.buffer);
                    // A wide program's temps lie anywhere around the window base: each its own.
                    const bool far = fv.buffer.space == BufferRef::Space::Temp &&
                                     (o.wide_addresses || fv.buffer.offset > 0x7fffffffu);
                    if (far && !bases.far.count(fv.buffer.offset)) {
                        // Past 2 GiB: its own register (load() checks the 4 GiB immediate).
                        isa::Reg r = b.reg(fmt::format("temp{}", bases.far.size()));
                        load_fn(r, fv.buffer);
                        bases.far.emplace(fv.buffer.offset, std::move(r));
                        continue;
                    }
                    if (bases.regs.count(key) || far) continue;
                    isa::Reg r = b.reg(arg_name(seg.args[slot.at(key)]));
                    if (o.wide_addresses)
                        load_fn(r, fv.buffer);
                    else
                        b.emit(Opcode::Lw, {r, table->word(slot.at(key))});
                    bases.regs.emplace(key, std::move(r));
                }
            return bases;
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
                emit_collective(b, c, x, y, ring, std::span(&*ready, 1), handshakes);
            } else if (c.torus) {
                // The torus runs over the whole board in core order: position is the core.
                ring[0] = b.reg("position");
                b.emit(Opcode::Lw, {ring[0], table->word(ring_args)});
                emit_collective(b, c, x, y, ring, torus_ready, ++torus_handshakes);
            } else {
                emit_collective(b, c, x, y, ring, {}, 0);
            }
            continue;
        }
        if (!dots[k].empty()) {
            emit_dot_fusions(b, dots[k], load);
            if (passes[k]) {
                // The reduction's pass, as the fusion of its own it would be otherwise.
                emit_delay(b, o.board.core.fusion_setup_cycles);
                const Fusion& pf = splits[k]->pass;
                emit_stream_fusion(b, g, pf, *passes[k], stream_bases(pf, load), o.board);
            }
            continue;
        }
        if (gathers[k]) {
            emit_gather_fusion(b, *gathers[k], load);
            continue;
        }
        if (concats[k]) {
            emit_concat_fusion(b, *concats[k], load);
            continue;
        }
        if (windows[k]) {
            const auto load_arg = [&](const isa::Reg& r) {
                b.emit(Opcode::Lw, {r, table->word(derived_args)});
            };
            // Wide programs: each temp at its window address (the arena register holds 0).
            const TempAddrFn temps = [&](const BufferRef& r) -> std::optional<uint32_t> {
                if (r.bytes == 0 && r.offset == 0) return 0;
                return window_address(groups[k], slot.at(alloc_key(r)), r.offset);
            };
            emit_conv_pool_fusion(b, *windows[k], load, load_arg, slots[k],
                                  o.wide_addresses ? &temps : nullptr);
            continue;
        }
        emit_stream_fusion(b, g, f, plans[k], stream_bases(f, load), o.board);
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
    std::set<std::pair<uint8_t, uint32_t>> run_allocs;
    bool run_rings = false;
    // A fusion with an HBM scratch (a convolution or pooling) also reads the temp arena and may
    // keep a packed filter in the derived arena, one more argument.
    bool run_derived = false;
    // A program larger than the core's instruction memory is halved until its pieces fit
    // (each cut a launch); a single fusion that does not fit is left for the launch to refuse.
    const std::function<void(std::span<const size_t>)> emit_run = [&](std::span<const size_t> fs) {
        ProgramSegment seg = device_segment(step, {fs.begin(), fs.end()}, options);
        if (fs.size() > 1 &&
            seg.program.code.size() * uint64_t(isa::kInstrBytes) > options.board.core.imem_bytes) {
            emit_run(fs.first(fs.size() / 2));
            emit_run(fs.subspan(fs.size() / 2));
            return;
        }
        out.segments.push_back(std::move(seg));
    };
    const auto flush = [&] {
        if (run.empty()) return;
        emit_run(run);
        run.clear();
        run_allocs.clear();
        run_rings = false;
        run_derived = false;
    };
    // A launch carries at most kNumSregs - 1 arguments (every allocation a program touches, and
    // a ring's three), so a step that touches more is cut into several programs, each as many
    // fusions as fit: each cut costs a launch.
    const auto insert_allocs = [](std::set<std::pair<uint8_t, uint32_t>>& allocs, const Fusion& f) {
        for (const auto* list : {&f.operands, &f.results})
            for (const FusionValue& fv : *list) allocs.insert(alloc_key(fv.buffer));
        if (f.scratch.bytes) allocs.insert(alloc_key(f.scratch));
    };
    const auto fits = [&](const Fusion& f) {
        auto allocs = run_allocs;
        insert_allocs(allocs, f);
        const bool rings = run_rings || (f.kind == FusionKind::Collective && options.replicas > 1);
        const bool derived = (run_derived || f.scratch.bytes != 0) && !options.wide_addresses;
        return allocs.size() + (rings ? 3 : 0) + (derived ? 1 : 0) < size_t(isa::kNumSregs);
    };
    const auto add = [&](size_t i) {
        const Fusion& f = step.fusions[i];
        if (!fits(f)) flush();
        insert_allocs(run_allocs, f);
        run_rings |= f.kind == FusionKind::Collective && options.replicas > 1;
        run_derived |= f.scratch.bytes != 0;
        run.push_back(i);
    };
    for (size_t i = 0; i < step.fusions.size(); ++i) {
        std::string fallback;
        if (options.host_fallback && step.fusions[i].kind != FusionKind::Custom) {
            // Generating the fusion alone tells whether the emitters cover it: every
            // NotYetGenerated comes from its own plan or body, never from its neighbours.
            try {
                const ProgramSegment alone = device_segment(step, {i}, options);
                // A fusion whose program alone exceeds the instruction memory (a batched dot
                // of many heads, one kernel per head) cannot launch.
                const uint64_t bytes = alone.program.code.size() * uint64_t(isa::kInstrBytes);
                if (bytes > options.board.core.imem_bytes)
                    fallback = fmt::format(
                        "{}: a program of {} bytes, beyond the instruction "
                        "memory's {}, not yet generated",
                        step.fusions[i].name, bytes, options.board.core.imem_bytes);
            } catch (const NotYetGenerated& e) {
                fallback = e.what();
            }
        }
        if (step.fusions[i].kind == FusionKind::Custom || !fallback.empty()) {
            flush();
            ProgramSegment host;
            host.host_fusion = int64_t(i);
            host.fallback = std::move(fallback);
            out.segments.push_back(std::move(host));
        } else {
            add(i);
        }
    }
    flush();
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

}  // namespace tpu::compiler
