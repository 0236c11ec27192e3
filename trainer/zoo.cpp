// SPDX-License-Identifier: Apache-2.0
#include "trainer/zoo.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

namespace tpu::trainer {
namespace {

uint32_t or_default(uint32_t value, uint32_t fallback) {
    return value ? value : fallback;
}

/// `examples` examples of `rows` rows of `features` values uniform in [-1, 1), labels uniform.
Dataset random_rows(uint32_t examples, uint32_t rows, uint32_t features, uint32_t classes,
                    uint32_t seed, bool values) {
    std::mt19937 rng(seed);
    Dataset d;
    d.count = examples;
    d.rows = rows;
    d.features = features;
    d.classes = classes;
    if (values) {
        d.x.resize(size_t(examples) * rows * features);
        // 24 random bits per value, as the module initialisers: the same inputs on every
        // platform.
        for (float& v : d.x) v = float(rng() >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    d.labels.resize(size_t(examples) * rows);
    for (uint8_t& l : d.labels) l = uint8_t(rng() % std::min(classes, 256u));
    return d;
}

/// One post-LN BERT encoder block over rows of hidden values, no embedding. With `labels` > 0
/// its training and validation steps put a token-classification head on the block's output
/// (Linear hidden -> labels, BertForTokenClassification's classifier); forward() and so
/// inference stay the block alone.
class Encoder : public Module {
public:
    Encoder(uint32_t hidden, uint32_t heads, uint32_t ffn, uint32_t seq, FfnActivation activation,
            uint32_t seed, uint32_t labels)
        : Module(seed) {
        m_block = &add<TransformerBlock>("block", hidden, heads, ffn, seq, false, rng(), false,
                                         activation);
        // Created after the block, so the block's weights are those of the inference model.
        if (labels) m_head = &add<Linear>("classifier", hidden, labels, true, rng());
    }
    Var forward(Runtime& rt, const Var& x) override { return (*m_block)(rt, x); }
    compiler::ValueId record_forward(Recorder& r, compiler::ValueId x) override {
        return m_block->record(r, x);
    }
    Var training_step(Runtime& rt, const Batch& batch) override {
        if (!m_head) return Module::training_step(rt, batch);
        return cross_entropy(rt, (*m_head)(rt, forward(rt, batch.x)), batch.onehot);
    }
    StepOutput validation_step(Runtime& rt, const Batch& batch) override {
        if (!m_head) return Module::validation_step(rt, batch);
        Var logits = (*m_head)(rt, forward(rt, batch.x));
        return {cross_entropy(rt, logits, batch.onehot), logits};
    }

private:
    TransformerBlock* m_block;
    Linear* m_head = nullptr;
};

/// `options` with every size the model `name` leaves at 0 set to its default.
ZooOptions with_defaults(std::string_view name, ZooOptions o) {
    if (name == "resnet18" || name == "resnet50") {
        o.image = or_default(o.image, 224);
    } else if (name == "bert-block") {
        o.hidden = or_default(o.hidden, 768);
        o.heads = or_default(o.heads, 12);
        o.seq = or_default(o.seq, 512);
    } else if (name == "gpt") {
        const GptConfig g;
        o.layers = or_default(o.layers, g.layers);
        o.hidden = or_default(o.hidden, g.hidden);
        o.heads = or_default(o.heads, g.heads);
        o.seq = or_default(o.seq, g.seq);
        o.vocab = or_default(o.vocab, g.vocab);
    }
    // 4 x hidden in 64 bits: a width near 2^32 must not wrap to a small ffn.
    if (o.ffn == 0 && o.hidden != 0)
        o.ffn = static_cast<uint32_t>(std::min<uint64_t>(4ull * o.hidden, UINT32_MAX));
    return o;
}

/// Refuses a weight or input of rows x cols (named by `what`, the options it comes from) that
/// would not fit the 4 GiB a core's kernels address, before anything is allocated.
void check_weight(const std::string& what, uint64_t rows, uint64_t cols) {
    if (rows * cols > driver::kHbmWindowBytes / 4)
        throw std::invalid_argument(fmt::format(
            "{}: a tensor of {} x {} fp32 values is larger than the 4 GiB a core's kernels "
            "address",
            what, rows, cols));
}

/// A torchvision ResNet block with batch norm folded into each convolution's weights and bias
/// (inference form): basic (two 3x3 convolutions, ResNet-18/34) or bottleneck (1x1, 3x3, 1x1
/// with 4x expansion, ResNet-50/101/152), with a 1x1 projection shortcut where the shape
/// changes. Names follow torchvision ("layer2.0.conv1", "layer2.0.downsample").
class ResBlock : public Layer {
public:
    ResBlock(bool bottleneck, ImageShape in, uint32_t width, uint32_t stride, std::mt19937& rng) {
        const uint32_t out = bottleneck ? 4 * width : width;
        if (bottleneck) {
            m_convs.push_back(std::make_unique<Conv2d>(in, width, 1, 1, 0, true, rng));
            m_convs.push_back(
                std::make_unique<Conv2d>(m_convs.back()->out(), width, 3, stride, 1, true, rng));
            m_convs.push_back(
                std::make_unique<Conv2d>(m_convs.back()->out(), out, 1, 1, 0, true, rng));
        } else {
            m_convs.push_back(std::make_unique<Conv2d>(in, width, 3, stride, 1, true, rng));
            m_convs.push_back(
                std::make_unique<Conv2d>(m_convs.back()->out(), out, 3, 1, 1, true, rng));
        }
        if (stride != 1 || in.channels != out)
            m_down = std::make_unique<Conv2d>(in, out, 1, stride, 0, true, rng);
        m_out = m_convs.back()->out();
    }
    void set_name(std::string n) override {
        for (size_t i = 0; i < m_convs.size(); ++i)
            m_convs[i]->set_name(fmt::format("{}.conv{}", n, i + 1));
        if (m_down) m_down->set_name(n + ".downsample");
        name = std::move(n);
    }
    std::vector<std::pair<std::string, ParamPtr*>> slots() override {
        std::vector<std::pair<std::string, ParamPtr*>> s;
        for (size_t i = 0; i < m_convs.size(); ++i)
            for (auto& [slot, p] : m_convs[i]->slots())
                s.emplace_back(fmt::format("conv{}.{}", i + 1, slot), p);
        if (m_down)
            for (auto& [slot, p] : m_down->slots()) s.emplace_back("downsample." + slot, p);
        return s;
    }
    Var operator()(Runtime& rt, const Var& x) {
        Var h = x;
        for (size_t i = 0; i < m_convs.size(); ++i) {
            h = (*m_convs[i])(rt, h);
            if (i + 1 < m_convs.size()) h = relu(rt, h);
        }
        const Var shortcut = m_down ? (*m_down)(rt, x) : x;
        const auto scope = rt.layer(name + ".add_relu", "add + relu");
        return add_relu(rt, h, shortcut);
    }
    compiler::ValueId record(Recorder& r, compiler::ValueId x) {
        compiler::Graph& g = r.graph();
        compiler::ValueId h = x;
        for (size_t i = 0; i < m_convs.size(); ++i) {
            h = m_convs[i]->record(r, h);
            if (i + 1 < m_convs.size()) h = compiler::relu(g, h);
        }
        const compiler::ValueId shortcut = m_down ? m_down->record(r, x) : x;
        const auto scope = r.layer(name + ".add_relu", "add + relu");
        return compiler::relu(g, compiler::add(g, h, shortcut));
    }
    ImageShape out() const { return m_out; }

private:
    std::vector<std::unique_ptr<Conv2d>> m_convs;
    std::unique_ptr<Conv2d> m_down;
    ImageShape m_out;
};

/// torchvision's ResNet-18 or ResNet-50 for `image` x `image` x 3 inputs, batch norm folded.
class ResNet : public Module {
public:
    ResNet(bool fifty, uint32_t image, uint32_t classes, uint32_t seed) : Module(seed) {
        m_stem = &add<Conv2d>("conv1", ImageShape{image, image, 3}, 64, 7, 2, 3, true, rng());
        m_pool = &add<MaxPool2d>("maxpool", m_stem->out(), 3, 2, 1);
        ImageShape shape = m_pool->out();
        const uint32_t counts[4] = {fifty ? 3u : 2u, fifty ? 4u : 2u, fifty ? 6u : 2u,
                                    fifty ? 3u : 2u};
        for (uint32_t stage = 0; stage < 4; ++stage)
            for (uint32_t i = 0; i < counts[stage]; ++i) {
                ResBlock& b = add<ResBlock>(fmt::format("layer{}.{}", stage + 1, i), fifty, shape,
                                            64u << stage, stage > 0 && i == 0 ? 2u : 1u, rng());
                m_blocks.push_back(&b);
                shape = b.out();
            }
        m_avg = &add<GlobalAvgPool>("avgpool", shape);
        m_fc = &add<Linear>("fc", shape.channels, classes, true, rng());
    }
    Var forward(Runtime& rt, const Var& x) override {
        Var h = (*m_pool)(rt, relu(rt, (*m_stem)(rt, x)));
        for (ResBlock* b : m_blocks) h = (*b)(rt, h);
        return (*m_fc)(rt, (*m_avg)(rt, h));
    }
    compiler::ValueId record_forward(Recorder& r, compiler::ValueId x) override {
        compiler::ValueId h = m_pool->record(r, compiler::relu(r.graph(), m_stem->record(r, x)));
        for (ResBlock* b : m_blocks) h = b->record(r, h);
        return m_fc->record(r, m_avg->record(r, h));
    }

private:
    Conv2d* m_stem;
    MaxPool2d* m_pool;
    std::vector<ResBlock*> m_blocks;
    GlobalAvgPool* m_avg;
    Linear* m_fc;
};

}  // namespace

const std::vector<ZooEntry>& zoo_models() {
    static const std::vector<ZooEntry> models = {
        {"resnet18",
         "torchvision's ResNet-18, batch norm folded into the convolutions: --image 224",
         {"image"}},
        {"resnet50",
         "torchvision's ResNet-50, batch norm folded into the convolutions: --image 224",
         {"image"}},
        {"cnn",
         "conv32-pool-conv64-pool-fc128-fc10 for 28x28x1 images (tpusim train --model cnn's)",
         {}},
        {"mlp", "the MLP 784-512-256-10 of tpusim train (Fashion-MNIST-shaped inputs)", {}},
        {"bert-block",
         "one BERT encoder block (post-LN): --hidden 768 --heads 12 --seq 512 --ffn 4 x hidden; "
         "--train-step adds a token-classification head (hidden -> 9 tags, random labels)",
         {"hidden", "heads", "seq", "ffn"}},
        {"gpt",
         "a decoder-only transformer with tied embeddings: --layers 2 --hidden 128 --heads 4 "
         "--seq 64 --vocab 86 (tpusim train --model gpt's)",
         {"hidden", "heads", "seq", "ffn", "layers", "vocab"}},
    };
    return models;
}

uint64_t zoo_example_values(std::string_view name, const ZooOptions& options, bool train_step) {
    const ZooOptions o = with_defaults(name, options);
    // Saturating: these come straight from the command line.
    const auto mul = [](uint64_t a, uint64_t b) {
        return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
    };
    if (name == "resnet18" || name == "resnet50") return mul(mul(o.image, o.image), 3) + 1000;
    if (name == "cnn" || name == "mlp") return 784 + 10;
    if (name == "bert-block")
        return mul(o.seq,
                   uint64_t(o.hidden) + (train_step ? kBertTokenLabels : std::min(o.hidden, 256u)));
    if (name == "gpt") return mul(o.seq, 2 * uint64_t(o.vocab));
    return 0;
}

void check_zoo_options(std::string_view name, const ZooOptions& options, uint32_t examples) {
    if (examples == 0) throw std::invalid_argument("a zoo model needs at least one example");
    const ZooOptions o = with_defaults(name, options);
    if (name == "resnet18" || name == "resnet50") {
        if (o.image < 32)
            throw std::invalid_argument(
                fmt::format("--image {}: a ResNet needs at least 32 x 32 pixels", o.image));
        check_weight(fmt::format("--image {}", o.image), uint64_t(o.image) * o.image, 3);
    } else if (name == "bert-block" || name == "gpt") {
        if (name == "gpt" && o.vocab > 256)
            throw std::invalid_argument(fmt::format(
                "--vocab {}: the token datasets hold byte tokens (at most 256)", o.vocab));
        if (o.hidden % o.heads != 0)
            throw std::invalid_argument(
                fmt::format("--hidden {} is not a multiple of --heads {}", o.hidden, o.heads));
        check_weight(fmt::format("--hidden {} x --ffn {}", o.hidden, o.ffn), o.hidden, o.ffn);
        check_weight(fmt::format("--hidden {}", o.hidden), o.hidden, o.hidden);
        // GPT's positional table, and the input rows of one BERT example.
        check_weight(fmt::format("--seq {} x --hidden {}", o.seq, o.hidden), o.seq, o.hidden);
    } else if (name != "cnn" && name != "mlp") {
        std::string names;
        for (const ZooEntry& e : zoo_models())
            names += fmt::format("{}{}", names.empty() ? "" : ", ", e.name);
        throw std::invalid_argument(fmt::format("model '{}': the zoo has {}", name, names));
    }
}

ZooModel make_zoo_model(std::string_view name, const ZooOptions& options, uint32_t examples,
                        bool train_step) {
    check_zoo_options(name, options, examples);
    const ZooOptions o = with_defaults(name, options);
    ZooModel m;
    if (name == "resnet18" || name == "resnet50") {
        const uint32_t image = o.image;
        m.module = std::make_unique<ResNet>(name == "resnet50", image, 1000, o.seed);
        m.description = fmt::format("{} on {}x{}x3 images, 1000 classes, batch norm folded",
                                    name == "resnet50" ? "ResNet-50" : "ResNet-18", image, image);
        // Labels are bytes (classes 0-255 of the 1000): enough for a --train-step loss.
        m.input = random_rows(examples, 1, image * image * 3, 1000, o.seed + 1, o.values);
    } else if (name == "cnn") {
        m.module = std::make_unique<Cnn>(ImageShape{28, 28, 1}, 10, OptimizerConfig{}, o.seed);
        m.description = "CNN conv32-pool-conv64-pool-fc128-fc10 on 28x28x1 images";
        m.input = random_rows(examples, 1, 784, 10, o.seed + 1, o.values);
    } else if (name == "mlp") {
        m.module = std::make_unique<Mlp>(std::vector<uint32_t>{784, 512, 256, 10},
                                         OptimizerConfig{}, o.seed);
        m.description = "MLP 784-512-256-10";
        m.input = random_rows(examples, 1, 784, 10, o.seed + 1, o.values);
    } else if (name == "bert-block") {
        const uint32_t hidden = o.hidden, heads = o.heads, seq = o.seq, ffn = o.ffn;
        m.module = std::make_unique<Encoder>(hidden, heads, ffn, seq, o.activation, o.seed,
                                             train_step ? kBertTokenLabels : 0);
        m.description = fmt::format("BERT encoder block: hidden {}, {} heads, seq {}, ffn {}{}{}",
                                    hidden, heads, seq, ffn,
                                    o.activation == FfnActivation::Relu ? " (ReLU)" : "",
                                    train_step ? fmt::format(", token-classification head ({} "
                                                             "labels)",
                                                             kBertTokenLabels)
                                               : std::string());
        // Inference reads no label; its label tensor keeps the width it always had, so the
        // device layout (and every cycle) of an inference stays as it was.
        m.input = random_rows(examples, seq, hidden,
                              train_step ? kBertTokenLabels : std::min(hidden, 256u), o.seed + 1,
                              o.values);
    } else {  // gpt
        GptConfig g;
        g.layers = o.layers;
        g.hidden = o.hidden;
        g.heads = o.heads;
        g.seq = o.seq;
        g.vocab = o.vocab;
        g.ffn = o.ffn;
        m.module = std::make_unique<Gpt>(g, OptimizerConfig{}, o.seed);
        m.description =
            fmt::format("GPT: {} layers, hidden {}, {} heads, seq {}, ffn {}, vocab {} (tied)",
                        g.layers, g.hidden, g.heads, g.seq, g.ffn, g.vocab);
        std::mt19937 rng(o.seed + 1);
        std::vector<uint8_t> tokens(size_t(examples) * g.seq + 1);
        for (uint8_t& t : tokens) t = uint8_t(rng() % g.vocab);
        m.input = token_windows(std::move(tokens), g.vocab, g.seq, g.seq);
    }
    return m;
}

}  // namespace tpu::trainer
