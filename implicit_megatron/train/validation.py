"""Validation while training: every evaluation set of the task, summed over tokens and ranks, with
the solver's statistics (the paper's Table 7: passes per forward, final residual, share converged;
a capped, unconverged evaluation shows here). Sums stay on the device until one read per set."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.train.step_metrics import reduce_over_ranks
from implicit_megatron.train.tasks import GroupedTask, Task


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over the labelled positions; 0 where none is (a catbAbI window without an answer)."""
    total = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp_min(1)


def accuracy(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The share of positions whose most likely class (among the real vocabulary) is the label
    (positions labelled IGNORE_INDEX not counted)."""
    valid = labels != IGNORE_INDEX
    hits = (logits[..., :vocab_size].argmax(-1) == labels) & valid
    return hits.sum() / valid.sum().clamp_min(1)


def group_hits(logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, vocab_size: int,
               count: int) -> torch.Tensor:
    """(2, count): correct predictions and scored positions per group (positions in group -1 are not scored)."""
    scored = groups >= 0
    hits = (logits[..., :vocab_size].argmax(-1) == labels) & scored
    ids = groups.clamp_min(0).flatten()
    return torch.stack([torch.bincount(ids, hits.flatten().float(), minlength=count)[:count],
                        torch.bincount(ids, scored.flatten().float(), minlength=count)[:count]])


@torch.no_grad()
def evaluate(engine, task: Task, forward: Callable, vocab_size: int, rank: int, world: int) -> dict[str, float]:
    """Loss (and perplexity or accuracy) and solver statistics of every evaluation set of `task`.
    `forward(inputs, labels=None)` is the trainer's: logits, or with labels the mean loss."""
    engine.eval()
    results = {}
    device = engine.device
    grouped = cast(GroupedTask, task) if task.groups else None
    for name, batches in task.eval_sets(rank, world).items():
        # loss sum, hits, tokens, passes, forwards, residual sum, converged, samples: over ranks later
        sums = torch.zeros(8, dtype=torch.float64, device=device)
        by_group = torch.zeros(2, task.groups, device=device)  # catbAbI: per task
        for batch in batches:  # sums over tokens, so that ranks with smaller batches weigh less
            inputs, labels = (t.to(device) for t in task.inputs_and_targets(batch))
            valid = labels != IGNORE_INDEX  # padding that keeps the ranks' forwards in step
            count = valid.sum()
            if task.reports_accuracy:
                logits = forward(inputs)
                sums[0] += lm_loss(logits, labels).double() * count
                sums[1] += accuracy(logits, labels, vocab_size).double() * count
                if grouped is not None:
                    by_group += group_hits(logits, labels, grouped.accuracy_groups(batch).to(labels.device),
                                           vocab_size, task.groups)
            else:  # the mean loss of a batch without labels (padding) is NaN: it adds nothing
                loss = forward(inputs, labels).double()
                sums[0] += torch.where(count > 0, loss * count, torch.zeros_like(loss))
            sums[2] += count
            stats = engine.module.solver_stats()
            sums[3] += stats.passes if stats is not None else 1
            sums[4] += 1
            if stats is not None:
                real = valid.flatten(1).any(1)
                sums[5] += (stats.residual.double() * real).sum()
                sums[6] += (stats.converged & real).sum()
                sums[7] += real.sum()
        loss_sum, correct, tokens, passes, forwards, residual, converged, samples = reduce_over_ranks(
            sums.tolist(), device)
        if not tokens:
            continue
        loss = loss_sum / tokens
        results.update({f"{name}/loss": loss, f"{name}/solver_iterations": passes / forwards})
        if samples:
            results.update({f"{name}/solver_residual": residual / samples,
                            f"{name}/converged_frac": converged / samples})
        if task.reports_accuracy:
            results[f"{name}/accuracy"] = correct / tokens
        else:
            results[f"{name}/ppl"] = math.exp(min(loss, 50.0))
        if grouped is not None:
            results.update(grouped.group_metrics(name, reduce_over_ranks(by_group.flatten().tolist(), device)))
    engine.train()
    return results
