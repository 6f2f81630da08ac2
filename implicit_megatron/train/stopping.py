"""SIGTERM while a rank starts up: remembered, and acted on at the next safe point.

Raising from a signal handler interrupts whatever runs at that moment, a C extension's
initialisation included (it crashed the process); the handler here only takes note, and start-up
asks `check()` between its stages (config, run lock, model and engine, before the first step).
Once training runs, Trainer.fit's own handler takes over: the stop is agreed between steps and a
checkpoint saved.
"""

from __future__ import annotations

import signal

_requested = False


class StoppedDuringStartUp(BaseException):  # noqa: N818 - a stop, not an error: no "except Exception" holds it
    """SIGTERM before the first step: nothing to save; the launch ends as a graceful stop."""


def install() -> None:
    signal.signal(signal.SIGTERM, _take_note)


def _take_note(signum, frame) -> None:
    global _requested
    _requested = True


def check() -> None:
    """Raise StoppedDuringStartUp when a SIGTERM has come."""
    if _requested:
        raise StoppedDuringStartUp
