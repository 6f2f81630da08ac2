"""A rank that stops answering (SIGSTOP: a debugger, a frozen node) ends the whole job within
distributed.timeout_minutes, with one line naming that rank and what it was doing, in a step as in a
resume's start-up; a pause of the whole job (SIGSTOP then SIGCONT of every process, as Ctrl-Z or a
SLURM suspend do) longer than the limit is not counted, a rank three times the limit slow in one step
(its heartbeat goes on) and the launcher that holds the rendezvous store suspended past the limit end
nothing either: the stall watch is the one judge of a stall, and the run goes on."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time

import psutil
import pytest
from support.processes import ROOT, child_env, faults, kill_tree, signal_job, torchrun_command

TINY = "configs/tiny/mamba2-implicit.yaml"
LIMIT = 0.1  # minutes: 6 s of silence (the collectives' and the store's backstop: the default, a day)


def logged_steps(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def launch(out, *extra: str, **env: str) -> tuple[subprocess.Popen, queue.Queue]:
    args = ["data.source=null", f"train.output_dir={out}", "train.steps=100000", "train.log_interval=1",
            "train.eval_interval=100000", "checkpoint.interval=2", "checkpoint.keep_last=1",
            "tracking.enabled=false", f"distributed.timeout_minutes={LIMIT}", *extra]
    proc = subprocess.Popen(torchrun_command("-m", "implicit_megatron.train", TINY, *args), cwd=ROOT,
                            env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return proc, lines


def rank1(proc) -> psutil.Process:
    return next(p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1")


def wait_for(condition, proc, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.2)


def output_until_exit(proc, lines: queue.Queue, seconds: float) -> tuple[str, float]:
    start = time.monotonic()
    proc.wait(timeout=seconds)
    ended = time.monotonic() - start
    time.sleep(0.5)  # the reader thread drains the pipe
    return "".join(lines.queue), ended


@pytest.mark.distributed
def test_a_stopped_rank_ends_the_job_naming_it_a_paused_job_goes_on(shakespeare_shards, tmp_path):
    data = f"data.prefixes=[{shakespeare_shards}]"
    proc, lines = launch(tmp_path, data, **faults(slow_step=[1, 4, 18]))  # 3 limits, above gloo's old 12 s
    try:
        wait_for(lambda: logged_steps(tmp_path) >= 5, proc, 180, "training past the slow step")
        os.kill(proc.pid, signal.SIGSTOP)  # torchrun's agent alone, which holds the rendezvous store
        time.sleep(9)  # 1.5 limits
        os.kill(proc.pid, signal.SIGCONT)
        signal_job(proc.pid, signal.SIGSTOP)  # the whole job, launcher included, for longer than the limit
        time.sleep(9)  # 1.5 limits, less than a collective's own 12 s
        signal_job(proc.pid, signal.SIGCONT)
        paused_at = logged_steps(tmp_path)
        wait_for(lambda: logged_steps(tmp_path) >= paused_at + 2, proc, 60, "a step after the pause")
        time.sleep(2)  # several heartbeats (one every 0.6 s) after the pause, so the last one names a later step
        stopped, start = rank1(proc), time.monotonic()
        stopped.suspend()
        wait_for(lambda: any(line.startswith("[train] error on rank 0") for line in list(lines.queue)), proc, 120,
                 "rank 0's line")
        ended = time.monotonic() - start
        stopped.resume()  # rank 1 may now take torchrun's SIGTERM instead of its 30 s grace and a SIGKILL
        out, _ = output_until_exit(proc, lines, 150)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode != 0
    named = [line for line in out.splitlines() if line.startswith("[train] error on rank 0 (")]
    assert named and "): rank 1 has given no sign of life for " in named[0], out[-3000:]
    assert f"distributed.timeout_minutes={LIMIT}" in named[0], out[-3000:]
    said = re.search(r"\(its last heartbeat: (step|the checkpoint of step) (\d+)\)", named[0])
    assert said, named[0]
    step = int(said.group(2))
    assert paused_at < step <= logged_steps(tmp_path) + 1, (paused_at, named[0])
    assert ended < 60, ended  # 6 s of silence, then the line

    # A resume whose rank 1 stops in its start-up: the job ends too, naming the start-up.
    proc, lines = launch(tmp_path, data)
    try:
        wait_for(lambda: any("starting from" in line for line in list(lines.queue)), proc, 180, "the resume")
        stopped, start = rank1(proc), time.monotonic()
        stopped.suspend()
        wait_for(lambda: any(line.startswith("[train] error on rank 0") for line in list(lines.queue)), proc, 120,
                 "rank 0's line")
        ended_start_up = time.monotonic() - start
        stopped.resume()
        out, _ = output_until_exit(proc, lines, 150)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode != 0
    named = [line for line in out.splitlines() if line.startswith("[train] error on rank 0 (start-up")]
    assert named and "rank 1 has given no sign of life for " in named[0], out[-3000:]
    assert "heartbeat: start-up" in named[0], named[0]
    assert ended_start_up < 60, ended_start_up
    print(json.dumps({"seconds_from_stop_to_the_line": round(ended, 1),
                      "seconds_from_stop_in_start_up_to_the_line": round(ended_start_up, 1)}))
