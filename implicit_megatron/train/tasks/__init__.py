"""What a run learns, one module per task: next-token prediction on packed shards
(language_model.py), the word problem's states (word_problem.py), the answers of catbAbI stories
(catbabi.py). `Task` is what the training loop, validation and checkpoints ask of each.

The loss is cross-entropy in every case (over the next token, the state after each token, or the
answer tokens). The word problem and catbAbI also report accuracy, the paper's measure for state
tracking; catbAbI per bAbI task too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from implicit_megatron.config import Config

if TYPE_CHECKING:  # the config check before each launch reads train.tasks.shards and needs no torch
    import torch


class Task(Protocol):
    """The contract between a task and the trainer."""

    reports_accuracy: bool  # validation reports accuracy besides the loss
    groups: int  # how many groups of positions `accuracy_groups` sorts targets into (catbAbI's tasks); 0: none

    def prepare(self) -> None:
        """(Rank 0, before training) build or check what the task reads, and say what it holds."""

    def train_batches(self, rank: int, world: int, accum: int) -> Iterator[torch.Tensor]:
        """This rank's micro-batches, the same global order at every world size; resumable through the
        iterator's state_dict() / load_state_dict() (the checkpoint keeps its position)."""

    def order_fingerprint(self, batches, consumed: int) -> str:
        """A digest of the training order of the first `consumed` samples: a resume compares it to
        accept a run whose order did not change."""

    def inputs_and_targets(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's inputs (B, T) and the targets of the loss (B, T; IGNORE_INDEX where none)."""

    def eval_sets(self, rank: int, world: int) -> dict[str, Iterator[torch.Tensor]]:
        """Validation sets by name, split across ranks so that every rank runs as many forwards."""



class GroupedTask(Task, Protocol):
    """A task whose accuracy is also reported per group of positions (groups > 0: catbAbI's tasks)."""

    def accuracy_groups(self, batch: torch.Tensor) -> torch.Tensor:
        """Each target's group id (B, T), -1 where not scored."""

    def group_metrics(self, name: str, totals: list[float]) -> dict[str, float]:
        """The metrics of the validation set `name` from per-group hits and counts."""


def build_task(cfg: Config) -> Task:
    """The task of `task.kind`."""
    if cfg.task.kind == "catbabi":
        from implicit_megatron.train.tasks.catbabi import CatbabiTask

        return CatbabiTask(cfg)
    if cfg.task.kind == "word_problem":
        from implicit_megatron.train.tasks.word_problem import WordProblemTask

        return WordProblemTask(cfg)
    from implicit_megatron.train.tasks.language_model import LanguageModelTask

    return LanguageModelTask(cfg)
