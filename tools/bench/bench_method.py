"""The pure-PyTorch method's own cost on the machine it runs on: passes of F at two lengths, and a training
step per mode.

    python tools/bench/bench_method.py [--configs mamba2/130m-implicit,llama/130m-implicit] [--d-model 256]
        [--layers 4] [--seq-len 256] [--short 48] [--batch 4] [--chunk 256] [--vocab-size 1000]
        [--modes explicit,(4+1),(24+4)] [--repeats 15] [--threads N]

Rows per config: one pass of the backbone without gradient at `--short` and at `--seq-len` tokens
(Mamba2's SSD at chunk `--chunk`: a short pass does the work of its own length, not of a chunk), their
ratio, and a training step (forward, chunked loss, backward; no optimizer) of each mode: the explicit
model, (4+1) and (24+4) at eps 0.05, with the passes the solver made. The configs keep their shape
but for the width, depth, vocabulary and chunk the options set (Llama: a head per 64 channels), and
their solver but for the mode's (s+k). Times are the median and the
fastest of `--repeats` calls after two warm-up calls, in milliseconds. The models are built from the
configs with the overrides the options give, through the package's public API only, so the same
command measures another checkout of the project: PYTHONPATH=OTHER python tools/bench/bench_method.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from implicit_megatron import build_model, load_config

ROOT = Path(__file__).resolve().parents[2]
MODES = {
    "explicit": ["implicit.enabled=false"],
    "(4+1)": ["implicit.enabled=true", "implicit.max_iter=4", "implicit.phantom_steps=1"],
    "(24+4)": ["implicit.enabled=true", "implicit.max_iter=24", "implicit.phantom_steps=4", "implicit.tol=0.05"],
}


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median and fastest seconds of `repeats` calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def build(name: str, args, mode: str):
    shape = [f"model.d_model={args.d_model}", f"model.n_layers={args.layers}", f"model.vocab_size={args.vocab_size}",
             f"model.mamba2.chunk_size={args.chunk}", f"model.llama.n_heads={max(1, args.d_model // 64)}",
             f"data.seq_len={args.seq_len}", "curriculum.phases=[]"]
    cfg = load_config(ROOT / "configs" / f"{name}.yaml", [*shape, *MODES[mode]], check_files=False)
    torch.manual_seed(0)
    return build_model(cfg)


def pass_rows(name: str, args) -> list[tuple]:
    """One pass of F without gradient, as the solver makes it, at the short and the full length."""
    model = build(name, args, "(4+1)").eval()
    backbone, rows, seconds = model.core.backbone, [], {}
    for tokens in (args.short, args.seq_len):
        ids = torch.randint(0, args.vocab_size, (args.batch, tokens), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            x = model.embedding(ids)
            inj = model.core.injection(x)
            z = backbone(torch.zeros_like(x), inj)  # a realistic iterate: the first pass's
            median, fastest = timed(lambda z=z, inj=inj: backbone(z, inj), args.repeats)
        seconds[tokens] = median
        rows.append((name, f"pass, {tokens} tokens", f"{median * 1e3:.2f}", f"{fastest * 1e3:.2f}", "", ""))
    ratio = seconds[args.short] / seconds[args.seq_len]
    rows.append((name, f"pass {args.short} / {args.seq_len} tokens", "", "", f"{ratio:.3f}x", ""))
    return rows


def step_rows(name: str, args) -> list[tuple]:
    rows, base = [], None
    for mode in args.modes.split(","):
        model = build(name, args, mode).train()
        ids = torch.randint(0, args.vocab_size, (args.batch, args.seq_len + 1),
                            generator=torch.Generator().manual_seed(2))
        inputs, labels = ids[:, :-1], ids[:, 1:]

        def step(model=model, inputs=inputs, labels=labels):
            model.zero_grad(set_to_none=True)
            model(inputs, labels=labels).backward()

        median, fastest = timed(step, args.repeats)
        base = base or median
        stats = model.solver_stats()
        passes = f"{stats.passes}+{stats.phantom_passes}" if stats is not None else "0+1"
        rows.append((name, f"training step {mode}", f"{median * 1e3:.1f}", f"{fastest * 1e3:.1f}",
                     f"{median / base:.2f}x", passes))
    return rows


def print_table(rows: list[tuple]) -> None:
    header = ("config", "measure", "median ms", "fastest ms", "ratio", "passes")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="mamba2/130m-implicit,llama/130m-implicit")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--short", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; d_model {args.d_model}, {args.layers} "
          f"layers, batch {args.batch}, chunk {args.chunk}, vocabulary {args.vocab_size}", flush=True)
    rows = []
    for name in args.configs.split(","):
        rows += pass_rows(name, args) + step_rows(name, args)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
