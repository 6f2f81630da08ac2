"""Sequential-mode generation: the prompt and then each new token are run token by token.

Between tokens only the committed per-layer state is carried (Mamba2: conv and SSM states; Llama:
the KV cache), so memory is constant in the number of solver passes, and for Mamba2 also in the
length. Prompts of different lengths generate together (`generate_batch`), each row as it would
alone. Sampling sees only the real vocabulary (the padded logits are masked); temperature 0 is
greedy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

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
    row_stop = None if stop is None else (lambda row, new_ids: stop(new_ids))
    row_on_token = None if on_token is None else (lambda row, *chosen: on_token(*chosen))
    return generate_batch(model, [prompt_ids], sampling, eod_id, row_stop, row_on_token)[0]


@torch.no_grad()
def generate_batch(model: LanguageModel, prompts: list[list[int]], sampling: SamplingConfig,
                   eod_id: int | None = None, stop: Callable[[int, list[int]], bool] | None = None,
                   on_token: Callable[[int, int, int, float], None] | None = None) -> list[GenerationResult]:
    """Generate after each of `prompts` together: the prompts left-padded into one batch, each row
    solved on its own (core.step), so that greedy decoding gives every row the tokens it gets alone.
    A row that has finished (EOD, `stop(row, new_ids)`, or max_new_tokens) is padding from then on:
    it is no longer iterated. `on_token(row, token, passes, residual)` is called as a token is chosen.
    Sampled rows draw from one generator in row order, so their draws depend on the batch."""
    if any(not ids for ids in prompts) and eod_id is None:
        raise ValueError("an empty prompt needs an end-of-document token to start from")
    prompts = [list(ids) if ids else [cast(int, eod_id)] for ids in prompts]  # checked above
    core, device = model.core, model.embedding.weight.device
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    results = [GenerationResult(ids) for ids in prompts]
    width = max(len(ids) for ids in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, device=device)
        mask[row, width - len(prompt):] = True
    z, state, stats = core.forward_sequential(model.embedding(ids), None, max_len=width + sampling.max_new_tokens,
                                              mask=mask)
    passes = torch.stack([s.passes_per_sample for s in stats], dim=1).cpu()
    for row, result in enumerate(results):
        result.prompt_passes = passes[row, mask[row].cpu()].tolist()
    active = torch.ones(len(prompts), dtype=torch.bool, device=device)
    for _ in range(sampling.max_new_tokens):
        tokens = sample_next(model.logits(z[:, -1]), model.vocab_size, sampling, generator)
        token_passes, residual = stats[-1].passes_per_sample.tolist(), stats[-1].residual.tolist()
        for row in active.nonzero().flatten().tolist():
            result, token = results[row], int(tokens[row])
            result.new_ids.append(token)
            result.passes.append(int(token_passes[row]))
            result.residuals.append(float(residual[row]))
            if on_token is not None:
                on_token(row, token, int(token_passes[row]), float(residual[row]))
            done = (sampling.stop_at_eod and token == eod_id) or (stop is not None and stop(row, result.new_ids))
            if done or len(result.new_ids) == sampling.max_new_tokens:
                active[row] = False  # the last token needs no step of its own
        if not bool(active.any()):
            break
        z, state, stats = core.forward_sequential(model.embedding(tokens[:, None]), state, mask=active[:, None],
                                                  last=z[:, -1])
    return results


def continuation_text(tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text the new tokens add to the prompt: the whole sequence decoded, cut after the prompt's
    own text. Decoding the new tokens alone drops what depends on their neighbours (SentencePiece
    writes a word's leading space as part of the token, and drops it at the start of a decode)."""
    head = tokenizer.decode(prompt_ids)
    whole = tokenizer.decode(prompt_ids + new_ids)
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new_ids)
