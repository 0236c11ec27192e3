// SPDX-License-Identifier: Apache-2.0
#include "trainer/module.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "compiler/builder.h"
#include "driver/kernels/attention.h"

namespace tpu::trainer {
namespace {

namespace cc = tpu::compiler;

/// `x` as NHWC images of `in` (a [B, H·W·C] row batch is reshaped; no data moves).
cc::ValueId as_nhwc(cc::Graph& g, cc::ValueId x, uint32_t height, uint32_t width,
                    uint32_t channels) {
    const cc::Shape& s = g.shape(x);
    if (s.rank() == 4) return x;
    return cc::reshape(g, x, {s.dims[0], height, width, channels});
}

/// `b` ([n]) added along the last dim of `y`.
cc::ValueId add_bias(cc::Graph& g, cc::ValueId y, cc::ValueId b) {
    const cc::Shape& s = g.shape(y);
    return cc::add(g, y, cc::broadcast(g, b, s.dims, {s.rank() - 1}));
}

/// Uniform in [lo, hi) from 24 random bits: the same values on every platform (std's
/// distributions are implementation-defined).
float uniform(std::mt19937& rng, float lo, float hi) {
    return lo + (hi - lo) * float(rng() >> 8) * (1.0f / 16777216.0f);
}

ParamPtr make_param(uint32_t rows, uint32_t cols, std::function<void(std::span<float>)> init) {
    auto p = std::make_shared<Parameter>();
    p->rows = rows;
    p->cols = cols;
    p->init = std::move(init);
    return p;
}

ParamPtr constant_param(uint32_t rows, uint32_t cols, float value) {
    return make_param(rows, cols,
                      [value](std::span<float> v) { std::fill(v.begin(), v.end(), value); });
}

/// The most fp32 values one parameter may hold: one core's kernels address 4 GiB.
constexpr uint64_t kMaxValues = driver::kHbmWindowBytes / 4;

/// Refuses a parameter too large for any core before its initial values are allocated.
void check_param_size(uint32_t rows, uint32_t cols) {
    if (uint64_t(rows) * cols > kMaxValues)
        throw std::invalid_argument(
            fmt::format("a {} x {} parameter ({} fp32 values) is larger than the 4 GiB a core's "
                        "kernels address",
                        rows, cols, uint64_t(rows) * cols));
}

// A parameter keeps the generator's state where its values begin and the module's generator
// skips past them, so later parameters get the values they would get if these were drawn now.
ParamPtr uniform_param(uint32_t rows, uint32_t cols, float bound, std::mt19937& rng) {
    check_param_size(rows, cols);
    const std::mt19937 at = rng;
    rng.discard(uint64_t(rows) * cols);  // one draw per value
    return make_param(rows, cols, [at, bound](std::span<float> v) {
        std::mt19937 r = at;
        for (float& x : v) x = uniform(r, -bound, bound);
    });
}

ParamPtr normal_param(uint32_t rows, uint32_t cols, float stddev, std::mt19937& rng) {
    // Box-Muller on our own uniforms, for platform-independent values.
    check_param_size(rows, cols);
    const std::mt19937 at = rng;
    rng.discard(2 * uint64_t(rows) * cols);  // two draws per value
    return make_param(rows, cols, [at, stddev](std::span<float> v) {
        std::mt19937 r = at;
        for (float& x : v) {
            const float u1 = uniform(r, 1e-7f, 1.0f), u2 = uniform(r, 0.0f, 1.0f);
            x = stddev * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
        }
    });
}

/// Prefixes a part's parameter names ("weight" -> "q.weight").
void add_slots(std::vector<std::pair<std::string, ParamPtr*>>& out, const std::string& part,
               Layer& layer) {
    for (auto& [slot, p] : layer.slots()) out.emplace_back(part + "." + slot, p);
}

}  // namespace

void OptimizerConfig::validate() const {
    // PyTorch's conditions, written so that NaN fails them as it does in Python.
    if (!(lr >= 0.0f) || !std::isfinite(lr))
        throw OptimizerError("lr", fmt::format("Invalid learning rate: {}", lr));
    if (!(momentum >= 0.0f) || !std::isfinite(momentum))
        throw OptimizerError("momentum", fmt::format("Invalid momentum value: {}", momentum));
    if (!(eps >= 0.0f) || !std::isfinite(eps))
        throw OptimizerError("eps", fmt::format("Invalid epsilon value: {}", eps));
    if (!(beta1 >= 0.0f && beta1 < 1.0f))
        throw OptimizerError("beta1", fmt::format("Invalid beta parameter at index 0: {}", beta1));
    if (!(beta2 >= 0.0f && beta2 < 1.0f))
        throw OptimizerError("beta2", fmt::format("Invalid beta parameter at index 1: {}", beta2));
}

Linear::Linear(uint32_t in, uint32_t out, bool bias, std::mt19937& rng) {
    const float bound = 1.0f / std::sqrt(float(in));
    weight = uniform_param(in, out, bound, rng);
    if (bias) this->bias = uniform_param(1, out, bound, rng);
}

Var Linear::operator()(Runtime& rt, const Var& x) {
    const auto scope = rt.layer(name, "linear");
    return linear(rt, x, rt.param(*weight), bias ? rt.param(*bias) : nullptr);
}

cc::ValueId Linear::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "linear");
    cc::Graph& g = r.graph();
    const cc::ValueId w = r.param(weight, {weight->cols, weight->rows}, true);
    const cc::ValueId b = bias ? r.param(bias, {bias->cols}) : cc::kNoValue;
    return cc::linear(g, x, w, b, r.linear_precision());
}

