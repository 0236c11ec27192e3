// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/gemm.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"
#include "trainer/metrics.h"

/// Device-resident values and reverse-mode differentiation for the trainer. Every op runs as
/// kernels on all replicas at once (one launch per kernel over the trainer's core set); the
/// host only sequences them, so no arithmetic of the training path runs on the host.
namespace tpu::trainer {

/// How a Trainer precision string maps onto the device.
enum class PrecisionMode : uint8_t {
    True32,     ///< "32-true": fp32 everywhere, matmuls in fp32-3pass (bf16 x3)
    Bf16Mixed,  ///< "bf16-mixed": bf16 matmul operands, fp32 accumulation, weights and updates
    Bf16True,   ///< "bf16-true": also every activation and weight rounded to bf16
};

/// One value of the graph: a tensor on every replica, and its gradient once backward has
/// reached it.
struct Node {
    driver::Tensor value;            ///< forward value (one replica per core)
    driver::Tensor grad;             ///< gradient (valid when has_grad)
    bool requires_grad = false;      ///< backward propagates into it
    bool has_grad = false;           ///< grad holds this step's gradient
    bool owns_grad = true;           ///< grad was allocated for this step (not a parameter's)
    std::function<void()> backward;  ///< propagates grad to the inputs (empty for leaves)
    int layer = -1;                  ///< the Runtime layer profile its forward ran in (-1: none)
};
using Var = std::shared_ptr<Node>;

/// A trainable fp32 matrix. Before placement it holds host initial values; after placement its
/// value and gradient are views into the trainer's flat per-core buffers, so tied parameters
/// (one shared_ptr used by two layers) stay one buffer per core.
struct Parameter {
    uint32_t rows = 0;  ///< rows
    uint32_t cols = 0;  ///< columns
    /// Writes the rows x cols initial values into its argument, the same on every call. Called
    /// at placement, and not at all on a timing-only board (sim.functional = false), whose
    /// device holds no values: a model's initial weights then cost no host memory.
    std::function<void(std::span<float>)> init;
    /// The initial values (a rows x cols vector made by `init`).
    std::vector<float> initial_values() const;
    driver::Tensor value;  ///< per-core value (a view) once placed
    driver::Tensor grad;   ///< per-core gradient (a view) once placed
    uint64_t offset = 0;   ///< fp32 values from the start of the flat buffers
    bool placed() const { return !value.bufs.empty(); }
};
using ParamPtr = std::shared_ptr<Parameter>;

/// The device work of one layer of a model, forward and backward (tpusim model's table).
struct LayerProfile {
    std::string name;          ///< the layer's name in its module ("conv1", "block_0.attn")
    std::string kind;          ///< what it computes ("linear", "conv2d", "attention", ...)
    uint64_t first_cycle = 0;  ///< board cycle at which its first kernel was issued
    uint64_t last_cycle = 0;   ///< board cycle at which its last kernel completed
    /// [start, end) board cycles of each run of consecutive kernels of this layer (its forward,
    /// later its backward): the spans of a per-layer trace track, which never overlap.
    std::vector<std::pair<uint64_t, uint64_t>> spans = {};
    /// Its kernels' totals: launches, board cycles, MXU MACs and peak, VPU FLOPs, HBM bytes.
    driver::KernelStats work = {};
};

class Runtime;

/// While alive, kernels the Runtime runs count towards one layer (nested scopes: the innermost),
/// and so does the backward of every value created meanwhile.
class LayerScope {
public:
    LayerScope(Runtime& rt, int previous) : m_rt(&rt), m_previous(previous) {}
    ~LayerScope();
    LayerScope(const LayerScope&) = delete;
    LayerScope& operator=(const LayerScope&) = delete;

private:
    Runtime* m_rt;
    int m_previous;
};

/// The device side of a training run: the core set, the kernels' program cache, the precision,
/// step-scoped scratch memory, the recorded graph and the metrics every kernel feeds.
class Runtime {
public:
    Runtime(driver::Device& dev, driver::ProgramCache& cache, std::vector<uint32_t> cores,
            PrecisionMode mode, Metrics& metrics);
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    driver::Device& device() { return m_dev; }
    driver::ProgramCache& cache() { return m_cache; }
    const std::vector<uint32_t>& cores() const { return m_cores; }
    PrecisionMode mode() const { return m_mode; }
    /// The library GEMM precision of this mode.
    driver::Precision matmul_precision() const;
    Metrics& metrics() { return m_metrics; }
    /// Dropout and other stochastic layers are active.
    bool training() const { return m_training; }
    void set_training(bool on) { m_training = on; }

