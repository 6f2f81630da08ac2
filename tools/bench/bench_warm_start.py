"""Warm starts in sequential mode: passes saved, and what they change, against the solver's own tolerance.

    python tools/bench/bench_warm_start.py MODEL [MODEL ...] [--data PREFIX] [--prompts 16] [--new-tokens 128]
        [--windows 8] [--tight 10] [--rule released|solver]

A warm start begins token t's solve from token t-1's fixed point instead of zero
(implicit.warm_start). For each model (a checkpoint folder or an export) this prints, for the cold
start at the model's tolerance, the warm start at that tolerance, and the cold start at a --tight
times smaller tolerance (the reference for how much the tolerance itself decides):

- passes per new token of greedy generation, and per prompt token (--prompts prompts of 16-64 tokens
  from the test split of --data, or random tokens without it; --new-tokens each, at least 2,000
  tokens in all by default);
- greedy agreement: on the cold start's generated sequences, teacher-forced, the share of positions
  whose greedy token equals the tight reference's, and equals the cold start's;
- sequential-mode perplexity of --windows test windows at the training length (with --data).

The warm start changes greedy tokens no more than the tolerance does when its agreement with the
tight reference is at least the cold start's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def prompts_of(model, args, generator: torch.Generator) -> list[list[int]]:
    lengths = torch.randint(16, 65, (args.prompts,), generator=generator).tolist()
    if args.data is None:
        return [torch.randint(1, model.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    from implicit_megatron.evaluation.windows import load_windows

    windows = load_windows(args.data, 64, seed=1234, max_windows=args.prompts)
    return [windows[i % len(windows), :n].tolist() for i, n in enumerate(lengths)]


def greedy_tokens(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Teacher-forced greedy token at every position of each sequence, in sequential mode."""
    out = []
    for ids in sequences:
        z, _, _ = model.core.forward_sequential(model.embedding(torch.tensor([ids])))
        out.append(model.logits(z)[0, :, :model.vocab_size].argmax(-1))
    return out


def sequential_ppl(model, windows: torch.Tensor | None) -> float | None:
    if windows is None:
        return None
    from implicit_megatron.evaluation.sequential import run_sequential

    return run_sequential(model, windows, batch_size=len(windows)).ppl


def measure(path: str, args) -> None:
    from implicit_megatron.evaluation.generation import SamplingConfig, generate_batch
    from implicit_megatron.evaluation.loading import load_model

    loaded = load_model(path)
    model, settings = loaded.model, loaded.model.core.settings
    if settings is not None and args.rule:
        settings = replace(settings, eval_rule=args.rule)
    if settings is None:
        print(f"{path}: an explicit model (one pass per token): nothing to warm-start")
        return
    tol = settings.stop_tol(False)
    if tol is None:
        print(f"{path}: evaluated at a fixed depth (no tolerance): a warm start saves no passes")
        return
    generator = torch.Generator().manual_seed(0)
    prompts = prompts_of(model, args, generator)
    windows = None
    if args.data is not None:
        from implicit_megatron.evaluation.windows import load_windows

        windows = load_windows(args.data, loaded.cfg.data.seq_len, seed=1234, max_windows=args.windows)
    variants = {"cold": replace(settings, warm_start=False), "warm": replace(settings, warm_start=True),
                f"cold, tol/{args.tight:g}": replace(settings, warm_start=False, tol=tol / args.tight,
                                                       eval_tol=tol / args.tight)}
    sampling = SamplingConfig(args.new_tokens, temperature=0.0, stop_at_eod=False)
    rows, sequences, greedy = {}, None, {}
    for name, variant in variants.items():
        model.core.settings = variant
        results = generate_batch(model, prompts, sampling)
        if sequences is None:  # the cold start's text is the one every variant is scored on
            sequences = [r.prompt_ids + r.new_ids for r in results]
        greedy[name] = torch.cat(greedy_tokens(model, sequences))
        rows[name] = (statistics.mean(p for r in results for p in r.passes),
                      statistics.mean(p for r in results for p in r.prompt_passes), sequential_ppl(model, windows))
    model.core.settings = settings
    reference, cold = greedy[f"cold, tol/{args.tight:g}"], greedy["cold"]
    tokens = sum(len(s) for s in sequences)
    print(f"{loaded.label}: tolerance {tol:g}, cap {settings.cap(False)}, rule {settings.eval_rule}; "
          f"{len(prompts)} prompts x {args.new_tokens} new tokens; agreement over {tokens} positions")
    print(f"{'start':<18} {'passes/token':>12} {'prompt passes':>13} {'agree tight':>12} {'agree cold':>11} "
          f"{'seq. ppl':>9}")
    for name, (passes, prompt_passes, ppl) in rows.items():
        agree_tight = (greedy[name] == reference).double().mean().item()
        agree_cold = (greedy[name] == cold).double().mean().item()
        shown = f"{ppl:>9.3f}" if ppl is not None and math.isfinite(ppl) else f"{'-':>9}"
        print(f"{name:<18} {passes:>12.2f} {prompt_passes:>13.2f} {agree_tight:>12.4f} {agree_cold:>11.4f} {shown}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="checkpoint folders or exported folders")
    p.add_argument("--data", default=None, help="a shard prefix: prompts and windows from its test split")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--windows", type=int, default=8, help="test windows for the sequential-mode perplexity")
    p.add_argument("--tight", type=float, default=10.0, help="the reference's tolerance: the model's / this")
    p.add_argument("--rule", choices=("released", "solver"), default=None,
                   help="the evaluation rule (implicit.eval_rule; default: the model's)")
    args = p.parse_args(argv)
    with torch.no_grad():
        for path in args.models:
            measure(path, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
