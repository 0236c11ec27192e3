// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/compiled_step.h"
#include "hw/board_config.h"
#include "isa/isa.h"

/// Code generation (compiler/README.md, "Code generation"): a compiled step becomes one device
/// program per core, every fusion emitted with the program builder in its own Builder::Scope, in
/// execution order. No SystemC or Eigen here.
namespace tpu::compiler {

/// What the code generator cannot generate yet (a fusion kind, an op, a layout), naming the
/// fusion: a front end may catch it and run the computation another way.
class NotYetGenerated : public CompileError {
public:
    using CompileError::CompileError;
};

/// What the code generator needs besides the step.
struct CodegenOptions {
    /// The board: VMEM and scalar-memory sizes, the VPU's lanes and sublanes, and what a fusion
    /// boundary costs inside one program (`core.fusion_setup_cycles`).
    hw::BoardConfig board{};
    /// Replicas the program runs on (one per core): the ring of its all-reduces.
    uint32_t replicas = 1;
    /// The cores of the replicas, in replica order (empty: not known, the ring). When they
    /// are the whole torus board in core order, an all-reduce takes the torus algorithm where
    /// driver::plan_allreduce_torus chooses it (its bound below the ring's), else the ring.
    std::vector<uint32_t> replica_cores{};
    /// A fusion the emitters do not cover yet runs on the host between launches, as a custom
    /// fusion does (its operands and results cross the host link), instead of failing the step
    /// with NotYetGenerated; ProgramSegment::fallback says why.
    bool host_fallback = false;
    /// Programs that address more HBM than the 4 GiB that 32-bit addresses reach (a step whose
    /// buffers do not fit the driver's window): each launch argument is an allocation's address
    /// in isa::kHbmMapUnit units, and each fusion maps its buffers to HBM windows (`hbm.map`,
    /// isa/README.md "HBM windows"), its kernels' addresses being window addresses. Off: the
    /// arguments are byte addresses in the first 4 GiB and no fusion maps a window.
    bool wide_addresses = false;
};

/// What one launch argument of a program holds on each core.
struct ProgramArg {
    enum class What : uint8_t {
        Base,      ///< the base address of an allocation (space, index)
        Position,  ///< the core's position in the replica ring (0..replicas-1)
        Next,      ///< the core at the next position of the ring
        Prev,      ///< the core at the previous position of the ring
        /// The segment's derived arena (ProgramSegment::derived: buffers the backend keeps
        /// for this program, each computed from a parameter and valid while the parameter is
        /// unchanged, such as a convolution's filter in packed bf16 tiles): its base, a multiple
        /// of kDerivedAlign, plus the stale mask in the bits below: bit j set when derived[j]
        /// must be (re)computed by this launch (its first launch, or the parameter was
        /// rewritten since). One argument, since a launch carries at most 31.
        Derived,
    };
    What what = What::Base;                           ///< what it holds
    BufferRef::Space space = BufferRef::Space::Temp;  ///< Base: which allocation
    uint32_t index = 0;  ///< Base of a Parameter, Input, Constant, Output: the number
};

/// Alignment of a derived arena; its low bits carry the stale mask, one per derived buffer.
inline constexpr uint32_t kDerivedAlign = 1u << 16;
/// Derived buffers a segment holds at most (a further one is recomputed on every launch).
inline constexpr size_t kMaxDerived = 16;

/// A buffer of a segment's derived arena: what a program computes from a parameter once and
/// keeps while the parameter is unchanged.
struct DerivedBuffer {
    uint32_t parameter = 0;  ///< CompiledStep::parameters index it is computed from
    uint64_t key = 0;        ///< what it holds (the packing kernel's key hash)
    uint64_t offset = 0;     ///< bytes into the derived arena
    uint64_t bytes = 0;      ///< its bytes per replica
};

/// One piece of a step: a device program (every device fusion between two host fusions) or a
/// custom fusion that runs on the host.
struct ProgramSegment {
    /// Device segment: the program every core of the replica set runs (empty for a host one).
    isa::Program program;
    /// Device segment: the launch arguments s1, s2, ..., each an allocation's base address.
    std::vector<ProgramArg> args;
    /// Host segment: the fusion's index in CompiledStep::fusions (-1 for a device one).
    int64_t host_fusion = -1;
    /// Host segment of a fusion that is not a custom call (CodegenOptions::host_fallback): the
    /// NotYetGenerated message that sent it to the host.
    std::string fallback;
    /// Device segment: its derived arena's buffers (at most kMaxDerived).
    std::vector<DerivedBuffer> derived;
    /// Device segment: the fusions it holds, in order.
    std::vector<size_t> fusions;
    /// Device segment: the pc where each fusion's code begins (its boundary set-up first), so a
    /// trace or an instruction record maps cycles back to fusions.
    std::vector<uint32_t> fusion_pcs;
    /// A buffer a fusion of a wide program (CodegenOptions::wide_addresses) touches: launch
    /// argument `arg` + `offset` bytes, `bytes` long.
    struct WindowRef {
        size_t arg = 0;
        uint64_t offset = 0;
        uint64_t bytes = 0;
    };
    /// Wide programs: per fusion, the buffers its HBM windows cover (non-empty: the launch
    /// arguments are addresses in isa::kHbmMapUnit units).
    std::vector<std::vector<WindowRef>> windows;
};

/// The generated code of a step: one device program per run of device fusions. A step without
/// custom calls (or host fallbacks) is one segment, so one launch.
struct StepProgram {
    std::vector<ProgramSegment> segments;
    double seconds = 0;  ///< host time code generation took
};

/// Generates the programs of `step`. Throws NotYetGenerated naming the fusion for what cannot be
/// generated yet (ops, layouts or dots the emitters do not cover; with `host_fallback` those
/// fusions become host segments instead) and isa::BuildError when a program does not fit the
/// core (VMEM, registers, instruction memory).
StepProgram generate_step(const CompiledStep& step, const CodegenOptions& options = {});

}  // namespace tpu::compiler
