"""launch/curriculum.sh as a user runs it: the tiny two-phase curriculum, each phase its own launch
(bounded: 2 CPU processes, ZeRO-2; free: 1 process, ZeRO-3); re-running skips and resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from support.processes import ROOT, child_env, faults, free_port, signal_job

from implicit_megatron.launch.curriculum import plan
from implicit_megatron.run_control import RunEnd

CONFIG = "configs/tiny/mamba2-curriculum.yaml"


def curriculum(*args: str, config: str = CONFIG, timeout: int = 400, **env: str) -> subprocess.CompletedProcess:
    env = child_env(PYTHON=sys.executable, MASTER_PORT=str(free_port()), **env)
    return subprocess.run(["bash", "launch/curriculum.sh", config, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_bad_phase_setting_is_refused_before_any_launch(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {ROOT / CONFIG}\ncurriculum:\n  phases:\n"
                   "    - {name: bounded, kind: bounded, fraction: 0.8, max_iter: 4, phantom_steps: 1}\n"
                   "    - {name: free, kind: free, fraction: 0.2, max_iter: 24, phantom_steps: 4, tol: 0.05,\n"
                   "       zero_stage: 4}\n")
    out = tmp_path / "run"
    result = curriculum(f"train.output_dir={out}", config=str(bad))
    assert result.returncode == 2
    assert f"{bad}: curriculum.phases[1].zero_stage: expected one of 0, 1, 2, 3, got 4" in result.stderr
    assert "[curriculum]" not in result.stdout and not out.exists()  # the first phase never started


@pytest.mark.distributed
@pytest.mark.slow
def test_two_phase_curriculum_end_to_end(shakespeare_shards, tmp_path):
    args = [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={tmp_path}",
            "train.steps=10", "train.eval_interval=100", "train.log_interval=1", "tracking.enabled=false"]
    # The free phase dies after writing its last checkpoint, before `latest` names it.
    crashed = curriculum(*args, **faults(crash_before_latest="free-step10"))
    assert crashed.returncode != 0
    assert "phase bounded: starting with GPUS_PER_NODE=2 NPROC=2" in crashed.stdout
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "bounded-step8"

    # SIGTERM to the curriculum while the free phase's launch is starting (the handoff converted the
    # bounded checkpoint; its first step has not run): honoured after that step, with a checkpoint.
    env = child_env(PYTHON=sys.executable, MASTER_PORT=str(free_port()), **faults(hold_start_up="free"))
    proc = subprocess.Popen(["bash", "launch/curriculum.sh", CONFIG, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 300
    while not (tmp_path / "start-up-held").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # to curriculum.sh alone, as `docker stop` sends it
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "phase bounded: finished, skipped" in out
    assert "phase free: starting with GPUS_PER_NODE=1 NPROC=1" in out
    assert "bounded-step8 (handoff/load, universal)" in out  # 2 processes ZeRO-2 -> 1 process ZeRO-3
    assert RunEnd.read(tmp_path).checkpoint == "free-step9"
    assert "[curriculum] phase free: stopped early with a checkpoint" in out

    result = curriculum(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "free-step9 (resume, native)" in result.stdout
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "free-step10"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "train/loss" in r][-1]
    assert last["step"] == 10 and last["train/consumed_samples"] == 80
    assert last["solver/iterations"] > 4  # the free phase's solver, not the bounded phase's 4 passes

    again = curriculum(*args)
    assert again.returncode == 0
    assert "phase bounded: finished, skipped" in again.stdout and "phase free: finished, skipped" in again.stdout


@pytest.mark.distributed
def test_a_stopped_phase_ends_the_curriculum_and_resumes_next_time(shakespeare_shards, tmp_path):
    """SIGTERM to the whole job (as SLURM sends it) while the bounded phase trains: the phase saves
    and stops, the curriculum exits 0 without starting the free phase, and says how to resume."""
    args = [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={tmp_path}",
            "train.steps=400", "train.eval_interval=1000", "train.log_interval=1", "tracking.enabled=false",
            "checkpoint.interval=1000"]
    env = child_env(PYTHON=sys.executable, MASTER_PORT=str(free_port()))
    proc = subprocess.Popen(["bash", "launch/curriculum.sh", CONFIG, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    metrics, deadline = tmp_path / "metrics.jsonl", time.time() + 180
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.1)
    signal_job(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    stopped = RunEnd.read(tmp_path)
    assert stopped.stopped and stopped.checkpoint == f"bounded-step{stopped.step}"
    assert "[curriculum] phase bounded: stopped early with a checkpoint" in out
    assert "launch the curriculum again to resume it" in out
    assert "phase free: starting" not in out and "every phase" not in out
    planned = plan(str(ROOT / CONFIG), args)
    assert [(phase.name, phase.done) for phase in planned] == [("bounded", False), ("free", False)]
