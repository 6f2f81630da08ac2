"""CUDA graphs (emulated on the CPU) through DeepSpeed engines: gradient accumulation over two
micro-batches gives eager's losses and gradient norms under ZeRO-0, -1 and -2, fp32 and bf16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.processes import run_torchrun

WORKERS = Path(__file__).parent / "workers"


@pytest.mark.distributed
def test_graphs_accumulate_as_eager_under_every_zero_stage():
    result = run_torchrun(WORKERS / "graph_accumulation.py", timeout=400)
    assert result.returncode == 0, result.stdout[-6000:]
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in result.stdout.splitlines() if "RESULT " in line]
    assert [(r["stage"], r["precision"]) for r in rows] == [(s, p) for s in (0, 1, 2) for p in ("fp32", "bf16")]
    for row in rows:
        (eager_losses, eager_norms), (losses, norms) = row["eager"], row["graphed"]
        assert len(norms) == len(eager_norms) == 3, row
        assert losses == pytest.approx(eager_losses, rel=1e-6), row
        assert norms == pytest.approx(eager_norms, rel=1e-6), row
