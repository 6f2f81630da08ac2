"""The backbones: each folder's spec (models.spec), by its name (model.arch). No torch is imported here."""

from __future__ import annotations

from implicit_megatron.models.llama import spec as llama
from implicit_megatron.models.mamba2 import spec as mamba2
from implicit_megatron.models.spec import BackboneSpec

SPECS: dict[str, BackboneSpec] = {spec.name: spec for spec in (mamba2.SPEC, llama.SPEC)}


def spec_of(arch: str) -> BackboneSpec:
    """The spec of backbone `arch` (model.arch)."""
    if arch not in SPECS:
        raise ValueError(f"unknown backbone {arch!r}; known: {', '.join(SPECS)}")
    return SPECS[arch]


def settings_of(model) -> object:
    """The chosen backbone's settings section of a model config (model.<arch>)."""
    return getattr(model, model.arch)
