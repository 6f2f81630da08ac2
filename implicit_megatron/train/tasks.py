"""What a run learns: next-token prediction on packed shards, or the word problem's states (here),
or the answers of catbAbI stories (catbabi_task.py).

A task gives the trainer its batches (resumable, the same global order at every world size), the
inputs and targets of a batch, and its evaluation sets; the loss is cross-entropy in every case
(over the next token, the state after each token, or the answer tokens). The word problem and
catbAbI also report accuracy, the paper's measure for state tracking; catbAbI per task too
(`groups`: how many groups of positions `accuracy_groups` sorts targets into; 0: none).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch

from data_pipeline.packed import DistributedBatchIterator
from implicit_megatron.config import Config
from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.train.batch_streams import GlobalBatchStream, order_digest, split_fixed_set

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
        from implicit_megatron.train.data import data_summary, prepare_shards

        prepare_shards(self.cfg)
        line, warning = data_summary(self.cfg)
        print(line, flush=True)  # beside the trainer's own lines
        if warning is not None:
            logging.getLogger(__name__).warning(warning)

    def train_batches(self, rank: int, world: int, accum: int) -> DistributedBatchIterator:
        from implicit_megatron.train.data import train_batches

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
        from implicit_megatron.train.data import valid_dataset

        if not hasattr(self, "_valid"):
            try:
                self._valid = valid_dataset(self.cfg)
            except FileNotFoundError as err:  # shards made without a validation split (--valid-fraction 0)
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


class WordProblemTask:
    """Inputs are group elements, targets the prefix products at the same positions (no shift)."""

    reports_accuracy = True
    groups = 0

    def __init__(self, cfg: Config):
        from data_pipeline.synthetic.algebra import get_algebra
        from data_pipeline.synthetic.word_problem import WordProblemSpec, from_released_p

        self.cfg = cfg
        w = cfg.task.word_problem
        self.p, self.eval_p = w.p, w.eval_p  # as the paper defines p
        if w.p_convention == "released":
            group_size = get_algebra(w.algebra).group_size
            self.p, self.eval_p = from_released_p(w.p, group_size), from_released_p(w.eval_p, group_size)
        self.spec = WordProblemSpec(w.algebra, cfg.data.seq_len, self.p, cfg.data.seed)

    def prepare(self) -> None:
        """Nothing to build: words are made on the fly."""

    def train_batches(self, rank: int, world: int, accum: int) -> GlobalBatchStream:
        """`accum` is implied: each rank's share of the global batch, in micro-batches."""
        return GlobalBatchStream(self.global_batch, self.cfg.train.global_batch_size,
                                 self.cfg.train.micro_batch_size, rank, world)

    def global_batch(self, k: int) -> torch.Tensor:
        """(2, global_batch, length): the words and labels of global batch k."""
        from data_pipeline.synthetic.word_problem import batch_rng, generate_words

        words, labels = generate_words(self.spec, self.cfg.train.global_batch_size, batch_rng(self.spec.seed, 0, k))
        return torch.from_numpy(np.stack([words, labels]).astype(np.int64))

    def inputs_and_targets(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return batch[0], batch[1]

    def order_fingerprint(self, batches: GlobalBatchStream, consumed: int) -> str:
        """Words are a function of (spec, batch number) alone, whatever train.steps: the digest of the
        spec's first global batch identifies the order."""
        return order_digest(self.global_batch(0).numpy())

    def eval_sets(self, rank: int, world: int) -> dict[str, Iterator[torch.Tensor]]:
        """In distribution (val), at eval_p (val_p{eval_p}), and at each longer length (val_len{L}):
        fixed sets from seeds apart from training's, split across ranks."""
        w = self.cfg.task.word_problem
        sets = {"val": replace(self.spec, seed=self.spec.seed + 1)}
        if w.eval_p != w.p:  # named by the value as configured
            sets[f"val_p{w.eval_p}"] = replace(self.spec, p=self.eval_p, seed=self.spec.seed + 2)
        for length in w.eval_lengths:
            sets[f"val_len{length}"] = replace(self.spec, length=length, seed=self.spec.seed + 3)
        return {name: self._fixed_set(spec, rank, world) for name, spec in sets.items()}

    def _fixed_set(self, spec, rank: int, world: int) -> Iterator[torch.Tensor]:
        from data_pipeline.synthetic.word_problem import generate

        words, labels = generate(spec.group, self.cfg.task.word_problem.eval_words, spec.length, spec.p, spec.seed)
        every = torch.from_numpy(np.stack([words, labels]).astype(np.int64))
        return split_fixed_set(every, rank, world, self.cfg.train.micro_batch_size, ignored_channel=1)


def build_task(cfg: Config):
    """The task of `task.kind`: LanguageModelTask, WordProblemTask or catbabi_task.CatbabiTask."""
    if cfg.task.kind == "catbabi":
        from implicit_megatron.train.catbabi_task import CatbabiTask

        return CatbabiTask(cfg)
    return WordProblemTask(cfg) if cfg.task.kind == "word_problem" else LanguageModelTask(cfg)
