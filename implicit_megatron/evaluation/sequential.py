"""The evaluation windows in sequential mode: token by token, only the committed state carried.

This is how the model generates (see generation.py); running it on the same windows as the
simultaneous forward measures the duality of the two modes and the passes each token needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from implicit_megatron.evaluation.windows import batches
from implicit_megatron.models.lm import LanguageModel


@dataclass
class SequentialResult:
    seq_len: int
    nll: torch.Tensor  # (windows, seq_len) float64
    predictions: torch.Tensor  # (windows, seq_len) int64, greedy over the real vocabulary
    passes: torch.Tensor  # (windows, seq_len) solver passes of each token
    residual: torch.Tensor  # (windows, seq_len) final relative residual of each token

    @property
    def ppl(self) -> float:
        return math.exp(self.nll.mean().item())


@torch.no_grad()
def run_sequential(model: LanguageModel, windows: torch.Tensor, batch_size: int) -> SequentialResult:
    """Per-token NLL, greedy predictions and solver passes in sequential mode."""
    device = model.embedding.weight.device
    nll, greedy, passes, residual = [], [], [], []
    for batch in batches(windows, batch_size):
        inputs, labels = batch[:, :-1].to(device), batch[:, 1:].to(device)
        z, _, stats = model.core.forward_sequential(model.embedding(inputs))
        logits = model.logits(z)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
        nll.append(loss.view(labels.shape).double().cpu())
        greedy.append(logits[..., :model.vocab_size].argmax(-1).cpu())
        passes.append(torch.stack([s.passes_per_sample.double().cpu() for s in stats], dim=1))
        residual.append(torch.stack([s.residual.double().cpu() for s in stats], dim=1))
    return SequentialResult(windows.shape[1] - 1, torch.cat(nll), torch.cat(greedy), torch.cat(passes),
                            torch.cat(residual))
