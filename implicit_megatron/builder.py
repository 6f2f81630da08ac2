"""build_model: compose a backbone, the (implicit or explicit) core and the language-model head.

This is the one place that knows both `models` and `implicit`; each of those knows nothing of
the other beyond the backbone contract (`backbone(z, inj)`, `backbone.step(z_t, state, inj_t)`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from implicit_megatron.config import Config
from implicit_megatron.implicit import ImplicitCore, Injection
from implicit_megatron.implicit.weight_norm import apply_weight_norm, remove_weight_norm, weight_normed
from implicit_megatron.models.backbone import Backbone, released_init_
from implicit_megatron.models.lm import LanguageModel

__all__ = ["apply_weight_norm", "build_model", "build_training_model", "remove_weight_norm", "weight_normed_layers"]


def build_model(cfg: Config, device=None, dtype=None) -> LanguageModel:
    """The model a config describes; the explicit baseline is the core with no solver settings
    (one pass from z^0 = embedding, no injection), so both share every line of block code."""
    backbone = Backbone(cfg.model, device=device, dtype=dtype)
    settings = injection = None
    weight_normed = cfg.implicit.enabled and cfg.implicit.weight_norm
    if cfg.implicit.enabled:
        settings = replace(cfg.implicit)  # implicit.* is the solver's settings; the core's own copy
        if cfg.implicit.injection:
            injection = Injection(cfg.model.d_model, backbone.injection_width, cfg.model.norm_eps,
                                  cfg.model.init_std, device=device, dtype=dtype)
    if cfg.model.init == "released":
        released_init_(backbone, injection, cfg.model, rescale_residual=not weight_normed)
    if weight_normed:
        apply_weight_norm(backbone)
        if injection is not None and cfg.implicit.weight_norm_injection:
            apply_weight_norm(injection)
    core = ImplicitCore(backbone, settings, injection, cuda_graphs=cfg.implicit.cuda_graphs)
    return LanguageModel(cfg.model, core, device=device, dtype=dtype)


def build_training_model(cfg: Config, timer=None) -> LanguageModel:
    """The model as the trainer runs it: `build_model`, then what training adds, in one place.
    Layers recompute their activations in backward (distributed.activation_checkpointing), blocks
    are compiled (train.compile), no CUDA graphs under ZeRO-3 (it gathers and releases parameters
    inside the forward), and `timer` (train.timers: name -> context manager) times the solve and
    the phantom passes."""
    model = build_model(cfg)
    model.backbone.checkpoint_layers = cfg.distributed.activation_checkpointing
    if cfg.train.compile:
        model.backbone.compile_blocks()
    if cfg.distributed.zero_stage == 3:
        model.core.graph_blocker = "ZeRO-3 gathers and releases parameters inside the forward"
    model.core.timer = timer
    return model


def weight_normed_layers(module: nn.Module) -> list[nn.Module]:
    """The weight-normalised layers (every Linear and Conv1d of a weight-normed module)."""
    return [layer for _, layer in weight_normed(module)]
