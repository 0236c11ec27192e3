# SPDX-License-Identifier: Apache-2.0
"""The library ops on numpy inputs: each against a numpy reference with a tolerance derived from
its numerics (hw/README.md), and the same cycles as `tpusim op` / `tpusim gemm` for the shape
(cycles do not depend on the values)."""

import numpy as np
import pytest

import tpusim

U = 2.0**-24  # fp32 unit roundoff: one fp32 operation errs by at most U relative
B = 2.0**-8   # bf16 unit roundoff (8 significant bits): rounding errs by at most B relative


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def bf(x):
    return tpusim.round_bf16(x).astype(np.float64)


def test_gemm_bf16_and_its_cli_cycles(board, cli):
    a, w = rand(37, 300, seed=1), rand(300, 129, seed=2)
    r = board.gemm(a, w, cores="0-1")
    assert r.output.shape == (37, 129) and r.output.dtype == np.float32
    # bf16 products are exact in fp32, summed in fp32: at most K U sum |a w| from the exact sum
    # of the rounded operands (Higham's bound for K terms).
    exact = bf(a) @ bf(w)
    assert np.all(np.abs(r.output - exact) <= 300 * U * (np.abs(bf(a)) @ np.abs(bf(w))))
    out = cli.json("gemm", "--m", 37, "--k", 300, "--n", 129, "--cores", "0-1")
    assert r.cycles == out["cycles"]
    assert r.summary["split"] == out["split"]


def test_gemm_fp32_6pass_is_nearly_fp32(board):
    a, w = rand(16, 200, seed=3), rand(200, 24, seed=4)
    r = board.gemm(a, w, precision="fp32-6pass")
    ad, wd = a.astype(np.float64), w.astype(np.float64)
    # Each fp32 operand is hi + mid + lo (bf16 parts) up to 2^-24 of it; the six passes drop
    # lo.mid, mid.lo and lo.lo (< 2^-24 relative each): under 5 U per product. Each pass sums K
    # products in fp32 (K U of its magnitude, the hi.hi pass carrying nearly all of it), and the
    # passes are added to the accumulator (6 more roundings).
    bound = (200 + 5 + 6) * U * (np.abs(ad) @ np.abs(wd))
    assert np.all(np.abs(r.output - ad @ wd) <= bound)
    with pytest.raises(ValueError, match="precision: .*fp16"):
        board.gemm(a, w, precision="fp16")
    with pytest.raises(ValueError, match="a's columns must equal w's rows"):
        board.gemm(a, a)


def conv_reference(x, w, b, stride, pad):
    n, h, wd, cin = x.shape
    k, cout = w.shape[0], w.shape[3]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    cols = np.empty((n, ho, wo, k, k, cin))
    for i in range(k):
        for j in range(k):
            cols[:, :, :, i, j, :] = xp[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :]
    cols = cols.reshape(n * ho * wo, k * k * cin)
    return (cols @ w.reshape(k * k * cin, cout)).reshape(n, ho, wo, cout) + b, cols


def test_conv2d_and_its_cli_cycles(board, cli):
    x, w, b = rand(4, 9, 9, 6, seed=5), rand(3, 3, 6, 10, seed=6), rand(10, seed=7)
    r = board.conv2d(x, w, b, stride=2, pad=1, cores="0-1")
    assert r.output.shape == (4, 5, 5, 10)
    exact, cols = conv_reference(bf(x), bf(w), b.astype(np.float64), 2, 1)
    # K = 3 * 3 * 6 bf16 products per output summed in fp32, then the fp32 bias added.
    k = 3 * 3 * 6
    bound = (k + 1) * U * ((np.abs(cols) @ np.abs(bf(w)).reshape(k, 10)).reshape(exact.shape)
                           + np.abs(b))
    assert np.all(np.abs(r.output - exact) <= bound)
    out = cli.json("op", "conv2d", "--batch", 4, "--height", 9, "--width", 9, "--cin", 6,
                   "--cout", 10, "--kernel", 3, "--stride", 2, "--pad", 1, "--cores", "0-1")
    assert r.cycles == out["cycles"] and r.summary["plan"] == out["plan"]
    with pytest.raises(ValueError, match="x has 6 channels .* w expects 5"):
        board.conv2d(x, rand(3, 3, 5, 10))


