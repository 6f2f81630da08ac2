"""Batches that every task's data order rests on: a global batch stream that is the same at every
world size and resumes from one number, a fixed evaluation set split across ranks, and the digest
that identifies a data order (what a resume compares).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import torch

from implicit_megatron.errors import RunRefused
from implicit_megatron.models.loss import IGNORE_INDEX


class GlobalBatchStream:
    """Global batch k is `make(k)` (a function of k alone, channels first: (C, global_batch, ...));
    each rank takes its micro-batches from its share, so the data order is the same at every world
    size and a resume needs only k."""

    def __init__(self, make, global_batch: int, micro_batch: int, rank: int, world: int):
        self.make, self.global_batch, self.micro_batch = make, global_batch, micro_batch
        self.rank, self.world = rank, world
        self.step = 0
        self._queue: list[torch.Tensor] = []

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        """(C, micro_batch, ...): this rank's next micro-batch."""
        if not self._queue:
            every = self.make(self.step)
            self.step += 1
            per_rank = self.global_batch // self.world
            mine = every[:, self.rank * per_rank:(self.rank + 1) * per_rank]
            self._queue = list(mine.split(self.micro_batch, dim=1))
        return self._queue.pop(0)

    def state_dict(self) -> dict[str, int]:
        return {"consumed_samples": self.step * self.global_batch, "global_batch_size": self.global_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["consumed_samples"] % self.global_batch:
            raise RunRefused(f"consumed_samples {state['consumed_samples']} is not a multiple of the global batch "
                             f"{self.global_batch}")
        self.step, self._queue = state["consumed_samples"] // self.global_batch, []


def split_fixed_set(every: torch.Tensor, rank: int, world: int, micro_batch: int,
                    ignored_channel: int) -> Iterator[torch.Tensor]:
    """This rank's micro-batches of a fixed evaluation set (C, N, ...), split across ranks by stride.
    Every rank must run as many forwards as the others (a free phase agrees on each pass over the
    ranks): a rank with fewer rows pads with a repeated row whose `ignored_channel` is IGNORE_INDEX."""
    mine = every[:, rank::world]
    share = -(-every.shape[1] // world)
    if mine.shape[1] < share:
        filler = every[:, :1].repeat(1, share - mine.shape[1], *[1] * (every.dim() - 2))
        filler[ignored_channel] = IGNORE_INDEX
        mine = torch.cat([mine, filler], dim=1)
    yield from mine.split(micro_batch, dim=1)


def order_digest(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return digest.hexdigest()
