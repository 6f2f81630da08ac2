"""launch/pretrain.sh and launch/curriculum.sh stay front doors: they find or set up the Python and
hand over to the launch in Python, where run control has its one owner (docs/training.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from implicit_megatron.run_control import STOP_ASKED, STOP_SIGNALS

LAUNCH = Path(__file__).resolve().parents[3] / "launch"


@pytest.mark.parametrize("script,module", [("pretrain.sh", "implicit_megatron.launch"),
                                           ("curriculum.sh", "implicit_megatron.launch.curriculum")])
def test_a_front_door_is_at_most_40_lines_and_ends_in_the_python_launch(script, module):
    lines = [line.strip() for line in (LAUNCH / script).read_text().splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    assert len(code) <= 40, f"{script}: {len(code)} lines that are not comments; run control belongs in Python"
    assert code[-1] == f'exec "$PYTHON" -m {module} "$@"'
    control = ("setsid", "awk", "kill ", "wait ", "torchrun", "--num_gpus")  # the launch's own work, in Python
    assert not any(word in line for line in code for word in control)


@pytest.mark.processes
@pytest.mark.parametrize("script", ["pretrain.sh", "curriculum.sh", "examples/slurm.sbatch"])
@pytest.mark.parametrize("signum", [s for s in STOP_SIGNALS if s != signal.SIGINT], ids=lambda s: s.name)
def test_a_front_door_takes_every_stop_signal_while_it_sets_up(script, signum):
    """A stop signal that comes while a front door sets up .venv is handed on to the launch, which
    then starts no rank: the traps are run_control's (a Ctrl-C reaches the set-up too, and ends it)."""
    (traps,) = [line for line in (LAUNCH / script).read_text().splitlines() if "--shell-traps" in line]
    shell = f'{traps}\nkill -{signum.name[3:]} $$\necho "asked=${{{STOP_ASKED}:-}}"'
    shown = subprocess.run(["bash", "-c", shell], cwd=LAUNCH.parent, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHON": sys.executable})
    assert shown.returncode == 0 and shown.stdout.strip() == f"asked={signum.name}", shown.stderr
