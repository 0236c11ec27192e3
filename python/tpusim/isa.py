# SPDX-License-Identifier: Apache-2.0
"""Programs for the TensorCore: assembly text in, program images out (isa/README.md)."""

import os
from pathlib import Path

from tpusim import _core

#: A program: instructions, the labels the assembler saw, and a name under which per-kernel
#: statistics count it. ``len(p)`` is its instruction count, ``p.to_bytes()`` its image
#: ("TPUPROG1", what ``tpusim asm`` writes), ``Program.from_bytes(image)`` decodes one and
#: ``p.disassemble()`` prints it back as text that reassembles to the same bytes.
Program = _core.Program


def assemble(text: str, name: str = "kernel", filename: str = "<input>") -> Program:
    """Assembles ISA text. ``name`` names the kernel in statistics and traces; ``filename``
    only names the source in errors. Raises :class:`tpusim.AsmError` ('FILE:LINE:COL: error:
    ...', with ``file``, ``line`` and ``col``) at the first error."""
    if not isinstance(text, str):
        raise TypeError(f"assemble: expected assembly text (str), got {type(text).__name__}")
    program = _core.assemble(text, filename)
    program.name = name
    return program


def disassemble(program: Program) -> str:
    """The program as assembly text (labels as the assembler saw them)."""
    if not isinstance(program, Program):
        raise TypeError(f"disassemble: expected a tpusim.Program, got {type(program).__name__}")
    return program.disassemble()


def load_program(path) -> Program:
    """Reads a kernel file as ``tpusim run`` does: a program image (starts with TPUPROG1) or
    assembly text. The program is named after the file ("vpu_chain.s" -> vpu_chain)."""
    path = os.fspath(path)
    program = _core.load_kernel(path)
    program.name = Path(path).stem.replace(".", "_") or "kernel"
    return program
