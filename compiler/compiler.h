// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/compiled_step.h"
#include "compiler/ir.h"
#include "hw/board_config.h"

/// The pass pipeline and the compile cache (compiler/README.md, "Passes").
namespace tpu::compiler {

/// What the pipeline does; every field's default follows the public XLA or PyTorch/XLA
/// behaviour named in its comment.
struct CompileOptions {
    /// The board: the MXU's size for the evaluator's numerics, the driver's planner for the
    /// stationary operand of each dot.
    hw::BoardConfig board{};
    /// Merge dots that share an operand (xla/service/dot_merger.cc) ...
    bool merge_dots = true;
    /// ... when the dot's operands and result take at most this many bytes (XLA's GPU pipeline
    /// passes xla_gpu_dot_merger_threshold_mb, default 32 MiB; TPU's value is not public).
    uint64_t dot_merge_max_bytes = uint64_t(32) << 20;
    /// Merge sibling reductions of one operand into one multi-output fusion, and a loop fusion
    /// into the reduction that consumes it (xla/service/gpu/multi_output_fusion.cc; TPU's
    /// multi-output policy is not public).
    bool multi_output_fusion = true;
    /// Let cheap producers be recomputed inside several consumer fusions instead of written
    /// once (InstructionFusion's may_duplicate; its global guard against extra reads applies).
    bool may_duplicate = true;
    /// Fuse elementwise producers into a batched dot's operand when the dot reads each of its
    /// elements once (xla/service/gpu/transforms/gemm_fusion.cc, FuseDotOperand; TPU's operand
    /// fusion is not public): attention's softmax normalize is computed as `P V` loads P.
    bool dot_operand_producers = true;
    /// Compute a reduction of a batched dot's result (attention's softmax max over the scores)
    /// in the dot's fusion as a second result, as the kernel stores each batch
    /// (compiler/README.md, "Reductions in a dot's fusion": producer-consumer multi-output
    /// fusion, xla/service/multi_output_fusion.h, with an output fusion as the producer; the
    /// TPU's policy is not public, the real v3 attention rows' time bounds its traffic).
    bool reductions_into_dots = true;
    /// Start of every buffer, in bytes (driver::Device::alloc aligns to 256).
    uint64_t buffer_alignment_bytes = 256;
    /// Reuse temp memory by liveness (false: every temp its own bytes, for comparison).
    bool reuse_buffers = true;
};

/// The pipeline's stages, in order (each documented in compiler/README.md):
/// 1. decompose: composites as PyTorch/XLA lowers them (batch norm as batchnorm_expander.cc);
/// 2. simplify: transposes folded into dots (transpose_folding.cc), broadcasts sunk below
///    elementwise ops and x*1, x+0 removed (algebraic_simplifier.cc), dead ops removed;
/// 3. merge dots that share an operand (dot_merger.cc);
/// 4. fuse (instruction_fusion.cc, multi_output_fusion.cc);
/// 5. plan each dot's stationary operand (driver::plan_gemm, gemm_estimate_cycles);
/// 6. assign layouts (layout_assignment.cc: each producer writes what its consumer reads);
/// 7. assign buffers by liveness (buffer_assignment.cc, heap_simulator.cc).
CompiledStep compile(const Graph& graph, const CompileOptions& options = {});

/// Stage 1 alone: a graph without composites.
Graph decompose(const Graph& graph);
/// Stage 2 alone.
Graph simplify(const Graph& graph);
/// Stage 3 alone.
Graph merge_dots(const Graph& graph, uint64_t max_bytes);

/// Compiled steps by graph: a graph whose structure was seen before is a hit (no compile); a
/// new structure (a new shape, a new op) compiles. Hits compare the whole structure, not just
/// the hash.
class CompileCache {
public:
    explicit CompileCache(CompileOptions options = {}) : m_options(std::move(options)) {}
    /// The compiled step of `graph`, compiling it on a miss (the host time is counted).
    std::shared_ptr<const CompiledStep> get(const Graph& graph);
    uint64_t hits() const { return m_hits; }
    uint64_t misses() const { return m_misses; }
    /// Host seconds spent compiling.
    double compile_seconds() const { return m_seconds; }
    /// Distinct graphs held.
    size_t size() const;
    const CompileOptions& options() const { return m_options; }

private:
    CompileOptions m_options;
    std::multimap<uint64_t, std::pair<std::string, std::shared_ptr<const CompiledStep>>> m_steps;
    uint64_t m_hits = 0, m_misses = 0;
    double m_seconds = 0;
};

}  // namespace tpu::compiler
