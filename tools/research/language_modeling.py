"""Language modelling: explicit against implicit Mamba2 on the same tokens, over seeds, tested at
1x to 8x the trained length.

    python tools/research/language_modeling.py [--config configs/quickstart.yaml]
        [--models explicit,implicit-4p1,implicit] [--seeds 3|0,2] [--lengths 1,2,4,8] [--eval-windows N]
        [--output runs/language_modeling] [--tag NAME] [--page docs/results/language_modeling.md]
        [--notes TEXT] [key=value ...]

Each (model, seed) trains CONFIG through launch/pretrain.sh into OUTPUT/TAG/<model>/seed<k>:
implicit is CONFIG as it is (its curriculum included), implicit-4p1 the same model trained (4+1)
for all its steps (one bounded phase: 4 passes, 1 phantom step; the paper's "(4+1)" rows), explicit
the same model with implicit.enabled=false and no curriculum. Seed k sets train.seed and
data.seed for every model, so the models of a seed start from the same initialisation seed and
see the same tokens in the same order. Runs save every tenth of their steps: a stopped sweep
resumes when its command runs again, and a finished run is not trained again. Then every final checkpoint is tested as
`tools/evaluate.py --tasks extrapolation` does, at each multiple of the trained length, on the
same test windows for every run (packed with one seed); a run's results are kept in its
evaluation/ folder and reused while its checkpoint and the lengths are the same.
It prints the tables and writes OUTPUT/TAG/results.json; --page also saves the sweep beside the
page (<page stem>/TAG.json and three PNGs: per-position perplexity at the longest length,
validation perplexity against tokens, and tools/plot_run.py's panels of each model's first seed)
and rebuilds the page from every sweep saved there. Extra key=value arguments go to every
training run (e.g. train.steps=400 train.eval_interval=20).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from implicit_megatron.research.sweep_runs import checkpoint_interval, publish, seed_list, train_run  # noqa: E402

MODELS = ("explicit", "implicit-4p1", "implicit")
BOUNDED_4P1 = "curriculum.phases=[{name: bounded, kind: bounded, fraction: 1.0, max_iter: 4, phantom_steps: 1}]"
EVAL_SEED = 4321  # the test windows' packing seed: the same windows for every run of a sweep


def overrides(args: argparse.Namespace, model: str, out: Path, seed: int) -> list[str]:
    result = [*args.extra, f"name={args.name}-{model}", f"train.output_dir={out}", f"train.seed={seed}",
              f"data.seed={1234 + seed}",
              f"checkpoint.interval={checkpoint_interval(args.steps)}", "tracking.enabled=false"]
    if model == "explicit":
        result += ["implicit.enabled=false", "curriculum.phases=[]"]
    elif model == "implicit-4p1":
        result += ["implicit.enabled=true", BOUNDED_4P1]
    return result


def evaluate(out: Path, args: argparse.Namespace) -> dict:
    """The run's final checkpoint at every length (cached in OUT/evaluation/results.json)."""
    from implicit_megatron.evaluation.runner import EvalOptions, run_evaluation

    tag = (out / "checkpoints" / "latest").read_text().strip()
    lengths = [args.seq_len * m for m in args.lengths]
    saved = out / "evaluation" / "results.json"
    if saved.is_file():
        results = json.loads(saved.read_text())
        kept = results.get("model", {}).get("tag") == tag and results.get("study") == study_key(args)
        if kept and sorted(results["extrapolation"]["lengths"], key=int) == [str(n) for n in lengths]:
            return results
    options = EvalOptions(model=str(out / "checkpoints"), data=args.data, tasks=["extrapolation"], seq_lens=lengths,
                          max_windows=args.eval_windows, seed=EVAL_SEED, output=str(out / "evaluation"))
    results = run_evaluation(options, log=lambda line: print(f"[language_modeling] {line}", flush=True))
    results["study"] = study_key(args)
    saved.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return results


def study_key(args: argparse.Namespace) -> dict:
    return {"eval_seed": EVAL_SEED, "eval_windows": args.eval_windows}


