// SPDX-License-Identifier: Apache-2.0
// tpusim model NAME: the per-layer table, timing-only cycles, training steps, traces, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_runner.h"
#include "tests/common/paths.h"

namespace {

using tpu::test::tmp;
using tpu::test::tpusim;
using tpu::test::tpusim_json;

const std::string kSmallGpt =
    "model gpt --layers 1 --hidden 32 --heads 2 --seq 24 --vocab 20 --batch 8";
const std::string kSmallBert = "model bert-block --hidden 64 --heads 4 --seq 40 --ffn 96";

/// The layers' names in table order.
std::vector<std::string> names(const nlohmann::json& j) {
    std::vector<std::string> out;
    for (const auto& l : j["layers"]) out.push_back(l["name"]);
    return out;
}

TEST(CliModel, LayersAddUpAndTimingOnlyGivesTheSameCycles) {
    for (const std::string& shape : {std::string("model mlp --batch 24"),
                                     std::string("model cnn --batch 16"), kSmallGpt, kSmallBert})
        for (const char* cores : {"0", "0-7"}) {
            const std::string args = shape + " --cores " + cores;
            const auto on = tpusim_json(args);
            const auto off = tpusim_json(args + " --set sim.functional=false");
            EXPECT_EQ(on["cycles"], off["cycles"]) << args;
            EXPECT_EQ(on["layers"], off["layers"]) << args;
            uint64_t sum = 0, flops = 0;
            for (const auto& l : on["layers"]) {
                sum += l["cycles"].get<uint64_t>();
                flops += l["flops"].get<uint64_t>();
                EXPECT_GT(l["cycles"].get<uint64_t>(), 0u) << l["name"];
                EXPECT_LE(l["mxu_utilization"].get<double>(), 1.0) << l["name"];
            }
            // Layers' kernels run one after another inside the forward pass.
            EXPECT_LE(sum, on["cycles"].get<uint64_t>()) << args;
            EXPECT_GT(sum, on["cycles"].get<uint64_t>() / 2) << args;
            EXPECT_EQ(flops, on["flops"].get<uint64_t>());
        }
}

TEST(CliModel, ZooModelsNameTheirLayers) {
    EXPECT_EQ(names(tpusim_json("model mlp")),
              (std::vector<std::string>{"layer_1", "layer_2", "layer_3"}));
    const auto gpt = names(tpusim_json(kSmallGpt));
    for (const char* want : {"wte", "wpe", "h_0.ln_1", "h_0.attn.q", "h_0.attn", "h_0.attn.out",
                             "h_0.fc_1", "h_0.fc_2", "ln_f", "lm_head"})
        EXPECT_NE(std::find(gpt.begin(), gpt.end(), want), gpt.end()) << want;
    const auto bert = tpusim_json(kSmallBert);
    EXPECT_EQ(bert["description"], "BERT encoder block: hidden 64, 4 heads, seq 40, ffn 96");
    EXPECT_EQ(bert["mode"], "inference");
    const auto bert_names = names(bert);
    EXPECT_NE(std::find(bert_names.begin(), bert_names.end(), "block.gelu"), bert_names.end());
    // PyTorchSim's EncoderBlock (the validation rows): ReLU between the feed-forward layers.
    const auto relu = tpusim_json(kSmallBert + " --activation relu");
    EXPECT_EQ(relu["description"],
              "BERT encoder block: hidden 64, 4 heads, seq 40, ffn 96 (ReLU)");
    const auto relu_names = names(relu);
    EXPECT_NE(std::find(relu_names.begin(), relu_names.end(), "block.relu"), relu_names.end());
    EXPECT_EQ(std::find(relu_names.begin(), relu_names.end(), "block.gelu"), relu_names.end());
}

TEST(CliModel, ResNetsAreTorchvisionsWithFoldedBatchNorm) {
    // 32x32 images keep it small; the layers are the same as at 224.
    for (const char* cores : {"0", "0-7"}) {
        const std::string args =
            std::string("model resnet18 --image 32 --batch 8 --cores ") + cores;
        const auto on = tpusim_json(args);
        const auto off = tpusim_json(args + " --set sim.functional=false");
        EXPECT_EQ(on["cycles"], off["cycles"]) << args;
        EXPECT_EQ(on["layers"], off["layers"]) << args;
    }
    const auto r18 = names(tpusim_json("model resnet18 --image 32 --set sim.functional=false"));
    // Stem, 8 basic blocks of 2 convolutions (3 with a projection shortcut), pool and head.
    for (const char* want : {"conv1", "maxpool", "layer1.0.conv1", "layer1.0.conv2",
                             "layer2.0.downsample", "layer4.1.conv2", "avgpool", "fc"})
        EXPECT_NE(std::find(r18.begin(), r18.end(), want), r18.end()) << want;
    EXPECT_EQ(std::count_if(r18.begin(), r18.end(),
                            [](const std::string& n) { return n.find(".conv") != n.npos; }),
              16);
    const auto r50 = names(tpusim_json("model resnet50 --image 32 --set sim.functional=false"));
    // 16 bottlenecks of 3 convolutions, 4 projection shortcuts.
    EXPECT_EQ(std::count_if(r50.begin(), r50.end(),
                            [](const std::string& n) { return n.find(".conv") != n.npos; }),
              48);
    EXPECT_EQ(std::count_if(r50.begin(), r50.end(),
                            [](const std::string& n) { return n.find("downsample") != n.npos; }),
              4);
}

TEST(CliModel, TrainStepAddsBackwardAllReduceAndOptimizer) {
    const auto infer = tpusim_json(kSmallGpt + " --cores 0-7");
    const auto step = tpusim_json(kSmallGpt + " --cores 0-7 --train-step");
    EXPECT_EQ(step["mode"], "train-step");
    EXPECT_EQ(names(step), names(infer));
    // Backward costs more than the forward alone: each layer's kernels at least double.
    for (size_t i = 0; i < step["layers"].size(); ++i)
        EXPECT_GT(step["layers"][i]["cycles"].get<uint64_t>(),
                  infer["layers"][i]["cycles"].get<uint64_t>())
            << step["layers"][i]["name"];
    EXPECT_GT(step["cycles"].get<uint64_t>(), 2 * infer["cycles"].get<uint64_t>());
}

TEST(CliModel, TraceHasOneSpanPerLayerRun) {
    const std::string trace = tmp("model_trace.json");
    const auto j = tpusim_json(kSmallBert + " --trace " + trace);
    const auto t = nlohmann::json::parse(tpu::test::slurp(trace));
    std::set<std::string> layer_names;
    for (const auto& l : j["layers"]) layer_names.insert(l["name"]);
    std::set<std::string> spans;
    for (const auto& e : t["traceEvents"])
        if (e.value("ph", "") == "X" && layer_names.count(e.value("name", "")))
            spans.insert(e["name"]);
    EXPECT_EQ(spans, layer_names);
}

TEST(CliModel, BadInputIsAnErrorNamingIt) {
    struct Case {
        std::string args, message;
    };
    const std::vector<Case> cases = {
        {"model resnet9", "model 'resnet9': the zoo has resnet18, resnet50, cnn, mlp"},
        {"model", "name is required"},
        {"model bert-block --hidden 100 --heads 12",
         "--hidden 100 is not a multiple of --heads 12"},
        {"model mlp --batch 0", "--batch: expected a whole number >= 1, got '0'"},
        {"model gpt --vocab 300", "--vocab 300"},
        {"model resnet18 --image 16", "--image 16: a ResNet needs at least 32 x 32 pixels"},
        {"model mlp --cores 9", "--cores"},
        {"model mlp --precision fp8", "precision='fp8'"},
        {"model mlp --activation relu", "--activation applies to bert-block, not to model mlp"},
        {"model bert-block --activation tanh", "--activation"},
    };
    for (const Case& c : cases) {
        const auto r = tpusim(c.args);
        EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    }
}

}  // namespace

