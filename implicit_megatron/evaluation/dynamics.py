"""Inference dynamics (the paper's Table 7): how many passes the solver takes and how close it ends.

Simultaneous mode: passes per forward and the final relative residual ||F(z) - z|| / ||F(z)||,
averaged over batches weighted by their size. Sequential mode adds the passes each token needs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from implicit_megatron.evaluation.perplexity import NLLResult
from implicit_megatron.evaluation.sequential import SequentialResult


@dataclass
class DynamicsResult:
    seq_len: int
    windows: int
    ppl: float
    mean_passes: float  # solver passes without gradient per simultaneous forward
    phantom_steps: int  # the model's k: damped steps with gradient in training (evaluation runs none)
    residual: float  # final relative residual
    converged_frac: float
    sequential_mean_passes: float | None = None  # per token, in sequential mode
    sequential_residual: float | None = None
    passes_per_position: list[dict] = field(default_factory=list)  # sequential mode, per bucket

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(simultaneous: NLLResult, sequential: SequentialResult | None, buckets: int,
              phantom_steps: int) -> DynamicsResult:
    stats = simultaneous.stats
    total = sum(s.size for s in stats)

    def mean(values) -> float:
        return sum(v * s.size for v, s in zip(values, stats)) / total

    result = DynamicsResult(simultaneous.seq_len, total, simultaneous.ppl, mean(s.passes for s in stats),
                            phantom_steps, mean(s.residual for s in stats),
                            mean(s.converged for s in stats))
    if sequential is not None:
        result.sequential_mean_passes = sequential.passes.mean().item()
        result.sequential_residual = sequential.residual.mean().item()
        length = sequential.passes.shape[1]
        width = max(1, math.ceil(length / buckets))
        per_position = sequential.passes.mean(dim=0)
        result.passes_per_position = [{"start": a, "end": min(length, a + width),
                                       "passes": per_position[a:a + width].mean().item()}
                                      for a in range(0, length, width)]
    return result
