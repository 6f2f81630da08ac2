"""Shards on a read-only file system (shared cluster datasets, a `:ro` container mount) train: the
packed-sample index cache goes to the user's cache, as it always does. The read-only
mount is a bind mount in a user namespace of the test's own (where the kernel allows one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ROOT, can_mount_tmpfs, child_env

TINY = "configs/tiny/mamba2-implicit.yaml"


@pytest.mark.distributed
def test_shards_on_a_read_only_file_system_train(shakespeare_shards, tmp_path):
    mounted = tmp_path / "ro"
    mounted.mkdir()
    if not can_mount_tmpfs(mounted):
        pytest.skip("this kernel does not let an unprivileged user mount (no user namespaces)")
    shards = Path(shakespeare_shards)
    prefix = mounted / shards.name
    args = [TINY, f"data.prefixes=[{prefix}]", "data.source=null", f"train.output_dir={tmp_path / 'run'}",
            "train.steps=2", "schedule.warmup_steps=1", "curriculum.phases=[]", "train.eval_interval=2",
            "train.eval_samples=4", "tracking.enabled=false"]
    check = [sys.executable, "-m", "implicit_megatron.config", *args, "--get", "output_dir"]
    train = [sys.executable, "-m", "implicit_megatron.train", *args]
    script = (f"mount --bind {shards.parent} {mounted} && mount -o remount,bind,ro {mounted} && "
              f"touch {mounted}/probe 2>/dev/null && echo WRITABLE; {' '.join(check)} && {' '.join(train)}")
    result = subprocess_run(script, tmp_path / "cache")
    assert "WRITABLE" not in result.stdout and result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cache = tmp_path / "cache" / "implicit-megatron" / "index-cache"
    assert "done at step 2" in result.stdout
    assert any(cache.rglob("*.npy")), list(cache.rglob("*"))  # megatron-core's indices, built here


@pytest.mark.distributed
def test_a_run_folder_that_turns_read_only_ends_the_run_saying_what_is_saved(shakespeare_shards, tmp_path):
    """The run's file system remounted read-only under a running job (a storage fault, a full quota):
    one line names the file and says that no checkpoint was saved, and the lock it cannot remove is a
    note for the next launch, not a traceback."""
    out = tmp_path / "fs"
    out.mkdir()
    if not can_mount_tmpfs(out):
        pytest.skip("this kernel does not let an unprivileged user mount (no user namespaces)")
    run = out / "run"
    train = [sys.executable, "-m", "implicit_megatron.train", TINY, f"data.prefixes=[{shakespeare_shards}]",
             "data.source=null", f"train.output_dir={run}", "train.steps=400", "train.log_interval=1",
             "checkpoint.interval=1000", "train.eval_interval=1000", "tracking.enabled=false"]
    script = (f"mount -t tmpfs -o size=64m tmpfs {out} && {{ {' '.join(train)} & }}; "
              f"until [ -f {run}/metrics.jsonl ] && [ $(wc -l < {run}/metrics.jsonl) -ge 2 ]; do sleep 0.1; done; "
              f"mount -o remount,ro {out} && wait $!")
    result = subprocess_run(script, tmp_path / "cache")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("error on rank 0")]
    assert len(said) == 1 and f"{run}/metrics.jsonl: could not be written at step" in said[0], result.stderr[-3000:]
    assert "(Read-only file system); no checkpoint of this run was saved" in said[0]
    assert f"note: {run}/run.lock stays (Read-only file system)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.distributed
def test_a_stop_signal_to_a_launch_whose_folder_turned_read_only_is_said_not_a_traceback(shakespeare_shards,
                                                                                          tmp_path):
    """SIGTERM to launch/pretrain.sh once its run folder is read-only: the stop request cannot be
    written there, which ended the launch in a traceback (and its rank, orphaned, said the launch was
    killed). The launch says why in one line and hands the signal to the ranks itself."""
    out = tmp_path / "fs"
    out.mkdir()
    if not can_mount_tmpfs(out):
        pytest.skip("this kernel does not let an unprivileged user mount (no user namespaces)")
    run = out / "run"
    launch = ["bash", "launch/pretrain.sh", TINY, f"data.prefixes=[{shakespeare_shards}]", "data.source=null",
              f"train.output_dir={run}", "train.steps=400", "train.log_interval=1", "checkpoint.interval=1000",
              "train.eval_interval=1000", "tracking.enabled=false"]
    script = (f"mount -t tmpfs -o size=64m tmpfs {out} && {{ NPROC=1 PYTHON={sys.executable} {' '.join(launch)} & }}; "
              f"until [ -f {run}/metrics.jsonl ] && [ $(wc -l < {run}/metrics.jsonl) -ge 2 ]; do sleep 0.1; done; "
              f"mount -o remount,ro {out} && kill -TERM $! && wait $!")
    result = subprocess_run(script, tmp_path / "cache")
    said = result.stdout + result.stderr
    assert "Traceback" not in said and "is gone (killed)" not in said, said[-3000:]
    assert f"pretrain.sh: SIGTERM: the stop request cannot be written in {run} (Read-only file system); the ranks " \
           "are sent the signal itself" in said, said[-3000:]


def subprocess_run(script: str, user_cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", script], cwd=ROOT,
                          env=child_env(XDG_CACHE_HOME=str(user_cache)), capture_output=True, text=True, timeout=300)
