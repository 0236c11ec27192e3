# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the tpusim CLI beside the module (to compare with) and the source tree.

Every test runs in this one process: each tpusim.Board owns its SystemC simulation context, so
boards open one after another, or at once, and a faulted board leaves the process usable.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import tpusim
from tpusim import _core

SOURCE = Path(_core.SOURCE_DIR)
EXAMPLES = SOURCE / "isa" / "examples"



class Cli:
    """Runs the tpusim executable built with the module."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, *args, check_rc=None):
        env = dict(os.environ, SYSTEMC_DISABLE_COPYRIGHT_MESSAGE="1")
        p = subprocess.run([self.path, *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=600)
        if check_rc is not None:
            assert p.returncode == check_rc, p.stderr
        return p

    def json(self, *args):
        return json.loads(self(*args, "--json", check_rc=0).stdout)


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("TPUSIM_CLI") or str(Path(_core.BINARY_DIR) / "bin" / "tpusim")
    if not os.path.exists(path):
        pytest.skip(f"the tpusim executable is not built ({path})")
    return Cli(path)


@pytest.fixture
def board():
    with tpusim.Board() as b:
        yield b
