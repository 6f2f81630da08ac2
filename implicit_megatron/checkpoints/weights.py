"""Weights into a model by name, with every misfit named, and the settings that decide whether a
checkpoint's weights fit a config (consolidating them from any layout is checkpoints.consolidate's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from implicit_megatron.implicit.weight_norm import WeightNormConv1d, WeightNormLinear

from pathlib import Path

import torch

from implicit_megatron.checkpoints.layout import read_client_state
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused
from implicit_megatron.models.registry import SPECS


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> list[str]:
    """Load `state` into `model`, naming any tensor that does not fit; returns the names kept fresh.

    Plain weights fill weight-normalised layers (g and v are recomputed from w), and a model folder
    without an injection module leaves the model's freshly initialised one: the way an implicit run
    starts from an explicit model.
    """
    own = model.state_dict()
    direct: dict[str, torch.Tensor] = {}
    folded: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        target = name if name in own else name.removesuffix(".weight") + ".parametrizations.weight.original1"
        if target not in own:
            raise RunRefused(f"{where}: tensor {name!r} has no place in the model")
        if tensor.shape != own[target].shape:
            raise RunRefused(f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                             f"{tuple(own[target].shape)}")
        (direct if name in own else folded)[name] = tensor
    covered = set(direct) | {n.removesuffix(".weight") + f".parametrizations.weight.original{i}"
                             for n in folded for i in (0, 1)}
    fresh = [k for k in own if k not in covered]
    if any(not k.startswith("core.injection.") for k in fresh):
        missing = [k for k in fresh if not k.startswith("core.injection.")]
        raise RunRefused(f"{where}: no tensor for {missing[0]!r}" + (f" and {len(missing) - 1} more" if
                                                                      len(missing) > 1 else ""))
    model.load_state_dict(direct, strict=False)
    with torch.no_grad():
        for name, tensor in folded.items():  # g and v that give this weight
            module = cast("WeightNormLinear | WeightNormConv1d", model.get_submodule(name.removesuffix(".weight")))
            module.set_weight(tensor.to(module.parametrizations.weight.original1.dtype))
    return fresh


SHAPE_KEYS = tuple(f"model.{k}" for k in ("arch", "d_model", "n_layers", "vocab_size", "pad_vocab_multiple",
                                           "tie_embeddings")) + tuple(
    f"model.{spec.name}.{k}" for spec in SPECS.values() for k in spec.shape_keys) + (
    "implicit.enabled", "implicit.injection", "implicit.weight_norm", "implicit.weight_norm_injection")
# the settings that fix the model's tensors (names and shapes); a checkpoint loads only where they agree
MISSING = object()


def model_settings_changed(path: Path, cfg: Config) -> str:
    """The settings that fix the model's tensors whose values differ between the config saved in the
    checkpoint tag at `path` and `cfg`, as 'model.d_model: 64 in the checkpoint, 128 here' (empty when
    none differs or none is known)."""
    try:
        saved = read_client_state(path)["config"]
    except (OSError, ValueError, KeyError):
        return ""

    def value(data: dict, dotted: str):
        for part in dotted.split("."):
            if not isinstance(data, dict) or part not in data:
                return MISSING  # a key older checkpoints lack
            data = data[part]
        return data

    now = cfg.to_dict()
    changed = {k: value(saved, k) for k in SHAPE_KEYS if value(saved, k) is not MISSING}
    changed = {k: v for k, v in changed.items() if v != value(now, k)}
    return "; ".join(f"{k}: {v!r} in the checkpoint, {value(now, k)!r} here" for k, v in changed.items())


