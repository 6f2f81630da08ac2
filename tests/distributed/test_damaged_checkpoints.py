"""A damaged checkpoint is named, export refuses it, and a resume falls back to the newest complete one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ROOT, run_torchrun
from support.reference_runs import losses, zero1_overrides

TINY = "configs/tiny/mamba2-implicit.yaml"


def export(checkpoints: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/convert_checkpoint.py", "export", str(checkpoints), str(out), *args],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.mark.distributed
def test_damaged_checkpoints_are_named_and_resume_falls_back(zero1_run, shakespeare_shards, tmp_path):
    run = Path(shutil.copytree(zero1_run, tmp_path / "run"))
    args = zero1_overrides(shakespeare_shards, run)
    straight = losses(zero1_run)
    checkpoints = run / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "free-step12"

    # Bytes changed on disk: export refuses by name and names the checkpoint to use instead.
    flipped = tmp_path / "flipped"
    shutil.copytree(checkpoints, flipped)
    states = flipped / "free-step12" / "mp_rank_00_model_states.pt"
    data = bytearray(states.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0x5A for b in data[middle:middle + 4096])
    states.write_bytes(bytes(data))
    refused = export(flipped, tmp_path / "export")
    assert refused.returncode == 2
    assert f"{states}: does not read back" in refused.stderr and "incomplete or corrupt" in refused.stderr
    assert "previous complete checkpoint is" in refused.stderr and "--tag bounded-step10" in refused.stderr
    assert not (tmp_path / "export").exists()
    assert export(flipped, tmp_path / "export", "--tag", "bounded-step10").returncode == 0

    # The newest checkpoint cut short and `latest` garbled: resume from the newest complete one.
    states = checkpoints / "free-step12" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[:1000])
    (checkpoints / "latest").write_bytes(b"\x00\xffstray")
    # (checkpoint.on_damaged=fail refuses instead: test_handoff.py::test_resume_never_starts_over_existing_checkpoints)
    resumed = run_torchrun("-m", "implicit_megatron.train", TINY, *args)
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    assert f"warning: {checkpoints / 'latest'}: does not hold a checkpoint tag name" in resumed.stdout
    assert f"warning: {states}: is 1000 bytes, the manifest says" in resumed.stdout
    assert f"resuming from {checkpoints / 'bounded-step10'}" in resumed.stdout
    again = losses(run)
    for step in (11, 12):  # the fallback repeats steps 11 and 12 exactly
        assert abs(again[step] - straight[step]) <= 1e-6, (step, again[step], straight[step])
    assert (checkpoints / "latest").read_text().strip() == "free-step12"
