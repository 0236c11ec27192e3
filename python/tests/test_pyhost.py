# SPDX-License-Identifier: Apache-2.0
"""A Hugging Face transformers BERT wholly on the board (issue #29 items 3-4; python/README.md,
"Timing transformers models"): PyTorch's views and permutes around the attention's batched dots
are layout changes the compiler folds into the dots (compiler/README.md, "PyTorch's attention
views"), so every fusion of the step is generated for the device, and the output is the host
evaluator's, bit for bit."""

import torch

import tpusim
import tpusim.torch as tt


def _bert():
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=1024, hidden_size=192, num_hidden_layers=2,
                        num_attention_heads=3, intermediate_size=768, max_position_embeddings=32)
    return tr.BertModel(cfg, add_pooling_layer=False).eval(), \
        dict(input_ids=torch.randint(0, 1024, (1, 32)))


def test_a_transformers_bert_runs_wholly_on_the_device_as_the_host_evaluator_computes_it():
    model, x = _bert()
    with torch.no_grad():
        want = tt.to_device(model)(**tt.to_device(x)).last_hidden_state.cpu()  # host evaluator
    model, x = _bert()
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        lazy = tt.to_device(model, dev)
        for _ in range(2):  # the second step: parameters resident, programs cached
            before, c0 = dev.stats(), board.cycle
            with torch.no_grad():
                got = lazy(**tt.to_device(x, dev)).last_hidden_state
            tt.mark_step(dev)
            cycles, s = board.cycle - c0, dev.stats()
        got = got.cpu()
    assert s["host_fusions"] == 0, s["fallbacks"]
    # The step touches 42 allocations (38 parameters, 2 inputs, the output, the temp arena),
    # more than a launch's 31 arguments: it is cut into programs that each fit (compiler/
    # README.md, "One program per step"), 3 launches and no host fusion between them.
    assert s["launches"] - before["launches"] == 3
    assert torch.equal(got, want)
    print(f"transformers BERT (2 layers, 192 wide, 32 tokens), batch 1: {cycles} cycles a step")
