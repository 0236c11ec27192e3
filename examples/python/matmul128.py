#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs isa/examples/matmul128.s (one 128x128x128 matmul on MXU 0) on numpy inputs and checks
the result against numpy.

    build/venv/bin/python examples/python/matmul128.py

The kernel reads A and W as bf16 from HBM 0x0 and 0x8000 and writes C = A W as fp32 to HBM
0x10000. bf16 products are exact in fp32 and the MXU sums the 128 products of an output in fp32,
so C may differ from the exact product of the bf16-rounded inputs by at most 128 * 2^-24 times
the sum of the products' magnitudes (the fp32 accumulation bound).
"""

from pathlib import Path

import numpy as np

import tpusim

KERNEL = Path(__file__).resolve().parents[2] / "isa" / "examples" / "matmul128.s"


def main() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)

    with tpusim.Board() as board:
        result = board.run(KERNEL, cores=0,
                           loads={0x0: tpusim.to_bf16(a), 0x8000: tpusim.to_bf16(w)},
                           dumps={"c": (0x10000, "float32", (128, 128))})
    c = result.outputs["c"]

    ab = tpusim.round_bf16(a).astype(np.float64)
    wb = tpusim.round_bf16(w).astype(np.float64)
    exact = ab @ wb
    bound = 128 * 2.0**-24 * (np.abs(ab) @ np.abs(wb))
    error = np.abs(c - exact)
    assert np.all(error <= bound), "the device result is outside the fp32 accumulation bound"
    vs_fp32 = np.abs(c - a.astype(np.float64) @ w.astype(np.float64)).max()

    core = result.cores[0]
    print(f"matmul128.s: {result.cycles} cycles = {result.seconds * 1e6:.3f} us; "
          f"{core['instructions']} instructions, {core['hbm_read_bytes']} HBM bytes read, "
          f"MXU utilisation {100 * result.mxu_utilization:.1f}%")
    print(f"max |C - bf16 product| = {error.max():.3e} (bound {bound.max():.3e}); "
          f"max |C - fp32 product| = {vs_fp32:.3e} (bf16 inputs)")


if __name__ == "__main__":
    main()
