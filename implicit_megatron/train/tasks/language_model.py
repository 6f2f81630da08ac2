"""Next-token prediction on packed shards: the paper's language modelling (and any corpus's)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch

from data_pipeline.packed import DistributedBatchIterator
from implicit_megatron.config import Config
from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.train.tasks.batch_streams import order_digest

PAD = -1  # a validation row that only keeps the ranks' forwards in step
FINGERPRINT_SAMPLES = 64


class LanguageModelTask:
    """Packed token windows of seq_len + 1: inputs are the first seq_len tokens, targets the last."""

    reports_accuracy = False
    groups = 0  # no accuracy per group of positions (catbAbI's per-task accuracy)

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def prepare(self) -> None:
        """(Rank 0) the shards built where data.source asks, then the data summary: tokens per split,
        planned tokens and the epochs they make, with a warning above one epoch."""
        from implicit_megatron.train.tasks.shards import data_summary, prepare_shards

        prepare_shards(self.cfg)
        line, warning = data_summary(self.cfg)
        print(line, flush=True)  # beside the trainer's own lines
        if warning is not None:
            logging.getLogger(__name__).warning(warning)

    def train_batches(self, rank: int, world: int, accum: int) -> DistributedBatchIterator:
        from implicit_megatron.train.tasks.shards import train_batches

        return train_batches(self.cfg, rank, world, accum)

    def order_fingerprint(self, batches: DistributedBatchIterator, consumed: int) -> str:
        """A digest of the first `consumed` training samples' order: the tokens of 64 of them, spread
        evenly (what a resume compares to accept a raised train.steps)."""
        return order_digest(np.asarray(batches.dataset[consumed * i // FINGERPRINT_SAMPLES])
                       for i in range(FINGERPRINT_SAMPLES) if consumed)

    def inputs_and_targets(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A row of PAD (validation padding) is an input of token 0 whose labels are ignored."""
        return batch[:, :-1].clamp_min(0), batch[:, 1:].masked_fill(batch[:, 1:] == PAD, IGNORE_INDEX)

    def eval_sets(self, rank: int, world: int) -> dict[str, Iterator[torch.Tensor]]:
        """The first train.eval_samples windows of the validation split, split across ranks: the same
        samples at every micro batch size and world size. Every rank runs as many forwards as the
        others (a free phase agrees on each pass over the ranks): a rank with fewer samples pads
        with rows whose labels are ignored."""
        from data_pipeline.packed import TooFewTokens
        from implicit_megatron.train.tasks.shards import valid_dataset

        if not hasattr(self, "_valid"):
            try:
                self._valid = valid_dataset(self.cfg)
            except (FileNotFoundError, TooFewTokens) as err:  # made without a validation split, or too short
                self._valid = None
                if rank == 0:
                    logging.getLogger(__name__).warning(f"no validation data; validation is skipped: {err}")
        if self._valid is None:
            return {}
        count = min(self.cfg.train.eval_samples, len(self._valid))
        return {"val": self._rows(range(rank, count, world), -(-count // world))}

    def _rows(self, indices: range, share: int) -> Iterator[torch.Tensor]:
        rows = [np.asarray(self._valid[i], dtype=np.int64) for i in indices]
        rows += [np.full(self.cfg.data.seq_len + 1, PAD, dtype=np.int64)] * (share - len(rows))
        micro = self.cfg.train.micro_batch_size
        for start in range(0, len(rows), micro):
            yield torch.from_numpy(np.stack(rows[start:start + micro]))
