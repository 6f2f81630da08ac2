"""The word problem's states (the paper's state tracking): group elements in, prefix products out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch

from implicit_megatron.config import Config
from implicit_megatron.train.tasks.batch_streams import GlobalBatchStream, order_digest, split_fixed_set


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
