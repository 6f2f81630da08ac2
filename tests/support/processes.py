"""Starting processes for the multi-process tests: torchrun on gloo, in their own process group."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from implicit_megatron.utils.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts workers in sessions of their own)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for proc in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def signal_job(pid: int, signum: int) -> None:
    """Send `signum` to a process and every process below it, as SLURM signals every process of a job
    step (launchers start their ranks, and launch/pretrain.sh its launcher, in sessions of their own,
    which a process-group signal would not reach)."""
    import psutil

    parent = psutil.Process(pid)
    for proc in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signum)


def torchrun_command(*args: str, nproc: int = 2) -> list[str]:
    """`args` is a script path or `-m module`, then its arguments."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", *map(str, args)]


FAULTS = ROOT / "tests" / "support" / "faults"  # a sitecustomize that injects faults (see its docstring)


def faults(**settings) -> dict[str, str]:
    """Environment for a launch whose training processes get these faults (tests/support/faults)."""
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "TEST_FAULTS": json.dumps(settings)}


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "CUDA_VISIBLE_DEVICES": "",
            **extra}


def run_in_session(command: list[str], timeout: float, merge_output: bool = False,
                   **env: str) -> subprocess.CompletedProcess:
    """Run in a process group of its own (stderr into stdout with `merge_output`); every process of
    it is killed, and the test fails, when the time is up."""
    proc = subprocess.Popen(command, cwd=ROOT, env=child_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_output else subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(command)} still running after {timeout} s:\n{out[-4000:]}\n{(err or '')[-2000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err or "")


def run_alone(*args: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """`args` (a script path or `-m module`, then its arguments) as the one process of a world of one,
    started directly with what a launcher would set (RANK, LOCAL_RANK, WORLD_SIZE, a free port): for
    what needs no second rank, no launcher (torchrun costs 2 s of CPU a launch)."""
    return run_in_session([sys.executable, *map(str, args)], timeout, merge_output=True, RANK="0", LOCAL_RANK="0",
                          WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **env)


def run_torchrun(*args: str, nproc: int = 2, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """Run on `nproc` CPU processes (gloo); the whole process group is killed on timeout."""
    return run_in_session(torchrun_command(*args, nproc=nproc), timeout, merge_output=True, **env)


def can_mount_tmpfs(folder) -> bool:
    """Whether this kernel lets an unprivileged user mount a tmpfs in a user namespace of its own (the
    full- and read-only-disk tests run there)."""
    import shutil

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=1m tmpfs {folder}"], capture_output=True)
    return probe.returncode == 0


def on_a_small_tmpfs(tmp_path, mount: str, snippet: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`snippet` (its `OUT`: the folder tmp_path/out) run by a Python in a mount namespace of its own,
    where the folder is a small tmpfs that `mount` (shell commands, `$OUT` the folder) sets up; the
    test is skipped where the kernel does not allow it. What the snippet leaves there is gone after,
    so it checks what it must itself and prints it."""
    out = tmp_path / "out"
    out.mkdir()
    if not can_mount_tmpfs(out):
        pytest.skip("this kernel does not let an unprivileged user mount a tmpfs (no user namespaces)")
    script = f'{mount} && {sys.executable} -c "$SNIPPET"'
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", script], cwd=ROOT,
                            env=child_env(SNIPPET=f"OUT = {str(out)!r}\n{snippet}", OUT=str(out)),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def store_host() -> tuple[subprocess.Popen, int]:
    """A process that hosts a rendezvous TCPStore (as torchrun's agent does), and its port: a test
    stops and resumes it (SIGSTOP, SIGCONT) as a suspended launcher."""
    host = subprocess.Popen([sys.executable, "-c", "import sys, time, torch.distributed as d\n"
                             "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
                             "print(s.port, flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    return host, int(host.stdout.readline())
