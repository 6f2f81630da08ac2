"""Word-problem accuracy of a trained model at any length, with test-time passes until convergence.

`evaluate_words` runs a set of words through the model in evaluation mode (for an implicit model,
the configured evaluation rule: by default the released one, damped passes until the batch's
relative change is below the tolerance, at most the evaluation cap). It reports accuracy over
every position and over the last `last` positions (the released metric, 10), the passes per forward
and the share of words whose residual ended below the tolerance. `sequential=True` runs the same
words token by token under the committed state (the released final evaluation: one solve per
token); passes are then per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from implicit_megatron.models.lm import LanguageModel


@dataclass
class WordResult:
    accuracy: float  # every position
    accuracy_last: float  # the last `last` positions of each word
    passes: float  # mean backbone passes per forward (per token in sequential mode)
    converged: float  # share of words (tokens, in sequential mode) whose residual ended below tol
    words: int
    length: int

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate_words(model: LanguageModel, words: torch.Tensor, labels: torch.Tensor, batch_size: int,
                   sequential: bool = False, last: int = 10) -> WordResult:
    """words, labels: (N, L) token ids and prefix products; the model is put in eval mode."""
    model.eval()
    device = model.embedding.weight.device
    correct = correct_last = converged = 0.0
    passes = []
    for start in range(0, words.shape[0], batch_size):
        x = words[start:start + batch_size].to(device)
        y = labels[start:start + batch_size].to(device)
        if sequential:
            z, _, stats = model.core.forward_sequential(model.embedding(x))
            logits = model.logits(z)
            passes += [s.passes_per_sample.double().mean().item() for s in stats]
            converged += sum(s.converged.double().sum().item() for s in stats) / len(stats)
        else:
            logits = model(x)
            solved = model.solver_stats()
            passes.append(solved.passes_per_sample.double().mean().item() if solved is not None else 1)
            converged += solved.converged.double().sum().item() if solved is not None else len(x)
        hits = (logits[..., :model.vocab_size].argmax(-1) == y).double()
        correct += hits.sum().item()
        correct_last += hits[:, -last:].sum().item()
    n, length = words.shape
    return WordResult(correct / (n * length), correct_last / (n * min(last, length)),
                      sum(passes) / len(passes), converged / n, n, length)