def run_result(out: Path, evaluation: dict, args: argparse.Namespace) -> dict:
    """What the page shows of one run: size, tokens, the validation curve, and each length's perplexity."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    validation = {r["step"]: r["val/ppl"] for r in rows if "val/ppl" in r}  # a resumed step logs once more
    tokens_per_step = args.batch * args.seq_len
    lengths = {n: {"ppl": v["ppl"], "positions": v["positions"]}
               for n, v in evaluation["extrapolation"]["lengths"].items()}
    return {"parameters": evaluation["model"]["parameters"], "tokens": args.steps * tokens_per_step,
            "curve": [[step * tokens_per_step, ppl] for step, ppl in sorted(validation.items())],
            "val_ppl": validation[max(validation)], "lengths": lengths}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--models", default="explicit,implicit")
    parser.add_argument("--seeds", default="3", help="how many (0..N-1), or which: 0,2 or 2, (seed 2 alone)")
    parser.add_argument("--lengths", default="1,2,4,8", help="test lengths as multiples of the trained length")
    parser.add_argument("--eval-windows", type=int, default=None, help="test windows per length (default: all)")
    parser.add_argument("--nproc", type=int, default=1, help="training processes per run")
    parser.add_argument("--output", default=str(ROOT / "runs" / "language_modeling"))
    parser.add_argument("--page", default=None, help="results page to rebuild, e.g. docs/results/language_modeling.md")
    parser.add_argument("--tag", default=None, help="name of this sweep (default CONFIG-STEPS)")
    parser.add_argument("--notes", default="", help="a paragraph printed under the sweep on the page")
    parser.add_argument("extra", nargs="*", help="key=value overrides for every training run")
    args = parser.parse_args(argv)
    args.seeds = seed_list(args.seeds, "language_modeling")
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        named = ",".join(unknown) or "(none)"
        raise SystemExit(f"language_modeling: --models {named}: choose from {', '.join(MODELS)}")
    try:
        args.lengths = [int(m) for m in args.lengths.split(",") if m]
    except ValueError:
        raise SystemExit(f"language_modeling: --lengths {args.lengths!r}: give multiples such as 1,2,4,8") from None
    if not args.lengths or args.lengths[0] != 1 or min(args.lengths) < 1:
        raise SystemExit(f"language_modeling: --lengths {args.lengths}: start at 1 (the trained length), e.g. 1,2,4,8")
    from implicit_megatron.config.reading import read_config
    from implicit_megatron.utils.typed_yaml import ConfigError

    try:  # every model's config, before anything trains
        cfg = read_config(args.config, args.extra)
        args.steps, args.seq_len, args.batch = cfg.train.steps, cfg.data.seq_len, cfg.train.global_batch_size
        args.name = cfg.name
        args.data = str(ROOT / cfg.data.prefixes[0])  # its test split; an absolute prefix stays as it is
        for model in args.models:
            read_config(args.config, overrides(args, model, Path(args.output), 0))
    except (ConfigError, FileNotFoundError) as err:
        raise SystemExit(f"language_modeling: {err}") from None
    args.tag = args.tag or f"{Path(args.config).stem}-{args.steps}"
    return args


def main(argv: list[str] | None = None) -> int:
    from implicit_megatron.research import language_modeling_report as report

    args = parse(argv)
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(args.output) / args.tag
    runs = {}
    for model in args.models:
        runs[model] = {}
        for seed in args.seeds:
            out = folder / model / f"seed{seed}"
            train_run(ROOT / args.config, overrides(args, model, out, seed), out, args.steps,
                      f"[language_modeling] {model} seed {seed}", args.nproc)
            runs[model][str(seed)] = run_result(out, evaluate(out, args), args)
            tested = sorted(runs[model][str(seed)]["lengths"].items(), key=lambda item: int(item[0]))
            print(f"[language_modeling] {model} seed {seed}: " + ", ".join(
                f"L{n} ppl {v['ppl']:.2f}" for n, v in tested), flush=True)
    parameters = {model: next(iter(seeds.values()))["parameters"] for model, seeds in runs.items()}
    lengths = ", ".join(str(args.seq_len * m) for m in args.lengths)
    settings = {"config": args.config, "steps": args.steps, "seq_len": args.seq_len, "batch": args.batch,
                "lengths": args.lengths, "seeds": args.seeds, "eval_windows": args.eval_windows,
                "description": (f"`{args.config}` ({', '.join(f'{m} {n:,} parameters' for m, n in parameters.items())})"
                                f", trained {args.steps} steps x {args.batch} sequences of {args.seq_len} tokens "
                                f"({args.steps * args.batch * args.seq_len:,} tokens per run), seeds "
                                f"{', '.join(map(str, args.seeds))}; tested at lengths {lengths} on the test split "
                                f"({args.eval_windows or 'all'} windows per length, packed with seed {EVAL_SEED}).")}
    results = {"command": "python tools/research/language_modeling.py " + shlex.join(argv), "settings": settings,
               "runs": runs, "notes": args.notes}
    publish(results, folder, report, args.page, args.tag, "[language_modeling]",
            [folder / model / f"seed{args.seeds[0]}" for model in args.models])
    return 0


if __name__ == "__main__":
    sys.exit(main())
