"""Whether a process is still running, and a watchdog that ends a worker whose parent has died.

A worker blocked on its task queue never notices that the process that fed it was killed (`kill -9`
leaves it waiting forever, dozens of them with many workers on a shared node); and a killed process
that nobody has reaped yet, a zombie, still answers to its process id.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, ...] (Linux); None where unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: tells a reused process id apart."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def process_running(pid: int, ticks: int | None = None) -> bool:
    """Running (not a zombie), and when `ticks` is given the same process that had them."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process with that id
    fields = stat_fields(pid)
    if fields is None:
        return True
    return fields[0] not in ("Z", "X") and (ticks is None or int(fields[19]) == ticks)


LAST_WORDS_SECONDS = 10.0  # the most `before_exit` may take before the process ends anyway


def exit_when_gone(pid: int, every: float = 1.0, message: str | None = None,
                   before_exit: Callable[[], None] | None = None, code: int = 1) -> None:
    """In a worker: a daemon thread that ends this process (exit status `code`) once `pid` (its feeder)
    is gone, saying `message` on standard error first, then running `before_exit` (a record the process
    would have made had it ended its own way; bounded by LAST_WORDS_SECONDS, its failure ignored)."""
    ticks = start_ticks(pid)

    def watch() -> None:
        while process_running(pid, ticks):
            time.sleep(every)
        if message:
            os.write(2, (message + "\n").encode())
        if before_exit is not None:
            threading.Timer(LAST_WORDS_SECONDS, os._exit, (code,)).start()
            with contextlib.suppress(BaseException):  # ending is what matters now
                before_exit()
        os._exit(code)

    threading.Thread(target=watch, name="exit-when-parent-dies", daemon=True).start()
