// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "trainer/graph.h"
#include "trainer/record.h"

/// Models in the style of a LightningModule: layers own parameters, a Module names them
/// ("layer_1.weight"), defines its steps and configures its optimizer.
namespace tpu::trainer {

/// A batch on the device: inputs and one-hot labels (one replica's rows per core).
struct Batch {
    Var x;              ///< rows x features
    Var onehot;         ///< rows x classes
    uint32_t rows = 0;  ///< rows per replica
};

/// What a validation step gives back.
struct StepOutput {
    Var loss;    ///< 1 x 1 mean loss
    Var logits;  ///< rows x classes (for accuracy)
};

/// An optimizer hyper-parameter PyTorch would reject; the message is PyTorch's ("Invalid
/// learning rate: nan").
class OptimizerError : public std::invalid_argument {
public:
    OptimizerError(std::string field, const std::string& message)
        : std::invalid_argument(message), m_field(std::move(field)) {}
    /// The OptimizerConfig field at fault ("lr", "momentum", "beta1", "beta2", "eps").
    const std::string& field() const { return m_field; }

private:
    std::string m_field;
};

/// The optimizer a module asks for (configure_optimizers).
struct OptimizerConfig {
    enum class Kind : uint8_t { Sgd, Adam };
    Kind kind = Kind::Adam;  ///< algorithm
    float lr = 1e-3f;        ///< learning rate
    float momentum = 0.9f;   ///< SGD momentum
    float beta1 = 0.9f;      ///< Adam beta1
    float beta2 = 0.999f;    ///< Adam beta2
    float eps = 1e-8f;       ///< Adam epsilon, added to sqrt(v_hat) as in PyTorch
    /// Throws OptimizerError where torch.optim.SGD or Adam raise ValueError (NaN counts as
    /// invalid, as it fails PyTorch's `0.0 <= x` checks).
    void validate() const;
};

/// A layer: named parameter slots (a slot may be re-pointed to tie weights).
class Layer {
public:
    virtual ~Layer() = default;
    /// (name, slot) of each parameter, e.g. {"weight", &weight}.
    virtual std::vector<std::pair<std::string, ParamPtr*>> slots() { return {}; }
    /// Names it (and, for a layer made of layers, its parts "name.part").
    virtual void set_name(std::string n) { name = std::move(n); }
    /// Its name in the module ("layer_1"), under which its kernels are profiled.
    std::string name;
};

/// y = x W + b, W in x out (PyTorch's weight transposed, so no transpose in the forward).
/// Initialised like torch.nn.Linear: W and b uniform in +-1/sqrt(in).
class Linear : public Layer {
public:
    Linear(uint32_t in, uint32_t out, bool bias, std::mt19937& rng);
    Var operator()(Runtime& rt, const Var& x);
    /// Records PyTorch's linear: the weight leaf is [out, in] (PyTorch's layout).
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    ParamPtr weight;  ///< in x out
    ParamPtr bias;    ///< 1 x out, or null
};

/// max(x, 0).
class ReLU : public Layer {
public:
    Var operator()(Runtime& rt, const Var& x) {
        const auto scope = rt.layer(name, "relu");
        return relu(rt, x);
    }
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
};

/// GELU (tanh form).
class GELU : public Layer {
public:
    Var operator()(Runtime& rt, const Var& x) {
        const auto scope = rt.layer(name, "gelu");
        return gelu(rt, x);
    }
    /// Records gelu's tanh form (PyTorch's approximate='tanh').
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
};

/// Inverted dropout, seeded; a new seed each step so masks differ between steps.
class Dropout : public Layer {
public:
    Dropout(float p, uint32_t seed) : m_p(p), m_seed(seed) {}
    Var operator()(Runtime& rt, const Var& x) {
        const auto scope = rt.layer(name, "dropout");
        return dropout(rt, x, m_p, m_seed + m_calls++);
    }
    /// Inference: the identity.
    compiler::ValueId record(Recorder&, compiler::ValueId x) { return x; }

private:
    float m_p;
    uint32_t m_seed, m_calls = 0;
};

/// A lookup table of `num` rows of `dim` values, normal(0, stddev) initialised (1 as
/// torch.nn.Embedding); its input is a one-hot batch (rows x num).
class Embedding : public Layer {
public:
    Embedding(uint32_t num, uint32_t dim, std::mt19937& rng, float stddev = 1.0f);
    Var operator()(Runtime& rt, const Var& onehot);
    /// Records aten::embedding: a gather of the rows of s32 token ids (exact rows, no matmul).
    compiler::ValueId record(Recorder& r, compiler::ValueId ids);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    ParamPtr weight;  ///< num x dim
};

/// Layer normalisation over the last dimension with gain (ones) and bias (zeros).
class LayerNorm : public Layer {
public:
    explicit LayerNorm(uint32_t dim, float eps = 1e-5f);
    Var operator()(Runtime& rt, const Var& x);
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    ParamPtr weight;  ///< 1 x dim
    ParamPtr bias;    ///< 1 x dim

private:
    float m_eps;
};

/// A learned `rows` x `dim` table added to every block of `rows` rows: the positional
/// embedding of sequences of `rows` tokens, normal(0, stddev) initialised.
class PositionalEmbedding : public Layer {
public:
    PositionalEmbedding(uint32_t rows, uint32_t dim, std::mt19937& rng, float stddev);
    Var operator()(Runtime& rt, const Var& x);
    /// Records x viewed as [sequences, rows, dim] plus the table broadcast over the sequences.
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    ParamPtr weight;  ///< rows x dim
};

/// The images a layer takes: each input row is one image of height x width x channels values
/// (NHWC, so a batch is B rows; the layout of Fashion-MNIST's 784 pixels).
struct ImageShape {
    uint32_t height = 1;    ///< rows
    uint32_t width = 1;     ///< columns
    uint32_t channels = 1;  ///< values per pixel
    /// height x width x channels.
    uint32_t values() const { return height * width * channels; }
};

/// Max or average pooling of image rows (torch.nn.MaxPool2d / AvgPool2d: stride defaults to
/// the kernel; average pooling counts padding in the divisor).
class Pool2d : public Layer {
public:
    /// Throws std::invalid_argument naming the bad size (a kernel larger than the padded image,
    /// padding above kernel / 2).
    Pool2d(bool max, ImageShape in, uint32_t kernel, uint32_t stride = 0, uint32_t pad = 0);
    Var operator()(Runtime& rt, const Var& x);
    /// Records a reduce-window on x as NHWC (x may be [B, H·W·C] rows); the result is NHWC.
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    /// The images it outputs.
    ImageShape out() const;

private:
    bool m_max;
    PoolWindow m_window;
};

/// torch.nn.Conv2d (groups 1) on image rows: weight k·k·Cin x Cout (HWIO, the layout the
/// implicit-GEMM kernel reads), initialised as PyTorch (uniform in +-1/sqrt(Cin k k)).
class Conv2d : public Layer {
public:
    /// Throws std::invalid_argument naming the bad size.
    Conv2d(ImageShape in, uint32_t cout, uint32_t kernel, uint32_t stride, uint32_t pad, bool bias,
           std::mt19937& rng);
    Var operator()(Runtime& rt, const Var& x);
    /// Records an NHWC x HWIO convolution (+ bias) on x as NHWC (x may be [B, H·W·C] rows);
    /// the result is NHWC.
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    /// The images it outputs.
    ImageShape out() const;
    ParamPtr weight;  ///< k·k·Cin x Cout
    ParamPtr bias;    ///< 1 x Cout, or null

private:
    driver::Conv2dShape m_shape;
};

/// torch.nn.MaxPool2d.
class MaxPool2d : public Pool2d {
public:
    MaxPool2d(ImageShape in, uint32_t kernel, uint32_t stride = 0, uint32_t pad = 0)
        : Pool2d(true, in, kernel, stride, pad) {}
};

/// torch.nn.AvgPool2d (count_include_pad=True).
class AvgPool2d : public Pool2d {
public:
    AvgPool2d(ImageShape in, uint32_t kernel, uint32_t stride = 0, uint32_t pad = 0)
        : Pool2d(false, in, kernel, stride, pad) {}
};

/// The mean of each channel over every pixel (torch.nn.AdaptiveAvgPool2d(1) then flatten):
/// B x H·W·C to B x C.
class GlobalAvgPool : public Layer {
public:
    explicit GlobalAvgPool(ImageShape in);
    Var operator()(Runtime& rt, const Var& x);
    /// Records the mean over H and W of x as NHWC: [B, C].
    compiler::ValueId record(Recorder& r, compiler::ValueId x);

private:
    PoolWindow m_window;
};

/// torch.nn.Flatten: image rows are already flat (one NHWC image per row), so it is the
/// identity and moves no data; it exists so models read like their PyTorch definitions.
class Flatten : public Layer {
public:
    Var operator()(Runtime&, const Var& x) { return x; }
    /// Records NHWC images as [B, H·W·C] rows (a reshape: no data moves).
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
};

/// Softmax over each row.
class Softmax : public Layer {
public:
    Var operator()(Runtime& rt, const Var& x) {
        const auto scope = rt.layer(name, "softmax");
        return softmax(rt, x);
    }
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
};

/// Multi-head self-attention over sequences of `seq` rows (input batch·seq x dim, as
/// torch.nn.MultiheadAttention with batch_first and q = k = v = x): q, k and v projections with
/// bias, `heads` heads of dim / heads, scaled dot-product attention (causal: each position
/// sees itself and the ones before), the output projection. Parameters "q.weight", "q.bias",
/// "k.*", "v.*", "out.*".
class MultiheadAttention : public Layer {
public:
    MultiheadAttention(uint32_t dim, uint32_t heads, uint32_t seq, bool causal, std::mt19937& rng);
    Var operator()(Runtime& rt, const Var& x);
    /// Records the projections, the head split as a reshape and transpose ([B, heads, seq, d],
    /// never a copy), scores as a batched dot times 1/sqrt(d) (plus -inf above the diagonal
    /// when causal), softmax over the keys, the weighted sum as a batched dot, the head merge
    /// and the output projection.
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    void set_name(std::string n) override;
    Linear q, k, v, out;  ///< projections, dim x dim each

private:
    uint32_t m_heads, m_seq;
    bool m_causal;
};

/// The feed-forward activation of a transformer block.
enum class FfnActivation {
    Gelu,  ///< GELU, tanh form (BERT's and GPT-2's)
    Relu,  ///< ReLU (the original Transformer's; PyTorchSim's EncoderBlock)
};

/// A transformer block. Pre-LN (GPT-2's): h = x + attn(ln_1(x)), y = h + mlp(ln_2(h)); post-LN
/// (BERT's): h = ln_1(x + attn(x)), y = ln_2(h + mlp(h)); mlp = fc_2(act(fc_1(.))), act GELU
/// (layer ".gelu") or ReLU (".relu").
/// Parameters "ln_1.*", "attn.*", "ln_2.*", "fc_1.*", "fc_2.*".
class TransformerBlock : public Layer {
public:
    TransformerBlock(uint32_t dim, uint32_t heads, uint32_t ffn, uint32_t seq, bool causal,
                     std::mt19937& rng, bool pre_ln = true,
                     FfnActivation activation = FfnActivation::Gelu);
    Var operator()(Runtime& rt, const Var& x);
    compiler::ValueId record(Recorder& r, compiler::ValueId x);
    std::vector<std::pair<std::string, ParamPtr*>> slots() override;
    void set_name(std::string n) override;
    LayerNorm ln_1;           ///< before attention
    MultiheadAttention attn;  ///< self-attention
    LayerNorm ln_2;           ///< before the feed-forward part
    Linear fc_1, fc_2;        ///< dim x ffn and ffn x dim
    GELU gelu;                ///< between fc_1 and fc_2 (FfnActivation::Gelu)
    ReLU relu;                ///< between fc_1 and fc_2 (FfnActivation::Relu)

private:
    bool m_pre_ln;
    FfnActivation m_activation;
};

/// The user's model. Subclasses create layers with add() in their constructor and define
/// forward(); the default steps compute the mean cross-entropy of forward(x).
class Module {
public:
    explicit Module(uint32_t seed = 0) : m_rng(seed) {}
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    virtual Var forward(Runtime& rt, const Var& x) = 0;
    /// The loss to minimise for one batch.
    virtual Var training_step(Runtime& rt, const Batch& batch);
    /// Loss and logits of one batch (evaluation mode, no gradients).
    virtual StepOutput validation_step(Runtime& rt, const Batch& batch);
    virtual OptimizerConfig configure_optimizers() const { return {}; }
    /// Records forward() into the compiler's IR (see record_inference); the default throws
    /// std::invalid_argument (a module that has not defined it).
    virtual compiler::ValueId record_forward(Recorder& r, compiler::ValueId x);
    /// Its input is token ids (an embedding) rather than rows of values.
    virtual bool token_input() const { return false; }

