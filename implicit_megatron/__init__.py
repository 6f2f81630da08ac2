"""implicit-megatron: pretraining of implicit (self-iterated) Mamba2 and Llama language models.

Public surface: `load_config(path, overrides)`, `build_model(cfg)` and `from_pretrained(folder)`.
Importing the package also registers its exported model with transformers' Auto classes (hf/auto.py).
They import lazily, so that `python -m implicit_megatron.config` and the training entry start
without importing each other.
"""

from __future__ import annotations

import os

from implicit_megatron.hf import auto, legacy_names

# Importing MLflow otherwise looks up telemetry on the network; clusters are often offline.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
legacy_names.install()  # folders exported by earlier versions import modules that have moved
auto.install()  # transformers' Auto classes load exports without running their code (hf/auto.py)


def load_config(path, overrides=(), **kwargs):
    """Read, override and check a run config as a launch does (implicit_megatron.prelaunch.load_config:
    the config's own rules, the tokenizer with check_files, every data shard with check_data)."""
    from implicit_megatron.prelaunch import load_config as _load

    return _load(path, overrides, **kwargs)


def build_model(cfg, device=None, dtype=None):
    """The LanguageModel a config describes (explicit, or wrapped in the implicit core)."""
    from implicit_megatron.builder import build_model as _build

    return _build(cfg, device=device, dtype=dtype)


def from_pretrained(folder, device=None, dtype=None):
    """A model from a folder written by `tools/convert_checkpoint.py export`."""
    from implicit_megatron.hf.export import from_pretrained as _load

    return _load(folder, device=device, dtype=dtype)


__all__ = ["build_model", "from_pretrained", "load_config"]
