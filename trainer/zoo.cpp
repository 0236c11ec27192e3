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

}  // namespace

const std::vector<ZooEntry>& zoo_models() {
    static const std::vector<ZooEntry> models = {
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
    if (name == "mlp") {
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
