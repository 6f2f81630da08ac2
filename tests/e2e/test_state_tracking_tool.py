"""tools/state_tracking.py end to end at toy size: both kinds of model train through the launcher
and the table reports every evaluation set; a finished sweep is not trained again."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT, child_env, free_port


def sweep(out, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "tools/state_tracking.py", "--models", "explicit-1l,implicit", "--algebra", "A5",
           "--length", "8", "--eval-lengths", "12", "--steps", "4", "--batch", "8", "--d-model", "32",
           "--output", str(out), "task.word_problem.eval_words=16", "train.log_interval=1", "implicit.eval_factor=4",
           *extra]
    return subprocess.run(cmd, cwd=ROOT, env=child_env(MASTER_PORT=str(free_port())), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_state_tracking_sweep(tmp_path):
    result = sweep(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == ("| model | train acc | acc p=0.1 L=8 | acc p=0.5 | acc L=12 | test passes (ID) | "
                       "test passes (OOD) |")
    explicit, implicit = rows[1].split(" | "), rows[2].split(" | ")
    assert explicit[0] == "| explicit-1l" and implicit[0] == "| implicit"
    assert float(explicit[-2]) == 1.0  # one pass of the explicit model
    assert 1.0 < float(implicit[-2]) <= 128  # the fixed point decides, up to 4 x 32 passes here
    assert all(0.0 <= float(cell) <= 1.0 for cell in explicit[1:5] + implicit[1:5])
    again = sweep(tmp_path)
    assert again.returncode == 0 and again.stdout.count("not trained again") == 2
