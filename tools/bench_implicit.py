"""Cost of the implicit core relative to the explicit model, on the machine it runs on.

    python tools/bench_implicit.py [--configs tiny/mamba2-implicit,tiny/llama-implicit] [--batch 8] [--seq-len 128]
                                   [--vocab-size N]

With the GPT-NeoX vocabulary the head dominates a tiny model's step; --vocab-size 512 shows the
backbone's share, which is what the solver multiplies.

For each config it prints one table row per mode:
- training step time (forward + backward) of explicit, (4+1), (24+4) with eps 0.05, unrolled 28,
  and the ratio to explicit; the bytes autograd saved for backward (flat in s, growing in k);
- passes to reach eps with plain iteration and with Anderson acceleration;
- sequential-mode time per token against an explicit one-token step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from implicit_megatron import build_model, load_config
from implicit_megatron.config import AndersonSettings
from implicit_megatron.implicit import SolverSettings

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "explicit": None,
    "(4+1)": SolverSettings(max_iter=4, phantom_steps=1),
    "(4+4)": SolverSettings(max_iter=4, phantom_steps=4),
    "(24+4) eps=0.05": SolverSettings(max_iter=24, tol=0.05, phantom_steps=4),
    "unrolled 28": SolverSettings(max_iter=28, gradient="unrolled"),
}


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def train_step(model, ids):
    def run():
        model.zero_grad(set_to_none=True)
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return run


def saved_bytes(model, ids) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        train_step(model, ids)()
    return total


def bench_config(name: str, args) -> list[tuple]:
    extra = [f"model.vocab_size={args.vocab_size}"] if args.vocab_size else []
    cfg = load_config(ROOT / "configs" / f"{name}.yaml", ["implicit.enabled=true", *extra], check_files=False)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    ids = torch.randint(0, cfg.model.vocab_size, (args.batch, args.seq_len))
    rows, base = [], None
    for mode, settings in MODES.items():
        model.core.settings = settings
        seconds = timed(train_step(model, ids), args.repeats)
        base = base or seconds
        passes = model.core.last_stats.total_passes if settings else 1
        rows.append((name, mode, f"{seconds * 1e3:.1f}", f"{seconds / base:.2f}x", passes,
                     f"{saved_bytes(model, ids) / 2**20:.1f}"))

    x = model.embedding(ids).detach()
    with torch.no_grad():
        for label, anderson in (("plain", AndersonSettings()), ("anderson", AndersonSettings(enabled=True))):
            model.core.settings = SolverSettings(max_iter=100, tol=0.05, phantom_steps=0, anderson=anderson)
            model.core(x)
            stats = model.core.last_stats
            rows.append((name, f"passes to eps=0.05 ({label})", "", "", stats.passes,
                         f"converged {stats.converged_frac:.2f}"))

    model.eval()
    tokens = x[:1, : args.seq_len // 4]
    model.core.settings = None
    explicit = timed(lambda: model.core.forward_sequential(tokens), 1) / tokens.shape[1]
    model.core.settings = SolverSettings(max_iter=24, tol=0.05, phantom_steps=4, eval_factor=1)
    implicit = timed(lambda: model.core.forward_sequential(tokens), 1) / tokens.shape[1]
    rows.append((name, "sequential per token (24+4)", f"{implicit * 1e3:.2f}", f"{implicit / explicit:.2f}x",
                 "", f"explicit step {explicit * 1e3:.2f} ms"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="tiny/mamba2-implicit,tiny/llama-implicit")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=None, help="override the vocabulary (default: config's)")
    args = parser.parse_args()
    header = ("config", "mode", "ms/step", "vs explicit", "passes", "saved MiB / note")
    rows = [row for name in args.configs.split(",") for row in bench_config(name, args)]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)))
    vocab = args.vocab_size or "config"
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"batch {args.batch} x {args.seq_len} tokens, vocabulary {vocab}")


if __name__ == "__main__":
    main()