cc::ValueId ReLU::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "relu");
    return cc::relu(r.graph(), x);
}

cc::ValueId GELU::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "gelu");
    return cc::gelu(r.graph(), x, true);
}

cc::ValueId Softmax::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "softmax");
    return cc::softmax(r.graph(), x, r.graph().shape(x).rank() - 1);
}

cc::ValueId Flatten::record(Recorder& r, cc::ValueId x) {
    const cc::Shape& s = r.graph().shape(x);
    if (s.rank() == 2) return x;
    return cc::reshape(r.graph(), x, {s.dims[0], s.elements() / s.dims[0]});
}

std::vector<std::pair<std::string, ParamPtr*>> Linear::slots() {
    std::vector<std::pair<std::string, ParamPtr*>> s{{"weight", &weight}};
    if (bias) s.emplace_back("bias", &bias);
    return s;
}

Embedding::Embedding(uint32_t num, uint32_t dim, std::mt19937& rng, float stddev) {
    weight = normal_param(num, dim, stddev, rng);
}

Var Embedding::operator()(Runtime& rt, const Var& onehot) {
    const auto scope = rt.layer(name, "embedding");
    return embedding(rt, onehot, rt.param(*weight));
}

cc::ValueId Embedding::record(Recorder& r, cc::ValueId ids) {
    const auto scope = r.layer(name, "embedding");
    return cc::gather_rows(r.graph(), r.param(weight, {weight->rows, weight->cols}), ids);
}

std::vector<std::pair<std::string, ParamPtr*>> Embedding::slots() {
    return {{"weight", &weight}};
}

PositionalEmbedding::PositionalEmbedding(uint32_t rows, uint32_t dim, std::mt19937& rng,
                                         float stddev) {
    weight = normal_param(rows, dim, stddev, rng);
}

Var PositionalEmbedding::operator()(Runtime& rt, const Var& x) {
    const auto scope = rt.layer(name, "positional");
    return add_periodic(rt, x, rt.param(*weight));
}

