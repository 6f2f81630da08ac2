"""Watches over a run's training loss that warn instead of letting a bad run end quietly."""

from __future__ import annotations

import math
from pathlib import Path

from implicit_megatron.checkpoints.layout import step_of, tags_by_step

RISE_FACTOR = 1.1  # a loss this many times its running minimum has clearly risen
RISEN_INTERVALS = 2  # log intervals in a row before the warning


class DivergenceWatch:
    """Warns once when the training loss has risen clearly above its running minimum and above
    ln(vocabulary), worse than guessing uniformly, for RISEN_INTERVALS log intervals in a row, and
    names the last checkpoint saved before the rise (the one to go back to)."""

    def __init__(self, vocab_size: int, checkpoints: Path) -> None:
        self.uniform = math.log(vocab_size)
        self.checkpoints = checkpoints
        self.minimum: tuple[float, int] | None = None  # (loss, step)
        self.risen = 0
        self.warned = False

    def observe(self, loss: float, step: int) -> str | None:
        """The warning to log at this log interval, if any."""
        if self.minimum is None or loss < self.minimum[0]:
            self.minimum, self.risen = (loss, step), 0
            return None
        rising = loss > self.uniform and loss > RISE_FACTOR * self.minimum[0]
        self.risen = self.risen + 1 if rising else 0
        if self.risen < RISEN_INTERVALS or self.warned:
            return None
        self.warned = True
        best, at = self.minimum
        before = [t for t in tags_by_step(self.checkpoints) if step_of(t) <= at]  # newest first
        where = (f"the last checkpoint before the rise is {self.checkpoints / before[0]}" if before else
                 "no checkpoint was saved before the rise")
        return (f"warning: the training loss rose from {best:.4g} (step {at}) to {loss:.4g} (step {step}), above "
                f"ln(vocabulary) = {self.uniform:.4g}, worse than guessing, for {self.risen} log intervals in a row: "
                f"the run is diverging (a learning rate too high?); {where}")