    /// A step-scoped tensor on every replica, freed by end_step().
    driver::Tensor scratch(uint32_t rows, uint32_t cols);
    /// A leaf value in step-scoped memory (inputs, labels).
    Var leaf(uint32_t rows, uint32_t cols);
    /// The graph value of a placed parameter: one node per parameter and step, however many
    /// layers use it, so tied weights accumulate their gradients. Requires grad while training.
    Var param(Parameter& p);
    /// Parameters used since the last end_step() whose gradient backward did not write.
    std::vector<Parameter*> params_without_grad() const;
    /// A new graph node with a value of rows x cols; `inputs_need_grad` decides whether it
    /// records a backward function.
    Var make(uint32_t rows, uint32_t cols, bool requires_grad);

    /// Attributes kernels to layer `name` (of `kind`) until the scope ends; an empty name
    /// leaves the attribution as it is. Layers with the same name share one profile.
    [[nodiscard]] LayerScope layer(const std::string& name, std::string_view kind);
    /// Per-layer work since the last clear_layer_profiles(), in first-use order.
    const std::vector<LayerProfile>& layer_profiles() const { return m_layers; }
    void clear_layer_profiles() {
        m_layers.clear();
        m_last_layer = -1;
    }

    /// Runs one kernel call, counts it (kernel_calls()) and records it in the current layer's
    /// profile.
    void exec(std::string_view kernel, const std::function<driver::Event()>& call);
    /// Kernel calls so far: each stands for one op recorded into a step's graph.
    uint64_t kernel_calls() const { return m_kernel_calls; }
    /// Records that op `op` ("aten::nonzero", or "nonzero") ran on the CPU instead of the
    /// device, as PyTorch/XLA does with ops it cannot lower: counted in the metrics under its
    /// aten:: name, and costed on the host timeline of the step it ran in (a device sync plus a
    /// round trip, config().runtime.cpu_fallback_us).
    void cpu_fallback(std::string_view op);
    /// The CPU fallbacks since the last call, in order (the trainer takes them per step).
    std::vector<std::string> take_cpu_fallbacks();
    /// Writes replica `index` of `t` from the host, recorded as TransferToDevice.
    void upload(const driver::Tensor& t, size_t index, const std::vector<float>& values);
    /// upload() without values, for a timing-only board (sim.functional = false): the transfer
    /// is timed and recorded alike, and nothing is copied.
    void upload_timing(const driver::Tensor& t, size_t index);
    /// Reads replica `index` of `t`, recorded as TransferFromDevice (a host sync).
    std::vector<float> download(const driver::Tensor& t, size_t index);

    /// Where an op writes the gradient it sends to `x`: x's own gradient if this is the first
    /// contribution (then `accumulate` is false), otherwise scratch that must be added with
    /// finish_grad().
    driver::Tensor grad_target(const Var& x, bool& accumulate);
    /// Adds `g` into x's gradient when grad_target asked for accumulation.
    void finish_grad(const Var& x, const driver::Tensor& g, bool accumulate);

