"""`HOSTFILE=... bash launch/pretrain.sh` over two nodes for real: DeepSpeed's launcher reaches node2
by pdsh and ssh, CPU ranks on gloo (tests/support/nodes.py makes the nodes). Two nodes of one
process train exactly as one node of two; what the launch sets reaches every rank on every node;
a stop, a killed launch and a node cut off end every rank within the bounds docs/cluster.md states."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.nodes import Nodes, missing
from support.reference_runs import losses, zero1_overrides

from implicit_megatron.run_control import Launch, RunEnd

pytestmark = [pytest.mark.distributed, pytest.mark.skipif(missing() is not None, reason=missing() or "")]
CONFIG = "configs/tiny/mamba2-implicit.yaml"


@pytest.fixture
def nodes(tmp_path):
    with Nodes(tmp_path / "nodes") as made:
        yield made


def settings(shards: str, out: Path, *extra: str) -> list[str]:
    return [CONFIG, f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}",
            "train.log_interval=1", "train.eval_interval=1000", "tracking.enabled=false", *extra]


def launch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What a user's shell on node1 holds: the thread count they chose, and the hostfile."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MASTER_", "OMP_", "PYTEST"))}
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HOSTFILE": str(hostfile),
            "MLFLOW_DISABLE_TELEMETRY": "true", **extra}


def ranks(node) -> list[int]:
    """The training processes running on `node` (its own PID namespace: only its processes)."""
    table = node.run("ps", "-eo", "pid=,args=").stdout.splitlines()
    return [int(line.split()[0]) for line in table if " -m implicit_megatron.train" in line and "launcher" not in line]


def environment(node, pid: int) -> dict[str, str]:
    raw = node.run("cat", f"/proc/{pid}/environ").stdout
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def script(proc: subprocess.Popen) -> int:
    """The launch's process id (as this machine sees it) under the `nsenter` that started it:
    pretrain.sh's, which becomes implicit_megatron.launch's by exec."""
    import psutil

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "implicit_megatron.launch" in p.cmdline()]
        if found:
            return found[0].pid
        time.sleep(0.05)
    raise AssertionError("pretrain.sh never started")


def wait_until(condition, what: str, seconds: float, proc=None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launch ended before {what}: {proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{what} did not come within {seconds} s"
        time.sleep(0.1)


def test_two_nodes_of_one_process_train_as_one_node_of_two(nodes, zero1_run, shakespeare_shards, tmp_path):
    """The reference: ZERO1_RUN, trained once per test run by torchrun on one node (2 processes)."""
    node1, _ = nodes
    out = tmp_path / "two-nodes"
    two_nodes = node1.run("bash", "launch/pretrain.sh", CONFIG, *zero1_overrides(shakespeare_shards, out),
                          env=launch_env(tmp_path), timeout=300, check=False)
    assert two_nodes.returncode == 0, two_nodes.stdout[-3000:] + two_nodes.stderr[-3000:]
    assert "node2: [" in two_nodes.stdout  # node2's rank ran there, its lines come back through pdsh
    # Bit for bit: the same data order, the same reductions, the same thread count on every rank.
    assert losses(out) == losses(zero1_run)
    assert len(losses(out)) == 12
    assert (out / "checkpoints" / "latest").read_text().strip() == "free-step12"


def test_a_stop_during_start_up_and_a_killed_launch_end_every_node(nodes, shakespeare_shards, tmp_path):
    node1, node2 = nodes
    out = tmp_path / "run"
    # SIGTERM to pretrain.sh as the launcher starts (`docker stop`, a scheduler's stop): every rank,
    # on both nodes, stops after its first step with a checkpoint, and the launch exits 0.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    proc = node1.popen("bash", "launch/pretrain.sh", *settings(shakespeare_shards, out, "train.steps=400"),
                       env=launch_env(tmp_path, TMPDIR=str(temporary)), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: (out / "stop-requested.armed").exists(), "the launch", 120, proc)
    os.kill(script(proc), signal.SIGTERM)
    text, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, text[-3000:]
    stopped = RunEnd.read(out)
    assert stopped.step == 1 and stopped.checkpoint == "bounded-step1", stopped
    assert sorted(losses(out)) == [1]
    assert not any(temporary.iterdir())  # the launch's environment file is gone with it

    # kill -9 of the launch's process group (a terminal closed, a job step killed): its ranks are in
    # sessions of their own, on node1 and over ssh on node2; every one of them ends.
    own = tmp_path / "own.env"  # the user's environment file (DeepSpeed's DS_ENV_FILE) is still read
    own.write_text("HF_HUB_OFFLINE=1\nRUN_NOTE=resumed-on-two-nodes")
    proc = node1.popen("bash", "launch/pretrain.sh", *settings(shakespeare_shards, out, "train.steps=400"),
                       env=launch_env(tmp_path, DS_ENV_FILE=str(own)), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: max(losses(out), default=0) >= 3, "steps after the resume", 180, proc)
    # What pretrain.sh sets for its ranks reached the rank on node2 as it reached node1's.
    for node in nodes:
        (pid,) = ranks(node)
        got = environment(node, pid)
        launch = Launch.of(got)
        assert got.get("OMP_NUM_THREADS") == "1" and launch is not None, got  # the stop request is the launch's
        assert launch.host == "node1" and launch.pid, got
        assert got.get("RUN_NOTE") == "resumed-on-two-nodes" and got.get("HF_HUB_OFFLINE") == "1", got
    os.killpg(os.getpgid(script(proc)), signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: not ranks(node1) and not ranks(node2), "the end of every rank", 60)
    assert time.monotonic() - killed_at < 60
    assert max(losses(out)) < 400
    proc.communicate(timeout=30)


def test_a_node_cut_off_ends_the_launch_naming_the_silent_rank(nodes, shakespeare_shards, tmp_path):
    node1, node2 = nodes
    out = tmp_path / "run"
    proc = node1.popen("bash", "launch/pretrain.sh",
                       *settings(shakespeare_shards, out, "train.steps=100000", "distributed.timeout_minutes=0.1"),
                       env=launch_env(tmp_path), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: max(losses(out), default=0) >= 3, "training", 180, proc)
    node2.cut_off()  # node2 runs on, unreachable: no connection closes, only silence
    cut_at = time.monotonic()
    text, _ = proc.communicate(timeout=120)
    ended = time.monotonic() - cut_at
    assert proc.returncode != 0
    assert "rank 1 has given no sign of life for" in text, text[-3000:]
    # 6 s of silence for the stall watch, then pdsh's ssh to node2 gives up after 2 x 5 s without an answer
    assert ended < 45, ended
