"""Runs that several multi-process tests hold their resumes to, trained once per test run
(tests/distributed/conftest.py)."""

from __future__ import annotations

from pathlib import Path

TINY = "configs/tiny/mamba2-implicit.yaml"
# 12 steps on 2 processes, ZeRO-1 (every rank writes optimizer shards), a checkpoint at steps 6, 10
# (the end of the bounded phase, 80 %) and 12, all kept; no tracking, so a copy resumes anywhere.
ZERO1_RUN = ("train.steps=12", "checkpoint.interval=6", "checkpoint.keep_last=5", "train.eval_interval=100",
             "distributed.zero_stage=1", "train.log_interval=1", "tracking.enabled=false")


def zero1_overrides(shards: str, out: Path, *extra: str) -> list[str]:
    """ZERO1_RUN's command line into `out`; `extra` after it, so it can switch tracking on."""
    return [f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}", *ZERO1_RUN, *extra]


def losses(out: Path) -> dict[int, float]:
    """Step -> training loss in a run folder's metrics.jsonl (whole records only: the run may be
    writing it while a test reads)."""
    from implicit_megatron.tracking.metrics_file import read_metrics

    return {row["step"]: row["train/loss"] for row in read_metrics(out) if "train/loss" in row}
