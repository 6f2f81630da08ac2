"""implicit_megatron.research.train_progress: a child's `[train] step` lines shown while it runs (a bar on
a terminal, throttled lines in a log), its warnings passed on, its output's tail and exit status kept."""

from __future__ import annotations

import io
import sys
import time

import pytest

from implicit_megatron.research.train_progress import StepProgress, run_with_progress

CHILD = """
import sys, time
print("[train] phase warmup: 4 unrolled damped passes", flush=True)
for step in range(1, 5):
    print(f"[train] step {step}/4  loss {1.0 / step:.4g}  lr 0.001", flush=True)
    if step == 2:
        print("[train] warning: the solver converged in no step of the last 5 intervals", flush=True)
print("[train] step 4/4  loss 0.31  accuracy 0.5", flush=True)  # the same step again: shown once
print("Traceback: something broke", file=sys.stderr, flush=True)
sys.exit(3)
"""


class Timed(io.StringIO):
    """A log that notes when each piece was written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.writes.append((time.monotonic(), text))
        return super().write(text)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.processes
def test_a_log_gets_the_first_and_last_step_and_warnings_and_the_tail_comes_back():
    shown = io.StringIO()
    result = run_with_progress([sys.executable, "-c", CHILD], "[state_tracking] implicit seed 0", stream=shown)
    assert result.returncode == 3
    assert result.stdout.splitlines()[0] == "[train] phase warmup: 4 unrolled damped passes"
    assert result.stdout.splitlines()[-1] == "Traceback: something broke"  # stderr is kept in the tail
    assert shown.getvalue().splitlines() == [
        "[state_tracking] implicit seed 0: step 1/4  loss 1",
        "[state_tracking] implicit seed 0: [train] warning: the solver converged in no step of the last 5 intervals",
        "[state_tracking] implicit seed 0: step 4/4  loss 0.25"]


@pytest.mark.processes
def test_lines_are_shown_as_they_arrive_not_when_the_child_ends(tmp_path):
    """The child prints step 1, then waits for the test to have seen it (a file the stream makes on
    that line) before it prints step 2 and ends; a progress that showed lines only at the end would
    leave it waiting, and it would end with status 3 instead."""
    seen = tmp_path / "step-1-shown"

    class Watching(io.StringIO):
        def write(self, text: str) -> int:
            if "step 1/2" in text:
                seen.touch()
            return super().write(text)

    child = (f"import os, sys, time\nprint('[train] step 1/2  loss 1', flush=True)\n"
             f"deadline = time.monotonic() + 60\n"
             f"while not os.path.exists({str(seen)!r}):\n"
             f"    if time.monotonic() > deadline: sys.exit(3)\n"
             f"    time.sleep(0.01)\n"
             f"print('[train] step 2/2  loss 1', flush=True)")
    shown = Watching()
    assert run_with_progress([sys.executable, "-c", child], "run", stream=shown, every=0.0).returncode == 0
    assert shown.getvalue().splitlines() == ["run: step 1/2  loss 1", "run: step 2/2  loss 1"]


def test_a_terminal_gets_a_bar():
    terminal = Terminal()
    progress = StepProgress("run", terminal, every=30.0)
    for line in ("[train] step 1/4  loss 2.0", "[train] step 3/4  loss 1.5", "[train] step 3/4  loss 1.4"):
        progress.line(line)
    progress.close()
    text = terminal.getvalue()
    assert "3/4" in text and "loss 1.5" in text and "loss 1.4" not in text


def test_the_piped_log_line_format_is_read_too():
    log = io.StringIO()
    progress = StepProgress("run", log, every=30.0)
    progress.line("[train] step 1,200/16,384 | loss 4.5123 | lr 3.00e-04 | passes 5.0 res 3.1e-03 conv 100% | "
                  "412 ms/step | 0:04:12 elapsed, ETA 0:30:11\n")
    progress.line("[train] val      step 1,200 | loss 4.2010 | ppl 66.74\n")
    progress.line("[train] step 16,384/16,384 | loss 3.9000 | 2:04:12 elapsed, ETA 0:00:00\n")
    assert log.getvalue().splitlines() == ["run: step 1200/16384  loss 4.5123  ETA 0:30:11",
                                           "run: step 16384/16384  loss 3.9000"]
