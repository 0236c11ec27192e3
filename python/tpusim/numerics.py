# SPDX-License-Identifier: Apache-2.0
"""bf16 as the MXU sees it: fp32 rounded to nearest, ties to even (hw/README.md, "Numerics").

numpy has no bf16 type, so bf16 values travel as their 16-bit patterns (uint16 arrays) and come
back widened to float32 (exactly). The conversion is the simulator's own (hw/core/numerics.h),
not a re-implementation.
"""

import numpy as np

from tpusim import _core


def to_bf16(x) -> np.ndarray:
    """Rounds fp32 values to bf16 (round to nearest, ties to even; NaN stays NaN, quietened,
    with its sign; infinities and denormals kept; values past the largest finite bf16 become
    infinity) and returns their bit patterns as a uint16 array of the same shape. Other float
    or integer arrays are converted to float32 first."""
    return _core.to_bf16(np.asarray(x, dtype=np.float32))


def from_bf16(bits) -> np.ndarray:
    """The float32 values of bf16 bit patterns (a uint16 array); exact."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"from_bf16: expected bf16 bit patterns as uint16, got {bits.dtype}")
    return _core.from_bf16(np.ascontiguousarray(bits))


def round_bf16(x) -> np.ndarray:
    """x rounded to bf16 precision, as float32 (what the MXU multiplies)."""
    return from_bf16(to_bf16(x))
