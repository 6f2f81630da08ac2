"""`sbatch launch/examples/slurm.sbatch` on a SLURM cluster of two test nodes for real (slurmctld,
slurmd and munged: tests/support/slurm.py): the example submits on a cluster without GPUs; two nodes
of one task train exactly as one node of two processes; a node that dies ends the job naming it, and
the run resumes on the node left to the same losses; a SIGTERM to the job's tasks during their
start-up stops every rank after a step with a checkpoint, the job requeues itself, and the next
allocation resumes to the same losses."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from support.nodes import Nodes
from support.processes import faults
from support.reference_runs import TINY, losses, zero1_overrides
from support.slurm import Slurm, missing

pytestmark = [pytest.mark.distributed, pytest.mark.skipif(missing() is not None, reason=missing() or "")]


@pytest.fixture
def slurm(tmp_path):
    with Nodes(tmp_path / "nodes") as nodes, Slurm(nodes, tmp_path / "slurm") as cluster:
        yield cluster


def submit(slurm: Slurm, log: Path, *overrides: str, **env: str) -> int:
    """Two nodes of one task each, resources on sbatch's command line as the example's header says."""
    return slurm.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={log}", "launch/examples/slurm.sbatch",
                        TINY, *overrides, PYTHON=sys.executable, OMP_NUM_THREADS="1", **env)


def test_a_sigterm_at_start_up_or_mid_run_stops_every_rank_and_the_requeued_job_resumes(
        slurm, zero1_run, shakespeare_shards, tmp_path):
    """`scancel --signal=TERM` as rank 0 takes the run's folder: each task gets the signal at its own
    moment of the start-up (rank 1 may be in the rendezvous already). Every rank trains its first step,
    saves and exits 0; the job requeues itself. In the next allocation the same mid-run: a step, a
    checkpoint, a requeue; the third allocation completes the run to the reference's losses."""
    out, log = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, log, *zero1_overrides(shakespeare_shards, out), **faults(seconds_per_step=0.3))
    slurm.wait_until(lambda: (out / "run.lock").exists(), "the start-up of rank 0", 120)
    slurm.run("scancel", "--signal=TERM", str(job))

    def resumed_and_training() -> bool:
        if "bounded-step1 (resume, native)" in log.read_text() and max(losses(out), default=0) >= 4:
            return True
        slurm.skip_requeue_delay(job)
        return False

    slurm.wait_until(resumed_and_training, "the requeued job's steps", 300, every=1)
    slurm.run("scancel", "--signal=TERM", str(job))
    info = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), 300, skip_delay=True)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", text[-3000:]
    assert "stopped by SIGTERM after step 1" in text and text.count(f"requeueing job {job}") == 2
    stopped = [line for line in text.splitlines() if "stopped by SIGTERM after step" in line]
    assert len(stopped) == 2 and "after step 1" not in stopped[1]
    assert losses(out) == losses(zero1_run)  # the steps of three allocations, as one straight run


def test_a_lost_node_ends_the_job_naming_its_rank_and_one_node_resumes_to_the_same_losses(
        slurm, zero1_run, shakespeare_shards, tmp_path):
    """Two nodes of one task train as one node of two, bit for bit, until node2 dies after the
    checkpoint of step 6 (every process of it gone at once, slurmd too): rank 0 names its address, the
    job ends; the run resumes on the one node left, two tasks on it, and its losses are the reference's.
    The example is submitted with its resources on sbatch's command line (its header asks for no GPU,
    which a cluster without GPU gres refuses)."""
    out, log = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, log, *zero1_overrides(shakespeare_shards, out, "distributed.timeout_minutes=0.1"),
                 **faults(seconds_per_step=0.3))
    latest = out / "checkpoints" / "latest"
    slurm.wait_until(lambda: latest.is_file() and latest.read_text().strip() == "bounded-step6", "step 6's checkpoint",
                     180)
    slurm.nodes[1].kill()
    lost_at = time.monotonic()
    slurm.wait_until(lambda: slurm.state(job)["JobState"] not in ("RUNNING", "CONFIGURING"), "the job's end", 90,
                     every=1)
    ended = time.monotonic() - lost_at
    text = log.read_text()
    # node2's kernel closes its connections as it goes: rank 0's collective fails naming node2's
    # address (a node cut off instead, silent, is named by the stall watch: tests/multinode/test_pdsh.py)
    said = [line for line in text.splitlines() if line.startswith("error on rank 0")]
    assert said and f"[{slurm.nodes[1].address}]" in said[0], text[-3000:]
    assert "Node failure on node2" in text
    assert ended < 60, ended
    # two nodes of one task train as one node of two (the reference: torchrun, one node), bit for bit
    assert losses(out) == {step: loss for step, loss in losses(zero1_run).items() if step <= max(losses(out))}
    assert 6 <= max(losses(out)) < 12
    slurm.run("scancel", str(job))  # requeued after the node failure, it would wait for two nodes for ever
    slurm.wait_for(job, ("CANCELLED", "FAILED", "NODE_FAIL"), 60)

    again = slurm.sbatch("--nodes=1", "--ntasks-per-node=2", f"--output={tmp_path / 'resumed.out'}",
                         "launch/examples/slurm.sbatch", TINY, *zero1_overrides(shakespeare_shards, out),
                         PYTHON=sys.executable, OMP_NUM_THREADS="1")
    info = slurm.wait_for(again, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), 240)
    resumed = (tmp_path / "resumed.out").read_text()
    assert info["JobState"] == "COMPLETED", resumed[-3000:]
    assert "bounded-step6 (resume, native)" in resumed or "bounded-step10 (resume, native)" in resumed
    assert losses(out) == losses(zero1_run)
