"""`train.timers`: where a training step's time goes (data, forward with its solve and phantom
passes, backward, optimizer), in ms per step over each log interval. The step and the model time
their own sections with the StepTimers they are given; as a callback, it adds what they measured
to each log interval's figures.

A GPU runs kernels after the host queued them, so a section's time is only its own once the device
has finished the work queued before and inside it: every section boundary synchronises. That costs
throughput, which is why the timers are off by default and, off, cost nothing (no synchronisation,
no clock read).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

from implicit_megatron.train.callbacks import Callback

SECTIONS = ("data", "forward", "solve", "phantom", "backward", "optimizer")


class StepTimers(Callback):
    priority = 10

    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0  # since the last read

    def count_step(self) -> None:
        self.steps += 1

    def section(self, name: str):
        """A context that adds its wall time to `name` (a no-op when the timers are off)."""
        return self._timed(name) if self.enabled else contextlib.nullcontext()

    @contextlib.contextmanager
    def _timed(self, name: str):
        self._synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._synchronize()
            self.seconds[name] += time.perf_counter() - start

    def on_interval(self, metrics: dict[str, float]) -> None:
        metrics.update(self.read())

    def read(self) -> dict[str, float]:
        """ms per step of each section since the last read, as `timers/<name>_ms`; starts over."""
        timed = {f"timers/{name}_ms": self.seconds[name] / self.steps * 1e3
                 for name in SECTIONS if name in self.seconds} if self.steps else {}
        self.seconds.clear()
        self.steps = 0
        return timed

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