    /// Unique parameters in registration order, each under the first name that holds it.
    std::vector<std::pair<std::string, ParamPtr>> named_parameters() const;
    /// Every (name, parameter) slot including tied aliases, e.g. both "layer_1.weight" and
    /// "layer_3.weight" when they share one parameter.
    std::vector<std::pair<std::string, ParamPtr>> all_parameter_slots() const;

protected:
    /// Creates a layer named `name` (its parameters become "name.weight", ...).
    /// A model whose parameters outgrow what one core addresses (they are replicated on every
    /// core) is a std::invalid_argument at the first layer past it, before the next is built.
    template <class L, class... A>
    L& add(std::string name, A&&... args) {
        auto layer = std::make_unique<L>(std::forward<A>(args)...);
        layer->set_name(name);
        count_parameters(name, *layer);
        L& ref = *layer;
        m_layers.emplace_back(std::move(name), std::move(layer));
        return ref;
    }
    /// The module's initialisation generator (seeded by the constructor).
    std::mt19937& rng() { return m_rng; }

private:
    /// Adds `layer`'s parameter values to the running total; throws past the limit.
    void count_parameters(const std::string& name, Layer& layer);

    std::mt19937 m_rng;
    std::vector<std::pair<std::string, std::unique_ptr<Layer>>> m_layers;
    uint64_t m_parameter_values = 0;  ///< fp32 values of the layers added so far
};

/// A multi-layer perceptron: Linear layers "layer_1".."layer_n" with ReLU between them.
class Mlp : public Module {
public:
    /// sizes = {inputs, hidden..., classes}, e.g. {784, 512, 256, 10}.
    Mlp(const std::vector<uint32_t>& sizes, OptimizerConfig opt, uint32_t seed = 0);
    Var forward(Runtime& rt, const Var& x) override;
    compiler::ValueId record_forward(Recorder& r, compiler::ValueId x) override;
    OptimizerConfig configure_optimizers() const override { return m_opt; }

private:
    std::vector<Linear*> m_linear;
    OptimizerConfig m_opt;
};

/// The small CNN for 28x28x1 images: conv 32 (3x3, pad 1), ReLU, max-pool 2, conv 64
/// (3x3, pad 1), ReLU, max-pool 2, flatten, linear 128, ReLU, linear `classes`.
class Cnn : public Module {
public:
    Cnn(ImageShape in, uint32_t classes, OptimizerConfig opt, uint32_t seed = 0);
    Var forward(Runtime& rt, const Var& x) override;
    compiler::ValueId record_forward(Recorder& r, compiler::ValueId x) override;
    OptimizerConfig configure_optimizers() const override { return m_opt; }

private:
    OptimizerConfig m_opt;
    Conv2d *m_conv1, *m_conv2;
    MaxPool2d *m_pool1, *m_pool2;
    Flatten* m_flatten;
    Linear *m_fc1, *m_fc2;
};

/// A decoder-only transformer's shape (GPT-2 style).
struct GptConfig {
    uint32_t vocab = 86;    ///< tokens
    uint32_t layers = 2;    ///< transformer blocks
    uint32_t hidden = 128;  ///< model width
    uint32_t heads = 4;     ///< attention heads
    uint32_t seq = 64;      ///< context (tokens per sequence)
    uint32_t ffn = 0;       ///< feed-forward width (0: 4 x hidden)
};

/// A decoder-only transformer: token embedding "wte" (vocab x hidden, normal(0, 0.02) as
/// GPT-2) plus positional embedding "wpe", `layers` causal pre-LN TransformerBlocks "h_0".., a
/// final LayerNorm "ln_f", and logits = h wteᵀ: the output projection is tied to the input
/// embedding (one parameter, one buffer per core, the gradients of both uses summed). Its input
/// is batch·seq rows of one-hot tokens; its output batch·seq rows of next-token logits.
class Gpt : public Module {
public:
    Gpt(GptConfig cfg, OptimizerConfig opt, uint32_t seed = 0);
    Var forward(Runtime& rt, const Var& x) override;
    compiler::ValueId record_forward(Recorder& r, compiler::ValueId x) override;
    OptimizerConfig configure_optimizers() const override { return m_opt; }
    const GptConfig& config() const { return m_cfg; }
    bool token_input() const override { return true; }

private:
    GptConfig m_cfg;
    OptimizerConfig m_opt;
    Embedding* m_wte;
    PositionalEmbedding* m_wpe;
    std::vector<TransformerBlock*> m_blocks;
    LayerNorm* m_ln_f;
};

}  // namespace tpu::trainer
