"""A checkpoint every checkpoint.interval steps, at a phase's last step and at the launch's last; the
Hooks save it where no callback holds it back (a non-finite step, a jumped loss). The checkpointer
(train/checkpointer.py) writes it and keeps checkpoint.keep_last of them."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback, StepControl, StepEnd


class CheckpointCadence(Callback):
    priority = 20

    def __init__(self, interval: int, ends_phase=lambda step: False) -> None:
        """`ends_phase(step)`: whether `step` is the last of its curriculum phase (Phases.ends_after)."""
        self.interval, self.ends_phase = interval, ends_phase

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        if end.step % self.interval == 0 or end.step == end.last_step or self.ends_phase(end.step):
            control.save = True
