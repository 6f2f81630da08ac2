"""launch/pretrain.sh as a user runs it: a bad config stops before any process; CPU processes train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ROOT, child_env, free_port


def pretrain(*args: str, nproc: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    env = child_env(PYTHON=sys.executable, NPROC=str(nproc), MASTER_PORT=str(free_port()))
    return subprocess.run(["bash", "launch/pretrain.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_bad_config_key_is_refused_before_launch(tmp_path):
    result = pretrain("configs/tiny/mamba2-implicit.yaml", "train.stepz=3", f"train.output_dir={tmp_path}")
    assert result.returncode == 2
    assert "train.stepz" in result.stderr and "did you mean 'train.steps'" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_batch_not_divisible_by_world_size_is_refused(tmp_path):
    result = pretrain("configs/tiny/mamba2-implicit.yaml", "train.micro_batch_size=4", nproc=3)
    assert result.returncode == 2 and "4 x 3" in result.stderr


@pytest.mark.distributed
def test_two_cpu_processes_train(shakespeare_shards, tmp_path):
    result = pretrain("configs/tiny/llama-implicit.yaml", f"data.prefixes=[{shakespeare_shards}]", "data.source=null",
                      f"train.output_dir={tmp_path}", "train.steps=6", "train.eval_interval=6",
                      "tracking.enabled=false", nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "done at step 6: validation perplexity" in result.stdout
    rows = [json.loads(line) for line in (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val/ppl"] > 1
