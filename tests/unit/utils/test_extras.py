"""A missing optional package is one line naming its extra and the command that installs it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from implicit_megatron import load_config
from implicit_megatron.utils.extras import EXTRAS, MissingExtra, missing, require
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_every_optional_module_belongs_to_an_extra_of_pyproject():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, (distribution, extra) in EXTRAS.items():
        assert any(spec.startswith(distribution) for spec in extras[extra]), (module, extra)


def test_an_importable_module_is_not_missing():
    assert missing("transformers", "a test") is None
    assert require("transformers", "a test") is sys.modules["transformers"]


def test_a_missing_module_is_named_with_its_extra_and_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what importing a package that is not installed does
    line = missing("wandb", "tracking.wandb.project (Weights & Biases)")
    assert line is not None and "\n" not in line
    assert line.startswith("tracking.wandb.project (Weights & Biases) needs wandb, which does not import here")
    assert line.endswith("install the 'wandb' extra: bash scripts/setup.sh wandb (or pip install -e .[wandb])")
    with pytest.raises(MissingExtra, match="bash scripts/setup.sh wandb"):
        require("wandb", "W&B")


def test_the_config_check_refuses_wandb_without_the_extra_naming_the_key(monkeypatch, tmp_path):
    overrides = [f"train.output_dir={tmp_path / 'run'}", "tracking.wandb.project=p"]
    load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", overrides)  # installed: accepted
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", overrides)
    assert "tracking.wandb.project" in str(caught.value) and "bash scripts/setup.sh wandb" in str(caught.value)
