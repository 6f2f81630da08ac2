"""A launch's start-up, before its ranks: a stop signal is the launch's from its first moments, and
the one plan a SLURM job reads of its config cannot be split by the characters a path may hold."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT, child_env
from support.stand_in_launch import finish, start

# Runs an entry as `python -m` does, noting which of the project's modules were imported when the
# first stop signal's handler was set: everything before it is time in which a signal kills silently.
SPY = """
import runpy, signal, sys
from implicit_megatron.run_control import STOP_SIGNALS
seen = []
taken = signal.signal
def spy(signum, handler):
    if signum in STOP_SIGNALS and not seen:
        seen.append(sorted(m for m in sys.modules if m.startswith(("implicit_megatron", "yaml", "data_pipeline"))))
        print("IMPORTED " + " ".join(seen[0]), flush=True)
        sys.exit(0)
    return taken(signum, handler)
signal.signal = spy
sys.argv = [sys.argv[1], "configs/tiny/mamba2-curriculum.yaml"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
LIGHT = {"implicit_megatron", "implicit_megatron.run_control", "implicit_megatron.launch",
         "implicit_megatron.utils", "implicit_megatron.utils.received_file", "implicit_megatron.utils.safe_write"}


@pytest.mark.processes
@pytest.mark.parametrize("module", ["implicit_megatron.launch", "implicit_megatron.launch.curriculum"])
def test_a_launch_takes_the_stop_signals_before_its_imports(module):
    """SIGTERM while a launch imports its config reader (a second or more on a busy node) killed it
    with no word; its handlers are set first, so a stop then is a stop asked before the ranks."""
    shown = subprocess.run([sys.executable, "-c", SPY, module], cwd=ROOT, env=child_env(), capture_output=True,
                           text=True, timeout=120)
    line = next((x for x in shown.stdout.splitlines() if x.startswith("IMPORTED")), None)
    assert line is not None, shown.stdout[-2000:] + shown.stderr[-2000:]
    heavy = set(line.split()[1:]) - LIGHT - {m for m in line.split()[1:] if m.startswith("implicit_megatron.hf")}
    assert not heavy, sorted(heavy)


@pytest.mark.processes
@pytest.mark.parametrize("which", ["slurm", "curriculum"])
@pytest.mark.parametrize("char", ["\u2028", "\u0085", "\u2029"])
def test_an_output_folder_holding_a_line_separator_is_one_folder(which, char, tmp_path):
    """The job reads the config's output folder back as text: a character `splitlines` takes for a
    line end (U+2028, U+0085, U+2029) must not make it a curriculum of several launches."""
    folder = tmp_path / f"run{char}end"
    code, out = finish(start(which, "finish", folder))
    assert code == 0 and "is a curriculum" not in out, out[-3000:]
