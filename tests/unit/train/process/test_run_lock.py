"""One run per output folder: a live holder refuses by name, a dead one's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from implicit_megatron.train.process.run_lock import LOCK_FILE, RunLock, RunLocked, in_use

ROOT = Path(__file__).resolve().parents[4]
HOLD = ("from implicit_megatron.train.process.run_lock import RunLock; import sys, time; "
        "RunLock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(60)")


def holder_process(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.processes
def test_a_live_holder_is_refused_by_name(tmp_path):
    proc = holder_process(tmp_path)
    try:
        with pytest.raises(RunLocked, match=rf"{tmp_path} is in use by another run \(host .*, process {proc.pid}"):
            RunLock.acquire(tmp_path)
        cli = subprocess.run([sys.executable, "-m", "implicit_megatron.train.process.run_lock", str(tmp_path)],
                             cwd=ROOT, capture_output=True, text=True)
        assert cli.returncode == 2 and f"process {proc.pid}" in cli.stderr
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid  # untouched
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.processes
def test_a_killed_holder_is_taken_over_and_released(tmp_path):
    proc = holder_process(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # killed, not reaped yet: a zombie still has its process id
    assert in_use(tmp_path) is None
    proc.wait()
    lines = []
    lock = RunLock.acquire(tmp_path, log=lines.append)
    assert len(lines) == 1 and "has ended" in lines[0] and f"process {proc.pid}" in lines[0]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_reused_process_id_is_not_the_holder(tmp_path):
    """Our own id with another start time: the holder that wrote it is gone."""
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid(), "ticks": 1,
                                                  "started": time.time() - 3600, "command": "old run"}))
    RunLock.acquire(tmp_path, log=lambda line: None).release()


def test_another_hosts_lock_says_how_to_clear_it(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "node-017", "pid": 4242, "started": time.time(),
                                                  "command": "python -m implicit_megatron.train c.yaml"}))
    with pytest.raises(RunLocked, match=rf"host node-017, process 4242.*remove {tmp_path / LOCK_FILE}"):
        RunLock.acquire(tmp_path)


def test_an_unreadable_lock_is_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text("")
    lock = RunLock.acquire(tmp_path, log=lambda line: None)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_release_leaves_another_runs_lock(tmp_path):
    lock = RunLock.acquire(tmp_path)
    theirs = {"host": "node-2", "pid": 1, "started": 0.0, "command": "x"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(theirs))
    lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == theirs


@pytest.mark.processes
@pytest.mark.parametrize("damage", [b'{"host": "h", "pid": "x"}', b'{"host": "h", "pid": -1}', b"\xff\xfe",
                                    b'["not", "a", "lock"]',
                                    json.dumps({"host": socket.gethostname(), "pid": 2**32}).encode()])
def test_a_damaged_lock_is_taken_over_with_a_line_naming_it(damage, tmp_path):
    """A lock whose process id is not a process id (pid -1 would be 'every process'; 2**32 overflowed
    os.kill), or that is not JSON at all, names no holder: the launch check passes and the run takes
    it over, saying so."""
    (tmp_path / LOCK_FILE).write_bytes(damage)
    assert in_use(tmp_path) is None
    cli = subprocess.run([sys.executable, "-m", "implicit_megatron.train.process.run_lock", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert cli.returncode == 0 and not cli.stderr, cli.stderr
    said = []
    lock = RunLock.acquire(tmp_path, log=said.append)
    assert said == [f"{tmp_path / LOCK_FILE}: the run that held it has ended (unreadable: damaged, or its starter "
                    "died writing it); taken over"]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
