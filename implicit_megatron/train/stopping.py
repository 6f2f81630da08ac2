"""A rank's stop signals, taken once at its start (implicit_megatron.run_control), and the checks of
its start-up.

A stop asked during the start-up (a signal, or one the launch took before it became this rank) is
checked between the start-up's stages (config, run lock, model and engine, before the first step):
a process alone ends there, with nothing saved; ranks of a larger world carry the request to their
first step and stop together after it (a rank leaving alone left the others waiting for it in the
rendezvous, as under `srun`, where each task gets the signal at its own moment of the start-up).
Once training runs, the preemption callback (train/callbacks/preemption.py) reads the same signals.
A second Ctrl-C stops the process at once.
"""

from __future__ import annotations

import os
import time

from implicit_megatron.run_control import SECOND_INTERRUPT, StopSignals, install_stop_signals

STARTED = time.monotonic()  # this rank's start (the module is imported first thing): exit_after_minutes counts from it
_signals: StopSignals | None = None


class StoppedDuringStartUp(BaseException):  # noqa: N818 - a stop, not an error: no "except Exception" holds it
    """A stop asked before the first step: nothing to save; the launch ends as a graceful stop."""


def at_once(reason: str) -> None:
    """A second Ctrl-C, or SIGQUIT: stop now, without saving (what the first Ctrl-C asked for takes a step)."""
    os.write(2, f"[train] stopped at once by {reason}: what was trained since the last checkpoint is lost\n".encode())
    os._exit(130 if reason == SECOND_INTERRUPT else 131)  # 128 + SIGINT, 128 + SIGQUIT


def signals() -> StopSignals:
    """This rank's stop signals, taken on the first call (the rank's entry calls it first thing)."""
    global _signals
    if _signals is None:
        _signals = install_stop_signals(at_once=at_once)
    return _signals


def requested() -> str | None:
    """What asked for a stop (None: nothing)."""
    return signals().asked()


def check() -> None:
    """Raise StoppedDuringStartUp when a stop was asked of a process that trains alone (WORLD_SIZE 1);
    in a larger world the request waits for the first step."""
    if requested() and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        raise StoppedDuringStartUp
