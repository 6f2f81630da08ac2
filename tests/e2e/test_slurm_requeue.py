"""launch/examples/slurm.sbatch requeues its job when the run stopped gracefully (here:
train.exit_after_minutes), and not when it failed or finished. SLURM's commands are stand-ins on
PATH: `srun` runs its one task here, `scontrol` records what it was asked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.processes import ROOT, child_env, faults, free_port

from implicit_megatron.run_control import RunEnd

SRUN = """#!/usr/bin/env bash
# one task on this machine: srun's options dropped
while [ "${1#--}" != "$1" ]; do shift; done
exec "$@"
"""
SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$SCONTROL_LOG"
if [ "$1 $2" = "show hostnames" ]; then echo 127.0.0.1; fi
"""


def sbatch(tmp_path: Path, out: Path, shards: str, *extra: str, **env: str) -> subprocess.CompletedProcess:
    """The batch script as SLURM would run it on the allocation's first node."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    args = ["configs/tiny/mamba2-implicit.yaml", f"data.prefixes=[{shards}]", "data.source=null",
            f"train.output_dir={out}", "train.steps=3", "train.log_interval=1", "checkpoint.interval=1",
            "train.eval_interval=1000", "tracking.enabled=false", "schedule.warmup_steps=1", *extra]
    environment = child_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SCONTROL_LOG=str(tmp_path / "scontrol"),
                            SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node001", SLURM_SUBMIT_DIR=str(ROOT),
                            NPROC="1", MASTER_PORT=str(free_port()), **env)
    return subprocess.run(["bash", str(ROOT / "launch/examples/slurm.sbatch"), *args], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=300)


def requeues(tmp_path: Path) -> list[str]:
    log = tmp_path / "scontrol"
    return [line for line in (log.read_text().splitlines() if log.is_file() else []) if line.startswith("requeue")]


@pytest.mark.distributed
def test_a_graceful_stop_requeues_the_job_a_failure_or_a_finish_does_not(shakespeare_shards, tmp_path):
    out = tmp_path / "run"
    stopped = sbatch(tmp_path, out, shakespeare_shards, "train.exit_after_minutes=0.001")
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    assert "stopped by train.exit_after_minutes=0.001 after step 1; launch again to resume" in stopped.stdout
    record = RunEnd.read(out)
    assert record.stopped and record.reason == "train.exit_after_minutes=0.001" and record.step == 1
    assert requeues(tmp_path) == ["requeue 4242"]
    assert "requeueing job 4242" in stopped.stdout

    failed = sbatch(tmp_path, out, shakespeare_shards, "train.max_nonfinite_in_row=1",
                    **faults(nan_loss_at_step=2))
    assert failed.returncode != 0 and requeues(tmp_path) == ["requeue 4242"]  # not again
    assert RunEnd.read(out).outcome == "failed"

    finished = sbatch(tmp_path, out, shakespeare_shards)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "starting from" in finished.stdout and "done at step 3" in finished.stdout
    assert requeues(tmp_path) == ["requeue 4242"]
