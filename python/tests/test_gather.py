# SPDX-License-Identifier: Apache-2.0
"""Embedding lookups on the board (compiler/README.md, "Gather fusions"): aten::embedding is a
gather of whole rows, generated for the device (the ids read into scalar memory, one DMA per
row), so the rows are the table's bits; a transformers BERT's embeddings run on the device."""

import collections

import torch

import tpusim
import tpusim.torch as tt


def test_an_embedding_on_the_board_returns_the_tables_rows_bit_for_bit():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(300, 200)  # rows of two lane chunks, the second padded
    ids = torch.randint(0, 300, (3, 13))
    want = emb.weight.detach()[ids].clone()
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        got = tt.to_device(emb, dev)(tt.to_device(ids, dev))
        tt.mark_step(dev)
        s = dev.stats()
        assert s["host_fusions"] == 0 and s["launches"] == 1, s["fallbacks"]
        assert torch.equal(got.cpu(), want)


def test_a_transformers_berts_embeddings_run_on_the_device():
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=1024, hidden_size=192, num_hidden_layers=2,
                        num_attention_heads=3, intermediate_size=768, max_position_embeddings=32)
    model = tr.BertModel(cfg, add_pooling_layer=False).eval()
    x = dict(input_ids=torch.randint(0, 1024, (1, 32)))
    with torch.no_grad():
        want = model(**x).last_hidden_state
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        with torch.no_grad():
            got = tt.to_device(model, dev)(**tt.to_device(x, dev)).last_hidden_state
        tt.mark_step(dev)
        s = dev.stats()
        got = got.cpu()
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 4 * 2.0**-8 * scale
    reasons = collections.Counter()
    for key, n in s["fallbacks"].items():
        reasons[key.split(": ", 1)[-1]] += n
    # No gather is left to the host; what is, is the batched dots' layouts and reshapes (the
    # code generator's open items, python/README.md): 18 fusions, the softmax's normalize
    # being computed in the values dot's fusion (compiler/README.md, "The attention's softmax in
    # the values dot").
    assert not any("s32" in why or "gather" in why for why in reasons), reasons
    assert sum(reasons.values()) == s["host_fusions"] == 18, reasons
