"""A training loss that diverges: a warning, once, when the loss has risen clearly above its running
minimum and above ln(vocabulary), worse than guessing uniformly, for RISEN_INTERVALS log intervals
in a row, naming the last checkpoint saved before the rise (the one to go back to). Pruning keeps
that checkpoint whatever checkpoint.keep_last says (checkpoints.layout.hold) from the first interval
of the rise, since the next save may prune it before the rise is sure. A rise that ends before the
warning lets it go at once; after a warning, once the loss has been back down for RISEN_INTERVALS
intervals, a checkpoint saved after that is good again and the held one may be pruned (release); a
later rise is warned about anew. Rank 0 writes the hold; the watch's state goes with each checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

from implicit_megatron.checkpoints.layout import hold, release, step_of, tags_by_step
from implicit_megatron.train.callbacks import Callback

RISE_FACTOR = 1.1  # a loss this many times its running minimum has clearly risen
RISEN_INTERVALS = 2  # log intervals in a row before the warning


class DivergenceWatch(Callback):
    priority = 45

    def __init__(self, vocab_size: int, checkpoints: Path, rank: int = 0, log=None) -> None:
        self.uniform = math.log(vocab_size)
        self.checkpoints, self.rank, self.log = checkpoints, rank, log
        self.minimum: tuple[float, int] | None = None  # (loss, step)
        self.risen = self.calm = 0
        self.held: str | None = None
        self.warned = False

    def on_metrics(self, metrics: dict[str, float], step: int) -> None:
        if "train/loss" in metrics:
            warning = self.observe(metrics["train/loss"], step)
            if warning and self.log is not None:
                self.log(warning)

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

    def state_dict(self) -> dict:
        return {"divergence": {"minimum": list(self.minimum) if self.minimum else None, "risen": self.risen,
                               "calm": self.calm, "held": self.held, "warned": self.warned}}

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        saved = state.get("divergence")
        if not same_run or not isinstance(saved, dict):
            return
        minimum = saved.get("minimum")
        self.minimum = (float(minimum[0]), int(minimum[1])) if minimum else None
        self.risen, self.calm = int(saved.get("risen", 0)), int(saved.get("calm", 0))
        self.held, self.warned = saved.get("held"), bool(saved.get("warned"))
