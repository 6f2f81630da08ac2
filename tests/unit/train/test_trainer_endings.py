"""However a launch ends, its stall watch ends first: a refusal in the resume, a failure in the
start-up. Left running, a heartbeat thread inside a store call while the process group is torn
down aborts the process at exit ("terminate called without an active exception", exit -6) instead
of the refusal's exit 2. In-process, on a one-rank gloo group."""

from __future__ import annotations

import pytest
from support.processes import ROOT

from implicit_megatron import load_config
from implicit_megatron.errors import RunRefused
from implicit_megatron.train import loop
from implicit_megatron.train.callbacks.stall import StallWatch


class Recorded(StallWatch):
    made: list[StallWatch] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


@pytest.fixture(autouse=True)
def recorded(monkeypatch):
    monkeypatch.setattr(loop, "StallWatch", Recorded)


def config(shards: str, out, *extra: str):
    return load_config(ROOT / "configs/tiny/mamba2-explicit.yaml",
                       [f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}", "train.steps=2",
                        "train.eval_interval=100", "tracking.enabled=false", "train.global_batch_size=2",
                        "train.micro_batch_size=2", "data.seq_len=32", "schedule.warmup_steps=1", *extra], world_size=1)


@pytest.mark.processes  # the MLflow run record asks git for the commit
def test_a_refused_resume_ends_the_stall_watch(one_rank, shakespeare_shards, tmp_path):
    loop.Trainer(config(shakespeare_shards, tmp_path)).fit()
    assert Recorded.made[-1].what == "finished"
    changed = loop.Trainer(config(shakespeare_shards, tmp_path, "data.seq_len=16", "train.steps=4"))
    with pytest.raises(RunRefused, match="changed data order"):
        changed.fit()
    assert Recorded.made[-1] is changed.stall and changed.stall.what == "finished"


def test_a_failed_start_up_ends_the_stall_watch(one_rank, shakespeare_shards, tmp_path, monkeypatch):
    def unbuildable(*args, **kwargs):
        raise RuntimeError("no engine today")

    monkeypatch.setattr(loop, "build_engine", unbuildable)
    with pytest.raises(RuntimeError, match="no engine today"):
        loop.Trainer(config(shakespeare_shards, tmp_path))
    assert Recorded.made[-1].what == "finished"
