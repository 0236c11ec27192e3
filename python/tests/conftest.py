# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures (the tpusim CLI beside the module, to compare with, and the source tree), and
each test in a forked child process of its own (--no-fork: all in one): a process holds one
SystemC simulation context today, so one board per process (branch ctx gives each Board its
own). pytest's own report serialisation carries the results back, xfail included.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from _pytest.reports import TestReport
from _pytest.runner import runtestprotocol

import tpusim
from tpusim import _core

SOURCE = Path(_core.SOURCE_DIR)
EXAMPLES = SOURCE / "isa" / "examples"

#: The marker of tests that open several boards in one process: strict, so that the lead flips
#: it (removes it) once one board per simulation context lands and they pass.
needs_ctx = pytest.mark.xfail(reason="needs one board per simulation context (branch ctx)",
                              strict=True)


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


def pytest_addoption(parser):
    parser.addoption("--no-fork", action="store_true",
                     help="run every test in this process (one tpusim.Board per process today)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.config.getoption("no_fork"):
        return None
    hook = item.config.hook
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run the test, send its reports, leave without cleanup
        os.close(read_end)
        payload = b""
        try:
            reports = runtestprotocol(item, log=False, nextitem=nextitem)
            payload = json.dumps([hook.pytest_report_to_serializable(config=item.config,
                                                                     report=r)
                                  for r in reports]).encode()
        finally:
            with os.fdopen(write_end, "wb") as f:
                f.write(payload)
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        payload = f.read()
    _, status = os.waitpid(pid, 0)
    if payload:
        reports = [hook.pytest_report_from_serializable(config=item.config, data=d)
                   for d in json.loads(payload)]
    else:
        reports = [TestReport(item.nodeid, item.location, {}, "failed",
                              f"the test's process died ({_wait_status(status)})", "call")]
    for r in reports:
        item.ihook.pytest_runtest_logreport(report=r)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _wait_status(status):
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"
