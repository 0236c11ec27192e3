// SPDX-License-Identifier: Apache-2.0
#include "trainer/zoo.h"

#include <algorithm>
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
                    uint32_t seed) {
    std::mt19937 rng(seed);
    Dataset d;
    d.count = examples;
    d.rows = rows;
    d.features = features;
    d.classes = classes;
    d.x.resize(size_t(examples) * rows * features);
    // 24 random bits per value, as the module initialisers: the same inputs on every platform.
    for (float& v : d.x) v = float(rng() >> 8) * (2.0f / 16777216.0f) - 1.0f;
    d.labels.resize(size_t(examples) * rows);
    for (uint8_t& l : d.labels) l = uint8_t(rng() % std::min(classes, 256u));
    return d;
}

/// A stack of transformer blocks over rows of hidden values, with no embedding or head: one
/// BERT encoder block when `layers` is 1 and the blocks are post-LN.
class Encoder : public Module {
public:
    Encoder(uint32_t hidden, uint32_t heads, uint32_t ffn, uint32_t seq, uint32_t seed)
        : Module(seed) {
        m_block = &add<TransformerBlock>("block", hidden, heads, ffn, seq, false, rng(), false);
    }
    Var forward(Runtime& rt, const Var& x) override { return (*m_block)(rt, x); }

private:
    TransformerBlock* m_block;
};

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
         "torchvision's ResNet-18, batch norm folded into the convolutions: --image 224"},
        {"resnet50",
         "torchvision's ResNet-50, batch norm folded into the convolutions: --image 224"},
        {"cnn",
         "conv32-pool-conv64-pool-fc128-fc10 for 28x28x1 images (tpusim train --model cnn's)"},
        {"mlp", "the MLP 784-512-256-10 of tpusim train (Fashion-MNIST-shaped inputs)"},
        {"bert-block",
         "one BERT encoder block (post-LN): --hidden 768 --heads 12 --seq 512 --ffn 4 x hidden"},
        {"gpt",
         "a decoder-only transformer with tied embeddings: --layers 2 --hidden 128 --heads 4 "
         "--seq 64 --vocab 86 (tpusim train --model gpt's)"},
    };
    return models;
}

ZooModel make_zoo_model(std::string_view name, const ZooOptions& o, uint32_t examples) {
    if (examples == 0) throw std::invalid_argument("a zoo model needs at least one example");
    ZooModel m;
    if (name == "resnet18" || name == "resnet50") {
        const uint32_t image = or_default(o.image, 224);
        if (image < 32)
            throw std::invalid_argument(
                fmt::format("--image {}: a ResNet needs at least 32 x 32 pixels", image));
        m.module = std::make_unique<ResNet>(name == "resnet50", image, 1000, o.seed);
        m.description = fmt::format("{} on {}x{}x3 images, 1000 classes, batch norm folded",
                                    name == "resnet50" ? "ResNet-50" : "ResNet-18", image, image);
        // Labels are bytes (classes 0-255 of the 1000): enough for a --train-step loss.
        m.input = random_rows(examples, 1, image * image * 3, 1000, o.seed + 1);
    } else if (name == "cnn") {
        m.module = std::make_unique<Cnn>(ImageShape{28, 28, 1}, 10, OptimizerConfig{}, o.seed);
        m.description = "CNN conv32-pool-conv64-pool-fc128-fc10 on 28x28x1 images";
        m.input = random_rows(examples, 1, 784, 10, o.seed + 1);
    } else if (name == "mlp") {
        m.module = std::make_unique<Mlp>(std::vector<uint32_t>{784, 512, 256, 10},
                                         OptimizerConfig{}, o.seed);
        m.description = "MLP 784-512-256-10";
        m.input = random_rows(examples, 1, 784, 10, o.seed + 1);
    } else if (name == "bert-block") {
        const uint32_t hidden = or_default(o.hidden, 768), heads = or_default(o.heads, 12),
                       seq = or_default(o.seq, 512), ffn = or_default(o.ffn, 4 * hidden);
        if (hidden % heads != 0)
            throw std::invalid_argument(
                fmt::format("--hidden {} is not a multiple of --heads {}", hidden, heads));
        m.module = std::make_unique<Encoder>(hidden, heads, ffn, seq, o.seed);
        m.description = fmt::format("BERT encoder block: hidden {}, {} heads, seq {}, ffn {}",
                                    hidden, heads, seq, ffn);
        // Labels only give --train-step a loss over the block's outputs.
        m.input = random_rows(examples, seq, hidden, std::min(hidden, 256u), o.seed + 1);
    } else if (name == "gpt") {
        GptConfig g;
        g.layers = or_default(o.layers, g.layers);
        g.hidden = or_default(o.hidden, g.hidden);
        g.heads = or_default(o.heads, g.heads);
        g.seq = or_default(o.seq, g.seq);
        g.vocab = or_default(o.vocab, g.vocab);
        g.ffn = or_default(o.ffn, 4 * g.hidden);
        if (g.vocab > 256)
            throw std::invalid_argument(fmt::format(
                "--vocab {}: the token datasets hold byte tokens (at most 256)", g.vocab));
        if (g.hidden % g.heads != 0)
            throw std::invalid_argument(
                fmt::format("--hidden {} is not a multiple of --heads {}", g.hidden, g.heads));
        m.module = std::make_unique<Gpt>(g, OptimizerConfig{}, o.seed);
        m.description =
            fmt::format("GPT: {} layers, hidden {}, {} heads, seq {}, ffn {}, vocab {} (tied)",
                        g.layers, g.hidden, g.heads, g.seq, g.ffn, g.vocab);
        std::mt19937 rng(o.seed + 1);
        std::vector<uint8_t> tokens(size_t(examples) * g.seq + 1);
        for (uint8_t& t : tokens) t = uint8_t(rng() % g.vocab);
        m.input = token_windows(std::move(tokens), g.vocab, g.seq, g.seq);
    } else {
        std::string names;
        for (const ZooEntry& e : zoo_models())
            names += fmt::format("{}{}", names.empty() ? "" : ", ", e.name);
        throw std::invalid_argument(fmt::format("model '{}': the zoo has {}", name, names));
    }
    return m;
}

}  // namespace tpu::trainer
