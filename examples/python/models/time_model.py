# SPDX-License-Identifier: Apache-2.0
"""Times an inference step of a transformers model on the simulated board (python/README.md,
"tpusim.torch"): the model is built from a config (never hub weights), recorded on lazy tensors,
compiled and run as generated programs on core 0. Prints the step's cycles, the fusions that ran
on the device against those the code generator left to the host, and the aten ops that fell
back to the CPU.

    build/venv/bin/python examples/python/models/time_model.py bert --batch 1
    build/venv/bin/python examples/python/models/time_model.py vit --batch 128

The sizes (below) are reduced so that each run takes under a minute on a 2-core machine (batch
128: BERT 25 s, ViT 15 s, ResNet 20 s of simulation and host fusions, plus the imports); --check
compares the output with PyTorch on the CPU (within 4 x 2^-8 of its magnitude) and fails
otherwise.
"""

import argparse
import collections
import time

import torch
import transformers as tr

import tpusim
import tpusim.torch as tt

SEQ = 32  # BERT's sequence length (short sentences: at 128, batch 128 takes 3 minutes)


def bert():
    # BERT's shape at a quarter of bert-base's width and 2 of its 12 layers.
    cfg = tr.BertConfig(vocab_size=1024, hidden_size=192, num_hidden_layers=2,
                        num_attention_heads=3, intermediate_size=768,
                        max_position_embeddings=SEQ)
    return tr.BertModel(cfg, add_pooling_layer=False), \
        lambda b: dict(input_ids=torch.randint(0, 1024, (b, SEQ)))


def vit():
    # ViT-Base's patching (16 x 16) on 64 x 64 images (16 patches), 2 layers of width 192.
    cfg = tr.ViTConfig(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                       intermediate_size=768, image_size=64, patch_size=16)
    return tr.ViTModel(cfg, add_pooling_layer=False), \
        lambda b: dict(pixel_values=torch.randn(b, 3, 64, 64))


def resnet():
    # A basic-block ResNet (ResNet-18's stages, one block each, narrower) on 32 x 32 images.
    cfg = tr.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                          layer_type="basic")
    return tr.ResNetModel(cfg), lambda b: dict(pixel_values=torch.randn(b, 3, 32, 32))


def gpt2():
    # GPT-2's shape at a quarter of its width and 2 of its 12 layers, on SEQ tokens.
    cfg = tr.GPT2Config(vocab_size=1024, n_embd=192, n_layer=2, n_head=3, n_positions=SEQ)
    return tr.GPT2Model(cfg), lambda b: dict(input_ids=torch.randint(0, 1024, (b, SEQ)))


def mobilenet():
    # MobileNetV2 at width 0.35 on 64 x 64 images (its depthwise convolutions run on the CPU).
    cfg = tr.MobileNetV2Config(depth_multiplier=0.35, image_size=64)
    return tr.MobileNetV2Model(cfg, add_pooling_layer=False), \
        lambda b: dict(pixel_values=torch.randn(b, 3, 64, 64))


MODELS = {"bert": bert, "vit": vit, "resnet": resnet, "gpt2": gpt2, "mobilenet": mobilenet}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="compare with PyTorch on the CPU")
    args = ap.parse_args()

    torch.manual_seed(0)
    model, inputs = MODELS[args.model]()
    model.eval()
    x = inputs(args.batch)
    if args.check:
        with torch.no_grad():
            want = model(**x).last_hidden_state  # before to_device moves the parameters
    t0 = time.perf_counter()
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        lazy = tt.to_device(model, dev)
        for step in range(2):
            # The first step writes the parameters to HBM and compiles; the second is the
            # steady state (parameters resident, compiled steps and programs cached).
            before, c0 = dev.stats(), board.cycle
            tt.clear_metrics()
            with torch.no_grad():
                out = lazy(**tt.to_device(x, dev)).last_hidden_state
            tt.mark_step(dev)
            cycles, after, mhz = board.cycle - c0, dev.stats(), board.clock_mhz
        got = out.cpu()
    seconds = time.perf_counter() - t0

    def delta(key):
        return after[key] - before[key]

    fusions, host = delta("fusions"), delta("host_fusions")
    print(f"{args.model} batch {args.batch}: {cycles} cycles a step on core 0 "
          f"({cycles / mhz:.1f} us), {delta('launches')} launches; "
          f"{seconds:.1f} s on the host for both steps")
    print(f"fusions: {fusions - host} on the device, {host} on the host "
          f"({delta('fallback_fusions')} not generated yet)")
    reasons = collections.Counter()
    for key, n in after["fallbacks"].items():
        # "fusion.N: why ... not yet generated": the reasons, counted over this step.
        reasons[key.split(": ", 1)[-1]] += n - before["fallbacks"].get(key, 0)
    for why, n in reasons.most_common():
        if n:
            print(f"  {n} x {why}")
    aten = {k: v for k, v in tt._metrics.METRICS.counters.items() if k.startswith("aten::")}
    print("ops on the CPU fallback:", ", ".join(f"{k} x{v}" for k, v in aten.items()) or "none")
    if args.check:
        err = (got - want).abs().max().item() / want.abs().max().item()
        print(f"max error {err:.3g} of the output's magnitude")
        # Matmuls round their operands to bf16 (2^-8 relative), as the tests' rule: 4 x 2^-8.
        if err > 4 * 2.0**-8:
            raise SystemExit(f"{args.model}: the board's output differs from the CPU's")


if __name__ == "__main__":
    main()
