"""Evaluation windows: one epoch of a split packed at one length, as the paper packs the test split.

Window j holds tokens [j*L, (j+1)*L] of the split's (seeded, shuffled) document stream: L inputs
and L labels, so no token is predicted twice and every window starts from an empty state. The
windows come out in the packed dataset's shuffled order; `max_windows` keeps a random subset.
"""

from __future__ import annotations

import os

import numpy as np
import torch


def check_prefix(prefix: str, split: str = "test") -> None:
    """FileNotFoundError naming the files a data prefix should have."""
    from data_pipeline.indexed import find_shards
    from data_pipeline.shard_check import check_build

    if not os.path.isdir(os.path.dirname(os.path.abspath(prefix))):
        raise FileNotFoundError(f"data prefix {prefix!r}: folder {os.path.dirname(prefix) or '.'} does not exist")
    find_shards(prefix, split)  # raises with the expected {prefix}_{split}.bin/.idx names
    check_build(prefix)  # ShardError (a ValueError) naming an incomplete build


def load_windows(prefix: str, seq_len: int, seed: int, split: str = "test",
                 max_windows: int | None = None) -> torch.Tensor:
    """(N, seq_len + 1) int64 token windows; ValueError when the split is shorter than one window."""
    from data_pipeline.packed import build_packed_dataset

    check_prefix(prefix, split)
    dataset = build_packed_dataset([prefix], None, split, seq_len, seed)
    count = len(dataset) if max_windows is None else min(max_windows, len(dataset))
    return torch.from_numpy(np.stack([dataset[i] for i in range(count)]))


def batches(windows: torch.Tensor, batch_size: int):
    """Consecutive slices of at most `batch_size` windows."""
    for start in range(0, len(windows), batch_size):
        yield windows[start:start + batch_size]
