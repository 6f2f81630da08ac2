"""A graceful stop while the rank trains: asked by a stop signal to the rank (run_control.STOP_SIGNALS,
taken once at its start: train/stopping.py), by the launch's stop request (rank 0 reads it at each
step; the launch writes it when it gets a stop signal, at any moment of the launch: it waits for
the first step), or by train.exit_after_minutes (Megatron's exit-duration: the run saves before its
allocation ends rather than being killed mid-step). Asked of any rank, it is agreed with the
step's one host read (step_metrics.step_flags): every rank saves at once (no validation: grace
periods are short) and stops, and the run's end (written by the rank's entry) names what asked and
the checkpoint.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from implicit_megatron.run_control import Launch, RunEnd, StopRequest, StopSignals
from implicit_megatron.train.callbacks import Callback, FitEnd, StepControl, StepEnd
from implicit_megatron.train.stopping import STARTED


class Preemption(Callback):
    priority = 80  # a stop's end comes before a non-finite last step's

    def __init__(self, signals: StopSignals, output_dir: str | Path, rank: int,
                 exit_after_minutes: float | None = None, log=None) -> None:
        self.signals, self.folder, self.rank, self.log = signals, Path(output_dir), rank, log
        self.minutes = exit_after_minutes
        self.deadline = None if exit_after_minutes is None else STARTED + 60 * exit_after_minutes
        self.stopped_after: int | None = None  # the step after which the ranks agreed to stop

    def before_resume(self) -> None:
        """A stop asked of an earlier launch is not one asked of this one: its request and end go,
        where no launch watches this one (a rank started directly, e.g. by srun or torchrun). Under
        the launch, it has removed both before the ranks started, and a request found now was asked
        during the start-up: it stays, and the first step stops."""
        if self.rank == 0 and Launch.of(os.environ) is None:
            StopRequest.clear(self.folder)
            RunEnd.clear(self.folder)

    def stop_asked(self) -> bool:
        """Whether this rank was asked to stop (rank 0 also reads the launch's request)."""
        if self.signals.asked() is None and self.rank == 0:
            request = StopRequest.read(self.folder)
            if request is not None:
                self.signals.note(request.reason)
        if self.signals.asked() is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.signals.note(f"train.exit_after_minutes={self.minutes:g}")
        return self.signals.asked() is not None

    @property
    def why(self) -> str:
        return self.signals.asked() or "another rank's stop request"

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        if not end.stop_agreed:
            return
        self.stopped_after = end.step
        control.save = True
        control.hold("validate", "a graceful stop (grace periods are short)")
        control.end("KILLED", completed=False, reason=self.why)

    def on_fit_end(self, end: FitEnd) -> None:
        if self.stopped_after is not None and end.status == "KILLED":
            if self.rank == 0:
                StopRequest.clear(self.folder)
            if self.log is not None:
                self.log(f"stopped by {self.why} after step {self.stopped_after}; launch again to resume")
