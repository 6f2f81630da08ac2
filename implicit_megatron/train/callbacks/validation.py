"""Validation every train.eval_interval steps and after the launch's last one (train/validation.py
evaluates; the Hooks run it where no callback holds it back). A validation held back (a non-finite
step, a graceful stop's short grace) is owed: it comes after the next step that may validate, in
this launch or, through the checkpoint, in the launch that resumes it."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback, StepControl, StepEnd


class ValidationCadence(Callback):
    priority = 30

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.owed = False  # a validation was due and not run

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        if end.step % self.interval == 0 or end.step == end.last_step or self.owed:
            control.validate = self.owed = True

    def on_validation(self, results: dict[str, float], step: int) -> None:
        self.owed = False

    def state_dict(self) -> dict:
        return {"validation_owed": self.owed}

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        self.owed = same_run and state.get("validation_owed") is True
