# SPDX-License-Identifier: Apache-2.0
"""What the transformers tests share (test_pyhost2.py, test_pyhost3.py): a small ViT and the
run of a model on the host evaluator and then on core 0 of a board."""

import torch

import tpusim
import tpusim.torch as tt


def on_board(build, x):
    """The model's output on the host evaluator, then on core 0 of a board (second step:
    parameters resident, programs cached): (host, board, the second step's host fusions and
    the fallbacks that step took, by reason)."""
    model = build()
    with torch.no_grad():
        want = tt.to_device(model)(**tt.to_device(x)).last_hidden_state.cpu()
    model = build()
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        lazy = tt.to_device(model, dev)
        for _ in range(2):
            before = dev.stats()
            with torch.no_grad():
                got = lazy(**tt.to_device(x, dev)).last_hidden_state
            tt.mark_step(dev)
            after = dev.stats()
        got = got.cpu()
    fallbacks = {k: v - before["fallbacks"].get(k, 0) for k, v in after["fallbacks"].items()}
    return want, got, {"host_fusions": after["host_fusions"] - before["host_fusions"],
                       "fallbacks": {k: v for k, v in fallbacks.items() if v}}


def vit():
    """A one-layer ViT of 64 x 64 images in 16 patches of 16 x 16 (17 tokens), hidden 192."""
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.ViTConfig(hidden_size=192, num_hidden_layers=1, num_attention_heads=3,
                       intermediate_size=384, image_size=64, patch_size=16)
    return tr.ViTModel(cfg, add_pooling_layer=False).eval()
