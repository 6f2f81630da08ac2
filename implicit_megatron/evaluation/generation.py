"""Sequential-mode generation: the prompt and then each new token are run token by token.

Between tokens only the committed per-layer state is carried (Mamba2: conv and SSM states; Llama:
the KV cache), so memory is constant in the number of solver passes, and for Mamba2 also in the
length. Sampling sees only the real vocabulary (the padded logits are masked); temperature 0 is
greedy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from implicit_megatron.models.lm import LanguageModel


@dataclass
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_at_eod: bool = True


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    new_ids: list[int] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)  # solver passes of the step that gave each new token
    residuals: list[float] = field(default_factory=list)
    prompt_passes: list[int] = field(default_factory=list)  # passes of each prompt token


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Top-k, then nucleus (top-p) filtering: the rest get -inf. logits (B, V)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) >= top_p  # keep the token that crosses p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, vocab_size: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> torch.Tensor:
    """(B, padded_vocab) logits -> (B,) token ids from the real vocabulary."""
    logits = logits[..., :vocab_size].float()
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


@torch.no_grad()
def generate(model: LanguageModel, prompt_ids: list[int], sampling: SamplingConfig, eod_id: int | None = None,
             stop: Callable[[list[int]], bool] | None = None,
             on_token: Callable[[int, int, float], None] | None = None) -> GenerationResult:
    """Generate after `prompt_ids` (an empty prompt starts from EOD). `stop(new_ids)` ends early;
    `on_token(token, passes, residual)` is called as each token is chosen."""
    if not prompt_ids:
        if eod_id is None:
            raise ValueError("an empty prompt needs an end-of-document token to start from")
        prompt_ids = [eod_id]
    core, device = model.core, model.embedding.weight.device
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    result = GenerationResult(list(prompt_ids))
    ids = torch.tensor([prompt_ids], device=device)
    z, state, stats = core.forward_sequential(model.embedding(ids), None,
                                              max_len=len(prompt_ids) + sampling.max_new_tokens)
    result.prompt_passes = [int(s.passes) for s in stats]
    for _ in range(sampling.max_new_tokens):
        token = int(sample_next(model.logits(z[:, -1]), model.vocab_size, sampling, generator)[0])
        passes, residual = int(stats[-1].passes), float(stats[-1].residual.max())
        result.new_ids.append(token)
        result.passes.append(passes)
        result.residuals.append(residual)
        if on_token is not None:
            on_token(token, passes, residual)
        if (sampling.stop_at_eod and token == eod_id) or (stop is not None and stop(result.new_ids)):
            break
        if len(result.new_ids) == sampling.max_new_tokens:
            break  # the last token needs no step of its own
        z, state, stats = core.forward_sequential(model.embedding(torch.tensor([[token]], device=device)), state)
    return result
