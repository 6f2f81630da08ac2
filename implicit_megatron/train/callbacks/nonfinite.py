"""A step whose loss or gradient is not finite: its update was skipped (train_step.py); here it is
said and tracked, the run stops after train.max_nonfinite_in_row of them in a row (naming the last
intact checkpoint), and the step is neither validated nor saved, unless it is the launch's last:
then the weights of the last finite update are saved, and the launch ends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from implicit_megatron.checkpoints.layout import read_latest
from implicit_megatron.errors import RunStopped
from implicit_megatron.train.callbacks import Callback, StepControl, StepEnd


class NonFinite(Callback):
    priority = 70

    def __init__(self, limit: int, checkpoints: Path, log: Callable[[str], None],
                 track: Callable[[dict, int], None]) -> None:
        self.limit, self.checkpoints, self.log, self.track = limit, checkpoints, log, track

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        if end.finite:
            return
        self.log(f"step {end.step}: non-finite loss ({end.nonfinite_in_row} in a row); its update is skipped")
        self.track({"train/nonfinite_steps": end.nonfinite_in_row}, end.step)
        if end.nonfinite_in_row >= self.limit:
            raise RunStopped(f"{end.nonfinite_in_row} non-finite losses in a row (train.max_nonfinite_in_row); "
                             f"{self.last_intact()}")
        control.hold("validate", "a non-finite step")
        if end.step < end.last_step:
            control.hold("save", "a non-finite step")
            return
        control.save = True
        control.end("FINISHED", completed=True)

    def last_intact(self) -> str:
        tag = read_latest(self.checkpoints)
        return (f"the last checkpoint before them, {self.checkpoints / tag}, is intact" if tag
                else "there is no checkpoint of this run yet")
