"""A rank whose launcher (the rendezvous store's host) was stopped still ends its run by its own decision:
the stall watch's heartbeat thread, left waiting in a store call, must not come back into an interpreter
that is finalizing (torch's C++ frames then abort the process, exit 134, after a run that finished), and
the store's silence is never counted against the next rank."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from support.processes import store_host

from implicit_megatron.train.callbacks.stall import StallWatch

RANK = """
import os, sys
from datetime import timedelta
import torch.distributed as dist
from implicit_megatron.train.callbacks.stall import StallWatch


class Finalizing:
    '''Held by __main__ alone, so its __del__ runs once the interpreter finalizes (daemon threads are then
    ended at their next return into Python): it holds the finalization until the test has let the
    store's host answer again.'''

    def __del__(self, write=os.write, read=os.read):
        write(1, b"finalizing\\n")
        read(0, 1)


store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=30))
watch = StallWatch(0.04, 0, 2, store, on_stall=lambda line: None)  # what it judges of the stop: other tests
print("watching", watch.mine, flush=True)
sys.stdin.readline()  # the store's host is stopped now: the heartbeat thread waits in a call
watch.done()
print("done", flush=True)
finalizing = Finalizing()
"""


@pytest.mark.processes
def test_a_rank_that_ends_while_the_store_host_is_stopped_exits_0():
    """The store's host stopped before the rank ends and answering again while it finalizes: exit 0, no
    'terminate called', and the 'finished' heartbeat reaches the store once it answers."""
    host, port = store_host()
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert rank.stdin is not None and rank.stdout is not None
    try:
        said = rank.stdout.readline().split()
        assert said[:1] == ["watching"], said
        time.sleep(0.5)  # heartbeats every 0.24 s
        os.kill(host.pid, signal.SIGSTOP)
        time.sleep(1.0)  # the heartbeat thread's next read now waits for the stopped host
        rank.stdin.write("\n")
        rank.stdin.flush()
        assert rank.stdout.readline() == "done\n"
        assert rank.stdout.readline() == "finalizing\n"
        os.kill(host.pid, signal.SIGCONT)  # a call still waiting returns now, into the finalizing interpreter
        time.sleep(1.0)
        with contextlib.suppress(BrokenPipeError):  # an aborted rank reads no more
            rank.stdin.write("\n")
            rank.stdin.flush()
        _, err = rank.communicate(timeout=60)
        assert rank.returncode == 0 and "terminate called" not in err, (rank.returncode, err[-3000:])
        assert f"the rendezvous store at 127.0.0.1:{port} has not answered for " in err, err[-3000:]
        assert "TCPStore.cpp" not in err and "frame #" not in err, err[-3000:]  # torch's warning of the cut: kept quiet
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        assert client.get(said[1]) == b"finished"  # the rank before it stops watching this one
    finally:
        os.kill(host.pid, signal.SIGCONT)
        for proc in (rank, host):
            proc.kill()
            proc.wait()


class PausableStore:
    """A store in this process whose calls wait while it is paused, as a stopped host's do."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.answering = threading.Event()
        self.answering.set()

    def clone(self) -> PausableStore:
        return self

    def set(self, key: str, value: str) -> None:
        self.answering.wait()
        self.values[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        self.answering.wait()
        return all(key in self.values for key in keys)

    def get(self, key: str) -> bytes:
        self.answering.wait()
        return self.values[key]


def test_a_store_that_stops_answering_stops_the_count_of_the_next_rank():
    """The next rank's heartbeat unchanged a while (slow to beat), then the store silent for longer than
    the limit while this rank trains on: nobody is named, since the next rank's silence counts only up to
    the store's last answer (it was once named as the launcher stopped a few heartbeats after its last news)."""
    store, lines = PausableStore(), []
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    theirs = f"stall_watch/{attempt}/1"
    store.values[theirs] = b"1 step 1"
    watch = StallWatch(0.02, 0, 2, store, on_stall=lines.append)  # 1.2 s: heartbeats every 0.12 s
    step = 0

    def train(seconds: float) -> None:
        nonlocal step
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            step += 1
            watch.doing(f"step {step}")
            time.sleep(0.05)

    try:
        train(0.6)  # the store answers; the next rank has said nothing new for half the limit
        store.answering.clear()  # the launcher holding the store is stopped
        store.values[theirs] = b"2 step 2"  # the next rank's heartbeat, sent meanwhile, read once it answers
        train(2.0)
        store.answering.set()
        for beat in range(3, 13):
            store.values[theirs] = f"{beat} step {beat}".encode()
            train(0.12)
    finally:
        store.answering.set()
        watch.done()
    assert lines == []
    assert not watch.thread.is_alive() and not watch.judge.is_alive()
