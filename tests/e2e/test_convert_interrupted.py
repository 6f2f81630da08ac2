"""Ctrl-C during an export or a universal conversion, as a terminal sends it (to the whole foreground
process group, the converter's own processes included): one line and exit 130, nothing half-written
left, the checkpoint intact. It ended in tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import ROOT, child_env

pytestmark = pytest.mark.processes

SAID = ("convert_checkpoint: stopped by Ctrl-C: nothing was written (a folder there before is as it was; the "
        "checkpoint read is intact)\n")


def interrupted_when(command: list[str], appears) -> subprocess.CompletedProcess:
    """Run `command`; Ctrl-C to its process group as soon as `appears()` finds what it writes."""
    proc = subprocess.Popen([sys.executable, "tools/convert_checkpoint.py", *command], cwd=ROOT, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not appears():
        assert proc.poll() is None, f"ended before its work was seen: {proc.communicate()}"
        assert time.monotonic() < deadline, "its work never appeared"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def test_ctrl_c_during_an_export_is_one_line_and_leaves_nothing(tiny_run, tmp_path):
    out = tmp_path / "export"
    result = interrupted_when(["export", str(tiny_run.run_dir), str(out)],
                              lambda: any(tmp_path.glob(".export.partial-*")))
    assert (result.returncode, result.stderr) == (130, SAID), result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # no export, no hidden partial folder


def test_ctrl_c_during_a_universal_conversion_is_one_line_and_leaves_the_tag_as_it_was(zero1_run, tmp_path):
    import shutil

    run = Path(shutil.copytree(zero1_run, tmp_path / "run"))  # a ZeRO-1 run: its optimizer state is sharded
    checkpoints = run / "checkpoints"
    tag = checkpoints / (checkpoints / "latest").read_text().strip()
    before = sorted(p.name for p in tag.iterdir())
    result = interrupted_when(["universal", str(run)], lambda: (tag / ".universal.tmp").exists())
    assert (result.returncode, result.stderr) == (130, SAID), result.stderr[-3000:]
    assert sorted(p.name for p in tag.iterdir()) == before
    assert not list(checkpoints.glob(".*conversion-input"))  # the converter's staging, removed
