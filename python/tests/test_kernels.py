# SPDX-License-Identifier: Apache-2.0
"""Programs and `run`: assemble/disassemble, matmul128.s on numpy inputs against numpy, and
bad requests worded as `tpusim run` words them."""

import json
import os
import signal
import subprocess

import numpy as np
import pytest

import tpusim
from conftest import EXAMPLES


def test_assemble_disassemble_round_trip():
    text = (EXAMPLES / "gemm512.s").read_text()
    p = tpusim.assemble(text, name="gemm512")
    assert p.name == "gemm512" and len(p) > 10
    again = tpusim.assemble(tpusim.disassemble(p))
    assert again.to_bytes() == p.to_bytes()
    image = p.to_bytes()
    assert image.startswith(b"TPUPROG1")
    assert tpusim.Program.from_bytes(image).to_bytes() == image


def test_asm_errors_carry_their_location_as_the_cli_prints_them(cli, tmp_path):
    src = tmp_path / "bad.s"
    src.write_text("nop\n  mxu.mn 0\n")
    with pytest.raises(tpusim.AsmError) as e:
        tpusim.assemble(src.read_text(), filename=str(src))
    assert (e.value.file, e.value.line, e.value.col) == (str(src), 2, 3)
    p = cli("asm", src)
    assert p.returncode == 2
    assert p.stderr == f"{e.value}\n"
    assert isinstance(e.value, ValueError)
    # A kernel file fails the same way through run().
    with tpusim.Board() as b, pytest.raises(tpusim.AsmError, match="bad.s:2:3: error"):
        b.run(src)
    with pytest.raises(ValueError, match="TPUPROG1|magic"):
        tpusim.Program.from_bytes(b"not a program")


def test_matmul128_against_numpy(board, cli, tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    r = board.run(EXAMPLES / "matmul128.s",
                  loads={0x0: tpusim.to_bf16(a), 0x8000: tpusim.to_bf16(w)},
                  dumps={"c": (0x10000, "float32", (128, 128))})
    c = r.outputs["c"]
    # bf16 products are exact in fp32; the MXU sums 128 of them per output in fp32, each add
    # rounding by at most 2^-24 of the running sum, so |c - exact| <= 128 * 2^-24 * sum |a w|
    # (the fp32 accumulation bound for 128 terms).
    ab, wb = tpusim.round_bf16(a).astype(np.float64), tpusim.round_bf16(w).astype(np.float64)
    exact = ab @ wb
    bound = 128 * 2.0**-24 * (np.abs(ab) @ np.abs(wb))
    assert np.all(np.abs(c - exact) <= bound)
    # The CLI's run of the same kernel and files: the same cycles and bytes.
    (tmp_path / "a.bin").write_bytes(tpusim.to_bf16(a).tobytes())
    (tmp_path / "w.bin").write_bytes(tpusim.to_bf16(w).tobytes())
    out = cli.json("run", EXAMPLES / "matmul128.s", "--load", f"0:0x0={tmp_path / 'a.bin'}",
                   "--load", f"0:0x8000={tmp_path / 'w.bin'}", "--dump",
                   f"0:0x10000:65536={tmp_path / 'c.bin'}")
    assert r.summary == {**out, "host_seconds": r.summary["host_seconds"]}
    assert (tmp_path / "c.bin").read_bytes() == c.tobytes()
    assert r.cores[0]["hbm_read_bytes"] == 2 * 128 * 128 * 2


def test_run_writes_trace_and_stats_as_the_cli(board, tmp_path):
    p = tpusim.assemble("li s1, 7\nadd s2, s1, s1\nhalt\n", name="tiny_kernel")
    r = board.run(p, cores="0-1", trace=tmp_path / "t.json", stats=tmp_path / "s.json")
    assert [c["id"] for c in r.cores] == [0, 1]
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["traceEvents"]
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats == r.stats
    assert stats["board"]["children"]["kernels"]["children"]["tiny_kernel"]["counters"][
        "launches"]["value"] == 1
    assert (tmp_path / "s.json.config.json").exists()


def test_bad_run_requests_are_value_and_type_errors(board):
    prog = tpusim.assemble("halt\n")
    with pytest.raises(ValueError, match=r"^loads\[17179869184\]: 4 bytes at 0x400000000 do not "
                                         r"fit in core0\.hbm"):
        board.run(prog, loads={1 << 34: np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match=r"^dumps\['c'\]: 4 bytes at 0x1000000 are not inside "
                                         r"core1\.vmem"):
        board.run(prog, dumps={"c": ((1, "vmem", 1 << 24), "float32", 1)})
    with pytest.raises(ValueError, match=r"dumps\['c'\]: a dump names one core"):
        board.run(prog, dumps={"c": (("0-1", 0), "float32", 1)})
    with pytest.raises(TypeError, match="float64 values"):
        board.run(prog, loads={0: np.zeros(2)})
    with pytest.raises(TypeError, match="program: expected a tpusim.Program or a kernel file"):
        board.run(42)
    with pytest.raises(ValueError, match="kernel: .*missing.s"):
        board.run("missing.s")
    with pytest.raises(ValueError, match="^cores: bad core list"):
        board.run(prog, cores="3-1")


def test_ctrl_c_stops_a_simulation_with_keyboard_interrupt():
    spin = tpusim.assemble("top: jmp top\n", name="spin")
    # No cycle limit; the host-time limit only keeps a broken stop from hanging the suite.
    with tpusim.Board(set={"sim.max_cycles": 0, "sim.max_host_seconds": 60}) as b:
        killer = subprocess.Popen(["sh", "-c", f"sleep 1; kill -INT {os.getpid()}"])
        with pytest.raises(KeyboardInterrupt, match="interrupted|Ctrl-C"):
            b.run(spin)
        killer.wait()
    # Python's own handler is back once the call returns.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
