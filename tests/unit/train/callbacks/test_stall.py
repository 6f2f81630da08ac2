"""The stall watch ends a job for a silent rank, never for a slow one, and never for time in which the
whole job was paused or the store's host was suspended and came back: real processes, each with its own
watch on a real TCPStore, stopped with SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from support.processes import store_host

from implicit_megatron.train.callbacks.stall import StallWatch, name_timeout

LIMIT_MINUTES = 0.04  # 2.4 s: heartbeats every 0.24 s, a pause counted afresh after 2 s of overrun

RANK = """
import os, sys, time
from datetime import timedelta
import torch.distributed as dist
from implicit_megatron.train.callbacks.stall import StallWatch
rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
store.add("ready", 1)
while store.add("ready", 0) < world:  # together, as init_process_group lets the ranks go
    time.sleep(0.01)
watch = StallWatch(float(sys.argv[4]), rank, world, store, on_stall=lambda line: (print(line, flush=True), os._exit(1)),
                   store_minutes=float(sys.argv[5]))
print("watching", flush=True)
for step in range(1, 10**6):
    watch.doing(f"step {step}")
    time.sleep(float(sys.argv[6]))  # a step far longer than a heartbeat: work is never timed
"""


def start(world: int, port: int, minutes: float = LIMIT_MINUTES, store_minutes: float = 1440.0,
          step_seconds: float = 1.0) -> list[subprocess.Popen]:
    """`world` ranks, started together (as init_process_group lets them go) and each watching."""
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(world), str(port), str(minutes),
                               str(store_minutes), str(step_seconds)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world)]
    for proc in ranks:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "watching", proc.stdout.read()
    return ranks


def server(port: int = 0):
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=30))


@pytest.mark.processes
def test_a_paused_job_and_slow_steps_go_on_a_silent_rank_is_named():
    store = server()
    ranks = start(3, store.port)
    try:
        time.sleep(4)  # steps of 1 s, longer than a heartbeat, for longer than the limit: nobody is named
        for proc in ranks:
            os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(6)  # the whole job paused for 2.5 limits (Ctrl-Z, a SLURM suspend)
        for proc in ranks:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(4)
        assert all(proc.poll() is None for proc in ranks), [p.stdout.read() for p in ranks if p.poll() is not None]
        os.kill(ranks[2].pid, signal.SIGSTOP)  # one rank alone: the rank before it in the ring names it
        out, _ = ranks[1].communicate(timeout=20)
        assert out.startswith("[train] error on rank 1 (step "), out
        assert "rank 2 has given no sign of life for " in out and " (its last heartbeat: step " in out, out
        assert "distributed.timeout_minutes=0.04" in out, out
        assert ranks[0].poll() is None  # rank 0 watches rank 1, which was never silent
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()


@pytest.mark.processes
def test_a_paused_job_is_not_counted_even_while_its_store_host_is_still_waking():
    """A SLURM suspend of the whole job, the store's host (the launcher) included, resumed rank first:
    for a moment the ranks run again, in the middle of a long step, while the store does not answer yet.
    Each watch sees its own sleep overrun and counts afresh; counting the pause, it would name the store."""
    host, port = store_host()
    try:
        ranks = start(2, port, step_seconds=60.0)  # no progress to be seen: only the pause can excuse
        for pid in (host.pid, *(proc.pid for proc in ranks)):
            os.kill(pid, signal.SIGSTOP)
        time.sleep(6)  # 2.5 limits
        for proc in ranks:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(1.2)  # half a limit with the store's host still stopped
        os.kill(host.pid, signal.SIGCONT)
        time.sleep(3)
        assert all(proc.poll() is None for proc in ranks), [p.stdout.read() for p in ranks if p.poll() is not None]
    finally:
        for proc in [host, *ranks]:
            proc.kill()
            proc.wait()


@pytest.mark.processes
def test_a_suspended_store_host_that_comes_back_ends_nothing():
    """The launcher that holds the store suspended (SIGSTOP) for 2.5 limits: the ranks' heartbeats wait,
    nobody is named, and once it answers again the watch goes on (a stopped rank is named again)."""
    host, port = store_host()
    try:
        ranks = start(2, port, store_minutes=1.0)
        os.kill(host.pid, signal.SIGSTOP)
        time.sleep(6)
        os.kill(host.pid, signal.SIGCONT)
        time.sleep(3)
        assert all(proc.poll() is None for proc in ranks), [p.stdout.read() for p in ranks if p.poll() is not None]
        os.kill(ranks[1].pid, signal.SIGSTOP)
        out, _ = ranks[0].communicate(timeout=20)
        assert out.startswith("[train] error on rank 0 (step ") and "rank 1 has given no sign of life" in out, out
    finally:
        for proc in [host, *ranks]:
            proc.kill()
            proc.wait()


@pytest.mark.processes
@pytest.mark.parametrize("case", ["past the backstop", "with no progress"])
def test_a_store_that_stops_answering_is_named_with_its_address(case):
    """Past the backstop (distributed.collective_timeout_minutes) while the ranks go on; or past the limit
    where the ranks make no progress either (the store's host lost with its ranks, the others blocked)."""
    host, port = store_host()
    try:
        if case == "past the backstop":
            ranks = start(2, port, store_minutes=0.08)  # 4.8 s, steps of 1 s
        else:
            ranks = start(2, port, step_seconds=60.0)  # a day's backstop, a step that never ends here
        os.kill(host.pid, signal.SIGSTOP)  # the node holding the store froze: nobody can hear anybody
        outs = [proc.communicate(timeout=30)[0] for proc in ranks]
        for rank, out in enumerate(outs):
            assert out.startswith(f"[train] error on rank {rank} (step "), out
            assert f"the rendezvous store at 127.0.0.1:{port} has not answered for " in out, out
            limit = "collective_timeout_minutes=0.08" if case == "past the backstop" else "timeout_minutes=0.04"
            assert f"distributed.{limit}" in out, out
            assert (", and this rank has been in step 1 for " in out) == (case == "with no progress"), out
    finally:
        host.kill()
        host.wait()


def test_a_rank_that_never_comes_is_named_during_start_up():
    store = server()
    lines: list[str] = []
    watch = StallWatch(0.01, 0, 2, store, on_stall=lines.append)
    deadline = time.monotonic() + 10
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines and lines[0].startswith("[train] error on rank 0 (start-up): rank 1 has given no sign of life"), lines
    assert "(its last heartbeat: start-up)" in lines[0]
    watch.done()


def test_ranks_that_finish_stop_watching_and_a_world_of_one_has_no_watch():
    store = server()
    lines: list[str] = []
    watches = [StallWatch(0.01, r, 2, store, on_stall=lines.append) for r in range(2)]
    time.sleep(0.3)
    watches[1].done()  # rank 1 ends first: rank 0, which watches it, must not call that silence
    time.sleep(1.5)
    watches[0].done()
    assert lines == []
    assert not watches[0].thread.is_alive() and not watches[1].thread.is_alive()
    alone = StallWatch(0.01, 0, 1, None, on_stall=lines.append)
    assert not hasattr(alone, "thread")  # no store is even asked for: nothing waits for another rank
    alone.doing("step 1")
    alone.done()


def test_the_process_groups_own_timeouts_are_named_in_one_line():
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 12000ms "
                        "for recv operation to complete")
    line = name_timeout(gloo, 1, 12.0)
    assert line is not None and line.startswith("[train] error on rank 1 (")
    assert "a collective timed out waiting for the other ranks after 12 minutes (distributed.collective_timeout" in line
    assert "raise distributed.collective_timeout_minutes" in line and "Timed out waiting 12000ms" in line
    store = dist.DistStoreError("wait timeout after 600000ms, keys: /default_pg/0//5/rank_0")
    line = name_timeout(store, 0, 10.0)
    assert line is not None and "the rendezvous store timed out" in line and "keys: /default_pg" in line
    assert name_timeout(RuntimeError("Connection closed by peer [127.0.0.1]:4242"), 0, 10.0) is None
    assert name_timeout(ValueError("Timed out waiting"), 0, 10.0) is None