def test_layernorm_and_its_cli_cycles(board, cli):
    x = rand(10, 96, seed=8) * 3 + 1
    g, b = rand(96, seed=9), rand(96, seed=10)
    r = board.layernorm(x, g, b, cores="0-3")
    xd = x.astype(np.float64)
    mean = xd.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(xd.var(-1, keepdims=True) + 1e-5)
    xhat = (xd - mean) * rstd
    exact = xhat * g + b
    # fp32 numerics: the mean is a sum of 96 values (96 U of sum |x|), which reaches x - mean
    # scaled by rstd; the variance is a sum of 96 squares (96 U relative), its reciprocal square
    # root halves that and adds 2 U, so rstd errs by 50 U relative, as does xhat; then three
    # more roundings (x gamma, + beta) of the output.
    bound = (96 * U * np.abs(xd).mean(-1, keepdims=True) * rstd + 50 * U * np.abs(xhat)) \
        * np.abs(g) + 3 * U * (np.abs(xhat * g) + np.abs(b))
    assert np.all(np.abs(r.output - exact) <= bound)
    out = cli.json("op", "layernorm", "--rows", 10, "--cols", 96, "--cores", "0-3")
    assert r.cycles == out["cycles"]
    # gamma and beta default to PyTorch's ones and zeros; leading dimensions are rows.
    r3 = board.layernorm(x.reshape(2, 5, 96))
    assert r3.output.shape == (2, 5, 96)


def test_softmax_and_its_cli_cycles(board, cli):
    x = rand(7, 300, seed=11) * 5
    r = board.softmax(x, cores=[2, 3])
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    exact = e / e.sum(-1, keepdims=True)
    # expf and logf are within 1-2 ulps, the row sum within 300 U: relative 1e-4 is 5x that.
    np.testing.assert_allclose(r.output, exact, rtol=1e-4, atol=0)
    out = cli.json("op", "softmax", "--rows", 7, "--cols", 300, "--cores", "2,3")
    assert r.cycles == out["cycles"]


def test_attention_and_its_cli_cycles(board, cli):
    q, k, v = (rand(3, 2, 24, 16, seed=s) for s in (12, 13, 14))
    r = board.attention(q, k, v, causal=True, cores="0-1")
    s = np.einsum("bhqd,bhkd->bhqk", bf(q), bf(k)) / np.sqrt(16)
    s = np.where(np.tril(np.ones((24, 24), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    exact = np.einsum("bhqk,bhkd->bhqd", p, bf(v))
    # P is rounded to bf16 for the P V product (relative B each, and sum P = 1), so |o - exact|
    # <= B max|v|, plus the fp32 sums of 24 products (24 U) and the softmax's few roundings in
    # P; Q K^T differs from the exact product of the rounded operands by 16 U only.
    assert np.max(np.abs(r.output - exact)) <= (B + 64 * U) * np.max(np.abs(bf(v)))
    out = cli.json("op", "attention", "--batch", 3, "--heads", 2, "--seq", 24, "--dhead", 16,
                   "--causal", "--cores", "0-1")
    assert r.cycles == out["cycles"]


def test_allreduce_and_its_cli_cycles(board, cli):
    x = rand(4, 1000, seed=15)
    r = board.allreduce(x, cores="0-3")
    assert r.output.shape == (4, 1000)
    # Every replica bit-identical; each value a sum of 4 fp32 terms (3 additions).
    assert all(np.array_equal(r.output[0], row) for row in r.output)
    exact = x.astype(np.float64).sum(0)
    assert np.all(np.abs(r.output[0] - exact) <= 3 * U * np.abs(x).astype(np.float64).sum(0))
    out = cli.json("op", "allreduce", "--elements", 1000, "--cores", "0-3")
    assert r.cycles == out["cycles"]
    with pytest.raises(ValueError, match="x has 4 rows for 2 cores"):
        board.allreduce(x, cores="0-1")
    with pytest.raises(ValueError, match="needs at least two cores"):
        board.allreduce(x[:1])


def test_op_results_carry_stats_and_files(board, tmp_path):
    r = board.softmax(rand(4, 128), stats=tmp_path / "s.csv", trace=tmp_path / "t.json")
    assert "kernels" in r.stats["board"]["children"]
    assert (tmp_path / "s.csv").read_text().startswith("path,")
    assert (tmp_path / "t.json").stat().st_size > 0
    with pytest.raises(ValueError, match="--trace-units and --trace-window need --trace"):
        board.softmax(rand(4, 128), trace_window="0:10")
    with pytest.raises(TypeError, match="expected a numeric array"):
        board.softmax(np.array(["a", "b"]))
