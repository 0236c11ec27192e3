# SPDX-License-Identifier: Apache-2.0
"""Boards: configs, presets and overrides; errors worded as the CLI words them; several boards in
one process; a fault followed by a working board."""

import numpy as np
import pytest

import tpusim
from conftest import EXAMPLES, SOURCE


def test_default_board_is_the_v3_8_like_one(board):
    assert board.num_cores == 8
    assert board.clock_mhz == 940
    assert board.config["name"] == "v3-8-like"
    assert board.cycle == 0


def test_presets_by_name_and_overrides():
    assert {"v3-8", "tiny", "v3-32"} <= set(tpusim.presets())
    with tpusim.Board("tiny", set={"sim.functional": False, "clock_mhz": 500}) as b:
        assert b.num_cores == 2
        assert b.config["sim"]["functional"] is False
        assert b.clock_mhz == 500


def test_config_path():
    with tpusim.Board(SOURCE / "configs" / "tiny.json") as b:
        assert b.config["core"]["mxu_rows"] == 8


def test_bad_configs_raise_value_error_with_the_clis_message(cli, tmp_path):
    cases = [({"set": {"no.such": 1}}, ["--set", "no.such=1"]),
             ({"set": {"clock_mhz": 0}}, ["--set", "clock_mhz=0"]),
             ({"config": str(tmp_path / "missing.json")},
              ["--config", str(tmp_path / "missing.json")])]
    for kwargs, flags in cases:
        with pytest.raises(ValueError) as e:
            tpusim.Board(**kwargs)
        # The CLI prints the same words after "tpusim: error: ".
        p = cli("config", *flags)
        assert p.returncode == 2
        assert p.stderr == f"tpusim: error: {e.value}\n"
    with pytest.raises(ValueError, match="neither a file nor a preset .*tiny"):
        tpusim.Board("v9-8")
    with pytest.raises(TypeError, match="set: keys are config paths"):
        tpusim.Board(set={1: 2})


def test_cores_take_the_clis_forms(board):
    assert board.cores(3) == [3]
    assert board.cores("0-3") == [0, 1, 2, 3]
    assert board.cores([5, 1]) == [1, 5]
    assert board.cores("all") == list(range(8))
    with pytest.raises(ValueError, match="^cores: bad core list '0-8': core 8 does not exist"):
        board.cores("0-8")
    with pytest.raises(TypeError, match="cores: expected"):
        board.cores(1.5j)


def test_a_closed_board_says_so():
    b = tpusim.Board()
    b.close()
    with pytest.raises(ValueError, match="the board is closed"):
        b.upload(np.zeros(4, np.float32))
    assert repr(b) == "<tpusim.Board (closed)>"


def deadlock(board):
    return board.run(EXAMPLES / "bad" / "deadlock.s", cores="0,1")


def test_a_device_fault_raises_device_error_naming_what_the_cli_names(cli):
    with tpusim.Board(set={"sim.launch_costs": False}) as b:
        with pytest.raises(tpusim.DeviceError) as e:
            deadlock(b)
    p = cli("run", EXAMPLES / "bad" / "deadlock.s", "--cores", "0,1", "--set",
            "sim.launch_costs=false")
    assert p.returncode == 1
    assert p.stderr == f"tpusim: {e.value}\n"
    assert str(e.value).startswith(f"{EXAMPLES / 'bad' / 'deadlock.s'}: deadlock at cycle 2")


def run_matmul(board):
    a = np.eye(128, dtype=np.float32)
    w = np.arange(128 * 128, dtype=np.float32).reshape(128, 128) / 128
    r = board.run(EXAMPLES / "matmul128.s",
                  loads={0x0: tpusim.to_bf16(a), 0x8000: tpusim.to_bf16(w)},
                  dumps={"c": (0x10000, "float32", (128, 128))})
    np.testing.assert_array_equal(r.outputs["c"], tpusim.round_bf16(w))
    return r.cycles


def test_several_boards_one_after_another():
    cycles = []
    for _ in range(3):
        with tpusim.Board() as b:
            cycles.append(run_matmul(b))
    assert cycles[0] == cycles[1] == cycles[2]


def test_after_a_fault_the_next_board_works():
    with tpusim.Board(set={"sim.launch_costs": False}) as b:
        with pytest.raises(tpusim.DeviceError):
            deadlock(b)
    with tpusim.Board() as b:
        run_matmul(b)