namespace {

TEST(CliModel, CompiledEngineCountsItsFusionsAndItsLayersSumToTheStep) {
    // The MLP's 784-wide first layer and 10-wide last one are not generated for the device yet
    // (K and N not multiples of 128): they run on the host, the middle one on the device.
    const auto j = tpusim_json("model mlp --batch 8 --engine compiled");
    EXPECT_EQ(j["engine"], "compiled");
    const auto& f = j["fusions"];
    EXPECT_EQ(f["total"].get<int>(), 3);
    EXPECT_EQ(f["device"].get<int>() + f["host"].get<int>(), 3);
    EXPECT_GE(f["device"].get<int>(), 1);
    ASSERT_EQ(f["host_fusions"].size(), f["host"].get<size_t>());
    uint64_t host = 0;
    for (const auto& h : f["host_fusions"]) {
        EXPECT_NE(h["reason"].get<std::string>().find("not yet generated"), std::string::npos);
        host += h["cycles"].get<uint64_t>();
    }
    EXPECT_EQ(j["cycles"].get<uint64_t>(), j["device_cycles"].get<uint64_t>() + host);
    uint64_t sum = 0, device = 0;
    for (const auto& l : j["layers"]) {
        sum += l["cycles"].get<uint64_t>();
        device += l["device_cycles"].get<uint64_t>();
    }
    EXPECT_EQ(sum, j["cycles"].get<uint64_t>());
    EXPECT_EQ(device, j["device_cycles"].get<uint64_t>());
    EXPECT_EQ(names(j), (std::vector<std::string>{"layer_1", "layer_2", "layer_3"}));
    const auto& m = j["memory"];
    // 784 x 512 + 512 + 512 x 256 + 256 + 256 x 10 + 10 fp32 values, each buffer in whole
    // 256-byte blocks and its layout's tiles.
    EXPECT_GE(m["parameter_bytes"].get<uint64_t>(), 4u * (784 * 512 + 512 + 512 * 256 + 256));
    EXPECT_EQ(m["peak_bytes"].get<uint64_t>(),
              m["parameter_bytes"].get<uint64_t>() + m["input_bytes"].get<uint64_t>() +
                  m["output_bytes"].get<uint64_t>() + m["temp_bytes"].get<uint64_t>());
}

TEST(CliModel, CompiledEngineListsEachFusionWithItsCyclesTrafficAndSpan) {
    const std::string trace = tmp("model_fusions_trace.json");
    const std::string args = "model mlp --batch 8 --engine compiled --steps 2";
    const auto j = tpusim_json(args + " --trace " + trace);
    const auto& f = j["fusions"];
    const auto& list = f["list"];
    ASSERT_EQ(list.size(), f["total"].get<size_t>());
    uint64_t sum = 0, end = 0;
    size_t host = 0;
    for (const auto& r : list) {
        sum += r["cycles"].get<uint64_t>();
        host += r["where"] == "host";
        // In program order, one after another on the device's clock.
        EXPECT_GE(r["begin_cycle"].get<uint64_t>(), end) << r["fusion"];
        end = r["begin_cycle"].get<uint64_t>() + r["cycles"].get<uint64_t>();
        EXPECT_GT(r["hbm_bytes"].get<uint64_t>(), 0u) << r["fusion"];
        EXPECT_LT(r["hbm_share_of_peak"].get<double>(), 1.0) << r["fusion"];
    }
    EXPECT_EQ(sum, j["cycles"].get<uint64_t>());
    EXPECT_EQ(host, f["host"].get<size_t>());
    // layer_2's dot reads its 512 x 256 fp32 weight and writes 8 x 256 results at least.
    const auto l2 = std::find_if(list.begin(), list.end(),
                                 [](const auto& r) { return r["layers"] == "layer_2"; });
    ASSERT_NE(l2, list.end());
    EXPECT_GE((*l2)["hbm_bytes"].get<uint64_t>(), 4u * (512 * 256 + 8 * 256));
    // The trace has the same fusions as slices, at the same cycles.
    const auto t = nlohmann::json::parse(tpu::test::slurp(trace));
    size_t slices = 0;
    for (const auto& e : t["traceEvents"])
        for (const auto& r : list)
            if (e.value("ph", "") == "X" && e.value("name", "") == r["fusion"]) {
                ++slices;
                EXPECT_EQ(e["args"]["begin_cycle"], r["begin_cycle"]);
            }
    EXPECT_EQ(slices, list.size());
    // The table lists them too.
    const auto text = tpusim(args + " --fusions");
    ASSERT_EQ(text.code, 0) << text.err;
    for (const auto& r : list)
        EXPECT_NE(text.out.find(r["fusion"].get<std::string>()), std::string::npos) << text.out;
    const auto eager = tpusim("model mlp --fusions");
    EXPECT_EQ(eager.code, 2);
    EXPECT_NE(eager.err.find("--fusions applies to --engine compiled"), std::string::npos)
        << eager.err;
}

TEST(CliModel, CompiledTrainingStepHasLossAllReduceAndOptimizerRows) {
    const auto j = tpusim_json("model mlp --batch 16 --cores 0-1 --engine compiled --train-step");
    EXPECT_EQ(j["mode"], "train-step");
    uint64_t sum = 0;
    for (const auto& l : j["layers"]) sum += l["cycles"].get<uint64_t>();
    EXPECT_EQ(sum, j["cycles"].get<uint64_t>());
    const auto rows = names(j);
    for (const char* want : {"layer_1", "layer_2", "layer_3", "loss", "allreduce", "optimizer"})
        EXPECT_NE(std::find(rows.begin(), rows.end(), want), rows.end()) << want;
    // Parameters, Adam's two moments per parameter, all on every core.
    EXPECT_GE(j["memory"]["parameter_bytes"].get<uint64_t>(),
              3u * 4u * (784 * 512 + 512 + 512 * 256 + 256));
}

TEST(CliModel, CompiledTrainingStepsRunWholeOnTheDevice) {
    // Every fusion of the MLP's and the CNN's training steps is generated (compiler/README.md,
    // "Training steps on the device"); timing only, the same step takes the same cycles and
    // uploads no values.
    for (const char* m : {"mlp", "cnn"}) {
        const std::string base = std::string("model ") + m + " --engine compiled --train-step";
        const auto j = tpusim_json(base);
        EXPECT_EQ(j["fusions"]["host"].get<int>(), 0) << m << ": " << j["fusions"].dump();
        const auto t = tpusim_json(base + " --set sim.functional=false");
        EXPECT_EQ(t["cycles"].get<uint64_t>(), j["cycles"].get<uint64_t>()) << m;
        EXPECT_EQ(t["memory"]["peak_bytes"], j["memory"]["peak_bytes"]) << m;
    }
}

TEST(CliModel, CompiledEngineRefusesWhatItDoesNotRecordYet) {
    const auto r = tpusim(kSmallGpt + " --engine compiled --train-step");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("is not recorded yet"), std::string::npos) << r.err;
    const auto p = tpusim("model mlp --engine compiled --precision bf16-true");
    EXPECT_NE(p.code, 0);
    EXPECT_NE(p.err.find("bf16-true"), std::string::npos) << p.err;
    const auto e = tpusim("model mlp --engine fast");
    EXPECT_NE(e.code, 0);
    EXPECT_NE(e.err.find("--engine"), std::string::npos) << e.err;
}

}  // namespace
