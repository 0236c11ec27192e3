# SPDX-License-Identifier: Apache-2.0
"""Transformers models at large batches on the board (python/README.md, "Timing transformers
models"; compiler/README.md, "Batches of sequences whole on the device"), and the host
evaluator as the reference of a torus board: each output is the host evaluator's, bit for
bit."""

import torch

import tpusim
import tpusim.torch as tt
from hf_boards import on_board, vit


def _bert(layers=1):
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=256, hidden_size=192, num_hidden_layers=layers,
                        num_attention_heads=3, intermediate_size=768, max_position_embeddings=32)
    return tr.BertModel(cfg, add_pooling_layer=False).eval()


def test_berts_gelu_dot_over_4096_tokens_runs_on_the_device_in_shorter_row_blocks():
    # fc_1 at batch 128 of 32 tokens: [4096, 192] x [192, 768] with erf's GELU in its
    # epilogue, whose scratch tiles (a row block each) alone exceeded VMEM at the kernel's
    # 4096-row block (before: 1 host fusion a layer, "a dot whose epilogue does not fit in VMEM
    # beside it").
    torch.manual_seed(4)
    want, got, s = on_board(_bert, dict(input_ids=torch.randint(0, 256, (128, 32))))
    assert s["host_fusions"] == 0, s["fallbacks"]
    assert torch.equal(got, want)


def test_vits_patches_and_17_token_sequences_at_batch_2_run_on_the_device():
    # The patch convolution reads its NCHW input and OIHW filter through the transposes
    # tpusim.torch records (the leaves laid out in the transposes' order), and the [2, 17,
    # 192] activations lie untiled row-major, the linears' [34, 192] views of them the same
    # bytes, the layer norms streaming rows of 192 padded to two lane chunks (before: 17 host
    # fusions with one layer). The position embeddings' add, a [17, 192] table repeated over
    # the untiled sequences, streams too: the table lies untiled like them, its rows loaded
    # once, row r reading table row r mod 17 (before: 3 host fusions, the add's and the layer
    # norm's that recompute it, "reshape of a tile repeated along major dims"). Left on the
    # host: the attention's two dots over heads of 17 rows, which are not whole tiles of the
    # projections.
    torch.manual_seed(6)
    want, got, s = on_board(vit, dict(pixel_values=torch.randn(2, 3, 64, 64)))
    assert s["host_fusions"] == 2, s["fallbacks"]
    assert not any("convolution" in k or "padded tiles" in k or "layout" in k or "repeated" in k
                   for k in s["fallbacks"]), s["fallbacks"]
    assert torch.equal(got, want)


def test_vits_class_token_concatenation_at_batch_1_is_copied_on_the_device():
    # The class token's concatenation before the 16 patches roots a loop fusion of its own (with
    # the patches' NCHW view), which copies each row by DMA from where it lies (before: 1 host
    # fusion, the concatenation with the position embeddings' add, "used both as a row and as a
    # column vector"). A copy: the same bits.
    torch.manual_seed(7)
    want, got, s = on_board(vit, dict(pixel_values=torch.randn(1, 3, 64, 64)))
    assert s["host_fusions"] == 0, s["fallbacks"]
    assert torch.equal(got, want)


def test_the_evaluator_of_a_torus_board_sums_an_all_reduce_in_the_boards_order():
    # v3-32 (8 x 4 torus): the compiled all-reduce over all 32 cores takes the torus, whose
    # order of additions is not the ring's. Device(board, cores, evaluator=True) evaluates in
    # the board's numerics, so its values are the board's bit for bit; the plain host
    # evaluator of 32 replicas sums in ring order (before, the only reference there was).
    torch.manual_seed(5)
    x = torch.randn(32 * 8, 256) * torch.exp(3 * torch.randn(32 * 8, 256))
    with tpusim.Board("v3-32") as board:
        dev = tt.Device(board, cores="all")
        ref = tt.Device(board, cores="all", evaluator=True)
        assert ref.replicas == 32 and ref.board is None
        got = tt.replica_values(tt.all_reduce(tt.shard(x, dev)))
        want = tt.replica_values(tt.all_reduce(tt.shard(x, ref)))
    ring = tt.replica_values(tt.all_reduce(tt.shard(x, tt.Device(replicas=32))))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(ring[0], want[0])
    # Both are the sum over the replicas, in different orders.
    exact = x.double().reshape(32, 8, 256).sum(0)
    scale = exact.abs().max().item()
    assert (want[0].double() - exact).abs().max().item() < 1e-5 * scale
    assert (ring[0].double() - exact).abs().max().item() < 1e-5 * scale


def test_a_host_backend_of_a_board_checks_its_cores():
    from tpusim._core import compiler as C

    with tpusim.Board() as board:
        try:
            C.HostBackend(2, board=board._board, cores=[0])
        except ValueError as e:
            assert "1 cores for 2 replicas" in str(e)
        else:
            raise AssertionError("no error")
        try:
            C.HostBackend(1, board=board._board, cores=[8])
        except ValueError as e:
            assert "core 8 is not on the board" in str(e)
        else:
            raise AssertionError("no error")
