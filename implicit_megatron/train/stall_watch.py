"""Ending a rank that waits for the others too long, naming the rank, the step and what it was doing.

A rank that is stopped (SIGSTOP, a debugger), hung or cut off leaves the others blocked in a
collective: DeepSpeed makes its own process groups with torch's default timeouts (30 minutes on
gloo; NCCL's watchdog names no step), and a launcher sees no rank exit, so nothing ends the job.
Each rank runs this watch: the loop says what it starts (`doing`: a step, a validation, a save),
and when that has not finished within distributed.timeout_minutes the rank prints one line and
exits 1, which makes the launcher end every rank. The watch reads the clock, never the device.
"""

from __future__ import annotations

import os
import threading
import time


class StallWatch:
    def __init__(self, minutes: float, rank: int) -> None:
        self.limit, self.minutes, self.rank = 60.0 * minutes, minutes, rank
        self.what: str | None = None
        self.since = 0.0
        threading.Thread(target=self._watch, name="stall-watch", daemon=True).start()

    def doing(self, what: str) -> None:
        """From now, `what` (e.g. 'step 12') must end within the limit, or the next `doing` or `done` come."""
        self.what, self.since = what, time.monotonic()

    def done(self) -> None:
        self.what = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(5.0, max(self.limit / 10, 0.1)))
            what, since = self.what, self.since
            if what is not None and time.monotonic() - since > self.limit:
                os.write(2, f"[train] error on rank {self.rank}: {what} has not finished within "
                            f"distributed.timeout_minutes={self.minutes:g}: another rank has stopped, hung or lost its "
                            "connection (or this one is far slower than the others); ending the job\n".encode())
                os._exit(1)
