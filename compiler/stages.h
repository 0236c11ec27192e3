// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "compiler/compiled_step.h"
#include "compiler/compiler.h"
#include "driver/kernels/gemm.h"

namespace tpu::driver {
struct Conv2dShape;
}

/// Internal: stages 5 to 7 of the pipeline, each filling in part of a CompiledStep whose graph
/// and fusions (ops, operands, results) are set. Not a stable API.
namespace tpu::compiler::detail {

/// Stage 5: DotPlan of every dot hero, from the driver's GEMM planner.
void plan_dots(CompiledStep& step, const CompileOptions& options);
/// Stage 6: the layout of every buffer (leaves, fusion results, outputs).
void assign_layouts(CompiledStep& step, const CompileOptions& options);
/// Stage 6b: the HBM scratch of each convolution fusion's packed operands (Fusion::scratch
/// bytes; codegen_conv.cpp), so buffer assignment places it.
void plan_convolution_scratch(CompiledStep& step, const CompileOptions& options);
/// Stage 7: buffers and offsets (parameters, inputs, outputs, the temp arena by liveness).
void assign_buffers(CompiledStep& step, const CompileOptions& options);

/// The layout XLA gives a TPU array by default: row-major, the two most-minor dims tiled by one
/// vector register (sublanes x lanes for 4-byte types; 2 x or 4 x the sublanes for 2- and
/// 1-byte types, which pack that many values per 32-bit word); rank 1 and 0 untiled.
Layout default_layout(const Shape& s, const hw::BoardConfig& board);

/// The MXU precision a dot of `dtype` operands at `precision` runs in: bf16 operands (or the
/// default precision) one bf16 pass, HIGH 3 passes, HIGHEST 6, as XLA's TPU backend maps
/// PrecisionConfig. The evaluator and the planner share it so they time and compute the same.
driver::Precision mxu_precision(Precision precision, DType dtype);

/// Whether convolution `s` runs as one dot of its im2col patches rather than a pass per kernel
/// tap (codegen_conv.cpp; the evaluator computes it in the same order). XLA's TPU convolution
/// emitter contracts one window position's input features per MXU pass: TensorFlow's design
/// note on the automatic space-to-depth rewrite (tensorflow/compiler/mlir/tensorflow/g3doc/
/// space_to_depth.md) calls the RGB first layer "not MXU friendly as it has a feature size of
/// 3", and the rewrite (2 x 2 pixels into 12 features, 7 x 7 taps into 4 x 4) gains "more than
/// 2X" on that convolution, which a folded lowering would not. That rewrite lives in the
/// TensorFlow bridge; PyTorch/XLA's graph reaches XLA without it. So overlapping windows keep
/// one pass per tap. A convolution whose windows do not overlap (kernel = stride, no padding:
/// ViT's patches) reads each input once as an im2col, a reshape and a transpose of x; whether
/// XLA's emitter contracts such patches whole is not public, and the fold is kept there.
bool conv_folds_taps(const driver::Conv2dShape& s, uint32_t R);

}  // namespace tpu::compiler::detail
