"""A training step reads the host once (the agreed finite/stop flags); what it reports is read once
per log interval. Counted in-process on a one-rank gloo group: our readers, and every .item()
(aten._local_scalar_dense) outside the optimizer. torch's AdamW on the CPU keeps its step counters
on the host and reads them there; the fused AdamW the trainer uses on GPUs keeps them on the device."""

from __future__ import annotations

import json

import torch
from support.processes import ROOT
from torch.utils._python_dispatch import TorchDispatchMode

from implicit_megatron import load_config
from implicit_megatron.train import loop, step_metrics, train_step


class Items(TorchDispatchMode):
    """Counts .item() calls while not paused."""

    def __init__(self):
        super().__init__()
        self.count, self.paused = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and not self.paused:
            self.count += 1
        return func(*args, **(kwargs or {}))


def counted(calls: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)
    return wrapper


def test_a_bounded_step_reads_the_host_once(one_rank, shakespeare_shards, tmp_path, monkeypatch):
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={tmp_path}",
                       "train.steps=8", "train.log_interval=4", "train.eval_interval=100", "checkpoint.interval=100",
                       "tracking.enabled=false", "curriculum.phases=[]", "train.global_batch_size=4",
                       "train.micro_batch_size=2", "data.seq_len=32"], world_size=1)
    calls = {"flags": 0, "reads": 0}
    monkeypatch.setattr(train_step, "step_flags", counted(calls, "flags", step_metrics.step_flags))
    monkeypatch.setattr(step_metrics, "read_on_host", counted(calls, "reads", step_metrics.read_on_host))
    trainer = loop.Trainer(cfg)
    trainer.resume()
    items = Items()
    optimizer_step = trainer.engine.optimizer.step

    def paused_step(*args, **kwargs):
        items.paused = True
        try:
            return optimizer_step(*args, **kwargs)
        finally:
            items.paused = False

    monkeypatch.setattr(trainer.engine.optimizer, "step", paused_step)
    per_step = []
    for step in range(8):
        before, items.count = dict(calls), 0
        with items:
            trainer.train_step(step)
        per_step.append((calls["flags"] - before["flags"], calls["reads"] - before["reads"], items.count))
        if (step + 1) % 4 == 0:
            trainer.report(trainer.progress.step)
    assert per_step == [(1, 0, 0)] * 8  # two micro-batches each: the agreed flags and nothing else
    assert calls["reads"] == 2  # one per log interval
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [4, 8]
    assert all(r["train/loss"] > 0 and r["train/grad_norm"] > 0 and r["solver/iterations"] == 4 for r in logged)
