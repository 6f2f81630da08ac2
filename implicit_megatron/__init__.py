"""implicit-megatron: pretraining of implicit (self-iterated) Mamba2 and Llama language models.

Public surface: `load_config(path, overrides)` and `build_model(cfg)`.
"""

from __future__ import annotations

import os

# Importing MLflow otherwise looks up telemetry on the network; clusters are often offline.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from implicit_megatron.config import Config, load_config  # noqa: E402


def build_model(cfg: Config, device=None, dtype=None):
    """The LanguageModel a config describes (explicit, or wrapped in the implicit core)."""
    from implicit_megatron.builder import build_model as _build

    return _build(cfg, device=device, dtype=dtype)


__all__ = ["Config", "build_model", "load_config"]
