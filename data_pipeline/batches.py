"""Micro-batches for one data-parallel rank, resumable by the number of consumed samples.

Global batch g (of micro_batch_size * dp_size * grad_accum samples) is dataset samples
[g * G, (g + 1) * G).  It is read as grad_accum steps of micro_batch_size * dp_size samples, and
at each step rank r takes the r-th run of micro_batch_size samples (Megatron's pretraining
sampler).  So every rank reads only its own fixed, disjoint slice, the ranks together read each
sample exactly once, and `consumed_samples` (counted over all ranks) is all a restart needs.
Only whole global batches are served: a final partial one is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # imported where a batch is made: the config check reads this package without torch
    import torch


class Samples(Protocol):
    """What the iterator reads (a PackedDataset, or any sequence of arrays): `len()` samples by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> np.ndarray: ...


class DistributedBatchIterator:
    """Yields torch.LongTensor (micro_batch_size, seq_len + 1) for rank `dp_rank` of `dp_size`."""

    def __init__(self, dataset: Samples, micro_batch_size: int, dp_rank: int, dp_size: int,
                 grad_accum: int = 1, consumed_samples: int = 0, vocab_size: int | None = None,
                 source: str = "the dataset") -> None:
        """`vocab_size`: every token id served is below it, or the batch is refused naming `source`
        (the shards), the sample and the id: a shard changed under a running job (random bytes
        written into it) would otherwise end in an embedding's IndexError that names nothing."""
        if micro_batch_size < 1 or dp_size < 1 or grad_accum < 1:
            raise ValueError(f"micro_batch_size, dp_size and grad_accum must be positive, got "
                             f"{micro_batch_size}, {dp_size}, {grad_accum}")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is not in [0, {dp_size})")
        self.dataset, self.vocab_size, self.source = dataset, vocab_size, source
        self.micro_batch_size, self.dp_rank, self.dp_size, self.grad_accum = (
            micro_batch_size, dp_rank, dp_size, grad_accum)
        self.consumed_samples = 0
        self.load_state_dict({"consumed_samples": consumed_samples})

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp_size * self.grad_accum

    @property
    def step_size(self) -> int:
        """Samples consumed (over all ranks) per micro-batch of every rank."""
        return self.micro_batch_size * self.dp_size

    @property
    def total_samples(self) -> int:
        """Samples that can be served: whole global batches only."""
        return len(self.dataset) // self.global_batch_size * self.global_batch_size

    def __iter__(self) -> DistributedBatchIterator:
        return self

    def __len__(self) -> int:
        """Micro-batches this rank has left."""
        return max(0, self.total_samples - self.consumed_samples) // self.step_size

    def __next__(self) -> torch.Tensor:
        if self.consumed_samples + self.step_size > self.total_samples:
            raise StopIteration
        start = self.consumed_samples + self.dp_rank * self.micro_batch_size
        batch = np.stack([self.dataset[i] for i in range(start, start + self.micro_batch_size)])
        if self.vocab_size is not None and batch.size and int(batch.max()) >= self.vocab_size:
            row = int(np.argmax(batch.max(axis=1) >= self.vocab_size))
            raise ValueError(f"{self.source}: sample {start + row} holds token id {int(batch[row].max())}, past the "
                             f"vocabulary of {self.vocab_size}: the shards changed under the run, or were made with "
                             "another tokenizer; copy or rebuild them")
        self.consumed_samples += self.step_size
        import torch

        return torch.from_numpy(batch.astype(np.int64, copy=False))

    def state_dict(self) -> dict[str, int]:
        return {"consumed_samples": self.consumed_samples, "global_batch_size": self.global_batch_size,
                "micro_batch_size": self.micro_batch_size, "dp_size": self.dp_size,
                "dataset_length": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue after `consumed_samples`; it must fall on a micro-step boundary of this layout."""
        consumed = int(state["consumed_samples"])
        if consumed < 0 or consumed % self.step_size:
            raise ValueError(f"consumed_samples {consumed} is not a multiple of micro_batch_size x dp_size "
                             f"= {self.step_size}")
        if "dataset_length" in state and state["dataset_length"] != len(self.dataset):
            raise ValueError(f"the saved position is in a dataset of {state['dataset_length']} samples, this "
                             f"one has {len(self.dataset)}; rebuild it with the same num_samples")
        self.consumed_samples = consumed