cc::ValueId PositionalEmbedding::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "positional");
    cc::Graph& g = r.graph();
    const cc::Shape s = g.shape(x);
    const int64_t rows = weight->rows, dim = weight->cols;
    if (s.rank() != 2 || s.dims[1] != dim || s.dims[0] % rows != 0)
        throw std::invalid_argument(fmt::format("{}: input {} is not whole sequences of {} x {}",
                                                name, s.to_string(), rows, dim));
    const std::vector<int64_t> seqs{s.dims[0] / rows, rows, dim};
    const cc::ValueId table = cc::broadcast(g, r.param(weight, {rows, dim}), seqs, {1, 2});
    return cc::reshape(g, cc::add(g, cc::reshape(g, x, seqs), table), s.dims);
}

std::vector<std::pair<std::string, ParamPtr*>> PositionalEmbedding::slots() {
    return {{"weight", &weight}};
}

Conv2d::Conv2d(ImageShape in, uint32_t cout, uint32_t kernel, uint32_t stride, uint32_t pad,
               bool with_bias, std::mt19937& rng)
    : m_shape{1, in.height, in.width, in.channels, cout, kernel, stride, pad} {
    try {
        m_shape.validate();
    } catch (const driver::DeviceError& e) {
        throw std::invalid_argument(e.what());
    }
    const float bound = 1.0f / std::sqrt(float(in.channels * kernel * kernel));
    weight = uniform_param(kernel * kernel * in.channels, cout, bound, rng);
    if (with_bias) bias = uniform_param(1, cout, bound, rng);
}

Var Conv2d::operator()(Runtime& rt, const Var& x) {
    const auto scope = rt.layer(
        name, fmt::format("conv2d {}x{}/{}", m_shape.kernel, m_shape.kernel, m_shape.stride));
    return conv2d(rt, x, rt.param(*weight), bias ? rt.param(*bias) : nullptr, m_shape);
}

cc::ValueId Conv2d::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(
        name, fmt::format("conv2d {}x{}/{}", m_shape.kernel, m_shape.kernel, m_shape.stride));
    cc::Graph& g = r.graph();
    const cc::ValueId w =
        r.param(weight, {m_shape.kernel, m_shape.kernel, m_shape.cin, m_shape.cout});
    // One bf16 pass in every mode, as the eager conv2d kernels (XLA's default precision).
    const cc::ValueId y = cc::conv2d(g, as_nhwc(g, x, m_shape.height, m_shape.width, m_shape.cin),
                                     w, m_shape.stride, m_shape.pad);
    return bias ? add_bias(g, y, r.param(bias, {bias->cols})) : y;
}

std::vector<std::pair<std::string, ParamPtr*>> Conv2d::slots() {
    std::vector<std::pair<std::string, ParamPtr*>> s{{"weight", &weight}};
    if (bias) s.emplace_back("bias", &bias);
    return s;
}

ImageShape Conv2d::out() const {
    return {m_shape.out_height(), m_shape.out_width(), m_shape.cout};
}

Pool2d::Pool2d(bool max, ImageShape in, uint32_t kernel, uint32_t stride, uint32_t pad)
    : m_max(max), m_window{1,  in.height, in.width, in.channels, kernel, stride ? stride : kernel,
                           pad} {
    try {
        m_window.validate(max ? "MaxPool2d" : "AvgPool2d");
    } catch (const driver::DeviceError& e) {
        throw std::invalid_argument(e.what());
    }
}

Var Pool2d::operator()(Runtime& rt, const Var& x) {
    const auto scope = rt.layer(name, m_max ? "max_pool2d" : "avg_pool2d");
    return m_max ? max_pool2d(rt, x, m_window) : avg_pool2d(rt, x, m_window);
}

cc::ValueId Pool2d::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, m_max ? "max_pool2d" : "avg_pool2d");
    cc::Graph& g = r.graph();
    return cc::pool(g, as_nhwc(g, x, m_window.height, m_window.width, m_window.channels),
                    m_max ? cc::PoolKind::Max : cc::PoolKind::Avg, m_window.kernel, m_window.stride,
                    m_window.pad);
}

ImageShape Pool2d::out() const {
    return {m_window.out_height(), m_window.out_width(), m_window.channels};
}

GlobalAvgPool::GlobalAvgPool(ImageShape in)
    : m_window{1, in.height, in.width, in.channels, 1, 1, 0} {}

