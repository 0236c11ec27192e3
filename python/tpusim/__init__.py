# SPDX-License-Identifier: Apache-2.0
"""tpusim: a cycle-level simulator of an 8-core TPU board, from Python.

A :class:`Board` is one simulated board (the built-in v3-8-like one, a preset by name, or a
JSON config, with overrides). On it, numpy arrays go to and from device memory, kernels written
in the ISA run as ``tpusim run`` runs them, and the kernel library's ops and the model zoo run as
``tpusim op`` and ``tpusim model`` do, with the same cycles::

    import numpy as np, tpusim
    with tpusim.Board() as board:
        a = np.random.rand(256, 512).astype(np.float32)
        w = np.random.rand(512, 128).astype(np.float32)
        r = board.gemm(a, w)              # bf16 operands, fp32 accumulation, as the MXU
        print(r.cycles, r.output.shape)   # board cycles; the (256, 128) result
        print(board.model("resnet18", batch=1).layers[0])

Errors are Python exceptions with the message the CLI prints: bad input raises ValueError (or
TypeError for a wrong type), a kernel's fault, deadlock or stop raises :class:`DeviceError`,
bad assembly :class:`AsmError`, and Ctrl-C during a simulation KeyboardInterrupt.

PyTorch programs run on the board through lazy tensors (``tpusim.torch``, as PyTorch/XLA runs
them on a TPU) and Lightning trains on it (``tpusim.lightning``, accelerator "tpusim").

The API is described in python/README.md.
"""

from tpusim._core import AsmError, DeviceError
from tpusim.board import Board, Buffer, Result, RunResult
from tpusim.isa import Program, assemble, disassemble, load_program
from tpusim.numerics import from_bf16, round_bf16, to_bf16
from tpusim.presets import models, presets

__all__ = [
    "AsmError",
    "Board",
    "Buffer",
    "DeviceError",
    "Program",
    "Result",
    "RunResult",
    "assemble",
    "disassemble",
    "from_bf16",
    "load_program",
    "models",
    "presets",
    "round_bf16",
    "to_bf16",
]
