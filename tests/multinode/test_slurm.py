"""`sbatch launch/examples/slurm.sbatch` on a SLURM cluster of two test nodes for real (slurmctld,
slurmd and munged: tests/support/slurm.py): the example submits on a cluster without GPUs, two nodes
of one task train exactly as one node of two processes, and a SIGTERM to the job's tasks at any
moment (its start-up included) stops every rank with a checkpoint, requeues the job, and the next
allocation resumes to the same losses."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from support.nodes import Nodes, missing
from support.reference_runs import TINY, zero1_overrides
from support.slurm import TOOLS, Slurm

absent = missing() or next((f"not installed: {tool} (bash scripts/install_cluster_tools.sh)" for tool in TOOLS
                            if shutil.which(tool, path="/usr/bin:/usr/sbin:/bin:/sbin") is None), None)
pytestmark = [pytest.mark.distributed, pytest.mark.skipif(absent is not None, reason=absent or "")]


@pytest.fixture
def slurm(tmp_path):
    with Nodes(tmp_path / "nodes") as nodes, Slurm(nodes, tmp_path / "slurm") as cluster:
        yield cluster


def losses(out: Path) -> dict[int, float]:
    metrics = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


def submit(slurm: Slurm, log: Path, *overrides: str, **env: str) -> int:
    """Two nodes of one task each, resources on sbatch's command line as the example's header says."""
    return slurm.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={log}", "launch/examples/slurm.sbatch",
                        TINY, *overrides, PYTHON=sys.executable, OMP_NUM_THREADS="1", **env)


def test_two_nodes_of_one_task_train_as_one_node_of_two(slurm, zero1_run, shakespeare_shards, tmp_path):
    """The example's header asks for no GPU (a cluster without gres takes it), and the reference run
    (torchrun, one node, two processes) is repeated bit for bit."""
    out, log = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, log, *zero1_overrides(shakespeare_shards, out))
    info = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), 240)
    assert info["JobState"] == "COMPLETED", log.read_text()[-3000:]
    assert losses(out) == losses(zero1_run) and len(losses(out)) == 12
    assert "requeue" not in log.read_text()


def test_a_sigterm_at_start_up_stops_every_rank_and_the_requeued_job_resumes(slurm, zero1_run, shakespeare_shards,
                                                                             tmp_path):
    """`scancel --signal=TERM` as rank 0 takes the run's folder: each task gets the signal at its own
    moment of the start-up (rank 1 may be in the rendezvous already). Every rank trains its first step,
    saves and exits 0; the job requeues itself, and the next allocation resumes to the reference's losses."""
    out, log = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, log, *zero1_overrides(shakespeare_shards, out))
    slurm.wait_until(lambda: (out / "run.lock").exists(), "the start-up of rank 0", 120)
    slurm.run("scancel", "--signal=TERM", str(job))
    info = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), 300, skip_delay=True)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", text[-3000:]
    assert "stopped by SIGTERM after step 1" in text and f"requeueing job {job}" in text
    assert "bounded-step1 (resume, native)" in text
    assert losses(out) == losses(zero1_run)  # the step before the stop, then the resume, as one run
