"""The stall watch's view of the loop: what this rank does (the next rank names it if this one falls
silent), and its end (the watching rank is told). The watch itself is train/stall_watch.py."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.stall_watch import StallWatch


class StallWatchCallback(Callback):
    def __init__(self, stall: StallWatch) -> None:
        self.stall = stall

    def on_step_start(self, trainer, step: int) -> None:
        self.stall.doing(f"step {step + 1}")

    def on_activity(self, trainer, what: str) -> None:
        self.stall.doing(what)

    def on_fit_end(self, trainer, status: str, completed: bool) -> None:
        self.stall.done()  # before the tracker's last writes: the neighbour stops watching this rank
