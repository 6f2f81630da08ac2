"""The validation set is counted in samples: the same windows at every micro batch and world size."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from implicit_megatron import load_config
from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.train.tasks.language_model import LanguageModelTask

ROOT = Path(__file__).resolve().parents[3]


def windows(task: LanguageModelTask, micro: int, world: int) -> tuple[list[tuple[int, ...]], int]:
    task.cfg.train.micro_batch_size = micro
    seen, forwards = [], set()
    for rank in range(world):
        batches = list(task.eval_sets(rank, world)["val"])
        forwards.add(len(batches))
        for batch in batches:
            inputs, labels = task.inputs_and_targets(batch)
            for row_in, row_labels in zip(inputs, labels):
                if (row_labels != IGNORE_INDEX).any():
                    seen.append(tuple(torch.cat([row_in[:1], row_labels]).tolist()))
                else:
                    assert (row_in == 0).all()  # padding: a forward whose labels count for nothing
    assert len(forwards) == 1, "every rank must run as many forwards"
    return sorted(seen), forwards.pop()


def test_the_same_windows_at_every_micro_batch_and_world_size(shakespeare_shards):
    cfg = load_config(ROOT / "configs/tiny/mamba2-explicit.yaml",
                      [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", "train.eval_samples=11"],
                      check_files=False)
    task = LanguageModelTask(cfg)
    reference, _ = windows(task, micro=4, world=1)
    assert len(reference) == 11 and len(set(reference)) == 11
    for micro, world in ((2, 1), (1, 2), (4, 2), (2, 4)):
        got, forwards = windows(task, micro, world)
        assert got == reference, (micro, world)
        share = math.ceil(11 / world)
        assert forwards == math.ceil(share / micro)
