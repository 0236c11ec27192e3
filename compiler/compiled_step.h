// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir.h"
#include "driver/kernels/stationary.h"

/// The compiled step: the contract between the compiler's passes and a code generator. A step
/// is a list of fusions in execution order; each fusion is a small graph of ops (in
/// CompiledStep::graph) with the buffers it reads and writes, their layouts and offsets. A code
/// generator emits one kernel per fusion into one program per core (every core runs the same
/// program on its replica; collectives talk across them).
namespace tpu::compiler {

/// Where an array lives in one core's HBM.
struct BufferRef {
    enum class Space : uint8_t {
        Parameter,  ///< a persistent buffer of the runtime: CompiledStep::parameters[index]
        Input,      ///< written by the host before the step: CompiledStep::inputs[index]
        Constant,   ///< written by the host with the graph: CompiledStep::constants[index]
        Output,     ///< allocated per run, handed to the host: CompiledStep::outputs[index]
        Temp,       ///< `offset` bytes into the step's temp arena (MemoryPlan::temp_bytes)
    };
    Space space = Space::Temp;  ///< which allocation
    uint32_t index = 0;         ///< Parameter, Input, Constant, Output: the number
    uint64_t offset = 0;        ///< Temp: byte offset in the arena
    uint64_t bytes = 0;         ///< bytes in its layout (tile padding included)
    /// "param(0)", "temp[4096+1536]".
    std::string to_string() const;
    friend bool operator==(const BufferRef&, const BufferRef&) = default;
};

/// An array a fusion reads or writes.
struct FusionValue {
    ValueId value = 0;   ///< in CompiledStep::graph
    Shape shape{};       ///< its type
    Layout layout{};     ///< how it lies in its buffer
    BufferRef buffer{};  ///< where
};

/// What a fusion is, as XLA names its fusion kinds.
enum class FusionKind : uint8_t {
    Loop,        ///< elementwise and data movement (kLoop); also pooling, scatter, gather roots
    Input,       ///< rooted at reductions (kInput): streams its operand through the VPU
    Output,      ///< rooted at a dot or convolution (kOutput): the MXU, with the ops fused
                 ///< before it (operand conversions, dims) and after it (its epilogue)
    Collective,  ///< an all-reduce over the replicas' ICI ring
    Custom,      ///< a host or library call
};
/// "loop", "input", "output", "collective", "custom".
std::string_view fusion_kind_name(FusionKind k);

/// Which dot operand the MXU holds while the other streams through it: the dot kernel's own
/// enum, so a layout decision reaches the emitter as it is.
using Stationary = driver::Stationary;

/// How a dot runs on the MXU, decided by the driver's GEMM planner (never re-derived here).
struct DotPlan {
    OpId op = kNoOp;                          ///< the dot
    int64_t batch = 1, m = 1, k = 1, n = 1;   ///< batch x ([m, k] x [k, n])
    Stationary stationary = Stationary::Rhs;  ///< the cheaper orientation
    double rhs_cycles = 0;  ///< planner estimate per core with the rhs stationary (all batches)
    double lhs_cycles = 0;  ///< the same with the lhs stationary
};

/// One fusion: ops that run as one kernel.
struct Fusion {
    std::string name;  ///< "fusion.3"
    FusionKind kind = FusionKind::Loop;
    OpId hero = kNoOp;      ///< the dot, convolution, reduction, collective or call that sets kind
    std::vector<OpId> ops;  ///< its ops in topological order (an op may sit in several fusions:
                            ///< cheap producers are duplicated into their consumers, as XLA does)
    std::vector<FusionValue> operands;  ///< arrays it reads (values defined outside it)
    std::vector<FusionValue> results;   ///< arrays it writes (needed after it)
    std::vector<DotPlan> dots;          ///< Output fusions with a dot: how it runs
    std::vector<std::string> layers;    ///< the scopes of its ops, first-use order
    /// HBM the fusion's kernel needs for itself while it runs (a convolution's packed operands),
    /// a temp live during this fusion only; bytes 0: none.
    BufferRef scratch{};
};

/// A buffer of the runtime: a parameter, input or constant of the step.
struct LeafBuffer {
    ValueId value = 0;  ///< the leaf in CompiledStep::graph
    std::string name;   ///< as recorded
    Shape shape{};
    Layout layout{};  ///< the layout the runtime keeps it in (parameters: across steps)
    uint64_t bytes = 0;
};

/// An output of the step.
struct OutputBuffer {
    ValueId value = 0;
    std::string name;
    Shape shape{};
    Layout layout{};
    /// Where the step leaves it: its own Output allocation, the parameter it updates in place,
    /// or (for an output that is a leaf of the step) that leaf's buffer.
    BufferRef buffer{};
    int64_t updates_parameter = -1;  ///< the parameter it replaces after the step, or -1
};

/// HBM per core.
struct MemoryPlan {
    uint64_t parameter_bytes = 0;      ///< persistent buffers read or updated by the step
    uint64_t input_bytes = 0;          ///< inputs and constants
    uint64_t output_bytes = 0;         ///< outputs with an allocation of their own
    uint64_t temp_bytes = 0;           ///< the temp arena: the peak of live intermediates
    uint64_t temp_unshared_bytes = 0;  ///< the arena without reuse (every temp its own bytes)
    uint64_t alignment_bytes = 0;      ///< every buffer starts at a multiple of this
    /// parameter + input + output + temp bytes: what the step needs on each core.
    uint64_t peak_bytes() const {
        return parameter_bytes + input_bytes + output_bytes + temp_bytes;
    }
};

/// A compiled step: the lowered graph, its fusions in execution order and its buffers.
struct CompiledStep {
    Graph graph;                  ///< after decomposition and rewrites; fusions index it
    std::vector<Fusion> fusions;  ///< execution order
    std::vector<LeafBuffer> parameters, inputs, constants;  ///< by leaf number
    std::vector<OutputBuffer> outputs;                      ///< as Graph::outputs()
    MemoryPlan memory{};
    uint64_t source_hash = 0;    ///< hash of the recorded graph it was compiled from
    double compile_seconds = 0;  ///< host time the compile took
    /// Fusion counts by kind, then each fusion: its ops, operands and results with buffers.
    std::string to_string() const;
    /// One line per fusion: "fusion.3 output dot+add+maximum [block.fc_1] <- ... -> ...".
    std::string summary() const;
};

}  // namespace tpu::compiler
