# SPDX-License-Identifier: Apache-2.0
"""Zoo models: the same cycles and per-layer table as `tpusim model`, the stats tree, trace and
stats files, and the CLI's errors."""

import json

import pytest

import tpusim


def test_zoo_lists_the_clis_models():
    assert {"resnet18", "resnet50", "bert-block", "gpt", "cnn", "mlp"} <= set(tpusim.models())


def test_model_cycles_and_layers_equal_the_clis(board, cli, tmp_path):
    r = board.model("mlp", batch=24, cores="0-1", stats=tmp_path / "s.json",
                    trace=tmp_path / "t.json")
    out = cli.json("model", "mlp", "--batch", 24, "--cores", "0-1")
    assert r.cycles == out["cycles"] > 0
    assert r.summary == {**out, "host_seconds": r.summary["host_seconds"]}
    assert [layer["name"] for layer in r.layers] == [layer["name"] for layer in out["layers"]]
    assert r.layers[0]["cycles"] > 0
    # The stats tree as a dict is what --stats writes; the trace has the per-layer track.
    assert json.loads((tmp_path / "s.json").read_text()) == r.stats
    names = {e.get("name") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]}
    assert r.layers[0]["name"] in names


def test_training_step_cycles_equal_the_clis(cli):
    with tpusim.Board() as b:
        r = b.model("gpt", layers=1, hidden=32, heads=2, seq=24, vocab=20, batch=8,
                    train_step=True, precision="32-true")
    out = cli.json("model", "gpt", "--layers", 1, "--hidden", 32, "--heads", 2, "--seq", 24,
                   "--vocab", 20, "--batch", 8, "--train-step", "--precision", "32-true")
    assert r.cycles == out["cycles"]
    assert r.summary["mode"] == "train-step"


@pytest.mark.parametrize("kwargs, cli_args", [
    ({"name": "resnet9"}, ["resnet9"]),
    ({"name": "bert-block", "hidden": 100, "heads": 12}, ["bert-block", "--hidden", 100,
                                                          "--heads", 12]),
    ({"name": "resnet18", "image": 16}, ["resnet18", "--image", 16]),
    ({"name": "mlp", "precision": "fp8"}, ["mlp", "--precision", "fp8"]),
])
def test_bad_models_raise_value_error_with_the_clis_message(board, cli, kwargs, cli_args):
    name = kwargs.pop("name")
    with pytest.raises(ValueError) as e:
        board.model(name, **kwargs)
    p = cli("model", *cli_args)
    assert p.returncode == 2
    assert p.stderr == f"tpusim: error: {e.value}\n"


def test_bad_arguments_are_type_and_value_errors(board):
    with pytest.raises(ValueError, match="batch: expected a whole number >= 1, got 0"):
        board.model("mlp", batch=0)
    with pytest.raises(TypeError, match="batch: expected an integer, got float"):
        board.model("mlp", batch=2.5)
    with pytest.raises(TypeError, match="model: expected a model name"):
        board.model(None)
