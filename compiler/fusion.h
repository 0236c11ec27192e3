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
