"""State-tracking sweep: train models on a word problem, print their accuracies and test-time passes.

    python tools/state_tracking.py [--models explicit-1l,explicit-2l,implicit] [--algebra Ma_A5]
        [--p 0.1] [--eval-p 0.5] [--length 64] [--eval-lengths 128] [--steps 2000] [--batch 64]
        [--d-model 64] [--nproc 1] [--output runs/state_tracking] [key=value ...]

Each model is a config of configs/state_tracking/ (explicit-Nl: mamba2-explicit[-Nl].yaml;
implicit: mamba2-implicit.yaml, one layer self-iterated), trained through the training entry
(launch/pretrain.sh) into OUTPUT/<model>; a finished run is not trained again. The table gives
the last evaluation: accuracy in distribution (p, length), out of distribution (eval-p; the paper
uses 0.5), on longer words, and the backbone passes per forward at test time. Extra key=value
arguments go to every run (e.g. train.eval_interval=250).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIGS = ROOT / "configs" / "state_tracking"


def config_of(model: str) -> Path:
    if model == "implicit":
        return CONFIGS / "mamba2-implicit.yaml"
    if model.startswith("explicit-") and model.endswith("l"):
        layers = model.removeprefix("explicit-").removesuffix("l")
        path = CONFIGS / ("mamba2-explicit.yaml" if layers == "1" else f"mamba2-explicit-{layers}l.yaml")
        if path.is_file():
            return path
    raise SystemExit(f"state_tracking: unknown model {model!r}; use implicit or explicit-{{1,2,4,8,16}}l")


def probability(text: str) -> float | None:
    return None if text.lower() in ("none", "null") else float(text)


def yaml_value(p: float | None) -> str:
    return "null" if p is None else str(p)


def overrides(args: argparse.Namespace, out: Path) -> list[str]:
    from data_pipeline.synthetic.algebra import get_algebra

    return [f"train.output_dir={out}", f"task.word_problem.algebra={args.algebra}",
            f"model.vocab_size={get_algebra(args.algebra).size}", f"task.word_problem.p={yaml_value(args.p)}",
            f"task.word_problem.eval_p={yaml_value(args.eval_p)}",
            f"task.word_problem.eval_lengths=[{args.eval_lengths}]",
            f"data.seq_len={args.length}", f"train.steps={args.steps}", f"train.global_batch_size={args.batch}",
            f"train.micro_batch_size={args.batch // args.nproc}", f"model.d_model={args.d_model}",
            f"model.mamba2.headdim={min(32, args.d_model // 2)}", f"train.eval_interval={args.steps}",
            f"schedule.warmup_steps={max(1, args.steps // 20)}", "tracking.enabled=false",
            "distributed.precision=fp32", *args.extra]


def train(model: str, args: argparse.Namespace) -> Path:
    out = Path(args.output) / model
    latest = out / "checkpoints" / "latest"
    if latest.is_file() and latest.read_text().strip() == f"step{args.steps}":
        print(f"[state_tracking] {model}: finished run in {out}, not trained again", flush=True)
        return out
    print(f"[state_tracking] {model}: training into {out}", flush=True)
    env = {**os.environ, "NPROC": str(args.nproc), "PYTHON": sys.executable}
    result = subprocess.run(["bash", "launch/pretrain.sh", str(config_of(model)), *overrides(args, out)], cwd=ROOT,
                            env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"state_tracking: {model} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return out


def last_evaluation(out: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val/accuracy" in r]
    trains = [r for r in rows if "train/accuracy" in r]
    if not evals:
        raise SystemExit(f"state_tracking: {out / 'metrics.jsonl'} has no evaluation")
    return {**evals[-1], "train/accuracy": trains[-1]["train/accuracy"] if trains else float("nan")}


def table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    ood = f"val_p{args.eval_p}" if args.eval_p != args.p else "val"
    longer = [f"val_len{n}" for n in args.eval_lengths.split(",") if n]
    head = (["model", "train acc", f"acc p={args.p} L={args.length}", f"acc p={args.eval_p}"]
            + [f"acc L={k.removeprefix('val_len')}" for k in longer]
            + ["test passes (ID)", "test passes (OOD)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, r in results.items():
        cells = [model, f"{r['train/accuracy']:.3f}", f"{r['val/accuracy']:.3f}", f"{r[f'{ood}/accuracy']:.3f}"]
        cells += [f"{r[f'{k}/accuracy']:.3f}" for k in longer]
        cells += [f"{r['val/solver_iterations']:.1f}", f"{r[f'{ood}/solver_iterations']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="explicit-1l,explicit-2l,implicit")
    parser.add_argument("--algebra", default="Ma_A5", choices=("S5", "A5", "Ma_A5", "Ma_S5"))
    parser.add_argument("--p", type=probability, default=0.1, help="hard-token share; none: uniform over G")
    parser.add_argument("--eval-p", type=probability, default=0.5)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--eval-lengths", default="128", help="comma-separated longer word lengths ('' for none)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--output", default=str(ROOT / "runs" / "state_tracking"))
    parser.add_argument("extra", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args(argv)
    results = {model: last_evaluation(train(model, args)) for model in args.models.split(",")}
    print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
