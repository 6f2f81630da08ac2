"""Duality of the two modes: does a model trained in simultaneous mode run in sequential mode?

The paper feeds identical windows to both modes and reports the greedy next-token match rate
(97.6 % for the 1.3B implicit Mamba2) and the per-position perplexity difference (its Figure 1C).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from implicit_megatron.evaluation.perplexity import NLLResult, position_buckets
from implicit_megatron.evaluation.sequential import SequentialResult


@dataclass
class DualityResult:
    seq_len: int
    windows: int
    tokens: int
    match_rate: float  # greedy predictions equal in both modes
    ppl_simultaneous: float
    ppl_sequential: float
    ppl_difference: float  # sequential - simultaneous
    max_nll_difference: float  # largest |NLL_seq - NLL_sim| of any token
    positions: list[dict] = field(default_factory=list)  # per bucket: start, end, both ppls, difference

    def to_dict(self) -> dict:
        return asdict(self)


def compare_modes(simultaneous: NLLResult, sequential: SequentialResult, buckets: int) -> DualityResult:
    """Both results must cover the same windows in the same order."""
    if simultaneous.nll.shape != sequential.nll.shape:
        raise ValueError(f"the two modes saw different windows: {tuple(simultaneous.nll.shape)} vs "
                         f"{tuple(sequential.nll.shape)}")
    match = (simultaneous.predictions == sequential.predictions).double().mean().item()
    ppl_sim, ppl_seq = simultaneous.ppl, sequential.ppl
    positions = []
    for a, b in zip(position_buckets(simultaneous.nll, buckets), position_buckets(sequential.nll, buckets)):
        positions.append({"start": a["start"], "end": a["end"], "ppl_simultaneous": a["ppl"],
                          "ppl_sequential": b["ppl"], "difference": b["ppl"] - a["ppl"]})
    worst = (sequential.nll - simultaneous.nll).abs().max().item()
    return DualityResult(simultaneous.seq_len, simultaneous.nll.shape[0], simultaneous.tokens, match, ppl_sim,
                         ppl_seq, ppl_seq - ppl_sim, worst, positions)
