"""What storing Mamba2's D, A_log and dt_bias in bf16 does to the loss (DeepSpeed's bf16 does so).

    python tools/bench/bench_ssm_precision.py [--config quickstart] [--steps 300] [--seeds 2] [--every 50]

DeepSpeed's bf16 engine casts every parameter of the module to bf16 and keeps float32 master
weights in the optimizer; mamba_ssm keeps D (and Megatron A_log and dt_bias) in float32. The mixer
computes A = -exp(A_log), softplus(dt + dt_bias) and the D skip in float32 either way, so what
differs is only the rounding of the three tensors the forward reads. Three runs per seed, with the
same data and initial weights, each a mixed-precision loop as DeepSpeed runs it (float32 masters,
AdamW as the trainer builds it, weights copied into the compute model before every step):

  bf16        every parameter read in bf16 (DeepSpeed bf16, what the project trains with)
  ssm-fp32    the same, but D, A_log and dt_bias read in float32 (mamba_ssm / Megatron)
  fp32        everything float32 (the reference)

Prints the training loss averaged over each window of --every steps, and the validation loss at
the end, per run; the last rows are the differences bf16 - ssm-fp32 and their spread over seeds.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch

from data_pipeline.packed import build_packed_dataset
from implicit_megatron import build_model, load_config
from implicit_megatron.train.optim import build_optimizer
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.train.tasks.shards import prepare_shards

ROOT = Path(__file__).resolve().parents[2]
SSM_PARAMS = ("A_log", "D", "dt_bias")
VARIANTS = ("bf16", "ssm-fp32", "fp32")


def compute_model(master: torch.nn.Module, variant: str) -> torch.nn.Module:
    model = copy.deepcopy(master)
    if variant == "fp32":
        return model
    model.to(torch.bfloat16)
    if variant == "ssm-fp32":
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in SSM_PARAMS:
                p.data = p.data.float()
    return model


def batch_at(data, step: int, batch: int) -> torch.Tensor:
    return torch.stack([torch.from_numpy(data[step * batch + i].astype("int64")) for i in range(batch)])


def train(cfg, variant: str, seed: int, steps: int, every: int) -> tuple[list[float], float]:
    torch.manual_seed(seed)
    master = build_model(cfg).train()
    model = compute_model(master, variant)
    optimizer = build_optimizer(master, cfg.optimizer)
    batch = cfg.train.global_batch_size
    data = build_packed_dataset(cfg.data.prefixes, None, "train", cfg.data.seq_len, seed=cfg.data.seed + seed,
                                num_samples=steps * batch)
    windows, losses = [], []
    for step in range(steps):
        with torch.no_grad():
            for p, q in zip(model.parameters(), master.parameters(), strict=True):
                p.copy_(q)
        ids = batch_at(data, step, batch)
        loss = model(ids[:, :-1], labels=ids[:, 1:])
        model.zero_grad(set_to_none=True)
        loss.backward()
        for p, q in zip(model.parameters(), master.parameters(), strict=True):
            q.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(master.parameters(), cfg.optimizer.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        optimizer.step()
        losses.append(loss.item())
        if len(losses) == every:
            windows.append(statistics.mean(losses))
            losses = []
    valid = build_packed_dataset(cfg.data.prefixes, None, "valid", cfg.data.seq_len, seed=cfg.data.seed,
                                 num_samples=None)
    model.eval()
    with torch.no_grad():
        for p, q in zip(model.parameters(), master.parameters(), strict=True):
            p.copy_(q)
        val = [model(b[:, :-1], labels=b[:, 1:]).item() for b in
               (batch_at(valid, i, batch) for i in range(min(4, len(valid) // batch)))]
    return windows, statistics.mean(val)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="quickstart", help="under configs/, without .yaml")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(ROOT / "configs" / f"{args.config}.yaml",
                      [f"train.steps={args.steps}", "curriculum.phases=[]", *args.overrides])
    prepare_shards(cfg)
    results = {}
    for seed in range(args.seeds):
        for variant in VARIANTS:
            results[variant, seed] = train(cfg, variant, seed, args.steps, args.every)
            windows, val = results[variant, seed]
            print(f"seed {seed} {variant:<9} " + " ".join(f"{w:.4f}" for w in windows) + f"  val {val:.4f}",
                  flush=True)
    header = ["run"] + [f"steps {i * args.every + 1}-{(i + 1) * args.every}" for i in
                        range(args.steps // args.every)] + ["val loss"]
    rows = []
    for variant in VARIANTS:
        runs = [results[variant, s] for s in range(args.seeds)]
        cols = list(zip(*[w for w, _ in runs], strict=True)) + [[v for _, v in runs]]
        rows.append([variant] + [f"{statistics.mean(c):.4f}" for c in cols])
    for a, b in (("bf16", "ssm-fp32"), ("bf16", "fp32"), ("ssm-fp32", "fp32")):
        diffs = []
        for s in range(args.seeds):
            (wa, va), (wb, vb) = results[a, s], results[b, s]
            diffs.append([x - y for x, y in zip(wa, wb, strict=True)] + [va - vb])
        cols = list(zip(*diffs, strict=True))
        spread = (lambda c: f" ± {statistics.stdev(c):.4f}") if args.seeds > 1 else (lambda c: "")
        rows.append([f"{a} - {b}"] + [f"{statistics.mean(c):+.4f}{spread(c)}" for c in cols])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    print(f"\n{args.config}, {args.steps} steps of {cfg.train.global_batch_size} x {cfg.data.seq_len} tokens, "
          f"implicit {cfg.implicit.enabled} ({cfg.implicit.max_iter}+{cfg.implicit.phantom_steps}), "
          f"{args.seeds} seeds, torch {torch.__version__}")


if __name__ == "__main__":
    main()
