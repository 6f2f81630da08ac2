"""Stopping a rank gracefully: SIGTERM during its start-up, and preemption while it trains.

Raising from a signal handler interrupts whatever runs at that moment, a C extension's
initialisation included (it crashed the process); the handlers here only take note. Ctrl-C
(SIGINT) and a closed terminal (SIGHUP) ask for the same stop as SIGTERM; a second Ctrl-C stops the
process at once. Start-up asks
`check()` between its stages (config, run lock, model and engine, before the first step): a process
alone ends there, with nothing saved; ranks of a larger world carry the request to their first step
and stop together after it (a rank leaving alone left the others waiting for it in the rendezvous,
as under `srun`, where each task gets the signal at its own moment of the start-up). Once
training runs, `Preemption` takes over: a SIGTERM, or STOP_FILE written by the launch
(launch/supervisor.py, which received one itself, at any moment of the launch: the file waits for
the first step), asks for a stop; the ranks agree on it with the step's one host read
(step_metrics.step_flags), save a checkpoint, and rank 0 writes PREEMPTED_FILE naming it, which
tells the launch that the stop was graceful. `train.exit_after_minutes` asks for the same
stop once that much time has passed since the rank started (Megatron's exit-duration), so that a run
saves before its allocation ends rather than being killed mid-step.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from implicit_megatron.utils.safe_write import replace_text

STOP_FILE = "stop-requested"  # in the output folder: stop as SIGTERM would (written by the launch)
PREEMPTED_FILE = "preempted.json"  # in the output folder: this launch stopped early, with its checkpoint
# Set by the launch (launch/supervisor.py) for the ranks it starts: it removed the files of earlier launches before
# starting them and writes STOP_FILE when it gets SIGTERM, so a STOP_FILE the ranks find is this launch's.
LAUNCHER_OWNS_STOP_FILE = "IMPLICIT_MEGATRON_LAUNCHER_STOP_FILE"

# Set by the launch for a rank it becomes (`exec`) when a SIGTERM came before: the stop is the rank's.
STOP_ASKED_BEFORE_START = "IMPLICIT_MEGATRON_STOP_ASKED"

_requested: str | None = None  # what asked for a stop during the start-up (SIGTERM, SIGINT, SIGHUP), if anything
# the signals that ask for the graceful stop, as a stop names them (a closed terminal sends SIGHUP)
REASONS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGHUP: "SIGHUP (the terminal closed)"}
STARTED = time.monotonic()  # this rank's start (the module is imported first thing): exit_after_minutes counts from it


class StoppedDuringStartUp(BaseException):  # noqa: N818 - a stop, not an error: no "except Exception" holds it
    """SIGTERM before the first step: nothing to save; the launch ends as a graceful stop."""


def install() -> None:
    global _requested
    for signum in REASONS:
        signal.signal(signum, _take_note)
    _requested = _requested or os.environ.get(STOP_ASKED_BEFORE_START) or None


def _take_note(signum, frame) -> None:
    global _requested
    if signum == signal.SIGINT and _requested:
        at_once()
    _requested = REASONS[signal.Signals(signum)]


def requested() -> str | None:
    """What asked for a stop during the start-up (None: nothing)."""
    return _requested


def at_once() -> None:
    """A second Ctrl-C: stop now, without saving (what the first one asked for takes a step)."""
    os.write(2, b"[train] stopped at once by a second Ctrl-C: what was trained since the last checkpoint is lost\n")
    os._exit(130)


def check() -> None:
    """Raise StoppedDuringStartUp when a stop was asked of a process that trains alone (WORLD_SIZE 1);
    in a larger world the request waits for the first step (Preemption.install takes it over)."""
    if _requested and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        raise StoppedDuringStartUp


class Preemption:
    """A stop asked of this rank while it trains, and the agreement of all ranks on it."""

    def __init__(self, output_dir: str | Path, rank: int, exit_after_minutes: float | None = None) -> None:
        self.folder, self.rank = Path(output_dir), rank
        self.requested = False  # this rank was asked (SIGTERM, STOP_FILE, its time is up)
        self.agreed = False  # some rank was, as of the last step: every rank stops after it
        self.minutes = exit_after_minutes
        self.deadline = None if exit_after_minutes is None else STARTED + 60 * exit_after_minutes
        self.reason = "SIGTERM"  # what asked, as rank 0 saw it

    def install(self) -> None:
        """Take over SIGTERM. A stop asked of an earlier launch is not one asked of this one: its
        PREEMPTED_FILE goes, and so does its STOP_FILE where no launcher watches this one (a rank
        started directly, e.g. by srun). Under the launch (launch/pretrain.sh) it has removed both before
        the ranks started, and a STOP_FILE found now is a stop asked during the start-up: it stays,
        and the first step stops."""
        for signum in REASONS:
            signal.signal(signum, self._take_note)
        if _requested:  # asked during the start-up of a world of several ranks: they stop after the first step
            self.requested, self.reason = True, _requested
        if self.rank == 0:
            (self.folder / PREEMPTED_FILE).unlink(missing_ok=True)
            if not os.environ.get(LAUNCHER_OWNS_STOP_FILE):
                (self.folder / STOP_FILE).unlink(missing_ok=True)

    def _take_note(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            at_once()
        self.requested = True
        self.reason = REASONS[signal.Signals(signum)]

    def asked(self) -> bool:
        """Whether this rank was asked to stop (rank 0 also reads STOP_FILE, which names what asked)."""
        if self.rank == 0 and not self.requested and (self.folder / STOP_FILE).exists():
            self.requested = True
            with contextlib.suppress(OSError):
                self.reason = (self.folder / STOP_FILE).read_text().strip() or self.reason
        if not self.requested and self.deadline is not None and time.monotonic() >= self.deadline:
            self.requested, self.reason = True, f"train.exit_after_minutes={self.minutes:g}"
        return self.requested

    @property
    def why(self) -> str:
        return self.reason if self.requested else "another rank's stop request"

    def record(self, step: int, tag: str | None) -> None:
        """Rank 0: the stop was graceful, after `step`, with checkpoint `tag` (None: none saved)."""
        if self.rank == 0:
            (self.folder / STOP_FILE).unlink(missing_ok=True)
            replace_text(self.folder / PREEMPTED_FILE, json.dumps({"step": step, "checkpoint": tag,
                                                                   "reason": self.why}) + "\n")
