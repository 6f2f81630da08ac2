"""The launch's half of run control, at its seam: the launch, a curriculum and a SLURM job, each run
for real against a stand-in for its ranks (support/stand_in_launch.py). Every stop signal
run_control names is the graceful stop under each of them; each ends with what its ranks said."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support.stand_in_launch import finish, start, started

from implicit_megatron.run_control import STOP_ASKED, STOP_SIGNALS, RunEnd

pytestmark = pytest.mark.processes
LAUNCHES = ("pretrain", "curriculum", "slurm")


def requeued(folder) -> bool:
    log = folder / "scontrol"
    return log.is_file() and "requeue 77" in log.read_text().splitlines()


@pytest.mark.parametrize("which", LAUNCHES)
@pytest.mark.parametrize("signum", list(STOP_SIGNALS), ids=lambda s: signal.Signals(s).name)
def test_every_stop_signal_is_the_graceful_stop_of_every_launch(which, signum, tmp_path):
    proc = start(which, "stop", tmp_path)
    started(proc, tmp_path)
    os.kill(proc.pid, signum)
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    end = RunEnd.read(tmp_path)
    assert end is not None and end.stopped and end.reason == STOP_SIGNALS[signum], out[-3000:]
    if which == "curriculum":
        assert "[curriculum] phase bounded: stopped early with a checkpoint" in out
        assert "phase free: starting" not in out and "launch the curriculum again to resume it" in out
    assert requeued(tmp_path) == (which == "slurm"), out[-3000:]
    if which == "slurm":
        assert "slurm.sbatch: stopped gracefully" in out and "requeueing job 77" in out


@pytest.mark.parametrize("which", LAUNCHES)
def test_a_stop_taken_before_the_launch_starts_no_rank(which, tmp_path):
    """A front door's trap hands on a stop it took while it set up (run_control.STOP_ASKED)."""
    name = signal.Signals(list(STOP_SIGNALS)[-1]).name
    code, out = finish(start(which, "finish", tmp_path, **{STOP_ASKED: name}))
    reason = STOP_SIGNALS[signal.Signals[name]]
    assert code == 0 and not (tmp_path / "rank-started").exists(), out[-3000:]
    said = f"stopped by {reason} before phase bounded" if which == "curriculum" else \
        f"stopped by {reason} before the ranks started"
    assert said in out, out[-3000:]
    assert requeued(tmp_path) == (which == "slurm")


@pytest.mark.parametrize("which", LAUNCHES)
@pytest.mark.parametrize("behaviour,status", [("finish", 0), ("fail", 1), ("refuse", 2), ("orphan", 3)])
def test_a_launch_ends_with_the_status_its_ranks_ended_with(which, behaviour, status, tmp_path):
    code, out = finish(start(which, behaviour, tmp_path))
    assert code == status, out[-3000:]
    assert RunEnd.read(tmp_path).exit_status == status
    assert not requeued(tmp_path)  # only a graceful stop requeues
    if which == "curriculum":  # each phase a launch of its own: the next starts after a finish only
        assert ("phase free: starting with GPUS_PER_NODE=1 NPROC=1" in out) == (status == 0), out[-3000:]
        assert ("every phase of" in out) == (status == 0)


@pytest.mark.parametrize("which", ["pretrain", "curriculum"])
def test_a_second_ctrl_c_ends_the_launch_at_once(which, tmp_path):
    proc = start(which, "hang", tmp_path)
    started(proc, tmp_path)
    os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while not (tmp_path / "stop-requested").exists():  # the first: the graceful stop asked
        assert proc.poll() is None and time.monotonic() < deadline, finish(proc, timeout=1)[1][-3000:]
    os.kill(proc.pid, signal.SIGINT)
    code, out = finish(proc)
    assert code == 130, out[-3000:]
    assert "stopped at once by a second Ctrl-C" in out and "Traceback" not in out, out[-3000:]
    assert out.count("is lost") == 1, out[-3000:]  # the end said once


@pytest.mark.parametrize("which", ["pretrain", "curriculum"])
def test_a_launcher_killed_by_a_signal_is_said_by_the_launch_once(which, tmp_path):
    """torchrun killed (the OOM killer, an admin): its ranks, in sessions of their own, record the end
    and leave the saying to the launch, which is alive: one line, naming the launcher."""
    code, out = finish(start(which, "killed", tmp_path))
    assert code != 0, out[-3000:]
    ends = [line for line in out.splitlines() if "is lost" in line]
    assert len(ends) == 1 and "the launcher of the ranks (process " in ends[0], out[-3000:]
    assert ends[0].endswith("is gone (killed): this launch ends here, what was trained since the last checkpoint "
                            "is lost"), ends


def test_each_phase_launches_with_the_processes_it_names(tmp_path):
    code, out = finish(start("curriculum", "finish", tmp_path))
    assert code == 0, out[-3000:]
    assert "phase bounded: starting with GPUS_PER_NODE=2 NPROC=2" in out
    assert (tmp_path / "rank-started").read_text().split()[1] == "1"  # the free phase's launch: NPROC=1


@pytest.mark.parametrize("which", LAUNCHES)
def test_sigquit_ends_the_launch_at_once_in_one_line(which, tmp_path):
    """SIGQUIT (Ctrl-\\) means quit now: as a second Ctrl-C, the launcher's ranks are killed at once and
    the end said in one line naming it, exit 131; no traceback, no core."""
    proc = start(which, "hang", tmp_path)
    started(proc, tmp_path)
    os.kill(proc.pid, signal.SIGQUIT)
    code, out = finish(proc)
    assert code == 128 + signal.SIGQUIT, out[-3000:]
    ends = [line for line in out.splitlines() if "is lost" in line]
    assert len(ends) == 1 and "stopped at once by SIGQUIT (Ctrl-\\)" in ends[0], out[-3000:]
    assert "Traceback" not in out and not (tmp_path / "stop-requested").exists(), out[-3000:]
    assert not requeued(tmp_path)  # not a graceful stop: the job is not requeued
