# SPDX-License-Identifier: Apache-2.0
"""bf16 rounding against an independent reference, and numpy round trips through device
buffers (fp32, bf16, int32)."""

import numpy as np
import pytest

import tpusim


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even, on the fp32 bit pattern (the IEEE rule written out with
    integers, independent of the simulator): keep the top 16 bits, round up when the dropped
    16 bits exceed half, or equal half and the kept lowest bit is odd. NaN: quiet, sign kept."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    keep, drop = u >> 16, u & 0xFFFF
    up = (drop > 0x8000) | ((drop == 0x8000) & ((keep & 1) == 1))
    out = (keep + up).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def test_bf16_matches_round_to_nearest_even_on_every_case():
    rng = np.random.default_rng(1)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan,
                        3.3895314e38,    # the largest finite bf16: stays
                        3.4028235e38,    # the largest fp32: rounds past it to inf
                        1e-45, -1e-45,   # fp32 denormals: kept, not flushed
                        1.17549435e-38], dtype=np.float32)
    # Exact ties: bit 15 set and nothing below it, with the kept lowest bit even and odd.
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x7F7F8000],
                    dtype=np.uint32).view(np.float32)
    random_bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([special, ties, random_bits.view(np.float32),
                        rng.standard_normal(10_000).astype(np.float32)])
    got = tpusim.to_bf16(x)
    assert got.dtype == np.uint16 and got.shape == x.shape
    np.testing.assert_array_equal(got, bf16_reference(x))
    # Widening back is exact: the bits land in the top half of an fp32.
    back = tpusim.from_bf16(got)
    np.testing.assert_array_equal(back.view(np.uint32), got.astype(np.uint32) << 16)


def test_bf16_ties_go_to_even():
    # 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: even (1) wins; 1 + 3 *
    # 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): it rounds up.
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8], dtype=np.float32)
    np.testing.assert_array_equal(tpusim.round_bf16(x), [1.0, 1 + 2.0**-6])


def test_from_bf16_wants_bit_patterns():
    with pytest.raises(TypeError, match="uint16"):
        tpusim.from_bf16(np.zeros(3, np.float32))


def test_buffers_round_trip_fp32_bf16_and_int32(board):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((33, 70)).astype(np.float32)
    buf = board.upload(x, core=3)
    assert (buf.core, buf.shape, buf.dtype, buf.nbytes) == (3, (33, 70), "float32", 33 * 70 * 4)
    np.testing.assert_array_equal(buf.read(), x)

    b16 = board.upload(x, dtype="bf16", core=0)
    assert b16.nbytes == 33 * 70 * 2
    np.testing.assert_array_equal(b16.read(), tpusim.round_bf16(x))

    i = rng.integers(-2**31, 2**31, (5, 7), dtype=np.int64).astype(np.int32)
    ib = board.upload(i)
    assert ib.dtype == "int32"
    np.testing.assert_array_equal(ib.read(), i)

    # Transfers are timed on the host link: each one moves the board's clock.
    before = board.cycle
    buf.write(np.zeros_like(x))
    buf.read()
    assert board.cycle > before
    np.testing.assert_array_equal(buf.read(), 0)
    buf.free()


def test_buffer_misuse_raises_clear_errors(board):
    with pytest.raises(ValueError, match="expected float32, bfloat16"):
        board.alloc((4,), dtype="float16")
    buf = board.alloc((2, 3))
    with pytest.raises(ValueError, match=r"shape \(3, 2\), the buffer holds \(2, 3\)"):
        buf.write(np.zeros((3, 2)))
    with pytest.raises(TypeError, match="int32 buffer: got float64"):
        board.alloc(4, dtype="int32").write(np.zeros(4))
    with pytest.raises(ValueError, match="core 8 does not exist"):
        board.alloc(4, core=8)
    with pytest.raises(ValueError, match="out of HBM on core 0"):
        board.alloc((1 << 31,), dtype="float32")
