"""Hooks at fixed points of the training loop, for what is not the loop's job.

The trainer calls every registered Callback's methods; the default ones do nothing. `register`
adds a callback for every Trainer started afterwards in this process. The test suite injects its
faults this way (a NaN loss, a jumping loss, a crash between a checkpoint's files and `latest`):
tests/support/faults/sitecustomize.py registers them in the processes a launcher starts, so that
nothing in the project reads fault settings from the environment.
"""

from __future__ import annotations

import torch


class Callback:
    def on_start_up_done(self, cfg) -> None:
        """The start-up is over (engine built, checkpoint chosen and converted); training comes next."""

    def on_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss before its backward (`step` counts from 1); returns the loss to use."""
        return loss

    def on_step_losses(self, step: int, losses: list[torch.Tensor]) -> list[torch.Tensor]:
        """A finite step's losses as reported and as the loss-jump guard sees them (after backward)."""
        return losses

    def before_latest(self, tag: str) -> None:
        """Every rank has written checkpoint `tag`; its rename and `latest` come next."""


_registered: list[Callback] = []


def register(callback: Callback) -> None:
    _registered.append(callback)


def registered() -> list[Callback]:
    return list(_registered)
