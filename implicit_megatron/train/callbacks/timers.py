"""`train.timers` in each log interval: where a step's time went (data, forward with its solve and
phantom passes, backward, optimizer). The step and the model time their own sections with the
StepTimers they are given (train/timers.py: each boundary waits for the GPU, so they are off by
default); this adds what they measured to the interval's figures, in ms per step."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.timers import StepTimers


class TimersCallback(Callback):
    def __init__(self, timers: StepTimers) -> None:
        self.timers = timers

    def on_interval(self, trainer, metrics: dict[str, float]) -> None:
        metrics.update(self.timers.read())