Var GlobalAvgPool::operator()(Runtime& rt, const Var& x) {
    const auto scope = rt.layer(name, "global_avg_pool");
    return global_avg_pool(rt, x, m_window);
}

cc::ValueId GlobalAvgPool::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "global_avg_pool");
    cc::Graph& g = r.graph();
    return cc::global_avg_pool(g,
                               as_nhwc(g, x, m_window.height, m_window.width, m_window.channels));
}

MultiheadAttention::MultiheadAttention(uint32_t dim, uint32_t heads, uint32_t seq, bool causal,
                                       std::mt19937& rng)
    : q(dim, dim, true, rng),
      k(dim, dim, true, rng),
      v(dim, dim, true, rng),
      out(dim, dim, true, rng),
      m_heads(heads),
      m_seq(seq),
      m_causal(causal) {
    if (heads == 0 || dim % heads != 0)
        throw std::invalid_argument(fmt::format(
            "embed_dim must be divisible by num_heads (embed_dim {}, num_heads {})", dim, heads));
    if (seq == 0) throw std::invalid_argument("MultiheadAttention: the sequence length is 0");
}

void MultiheadAttention::set_name(std::string n) {
    q.set_name(n + ".q");
    k.set_name(n + ".k");
    v.set_name(n + ".v");
    out.set_name(n + ".out");
    name = std::move(n);
}

Var MultiheadAttention::operator()(Runtime& rt, const Var& x) {
    // The projections count as their own layers (inner scopes); the head moves, scores,
    // softmax and weighted sum as this one.
    const auto scope = rt.layer(name, m_causal ? "attention (causal)" : "attention");
    const Var qh = split_heads(rt, q(rt, x), m_heads), kh = split_heads(rt, k(rt, x), m_heads),
              vh = split_heads(rt, v(rt, x), m_heads);
    return out(rt, merge_heads(rt, attention(rt, qh, kh, vh, m_seq, m_causal), m_heads));
}

cc::ValueId MultiheadAttention::record(Recorder& r, cc::ValueId x) {
    cc::Graph& g = r.graph();
    // The projections are layers of their own (absolute scopes inside this one), as in the
    // eager table.
    const auto scope = r.layer(name, m_causal ? "attention (causal)" : "attention");
    const cc::ValueId qp = q.record(r, x), kp = k.record(r, x), vp = v.record(r, x);
    const cc::Shape xs = g.shape(x);
    const int64_t rows = xs.dims[0], dim = xs.dims[1], seq = m_seq, heads = m_heads,
                  d = dim / heads, batch = rows / seq;
    // [B·S, H·d] -> [B, H, S, d]: a change of dims the dots read through, never a copy.
    const auto split = [&](cc::ValueId t) {
        return cc::transpose(g, cc::reshape(g, t, {batch, seq, heads, d}), {0, 2, 1, 3});
    };
    const cc::ValueId qh = split(qp), kh = split(kp), vh = split(vp);
    cc::DotDims sd;  // q k^T per (sequence, head): [B, H, S(q), S(k)]
    sd.lhs_batch = sd.rhs_batch = {0, 1};
    sd.lhs_contracting = sd.rhs_contracting = {3};
    cc::ValueId s = cc::dot(g, qh, kh, sd);
    // The eager kernel's order: scores times fp32(1 / sqrt(d)), then the causal bias.
    const driver::AttentionShape as{1, 1, m_seq, uint32_t(d), m_causal};
    s = cc::mul(g, s, cc::full(g, double(as.scale()), g.shape(s)));
    if (m_causal) {
        std::vector<float> mask(size_t(seq) * seq, 0.0f);
        for (int64_t i = 0; i < seq; ++i)
            for (int64_t j = i + 1; j < seq; ++j)
                mask[size_t(i * seq + j)] = -std::numeric_limits<float>::infinity();
        const cc::ValueId m =
            g.constant(cc::Shape{cc::DType::F32, {seq, seq}}, std::move(mask), name + ".mask");
        s = cc::add(g, s, cc::broadcast(g, m, g.shape(s).dims, {2, 3}));
    }
    const cc::ValueId p = cc::softmax(g, s, 3);
    cc::DotDims od;  // p v: [B, H, S(q), d]
    od.lhs_batch = od.rhs_batch = {0, 1};
    od.lhs_contracting = {3};
    od.rhs_contracting = {2};
    const cc::ValueId o = cc::dot(g, p, vh, od);
    const cc::ValueId merged =
        cc::reshape(g, cc::transpose(g, o, {0, 2, 1, 3}), {rows, dim});  // [B·S, H·d]
    return out.record(r, merged);
}

