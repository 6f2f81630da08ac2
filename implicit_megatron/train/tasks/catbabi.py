"""catbAbI as a training task: the bAbI stories of a folder as one token stream, scored on answers.

As in Schlag et al. (2021) and the paper's appendix D.2, the stories of a split (shuffled with
data.seed) are concatenated, "<eos>" before each, and cut into windows of data.seq_len + 1 tokens,
one after the other; the model predicts the next token, and the loss and the accuracy count only
the tokens that answer a question. Validation also reports the accuracy of each of the 20 tasks.
The vocabulary is built from every split in the folder (sorted words, so the same on every rank and
at every launch) and saved beside the run as catbabi_vocab.json.

Windows are independent samples here: the recurrent state is not carried from one window into the
next, as the released models do not carry it either.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from data_pipeline.synthetic.catbabi import folder_vocabulary, split_windows
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused
from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.train.tasks.batch_streams import GlobalBatchStream, order_digest, split_fixed_set

TASKS = 20  # bAbI task numbers run from 1 to 20; metrics are named accuracy_task<N>
VOCAB_FILE = "catbabi_vocab.json"


def windows(folder: str, split: str, split_answers: bool, seq_len: int, seed: int | None) -> np.ndarray:
    """data_pipeline's split_windows; a split too short for one window refuses the run in one line."""
    try:
        return split_windows(folder, split, split_answers, seq_len, seed)
    except ValueError as err:
        raise RunRefused(str(err)) from None


class CatbabiTask:
    """Inputs are a window's first seq_len tokens; targets the next tokens where they answer a question."""

    reports_accuracy = True
    groups = TASKS + 1  # accuracy_groups ids: the task number (0 unused)

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.options = cfg.task.catbabi

    @functools.cached_property
    def _train(self) -> np.ndarray:
        c = self.options
        return windows(c.folder, "train", c.split_answers, self.cfg.data.seq_len, self.cfg.data.seed)

    def prepare(self) -> None:
        """Save the vocabulary beside the run (what generation and analysis decode with)."""
        c = self.options
        folder_vocabulary(c.folder, c.split_answers).save(Path(self.cfg.output_dir) / VOCAB_FILE)

    def train_batches(self, rank: int, world: int, accum: int) -> GlobalBatchStream:
        return GlobalBatchStream(self.global_batch, self.cfg.train.global_batch_size,
                                 self.cfg.train.micro_batch_size, rank, world)

    def global_batch(self, k: int) -> torch.Tensor:
        """(3, global_batch, seq_len + 1): samples k*G .. (k+1)*G - 1 of the endless sequence of epochs,
        each epoch every training window once, in an order drawn from (data.seed, epoch)."""
        size = self.cfg.train.global_batch_size
        count = len(self._train)
        samples = np.arange(k * size, (k + 1) * size)
        rows = np.empty(size, dtype=np.int64)
        for epoch in np.unique(samples // count):
            here = samples // count == epoch
            order = np.random.default_rng([self.cfg.data.seed, int(epoch)]).permutation(count)
            rows[here] = order[samples[here] % count]
        return torch.from_numpy(self._train[rows]).transpose(0, 1).contiguous()

    def inputs_and_targets(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels are IGNORE_INDEX except on answer tokens (mark > 0; padding rows carry a negative mark)."""
        tokens, answer = batch[0], batch[1][:, 1:] > 0
        return tokens[:, :-1], tokens[:, 1:].masked_fill(~answer, IGNORE_INDEX)

    def accuracy_groups(self, batch: torch.Tensor) -> torch.Tensor:
        """The task number of each scored target; -1 where the target is not an answer."""
        return batch[2][:, 1:].masked_fill(batch[1][:, 1:] <= 0, -1)

    def group_metrics(self, name: str, totals: list[float]) -> dict[str, float]:
        hits, counts = totals[: self.groups], totals[self.groups:]
        return {f"{name}/accuracy_task{t}": hits[t] / counts[t] for t in range(1, self.groups) if counts[t]}

    def order_fingerprint(self, batches: GlobalBatchStream, consumed: int) -> str:
        """The order is a function of (data.seed, the training windows): the digest of the first
        global batch identifies it."""
        return order_digest(self.global_batch(0).numpy())

    def eval_sets(self, rank: int, world: int) -> dict[str, Iterator[torch.Tensor]]:
        """`val`: train.eval_samples windows of task.catbabi.eval_split (all of them if fewer), spread
        evenly over its stream in file order (tasks 1 to 20) so that every task is in it, split
        across ranks."""
        return {"val": split_fixed_set(self._eval, rank, world, self.cfg.train.micro_batch_size, ignored_channel=1)}

    @functools.cached_property
    def _eval(self) -> torch.Tensor:
        """(3, windows, seq_len + 1): the evaluation windows, read once per run."""
        c = self.options
        every = windows(c.folder, c.eval_split, c.split_answers, self.cfg.data.seq_len, None)
        wanted = min(self.cfg.train.eval_samples, len(every))
        picked = every[[len(every) * i // wanted for i in range(wanted)]]
        return torch.from_numpy(picked).transpose(0, 1).contiguous()
