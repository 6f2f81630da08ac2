"""No checkpoint of a jumped loss (train/guards.py's LossJumpGuard, checkpoint.max_loss_jump): every
finite step's loss is kept on the device, and read when a checkpoint is due."""

from __future__ import annotations

import torch

from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.guards import LossJumpGuard


class LossJumpCallback(Callback):
    def __init__(self, guard: LossJumpGuard) -> None:
        self.guard = guard

    def on_step_end(self, trainer, result, control) -> None:
        if result.finite:
            self.guard.add(torch.stack(result.losses).mean())

    def allows_save(self, trainer, step: int) -> bool:
        return self.guard.allows_save(step, trainer.engine.device)
