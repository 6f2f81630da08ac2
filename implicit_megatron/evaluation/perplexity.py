"""Token negative log-likelihood in simultaneous mode (the parallel forward), and what it gives.

The NLL is cross-entropy over the model's whole (padded) output, exactly the training loss, so
the test perplexity is comparable with the run's `val/ppl`. Each batch's solver statistics are
kept for the inference-dynamics table.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from implicit_megatron.evaluation.windows import batches
from implicit_megatron.models.lm import LanguageModel


@dataclass
class BatchStats:
    """One simultaneous solve: passes without gradient, phantom passes, residual and convergence."""

    size: int
    passes: int
    phantom_passes: int
    residual: float  # mean over the batch of the final relative residual
    converged: float  # fraction of the batch below the tolerance


@dataclass
class NLLResult:
    seq_len: int
    nll: torch.Tensor  # (windows, seq_len) float64, per predicted token
    predictions: torch.Tensor  # (windows, seq_len) int64, greedy over the real vocabulary
    stats: list[BatchStats] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.nll.numel()

    @property
    def mean_nll(self) -> float:
        return self.nll.mean().item()

    @property
    def ppl(self) -> float:
        return math.exp(self.mean_nll)


def batch_stats(model: LanguageModel, size: int) -> BatchStats:
    stats = model.solver_stats()
    if stats is None:  # the explicit model: one pass, nothing to converge
        return BatchStats(size, 1, 0, 0.0, 1.0)
    return BatchStats(size, int(stats.passes), int(stats.phantom_passes), stats.residual.float().mean().item(),
                      stats.converged_frac)


@torch.no_grad()
def token_nll(model: LanguageModel, windows: torch.Tensor, batch_size: int, progress=None,
              every: float = 30.0) -> NLLResult:
    """Per-token NLL and greedy prediction of every window (L inputs, L labels), and the solver
    statistics of each batch; `progress(windows done)` is called at most every `every` seconds."""
    device = model.embedding.weight.device
    rows: list[torch.Tensor] = []
    greedy: list[torch.Tensor] = []
    stats: list[BatchStats] = []
    last = time.monotonic()
    for batch in batches(windows, batch_size):
        if progress is not None and time.monotonic() - last >= every:
            progress(sum(len(r) for r in rows))
            last = time.monotonic()
        inputs, labels = batch[:, :-1].to(device), batch[:, 1:].to(device)
        logits = model(inputs)
        nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
        rows.append(nll.view(labels.shape).double().cpu())
        greedy.append(logits[..., :model.vocab_size].argmax(-1).cpu())
        stats.append(batch_stats(model, len(batch)))
    return NLLResult(windows.shape[1] - 1, torch.cat(rows), torch.cat(greedy), stats)


def position_buckets(nll: torch.Tensor, buckets: int) -> list[dict]:
    """Perplexity per position bucket: exp of the mean NLL over every window's positions [start, end)."""
    length = nll.shape[1]
    width = max(1, math.ceil(length / buckets))
    per_position = nll.mean(dim=0)
    out = []
    for start in range(0, length, width):
        end = min(length, start + width)
        out.append({"start": start, "end": end, "ppl": math.exp(per_position[start:end].mean().item())})
    return out
