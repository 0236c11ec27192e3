// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <vector>

#include "compiler/compiled_step.h"
#include "compiler/ir.h"

/// Internal: the fusion stage's result before layouts and buffers. Not a stable API.
namespace tpu::compiler::detail {

/// The fusion switches of CompileOptions.
struct FusionOptions {
    bool multi_output_fusion = true;
    bool may_duplicate = true;
    /// Recompute a loop fusion that a reduction and others read in all of them when that
    /// moves fewer bytes (PriorityFusion; fusion.cpp, duplicate_into_readers).
    bool recompute_for_reductions = true;
    /// Fuse the elementwise producers of a batched dot's operand into the dot's fusion (the
    /// softmax's normalize into attention's `P V`) when the dot reads each element of that
    /// operand once (fusion.cpp, operand_producer_fusible).
    bool dot_operand_producers = true;
    /// Merge a reduction of a batched dot's result, over one of its matrix dims, into the dot's
    /// fusion as a second result (fusion.cpp, reductions_into_dots).
    bool reductions_into_dots = true;
    /// The MXU's columns (CoreConfig::mxu_cols): a dot whose other operand has at most this many
    /// free elements per batch computes all of a block's results in one pass over the operand.
    int64_t mxu_cols = 128;
};

/// One fusion: its ops (ascending ids), kind, hero, the values it reads and writes.
struct FusionGroup {
    std::vector<OpId> ops;
    FusionKind kind = FusionKind::Loop;
    OpId hero = kNoOp;
    std::vector<ValueId> operands, results;
};

/// Stage 4: the fusions of `g` (decomposed, simplified) in execution order.
std::vector<FusionGroup> fuse(const Graph& g, const FusionOptions& options);

}  // namespace tpu::compiler::detail