    /// Runs the recorded graph backwards from `loss` (its gradient is already seeded by the
    /// loss op) and clears the graph.
    void backward(const Var& loss);
    /// Frees step-scoped memory and forgets the graph.
    void end_step();

private:
    driver::Device& m_dev;
    driver::ProgramCache& m_cache;
    std::vector<uint32_t> m_cores;
    PrecisionMode m_mode;
    Metrics& m_metrics;
    bool m_training = true;
    std::vector<driver::Tensor> m_scratch;
    std::vector<Var> m_tape;  ///< nodes with a backward function, in creation order
    std::vector<std::pair<Parameter*, Var>> m_params;  ///< this step's parameter nodes
    std::vector<LayerProfile> m_layers;                ///< per-layer work
    int m_layer = -1;                                  ///< the current layer (-1: none)
    int m_last_layer = -1;  ///< the layer of the last kernel run (spans grow while it repeats)
    uint64_t m_kernel_calls = 0;           ///< exec() calls
    std::vector<std::string> m_fallbacks;  ///< cpu_fallback() ops not yet taken
    friend class LayerScope;
};

// ---- Ops: forward now, backward recorded ------------------------------------------------------

/// y = x W + b (b may be null). x: B x in, W: in x out, b: 1 x out.
Var linear(Runtime& rt, const Var& x, const Var& w, const Var& b);
/// y = max(x, 0).
Var relu(Runtime& rt, const Var& x);
/// GELU, tanh form.
Var gelu(Runtime& rt, const Var& x);
/// Inverted dropout with probability p while training; identity otherwise.
Var dropout(Runtime& rt, const Var& x, float p, uint32_t seed);
/// Row-wise layer normalisation with gain gamma and bias beta (1 x cols each).
Var layer_norm(Runtime& rt, const Var& x, const Var& gamma, const Var& beta, float eps);
/// Embedding lookup as a one-hot matmul (the MXU way on a TPU): onehot B x V, table V x D.
Var embedding(Runtime& rt, const Var& onehot, const Var& table);
/// y = a + b (same shape): a residual connection.
Var add(Runtime& rt, const Var& a, const Var& b);
/// y = relu(a + b) in one kernel (a ResNet block's join): the same values and gradients as
/// relu(add(a, b)), without storing and re-reading the sum.
Var add_relu(Runtime& rt, const Var& a, const Var& b);
/// y = x + table added to every block of table.rows rows of x (x.rows a multiple of them, same
/// columns): a learned positional embedding added to each sequence of a batch of sequences.
Var add_periodic(Runtime& rt, const Var& x, const Var& table);
/// y = x Wᵀ (W: out x in, PyTorch's own layout): a language model's output projection tied to
/// its input embedding table (vocab x hidden), with no copy of the table.
Var linear_transposed(Runtime& rt, const Var& x, const Var& w);
/// Token rows (n x heads·dhead, head h in columns h·dhead ..) to head-major rows (heads·n x
/// dhead, head h in rows h·n ..): every head's block is then one contiguous problem, the
/// layout attention() takes. One strided copy per head.
Var split_heads(Runtime& rt, const Var& x, uint32_t heads);
/// The inverse of split_heads: heads·n x dhead back to n x heads·dhead.
Var merge_heads(Runtime& rt, const Var& x, uint32_t heads);
/// Scaled dot-product attention per group of `seq` rows of head-major q, k and v (groups·seq
/// x dhead each, see split_heads): softmax(q kᵀ / sqrt(dhead), keys after the query masked
/// when `causal`) v. The two contractions are bf16 MXU passes in every precision mode (XLA's
/// default precision for attention on a TPU).
Var attention(Runtime& rt, const Var& q, const Var& k, const Var& v, uint32_t seq, bool causal);
/// Softmax over each row.
Var softmax(Runtime& rt, const Var& x);
/// What pools an image batch: its per-image NHWC shape and the window (batch is ignored; each
/// input row is one image of height x width x channels values).
using PoolWindow = driver::PoolShape;
/// Max pooling of each image row (B x H·W·C) to B x Ho·Wo·C; the gradient goes to the first
/// maximum of each window.
Var max_pool2d(Runtime& rt, const Var& x, const PoolWindow& w);
/// Average pooling (padding counts in the divisor, PyTorch's count_include_pad=True).
Var avg_pool2d(Runtime& rt, const Var& x, const PoolWindow& w);
/// Global average pooling of each image row (B x H·W·C) to B x C.
Var global_avg_pool(Runtime& rt, const Var& x, const PoolWindow& w);
/// conv2d of image rows (B x H·W·Cin, NHWC) with weights w (k·k·Cin x Cout, HWIO) and bias b
/// (1 x Cout, may be null) to B x Ho·Wo·Cout; `shape.batch` is ignored (the rows are the
/// batch). bf16 MXU passes in every precision mode, as XLA's default convolution precision.
Var conv2d(Runtime& rt, const Var& x, const Var& w, const Var& b, driver::Conv2dShape shape);
/// Mean softmax cross-entropy over the rows of logits (B x C) against one-hot labels; the
/// result is 1 x 1. Its backward seeds dlogits = (softmax - y) / B.
Var cross_entropy(Runtime& rt, const Var& logits, const Var& onehot);

}  // namespace tpu::trainer