std::vector<std::pair<std::string, ParamPtr*>> MultiheadAttention::slots() {
    std::vector<std::pair<std::string, ParamPtr*>> s;
    for (auto [part, layer] :
         {std::pair<const char*, Linear*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
        add_slots(s, part, *layer);
    return s;
}

TransformerBlock::TransformerBlock(uint32_t dim, uint32_t heads, uint32_t ffn, uint32_t seq,
                                   bool causal, std::mt19937& rng, bool pre_ln,
                                   FfnActivation activation)
    : ln_1(dim),
      attn(dim, heads, seq, causal, rng),
      ln_2(dim),
      fc_1(dim, ffn, true, rng),
      fc_2(ffn, dim, true, rng),
      m_pre_ln(pre_ln),
      m_activation(activation) {}

void TransformerBlock::set_name(std::string n) {
    ln_1.set_name(n + ".ln_1");
    attn.set_name(n + ".attn");
    ln_2.set_name(n + ".ln_2");
    fc_1.set_name(n + ".fc_1");
    gelu.set_name(n + ".gelu");
    relu.set_name(n + ".relu");
    fc_2.set_name(n + ".fc_2");
    name = std::move(n);
}

Var TransformerBlock::operator()(Runtime& rt, const Var& x) {
    const auto residual = [&](const char* part, const Var& a, const Var& b) {
        const auto scope = rt.layer(name + part, "add");
        return add(rt, a, b);
    };
    const auto mlp = [&](const Var& v) {
        const Var h = fc_1(rt, v);
        return fc_2(rt, m_activation == FfnActivation::Relu ? relu(rt, h) : gelu(rt, h));
    };
    if (m_pre_ln) {
        const Var h = residual(".residual_1", x, attn(rt, ln_1(rt, x)));
        return residual(".residual_2", h, mlp(ln_2(rt, h)));
    }
    const Var h = ln_1(rt, residual(".residual_1", x, attn(rt, x)));
    return ln_2(rt, residual(".residual_2", h, mlp(h)));
}

cc::ValueId TransformerBlock::record(Recorder& r, cc::ValueId x) {
    cc::Graph& g = r.graph();
    const auto residual = [&](const char* part, cc::ValueId a, cc::ValueId b) {
        const auto scope = r.layer(name + part, "add");
        return cc::add(g, a, b);
    };
    const auto mlp = [&](cc::ValueId v) {
        const cc::ValueId h = fc_1.record(r, v);
        return fc_2.record(r, m_activation == FfnActivation::Relu ? relu.record(r, h)
                                                                  : gelu.record(r, h));
    };
    if (m_pre_ln) {
        const cc::ValueId h = residual(".residual_1", x, attn.record(r, ln_1.record(r, x)));
        return residual(".residual_2", h, mlp(ln_2.record(r, h)));
    }
    const cc::ValueId h = ln_1.record(r, residual(".residual_1", x, attn.record(r, x)));
    return ln_2.record(r, residual(".residual_2", h, mlp(h)));
}

std::vector<std::pair<std::string, ParamPtr*>> TransformerBlock::slots() {
    std::vector<std::pair<std::string, ParamPtr*>> s;
    for (auto [part, layer] : {std::pair<const char*, Layer*>{"ln_1", &ln_1},
                               {"attn", &attn},
                               {"ln_2", &ln_2},
                               {"fc_1", &fc_1},
                               {"fc_2", &fc_2}})
        add_slots(s, part, *layer);
    return s;
}

LayerNorm::LayerNorm(uint32_t dim, float eps) : m_eps(eps) {
    weight = constant_param(1, dim, 1.0f);
    bias = constant_param(1, dim, 0.0f);
}

Var LayerNorm::operator()(Runtime& rt, const Var& x) {
    const auto scope = rt.layer(name, "layernorm");
    return layer_norm(rt, x, rt.param(*weight), rt.param(*bias), m_eps);
}

cc::ValueId LayerNorm::record(Recorder& r, cc::ValueId x) {
    const auto scope = r.layer(name, "layernorm");
    return cc::layer_norm(r.graph(), x, r.param(weight, {weight->cols}),
                          r.param(bias, {bias->cols}), m_eps)
        .y;
}

std::vector<std::pair<std::string, ParamPtr*>> LayerNorm::slots() {
    return {{"weight", &weight}, {"bias", &bias}};
}

void Module::count_parameters(const std::string& name, Layer& layer) {
    for (auto& [slot, p] : layer.slots())
        if (*p) m_parameter_values += uint64_t((*p)->rows) * (*p)->cols;
    if (m_parameter_values > kMaxValues)
        throw std::invalid_argument(
            fmt::format("{}: the model's parameters reach {} fp32 values, more than the 4 GiB a "
                        "core's kernels address (every core holds a replica)",
                        name, m_parameter_values));
}

Var Module::training_step(Runtime& rt, const Batch& batch) {
    return cross_entropy(rt, forward(rt, batch.x), batch.onehot);
}

StepOutput Module::validation_step(Runtime& rt, const Batch& batch) {
    Var logits = forward(rt, batch.x);
    return {cross_entropy(rt, logits, batch.onehot), logits};
}

cc::ValueId Module::record_forward(Recorder&, cc::ValueId) {
    throw std::invalid_argument("this module does not record its forward into the compiler");
}

std::vector<std::pair<std::string, ParamPtr>> Module::all_parameter_slots() const {
    std::vector<std::pair<std::string, ParamPtr>> out;
    for (const auto& [name, layer] : m_layers)
        for (auto& [slot, p] : layer->slots())
            if (*p) out.emplace_back(name + "." + slot, *p);
    return out;
}

std::vector<std::pair<std::string, ParamPtr>> Module::named_parameters() const {
    std::vector<std::pair<std::string, ParamPtr>> out;
    for (auto& [name, p] : all_parameter_slots()) {
        bool seen = false;
        for (const auto& [n2, q] : out) seen |= q == p;
        if (!seen) out.emplace_back(name, p);
    }
    return out;
}

Mlp::Mlp(const std::vector<uint32_t>& sizes, OptimizerConfig opt, uint32_t seed)
    : Module(seed), m_opt(opt) {
    if (sizes.size() < 2)
        throw std::invalid_argument(
            fmt::format("an MLP needs at least an input and an output size, got {}", sizes.size()));
    for (size_t i = 0; i + 1 < sizes.size(); ++i)
        m_linear.push_back(
            &add<Linear>(fmt::format("layer_{}", i + 1), sizes[i], sizes[i + 1], true, rng()));
}

Var Mlp::forward(Runtime& rt, const Var& x) {
    Var h = x;
    for (size_t i = 0; i < m_linear.size(); ++i) {
        h = (*m_linear[i])(rt, h);
        if (i + 1 < m_linear.size()) h = relu(rt, h);
    }
    return h;
}

cc::ValueId Mlp::record_forward(Recorder& r, cc::ValueId x) {
    cc::ValueId h = x;
    for (size_t i = 0; i < m_linear.size(); ++i) {
        h = m_linear[i]->record(r, h);
        if (i + 1 < m_linear.size()) h = cc::relu(r.graph(), h);
    }
    return h;
}

Cnn::Cnn(ImageShape in, uint32_t classes, OptimizerConfig opt, uint32_t seed)
    : Module(seed), m_opt(opt) {
    m_conv1 = &add<Conv2d>("conv1", in, 32, 3, 1, 1, true, rng());
    m_pool1 = &add<MaxPool2d>("pool1", m_conv1->out(), 2);
    m_conv2 = &add<Conv2d>("conv2", m_pool1->out(), 64, 3, 1, 1, true, rng());
    m_pool2 = &add<MaxPool2d>("pool2", m_conv2->out(), 2);
    m_flatten = &add<Flatten>("flatten");
    m_fc1 = &add<Linear>("fc1", m_pool2->out().values(), 128, true, rng());
    m_fc2 = &add<Linear>("fc2", 128, classes, true, rng());
}

Var Cnn::forward(Runtime& rt, const Var& x) {
    Var h = (*m_pool1)(rt, relu(rt, (*m_conv1)(rt, x)));
    h = (*m_flatten)(rt, (*m_pool2)(rt, relu(rt, (*m_conv2)(rt, h))));
    return (*m_fc2)(rt, relu(rt, (*m_fc1)(rt, h)));
}

cc::ValueId Cnn::record_forward(Recorder& r, cc::ValueId x) {
    cc::Graph& g = r.graph();
    cc::ValueId h = m_pool1->record(r, cc::relu(g, m_conv1->record(r, x)));
    h = m_flatten->record(r, m_pool2->record(r, cc::relu(g, m_conv2->record(r, h))));
    return m_fc2->record(r, cc::relu(g, m_fc1->record(r, h)));
}

Gpt::Gpt(GptConfig cfg, OptimizerConfig opt, uint32_t seed) : Module(seed), m_cfg(cfg), m_opt(opt) {
    if (m_cfg.ffn == 0) m_cfg.ffn = 4 * m_cfg.hidden;
    for (const auto& [field, value] : {std::pair{"vocab", m_cfg.vocab},
                                       {"layers", m_cfg.layers},
                                       {"hidden", m_cfg.hidden},
                                       {"heads", m_cfg.heads},
                                       {"seq", m_cfg.seq}})
        if (value == 0) throw std::invalid_argument(fmt::format("GPT: {} is 0", field));
    m_wte = &add<Embedding>("wte", m_cfg.vocab, m_cfg.hidden, rng(), 0.02f);
    m_wpe = &add<PositionalEmbedding>("wpe", m_cfg.seq, m_cfg.hidden, rng(), 0.01f);
    for (uint32_t i = 0; i < m_cfg.layers; ++i)
        m_blocks.push_back(&add<TransformerBlock>(fmt::format("h_{}", i), m_cfg.hidden, m_cfg.heads,
                                                  m_cfg.ffn, m_cfg.seq, true, rng()));
    m_ln_f = &add<LayerNorm>("ln_f", m_cfg.hidden);
}

Var Gpt::forward(Runtime& rt, const Var& x) {
    Var h = (*m_wpe)(rt, (*m_wte)(rt, x));
    for (TransformerBlock* b : m_blocks) h = (*b)(rt, h);
    h = (*m_ln_f)(rt, h);
    const auto scope = rt.layer("lm_head", "linear (tied to wte)");
    return linear_transposed(rt, h, rt.param(*m_wte->weight));
}

}  // namespace tpu::trainer

namespace tpu::trainer {

cc::ValueId Gpt::record_forward(Recorder& r, cc::ValueId x) {
    cc::ValueId h = m_wpe->record(r, m_wte->record(r, x));
    for (TransformerBlock* b : m_blocks) h = b->record(r, h);
    h = m_ln_f->record(r, h);
    const auto scope = r.layer("lm_head", "linear (tied to wte)");
    // h wte^T: PyTorch's linear with the tied [vocab, hidden] table as its weight.
    const ParamPtr& wte = m_wte->weight;
    return cc::linear(r.graph(), h, r.param(wte, {wte->rows, wte->cols}), cc::kNoValue,
                      r.linear_precision());
}

}  // namespace tpu::trainer
