// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/builder.h"
#include "compiler/compiled_step.h"
#include "compiler/lazy.h"
#include "trainer/dataset.h"
#include "trainer/graph.h"

/// Recording a model into the compiler's IR (trainer/README.md, "Recording into the compiler"):
/// each layer records its forward with the compiler's builder functions, under a scope named as
/// the eager per-layer table names the layer, so a compiled fusion maps back to its layers.
namespace tpu::trainer {

class Module;

/// One parameter leaf of a recorded graph: its name, the trainer parameter it holds and how its
/// values are laid out in the leaf.
struct RecordedParameter {
    std::string name;               ///< "layer_1.weight" (the module's first name for it)
    ParamPtr param;                 ///< the trainer's parameter
    compiler::ValueId value = 0;    ///< the leaf
    std::vector<int64_t> dims;      ///< the leaf's dims
    bool transposed = false;        ///< the leaf is the parameter's rows x cols transposed
    compiler::LazyTensor tensor{};  ///< its data in a LazyContext (when recording into one)
    /// Its optimizer state in the LazyContext (SGD: the momentum in `state1`; Adam: m and v),
    /// created by the first recorded training step.
    compiler::LazyTensor state1{}, state2{};
    /// The leaf's values (row-major, the leaf's shape) from the parameter's initial values.
    std::vector<float> initial_values() const;
};

/// Records layers into a compiler::Graph. Every Parameter is one leaf, however many layers use it
/// (a tied weight stays one buffer). Contractions follow the eager trainer's precision: linears
/// at `high` (three bf16 passes) in 32-true, one bf16 pass otherwise; convolutions and attention
/// one bf16 pass in every mode (XLA's default precision, as the eager kernels).
class Recorder {
public:
    /// Records into `g`; parameter leaves are named after `names` (the module's names; a
    /// parameter not in it is "param.N"). bf16-true is refused (std::invalid_argument): its
    /// rounding of every activation is not recorded.
    Recorder(compiler::Graph& g, PrecisionMode mode,
             std::map<const Parameter*, std::string> names = {});
    /// Records into `ctx`'s pending graph: a parameter's first use uploads its initial values as
    /// a LazyContext parameter (data that lives across steps), later uses read that tensor.
    Recorder(compiler::LazyContext& ctx, PrecisionMode mode,
             std::map<const Parameter*, std::string> names = {});
    /// After the context's cut (mark_step): the next ops record into its new graph, parameters
    /// keep their tensors.
    void new_step();

    compiler::Graph& graph() { return m_g; }
    /// The precision of a linear layer's dot in this mode.
    compiler::Precision linear_precision() const { return m_linear; }
    /// The leaf of `p` with `dims` (its rows x cols values row-major, or transposed: PyTorch's
    /// [out, in] linear weight from the trainer's in x out). A second use must ask for the same.
    compiler::ValueId param(const ParamPtr& p, std::vector<int64_t> dims, bool transposed = false);
    /// The parameter leaves in parameter-number order.
    const std::vector<RecordedParameter>& parameters() const { return m_params; }
    std::vector<RecordedParameter>& parameters() { return m_params; }

    /// While alive, ops are recorded under layer `name` exactly (the eager table's full name,
    /// not joined to an enclosing scope); an empty name keeps the scope.
    class Scope {
    public:
        Scope(compiler::Graph& g, const std::string& name);
        ~Scope() { m_g.set_scope(std::move(m_previous)); }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;

