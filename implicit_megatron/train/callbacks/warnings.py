"""Warnings from each log interval's metrics (train/guards.py): a training loss that diverges (the
last checkpoint before the rise is kept and named), solves that never converge to the tolerance."""

from __future__ import annotations

from implicit_megatron.checkpoints.layout import checkpoint_dir
from implicit_megatron.config import Config
from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.guards import ConvergenceWatch, DivergenceWatch


class WarningsCallback(Callback):
    def __init__(self, cfg: Config, rank: int, log) -> None:
        self.log = log
        self.convergence = ConvergenceWatch(cfg.train.warn_unconverged_intervals, log)
        self.divergence = DivergenceWatch(cfg.model.vocab_size, checkpoint_dir(cfg), rank)

    def on_metrics(self, trainer, metrics: dict[str, float], step: int) -> None:
        self.convergence.observe(metrics, trainer.engine.module.core.settings, step)
        if "train/loss" in metrics:
            warning = self.divergence.observe(metrics["train/loss"], step)
            if warning:
                self.log(warning)
