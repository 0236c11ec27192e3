# SPDX-License-Identifier: Apache-2.0
"""Board presets (configs/*.json) and the model zoo, by name."""

from pathlib import Path

from tpusim import _core

CONFIGS = Path(_core.SOURCE_DIR) / "configs"


def presets() -> list:
    """Names of the board presets, e.g. ``tpusim.Board("v3-32")`` (configs/README.md)."""
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def config_path(config) -> str:
    """The JSON file of ``config``: a path as given, or a preset name (configs/NAME.json)."""
    if config is None:
        return ""
    path = Path(config)
    if path.exists() or path.suffix == ".json" or "/" in str(config):
        return str(path)
    if (CONFIGS / f"{config}.json").exists():
        return str(CONFIGS / f"{config}.json")
    raise ValueError(
        f"config '{config}': neither a file nor a preset (presets: {', '.join(presets())})")


def models() -> dict:
    """The model zoo of :meth:`tpusim.Board.model` (``tpusim model``): name -> description."""
    return dict(_core.zoo_models())
