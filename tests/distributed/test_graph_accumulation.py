"""CUDA graphs through DeepSpeed engines: gradient accumulation over two micro-batches gives eager's
losses and, parameter by parameter, eager's gradients, while graphs are captured mid-accumulation,
evicted and captured again. On the CPU emulation of CUDA graphs under ZeRO-0, -1 and -2 in fp32 and
bf16 (every commit); on GPUs under ZeRO-1 and -2 in bf16 through NCCL (where there are GPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.processes import run_torchrun

WORKERS = Path(__file__).parent / "workers"


def results(*args: str, nproc: int = 2) -> list[dict]:
    result = run_torchrun(WORKERS / "graph_accumulation.py", *args, nproc=nproc, timeout=500)
    assert result.returncode == 0, result.stdout[-6000:]
    return [json.loads(line.split("RESULT ", 1)[1]) for line in result.stdout.splitlines() if "RESULT " in line]


@pytest.mark.distributed
def test_graphs_accumulate_as_eager_under_every_zero_stage():
    rows = results("--device", "cpu")
    assert [(r["stage"], r["precision"]) for r in rows] == [(s, p) for s in (0, 1, 2) for p in ("fp32", "bf16")]
    for row in rows:
        assert row["steps"] == 4, row
        assert row["graphed"] == pytest.approx(row["eager"], rel=1e-6), row
        assert row["gradient_difference"] <= 1e-6, row


@pytest.mark.distributed
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_graphs_accumulate_as_eager_on_gpus():
    rows = results("--device", "cuda", "--stages", "1,2", "--precisions", "bf16",
                   nproc=min(2, torch.cuda.device_count()))
    assert [(r["stage"], r["precision"]) for r in rows] == [(1, "bf16"), (2, "bf16")]
    for row in rows:
        assert row["steps"] == 4, row
        assert row["graphed"] == pytest.approx(row["eager"], rel=3e-2), row
        assert row["gradient_difference"] <= 3e-2, row
