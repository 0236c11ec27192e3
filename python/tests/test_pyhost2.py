# SPDX-License-Identifier: Apache-2.0
"""Transformers models past BERT at batch 1 on the board (python/README.md, "Timing transformers
models"; compiler/README.md, "Slices, padded tiles and batches of heads"): GPT-2's q, k, v as
slices of one projection, ViT's 17-token scores in padded tiles and BERT's softmax statistics
and token-type embedding at batch 2 are generated for the device, and each model's output is
the host evaluator's, bit for bit. Small configs (never hub weights), a few seconds each."""

import torch

from hf_boards import on_board, vit


def _gpt2():
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.GPT2Config(vocab_size=256, n_embd=192, n_layer=1, n_head=3, n_positions=16,
                        bos_token_id=0, eos_token_id=0)
    return tr.GPT2Model(cfg).eval()


def test_gpt2s_sliced_qkv_run_wholly_on_the_device_as_the_host_evaluator_computes_them():
    # c_attn's [S, 3 D] output split by slices: the attention's dots read each head of q, k
    # and v as a window of its tiles, q's and k's scale in its epilogue (before: 2 host fusions
    # a layer, "reshape before a batched dot").
    want, got, s = on_board(_gpt2, dict(input_ids=torch.randint(0, 256, (1, 16))))
    assert s["host_fusions"] == 0, s["fallbacks"]
    assert torch.equal(got, want)


def test_vits_scores_over_17_tokens_are_softmaxed_on_the_device_in_padded_tiles():
    # 16 patches and the class token: [3, 17, 17] scores, each head's rows padded to 24 in
    # T(8,128) tiles (before: 3 host fusions a layer, "padded tiles"). Nothing is left on the
    # host since the embeddings' concatenation of the class token is copied on the device and
    # the patch convolution reads its NCHW input through its transpose (test_pyhost3.py).
    torch.manual_seed(1)
    want, got, s = on_board(vit, dict(pixel_values=torch.randn(1, 3, 64, 64)))
    assert s["host_fusions"] == 0, s["fallbacks"]
    assert not any("convolution" in k for k in s["fallbacks"]), s["fallbacks"]
    assert torch.equal(got, want)


def _bert():
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=256, hidden_size=192, num_hidden_layers=1,
                        num_attention_heads=3, intermediate_size=384, max_position_embeddings=16)
    return tr.BertModel(cfg, add_pooling_layer=False).eval()


def test_berts_attention_at_batch_2_runs_wholly_on_the_device():
    # [2, 3, 16] softmax statistics in tiles and the token-type ids expanded over the batch
    # (before: 8 host fusions with one layer, the embeddings' 2 and the layer's 6), and the
    # attention's dots over the heads [B, H, S, d] that bmm sees merged as [B H, S, d]: dots
    # with the batch dims {B, H}, head (b, h) a window of the projections' tiles (before: 4
    # host fusions a layer, "reshape before a batched dot" and the fusion writing P for them).
    torch.manual_seed(2)
    want, got, s = on_board(_bert, dict(input_ids=torch.randint(0, 256, (2, 16))))
    assert s["host_fusions"] == 0, s["fallbacks"]
    assert torch.equal(got, want)


def test_gpt2s_sliced_heads_at_batch_2_are_read_by_the_attentions_dots():
    # c_attn's [B S, 3 D] output viewed as [B, S, 3 D] and sliced: each slice is a slice of
    # the [B S, 3 D] columns, its heads windows of those tiles (before: 4 host fusions a
    # layer). The position embeddings broadcast over the batch are read by the first c_proj's
    # residual as the sum the embeddings' fusion writes (before: 1 host fusion, "a broadcast
    # f32[16,192] -> f32[2,16,192] in the epilogue").
    torch.manual_seed(3)
    want, got, s = on_board(_gpt2, dict(input_ids=torch.randint(0, 256, (2, 16))))
    assert s["host_fusions"] == 0, s["fallbacks"]
    assert torch.equal(got, want)
