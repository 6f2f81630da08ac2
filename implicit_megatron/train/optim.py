"""AdamW parameter groups: no weight decay on norms, biases, embeddings and the SSM's A_log, D, dt_bias."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from implicit_megatron.config import OptimizerConfig

NO_DECAY_NAMES = ("A_log", "D", "dt_bias", "original0")  # original0: a weight-normalised layer's gain


def decays(name: str, param: nn.Parameter) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias" or leaf in NO_DECAY_NAMES:
        return False
    return not any(part in name for part in ("norm", "embedding"))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if decays(name, param) else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """torch's AdamW (fused on GPU): DeepSpeed's own Adam ops compile for minutes when not prebuilt."""
    on_gpu = next(model.parameters()).is_cuda
    betas = cast("tuple[float, float]", tuple(cfg.betas))  # two, by the config's type
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=betas,
                             eps=cfg.eps, fused=on_gpu or None)
