"""A rank that stops answering (SIGSTOP: a debugger, a frozen node) ends the whole job within
distributed.timeout_minutes, with one line naming the rank and the step it was waiting in; without
a limit the other ranks waited in their collective for ever and a launcher saw nothing to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
from support.processes import ROOT, child_env, kill_tree, torchrun_command

TINY = "configs/tiny/mamba2-implicit.yaml"


def logged_steps(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.distributed
def test_a_stopped_rank_ends_the_job_naming_the_rank_and_the_step(shakespeare_shards, tmp_path):
    args = [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={tmp_path}",
            "train.steps=100000", "train.log_interval=1", "train.eval_interval=100000", "checkpoint.interval=100000",
            "tracking.enabled=false", "distributed.timeout_minutes=0.1"]
    proc = subprocess.Popen(torchrun_command("-m", "implicit_megatron.train", TINY, *args), cwd=ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while logged_steps(tmp_path) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the run never trained"
            time.sleep(0.2)
        rank1 = next(p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1")
        os.kill(rank1.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        out, _ = proc.communicate(timeout=150)
        ended = time.monotonic() - stopped
    finally:
        kill_tree(proc.pid)
    assert proc.returncode != 0
    named = [line for line in out.splitlines() if line.startswith("[train] error on rank 0: step ")]
    assert named and "has not finished within distributed.timeout_minutes=0.1" in named[0], out[-3000:]
    step = int(named[0].split("step ")[1].split()[0])
    assert step > logged_steps(tmp_path) >= 2  # the step after the last one rank 0 finished
    assert ended < 120, ended
    print(json.dumps({"seconds_from_stop_to_exit": round(ended, 1)}))
