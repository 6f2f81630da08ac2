"""Learning rate as a pure function of the global step over the whole curriculum.

Linear warmup to the peak, constant, then the 1 - sqrt cooldown to `min_lr` (Hägele et al., 2024)
from `cooldown_start` x total steps (the paper's WSD schedule). `cooldown: linear` is a straight
line to `min_lr` instead (with cooldown_start at the end of the warmup and min_lr 0:
transformers' linear schedule); `cooldown: cosine` is half a cosine to `min_lr` (with
cooldown_start at the end of the warmup: the warmup-cosine schedule of Megatron and GPT-NeoX).
Being a function of the step alone, it needs no state in a checkpoint and continues unchanged
across phase handoffs and world-size changes.
"""

from __future__ import annotations

import math

from implicit_megatron.config import Config


def learning_rate(step: int, cfg: Config) -> float:
    """The LR of optimizer step `step` (0-based)."""
    peak, floor = cfg.optimizer.lr, cfg.schedule.min_lr
    total, warmup = cfg.train.steps, cfg.schedule.warmup_steps
    if step < warmup:
        return peak * (step + 1) / warmup
    cooldown = max(round(cfg.schedule.cooldown_start * total), warmup)
    if step < cooldown or total <= cooldown:
        return peak
    progress = min((step - cooldown) / (total - cooldown), 1.0)
    shape = cfg.schedule.cooldown
    remaining = (1.0 - progress if shape == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
                 if shape == "cosine" else 1.0 - math.sqrt(progress))
    return floor + (peak - floor) * remaining
