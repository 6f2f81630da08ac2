"""Watches over a run that warn, or hold back a checkpoint, instead of letting a bad run end quietly:
a loss that jumps (no checkpoint of that step), a loss that diverges, solves that never converge,
non-finite steps in a row (the run stops, naming the last intact checkpoint)."""

from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist

from implicit_megatron.checkpoints.layout import hold, read_latest, release, step_of, tags_by_step
from implicit_megatron.errors import RunStopped
from implicit_megatron.train.step_metrics import read_on_host, reduce_over_ranks

RISE_FACTOR = 1.1  # a loss this many times its running minimum has clearly risen
RISEN_INTERVALS = 2  # log intervals in a row before the warning
MIN_LOSS_JUMP = 0.5  # nats: a smaller rise is no jump, whatever the ratio (LossJumpGuard)


class LossJumpGuard:
    """No checkpoint at a step whose loss exceeds `factor` x the mean of the 20 finite steps before it
    and that mean by MIN_LOSS_JUMP nats, on any rank (agreed: a save is collective); a warning says
    so. The floor matters near zero: a solved word problem's loss moves from 0.005 to 0.05 without
    diverging, and the ratio alone once cost a run its final checkpoint. Step losses stay on the
    device until a checkpoint is due."""

    def __init__(self, factor: float | None, log) -> None:
        self.factor, self.log = factor, log
        self.recent: collections.deque[float] = collections.deque(maxlen=20)
        self.unread: list[torch.Tensor] = []

    def add(self, step_loss: torch.Tensor) -> None:
        """A finite step's mean loss."""
        self.unread.append(step_loss.detach())

    def allows_save(self, step: int, device: torch.device) -> bool:
        """Whether the latest step may be checkpointed (every rank gets the same answer)."""
        (values,) = read_on_host(self.unread)
        self.unread = []
        self.recent.extend(values[:-1])
        loss = values[-1] if values else float("nan")
        jumped = self.jumped(loss, device)
        if jumped:
            self.log(f"warning: no checkpoint at step {step}: the loss jumped beyond checkpoint.max_loss_jump="
                     f"{self.factor} x its recent mean; the previous checkpoint stays the latest")
        self.recent.append(loss)
        return not jumped

    def jumped(self, loss: float, device: torch.device) -> bool:
        """Whether `loss` jumped against the recent losses on any rank."""
        mean = sum(self.recent) / len(self.recent) if self.recent else None
        jump = bool(self.factor and mean is not None and loss > self.factor * mean and loss > mean + MIN_LOSS_JUMP)
        (flag,) = reduce_over_ranks([1.0 if jump else 0.0], device, dist.ReduceOp.MAX)
        return bool(flag)


class ConvergenceWatch:
    """A warning when, in a phase with a tolerance, no solve has converged for `limit` log intervals
    in a row (every solve stopped at its cap): the fixed point is not being found."""

    def __init__(self, limit: int, log) -> None:
        self.limit, self.log, self.unconverged = limit, log, 0

    def observe(self, metrics: dict[str, float], settings, step: int) -> None:
        if "solver/converged_frac" not in metrics or settings is None or settings.tol is None:
            return
        self.unconverged = self.unconverged + 1 if metrics["solver/converged_frac"] == 0 else 0
        if self.limit and self.unconverged == self.limit:
            self.log(f"warning: no solve has converged to tol {settings.tol} in {self.limit} log intervals in a "
                     f"row (step {step}; every solve stops at max_iter {settings.max_iter}): the fixed point is "
                     "not being found; see docs/checkpoints.md, How an implicit model is evaluated")


def nonfinite_stop(nonfinite_in_row: int, limit: int, checkpoints: Path) -> None:
    """Raise when `limit` steps in a row were not finite, naming the last intact checkpoint."""
    if nonfinite_in_row < limit:
        return
    tag = read_latest(checkpoints)
    last = (f"the last checkpoint before them, {checkpoints / tag}, is intact" if tag
            else "there is no checkpoint of this run yet")
    raise RunStopped(f"{nonfinite_in_row} non-finite losses in a row (train.max_nonfinite_in_row); {last}")


class DivergenceWatch:
    """Warns once when the training loss has risen clearly above its running minimum and above
    ln(vocabulary), worse than guessing uniformly, for RISEN_INTERVALS log intervals in a row, and
    names the last checkpoint saved before the rise (the one to go back to). Pruning keeps that
    checkpoint whatever checkpoint.keep_last says (checkpoints.layout.hold) from the first interval
    of the rise, since the next save may prune it before the rise is sure. A rise that ends before
    the warning lets it go at once; after a warning, once the loss has been back down for
    RISEN_INTERVALS intervals, a checkpoint saved after that is good again and the held one may be
    pruned (release); a later rise is warned about anew. Rank 0 writes the hold."""

    def __init__(self, vocab_size: int, checkpoints: Path, rank: int = 0) -> None:
        self.uniform = math.log(vocab_size)
        self.checkpoints, self.rank = checkpoints, rank
        self.minimum: tuple[float, int] | None = None  # (loss, step)
        self.risen = self.calm = 0
        self.held: str | None = None
        self.warned = False

    def observe(self, loss: float, step: int) -> str | None:
        """The warning to log at this log interval, if any."""
        if self.minimum is None or loss < self.minimum[0]:
            self.minimum, self.risen = (loss, step), 0
            self._settle(step)
            return None
        if not (loss > self.uniform and loss > RISE_FACTOR * self.minimum[0]):
            self.risen = 0
            self._settle(step)
            return None
        self.risen, self.calm = self.risen + 1, 0
        best, at = self.minimum
        if self.held is None:
            before = [t for t in tags_by_step(self.checkpoints) if cast(int, step_of(t)) <= at]  # newest first
            if before:
                self.held = before[0]
                if self.rank == 0:
                    hold(self.checkpoints, self.held, f"the last checkpoint before the loss rose at step {step}")
        if self.risen < RISEN_INTERVALS or self.warned:
            return None
        self.warned = True
        where = (f"the last checkpoint before the rise is {self.checkpoints / self.held} (kept until the loss is "
                 "back down)" if self.held else "no checkpoint was saved before the rise")
        return (f"warning: the training loss rose from {best:.4g} (step {at}) to {loss:.4g} (step {step}), above "
                f"ln(vocabulary) = {self.uniform:.4g}, worse than guessing, for {self.risen} log intervals in a row: "
                f"the run is diverging (a learning rate too high?); {where}")

    def _settle(self, step: int) -> None:
        """The loss is not rising at `step`: let the held checkpoint go, at once when no warning was
        given, else once the loss has stayed down for RISEN_INTERVALS intervals."""
        if self.held is None:
            return
        self.calm += 1
        if self.warned and self.calm < RISEN_INTERVALS:
            return
        if self.rank == 0:
            release(self.checkpoints, step)
        self.held, self.warned, self.calm = None, False, 0
