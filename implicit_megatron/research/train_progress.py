"""A training launch run as a child process, its progress shown while it trains.

Tools that train runs one after another (tools/research/state_tracking.py) used to capture a launch's output
until it ended, so nothing showed for minutes or hours. Here the child's output is read line by
line as it comes: its `[train] step N/TOTAL ...` lines drive a progress bar on a terminal, or, in a
log file, a line `LABEL: step N/TOTAL  loss X` for the first step, the last, and at most one every
`every` seconds between; its `[train] warning:` lines are passed on. Everything goes to stderr (or
`stream`). The tail of the output (stdout and stderr together) comes back for error reports.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

STEP_LINE = re.compile(r"\[train\] step ([\d,]+)/([\d,]+)\s*(.*)")  # "step 1,200/16,384 | loss 4.51 | ..."
LOSS = re.compile(r"\bloss ([^\s|]+)")
ETA = re.compile(r"\bETA ([^\s|,]+)")
TAIL_LINES = 400


class StepProgress:
    """Shows `[train] step` lines: a tqdm bar where `stream` is a terminal, throttled lines elsewhere."""

    def __init__(self, label: str, stream: TextIO, every: float) -> None:
        self.label, self.stream, self.every = label, stream, every
        self.step = 0
        self.shown_at: float | None = None
        self.bar: tqdm | None = None
        self.terminal = hasattr(stream, "isatty") and stream.isatty()

    def line(self, text: str) -> None:
        """One line of the child's output."""
        match = STEP_LINE.search(text)
        if match:
            rest = match.group(3)
            self.advance(int(match.group(1).replace(",", "")), int(match.group(2).replace(",", "")),
                         LOSS.search(rest), ETA.search(rest))
        elif "[train] warning:" in text:
            self.say(f"{self.label}: {text.strip()}")

    def advance(self, step: int, total: int, loss: re.Match | None, eta: re.Match | None = None) -> None:
        if step <= self.step:  # steps only move forward: a line repeated is shown once
            return
        self.step = step
        loss_text = f"loss {loss.group(1)}" if loss else ""
        if self.terminal:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=self.label, unit="step", file=self.stream, dynamic_ncols=True)
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(loss_text, refresh=True)
            return
        now = time.monotonic()
        if self.shown_at is None or step >= total or now - self.shown_at >= self.every:
            self.shown_at = now
            extra = [text for text in (loss_text, eta and step < total and f"ETA {eta.group(1)}") if text]
            self.say(f"{self.label}: step {step}/{total}" + "".join(f"  {text}" for text in extra))

    def say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_with_progress(cmd: list[str], label: str, stream: TextIO | None = None, every: float = 30.0,
                      **popen) -> subprocess.CompletedProcess:
    """Run `cmd` (Popen keywords: cwd, env, ...) showing its training progress; returns its exit
    status and, as stdout, the last TAIL_LINES lines of its output (stderr merged into it). Like
    subprocess.run, an interrupt or error here kills the child."""
    stream = sys.stderr if stream is None else stream
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    progress = StepProgress(label, stream, every)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          errors="replace", **popen) as proc:
        try:
            assert proc.stdout is not None  # stdout=PIPE
            for text in proc.stdout:
                tail.append(text)
                progress.line(text)
            returncode = proc.wait()
        except BaseException:
            proc.kill()
            raise
        finally:
            progress.close()
    return subprocess.CompletedProcess(cmd, returncode, "".join(tail), "")