    private:
        compiler::Graph& m_g;
        std::string m_previous;
    };
    /// `kind` names what the layer computes in the per-layer table (the eager table's kinds);
    /// layers are listed in first-use order (layers()).
    [[nodiscard]] Scope layer(const std::string& name, std::string_view kind = {});
    /// (name, kind) of every layer recorded so far, in first-use order.
    const std::vector<std::pair<std::string, std::string>>& layers() const { return m_layers; }

private:
    compiler::Graph& m_g;
    compiler::LazyContext* m_ctx = nullptr;
    std::vector<bool> m_in_graph;  ///< per parameter: its value is a leaf of the pending graph
    compiler::Precision m_linear;
    std::map<const Parameter*, std::string> m_names;
    std::vector<RecordedParameter> m_params;
    std::vector<std::pair<std::string, std::string>> m_layers;
};

/// A model's inference forward as one recorded graph.
struct RecordedModel {
    compiler::Graph graph;                      ///< input "x", the parameters, output "y"
    compiler::ValueId input = 0;                ///< the batch
    compiler::ValueId output = 0;               ///< forward(x)
    std::vector<RecordedParameter> parameters;  ///< by parameter number
    std::vector<std::pair<std::string, std::string>> layers;  ///< (name, kind), first use
};

/// Records `module`'s inference forward for `rows` input rows of `features` values (a token
/// model takes s32 token ids [rows]: its embedding is a gather).
RecordedModel record_inference(Module& module, uint32_t rows, uint32_t features,
                               PrecisionMode mode);

/// The module's parameter names (its first name for each), for a Recorder.
std::map<const Parameter*, std::string> parameter_names(const Module& module);

/// Records `module`'s inference forward into `ctx` through `r` (a Recorder on ctx): the batch
/// is input "x" (`inputs`: one vector for every replica or one per replica, `rows` rows of
/// `features` values each, or `rows` token ids for a token model). Returns forward(x), pending
/// until the caller's cut (ctx.mark_step()).
compiler::LazyTensor record_forward_step(compiler::LazyContext& ctx, Recorder& r, Module& module,
                                         uint32_t rows, uint32_t features,
                                         std::vector<std::vector<float>> inputs);

/// One row of the compiled engine's per-layer table.
struct CompiledLayer {
    std::string name;      ///< the layer (its scope), or "other": fusions outside every layer
    std::string kind;      ///< what it computes, as the eager table says
    uint64_t cycles = 0;   ///< its share of its fusions' cycles
    double flops = 0;      ///< flops of its ops over all its fusions (the split's weights)
    uint32_t fusions = 0;  ///< fusions it has ops in
};

/// The flops an op of `g` does: a dot or convolution 2 per multiply-add, pooling one per window
/// element, a reduction one per operand element, other computing ops one per result element;
/// leaves, literals and data movement none.
double op_flops(const compiler::Graph& g, const compiler::Op& op);

/// Splits each fusion's cycles (`fusion_cycles[i]` for step.fusions[i]) over the layers its ops
/// were recorded in, in proportion to the flops of each layer's ops in that fusion (equal shares
/// when none of them computes; ops outside every layer carry no weight), whole cycles with the
/// remainder to the largest share; a fusion without layer ops goes to "other". A merged dot
/// (the dot merger's Q, K and V) read only through slices gives each slice's layer the flops of
/// its columns. The rows, in
/// first-use order (layers named in `kinds` first in its order, then others as met, "other"
/// last), sum to the sum of `fusion_cycles`.
std::vector<CompiledLayer> attribute_fusion_cycles(
    const compiler::CompiledStep& step, const std::vector<uint64_t>& fusion_cycles,
    const std::vector<std::pair<std::string, std::string>>& kinds);

/// Records the gradient of `y` (a value of `g` whose gradient is `dy`) with respect to each
/// value in `wrt`, reverse mode over the recorded ops, with the builder functions (the
/// backward a front end records by hand; compiler/README.md). Ops the zoo's MLP, CNN and
/// ResNets record have rules: linear dots, convolutions, pooling, ReLU, broadcasts, reshapes,
/// adds, sums and divisions by a broadcast literal (each contraction's gradient at its forward
/// precision). Another op on the path throws std::invalid_argument naming it. A value of `wrt`
/// that `y` does not depend on gets zeros.
std::vector<compiler::ValueId> record_gradients(compiler::Graph& g, compiler::ValueId y,
                                                compiler::ValueId dy,
                                                const std::vector<compiler::ValueId>& wrt);

/// Records one training step of `module` into `ctx` (PyTorch/XLA's step, cut by the caller's
/// mark_step()): the forward on input "x" (as record_forward_step), the mean softmax
/// cross-entropy against `onehot` (one vector for every replica or one per replica, `rows` x
/// `classes`), the backward (record_gradients; the loss's gradient (softmax - onehot) / rows as
/// the eager trainer seeds it), each gradient all-reduced as the mean over the replicas, and the
/// module's optimizer (configure_optimizers(): SGD with momentum or Adam at step `step` >= 1)
/// updating every parameter in place. `replicas` is the backend's (the all-reduce's mean).
/// Returns the loss (pending). Backward ops are recorded under their forward op's layer (as the
/// eager table counts them), the loss under "loss", the all-reduces under "allreduce", the
/// updates under "optimizer". Throws std::invalid_argument for a module with an op outside
/// record_gradients' rules.
compiler::LazyTensor record_train_step(compiler::LazyContext& ctx, Recorder& r, Module& module,
                                       uint32_t rows, uint32_t features, uint32_t classes,
                                       std::vector<std::vector<float>> inputs,
                                       std::vector<std::vector<float>> onehot, uint32_t step,
                                       size_t replicas = 1);

/// The recorded graph's input values for examples [first, first + count) of `d`: the rows of
/// d.x, or for token windows each row's token id.
std::vector<float> recorded_input_values(const Dataset& d, uint32_t first, uint32_t count);

}  // namespace tpu::trainer
