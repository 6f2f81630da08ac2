"""State tracking: train explicit and implicit Mamba2 on a word problem over seeds, test at longer words.

    python tools/research/state_tracking.py --algebra Z2 [--models explicit-1l,explicit-2l,explicit-4l,implicit]
        [--seeds 3|0,2] [--length 64] [--test-lengths 64,256,1024] [--p 0.5] [--eval-p 0.5]
        [--steps 1000] [--batch 64] [--d-model 64] [--recipe ours|released] [--sequential]
        [--test-words 256[,LENGTH:N]] [--test-tol 0.01] [--own-stop] [--estimate] [--nproc 1] [--precision fp32|bf16]
        [--device cuda|cpu]
        [--output runs/state_tracking] [--page docs/results/state_tracking.md] [--tag NAME] [key=value ...]

Each model is a config of configs/state_tracking/ (explicit-Nl: mamba2-explicit[-Nl].yaml; implicit:
mamba2-implicit.yaml, one layer self-iterated; with --recipe released, released.yaml: the released
warm-up of unrolled damped passes first). Each (model, seed) trains through launch/pretrain.sh into
OUTPUT/TAG/<model>/seed<k>, its progress on stderr as it trains (a bar on a terminal; in a log, its
step and loss at most every 30 s); a finished run is not trained again, and one that was stopped
resumes from its last checkpoint (saved every tenth of the steps): to resume a sweep, run the same
command again. Before training it prints an estimate of the training time here, timed on one batch
of each model (--estimate: only that). Then every final checkpoint is
tested here, on words the training never saw, at each test length (training p) and at eval-p
(training length): accuracy over every position and over the last 10, passes per forward (an
implicit model iterates until the batch's relative change is below its tolerance, up to its
evaluation cap) and the converged share. --test-tol sets that tolerance for the tests: the trained
one (0.05, the released rule) measures the change over the whole batch, so at long words, where
each pass changes only the positions not yet resolved, it can stop while most are wrong (S3 at
16x the trained length: 34 passes and 0.26 at 0.05, 361 passes and 0.996 at 0.01).
--own-stop also tests every set with each word stopping on its own relative change
(implicit.eval_stop=sequence; sets suffixed -own, on the same words).
--sequential adds token-by-token evaluation at the training length (the released final metric).
It prints the tables and writes OUTPUT/TAG/results.json; --page also saves the sweep beside the
page (<page stem>/TAG.json and three PNGs: accuracy and passes against length, and
tools/plot_run.py's training curves of each model's first seed) and rebuilds the page from every
sweep saved there.
Extra key=value arguments go to every training run. Tables give mean ± sd over seeds and the
95 % bootstrap interval of the mean.

The paper's experiment (fig. 3: Ma x A5 at length 256, p = 0.1, tested at p = 0.5 and at 1024;
the released model's widths; 10 seeds), for a GPU machine:

    python tools/research/state_tracking.py --algebra Ma_A5 --seeds 10 --length 256 --p 0.1 --eval-p 0.5 \
        --test-lengths 256,1024 --test-words 1024 --d-model 256 --batch 512 --steps 16384 \
        --nproc 1 --precision bf16 --tag Ma_A5-L256-paper --page docs/results/state_tracking.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import zlib
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from implicit_megatron.research.sweep_runs import checkpoint_interval, finished, publish, seed_list, train_run  # noqa: E402

CONFIGS = ROOT / "configs" / "state_tracking"
TEST_SEED = 10_000  # test words: seeds far from every training seed (data.seed + seed)


def config_of(model: str, recipe: str) -> Path:
    if model == "implicit":
        return CONFIGS / ("released.yaml" if recipe == "released" else "mamba2-implicit.yaml")
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


def scan_chunk(length: int) -> int:
    """The SSD scan's chunk for words of `length`: 64, or the power of two that covers a shorter word
    (the scan pads a word to whole chunks; the function computed is the same for any chunk)."""
    return min(64, 1 << max(0, length - 1).bit_length())


def overrides(args: argparse.Namespace, model: str, out: Path, seed: int) -> list[str]:
    from data_pipeline.synthetic.algebra import get_algebra

    warmup = max(1, math.ceil(args.steps / (10 if args.recipe == "released" else 20)))
    result = [f"train.output_dir={out}", f"task.word_problem.algebra={args.algebra}",
              f"model.vocab_size={get_algebra(args.algebra).size}", "task.word_problem.p_convention=paper",
              f"task.word_problem.p={yaml_value(args.p)}", f"task.word_problem.eval_p={yaml_value(args.eval_p)}",
              "task.word_problem.eval_lengths=[]", "task.word_problem.eval_words=64",
              f"data.seq_len={args.length}", f"train.steps={args.steps}", f"train.global_batch_size={args.batch}",
              f"train.micro_batch_size={args.batch // args.nproc}", f"model.d_model={args.d_model}",
              f"model.mamba2.headdim={min(64, args.d_model // 2)}",
              f"model.mamba2.chunk_size={scan_chunk(args.length)}",
              f"train.eval_interval={args.steps}", f"checkpoint.interval={checkpoint_interval(args.steps)}",
              f"schedule.warmup_steps={warmup}",
              "tracking.enabled=false",
              f"distributed.precision={args.precision}", f"train.seed={seed}", f"data.seed={1234 + seed}"]
    if args.recipe == "released" and model == "implicit":
        result.append(f"schedule.cooldown_start={warmup / args.steps}")
    return [*result, *args.extra]


def train(model: str, seed: int, args: argparse.Namespace, out: Path) -> None:
    """Train one (model, seed) through the launcher, its progress on stderr as it trains."""
    train_run(config_of(model, args.recipe), overrides(args, model, out, seed), out, args.steps,
              f"[state_tracking] {model} seed {seed}", args.nproc)


def run_threads(nproc: int) -> int:
    """The threads each training process runs on, as the launch sets them (launch/world.py): OMP_NUM_THREADS
    when it is set, else the cores shared by the processes. The estimate times the step on these, so
    a sweep started with OMP_NUM_THREADS=1 beside another is not timed on threads it will not have."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else max(1, (os.cpu_count() or 1) // nproc)


def step_seconds(model: str, args: argparse.Namespace) -> float:
    """Seconds per training step of `model` here, timed on one micro-batch (forward and backward) with
    every implicit solve run to its cap, as the S3 and parity runs' solves are from a few hundred
    steps on (the optimizer, the data and the launch add a little)."""
    import time

    import torch

    from implicit_megatron.builder import build_model
    from implicit_megatron.config.reading import read_config

    cfg = read_config(config_of(model, args.recipe), overrides(args, model, Path(args.output), 0))
    threads = torch.get_num_threads()
    torch.set_num_threads(run_threads(args.nproc))
    try:
        net = build_model(cfg, device=args.device)
        if net.core.implicit:
            net.core.set_phase(tol=0.0)
        ids = torch.randint(0, cfg.model.vocab_size, (cfg.train.micro_batch_size, args.length), device=args.device)
        times = []
        for _ in range(3):  # the first one warms up
            start = time.perf_counter()
            net(ids, labels=ids).backward()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * args.nproc)
    return min(times[1:]) * max(1, accumulation)


def estimate(todo: dict[str, list[int]], args: argparse.Namespace) -> str:
    """What the runs still to train will take here, before any starts."""
    parts, total = [], 0.0
    for model, seeds in todo.items():
        seconds = step_seconds(model, args)
        total += seconds * args.steps * len(seeds)
        capped = " (every solve at its cap)" if model == "implicit" else ""
        parts.append(f"{model} {seconds:.2f} s/step{capped} x {args.steps} steps x {len(seeds)} seed(s)")
    return (f"[state_tracking] estimate: {'; '.join(parts)}: about {total / 60:.0f} min of training in all "
            f"on {args.device} (resumed runs take less; the tests come after)")


def test_sets(args: argparse.Namespace) -> dict[str, tuple[int, float | None, int]]:
    """name -> (length, p, words): every test length at the training p, and eval-p at the training length."""
    sets = {f"L{length}": (length, args.p) for length in args.test_lengths}
    if args.eval_p != args.p:
        sets[f"L{args.length}-p{args.eval_p}"] = (args.length, args.eval_p)
    return {name: (length, p, args.words_at.get(length, args.test_words)) for name, (length, p) in sets.items()}


def set_seed(name: str) -> int:
    """The test words of a set depend on its name alone, so adding a set changes no other set."""
    return TEST_SEED + zlib.crc32(name.encode()) % 1_000_000


def evaluate(out: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Every test set through the run's final checkpoint (fp32, on --device), as WordResult dicts; each
    kept in OUT/test_results.json and reused while the checkpoint and that set's settings are the same."""
    import torch

    from data_pipeline.synthetic.word_problem import generate
    from implicit_megatron.builder import build_model
    from implicit_megatron.evaluation.word_problems import evaluate_words
    from implicit_megatron.hf.export import read_checkpoint

    checkpoint = (out / "checkpoints" / "latest").read_text().strip()
    path = out / "test_results.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    cached = saved.get("sets", {}) if saved.get("checkpoint") == checkpoint else {}
    model, kept = None, dict(cached)
    for name, (length, p, words) in test_sets(args).items():
        key = {"length": length, "p": p, "words": words, "seed": set_seed(name)}
        if args.test_tol is not None:
            key["tol"] = args.test_tol
        names = [name] + ([f"{name}-own"] if args.own_stop else [])
        names += [f"seq-{name}"] if args.sequential and length == args.length and p == args.p else []
        if all(cached.get(n, {}).get("key") == key for n in names):
            continue
        if model is None:
            state, cfg = read_checkpoint(out / "checkpoints")
            model = build_model(cfg)
            model.load_state_dict(state)
            model.to(args.device)
            if model.core.implicit and args.test_tol is not None:
                model.core.settings = replace(model.core.settings, tol=args.test_tol, eval_tol=args.test_tol)
        inputs, labels = (torch.from_numpy(a.astype("int64")) for a in
                          generate(args.algebra, words, length, p, set_seed(name)))
        for n in names:
            if model.core.implicit:  # the batch's stop test, or each word's own (-own)
                stop = "sequence" if n.endswith("-own") else "batch"
                model.core.settings = replace(model.core.settings, eval_stop=stop)
            result = evaluate_words(model, inputs, labels, args.eval_batch, sequential=n.startswith("seq-"))
            kept[n] = {"key": key, "result": result.as_dict()}
    path.write_text(json.dumps({"checkpoint": checkpoint, "sets": kept}, indent=1) + "\n")
    wanted = {"": True, "-own": args.own_stop, "seq-": args.sequential}
    shown = [n for name in test_sets(args) for kind, n in (("", name), ("-own", f"{name}-own"), ("seq-", f"seq-{name}"))
             if n in kept and wanted[kind]]
    return {n: kept[n]["result"] for n in shown}


def words_note(args: argparse.Namespace) -> str:
    others = ", ".join(f"{words} at length {length}" for length, words in sorted(args.words_at.items()))
    return f"{args.test_words}" + (f" ({others})" if others else "")


def words_per_length(text: str) -> tuple[int, dict[int, int]]:
    """'64' or '64,1024:16': words per test set, and per length where it differs."""
    default, exceptions = None, {}
    for part in text.split(","):
        length, _, words = part.rpartition(":")
        if length:
            exceptions[int(length)] = int(words)
        else:
            default = int(words)
    if default is None:
        raise SystemExit(f"state_tracking: --test-words {text!r} names no default count (e.g. 64,1024:16)")
    return default, exceptions


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="explicit-1l,explicit-2l,explicit-4l,implicit")
    parser.add_argument("--algebra", default="Z2", help="S5, A5, S3, A4, Z<m> (Z2: parity) or Ma_<group>")
    parser.add_argument("--seeds", default="3", help="how many (0..N-1), or which: 0,2 or 2, (seed 2 alone)")
    parser.add_argument("--p", type=probability, default=0.5, help="share of non-identity group parts; none: uniform")
    parser.add_argument("--eval-p", type=probability, default=0.5)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--test-lengths", default="64,256,1024", help="comma-separated word lengths")
    parser.add_argument("--test-words", default="256",
                        help="words per test set; LENGTH:N sets another count at a length, e.g. 64,1024:16")
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--test-tol", type=float, default=None,
                        help="relative change at which the implicit models' test solve stops (default: their own)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--recipe", choices=("ours", "released"), default="ours")
    parser.add_argument("--sequential", action="store_true", help="also token by token at the training length")
    parser.add_argument("--estimate", action="store_true",
                        help="print what the runs still to train would take here, and stop")
    parser.add_argument("--own-stop", action="store_true", help="also test with each word stopping on its own")
    parser.add_argument("--nproc", type=int, default=1, help="training processes per run (GPUs on a GPU machine)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="training precision")
    parser.add_argument("--device", default=None, help="where the tests run (default: cuda if present, else cpu)")
    parser.add_argument("--output", default=str(ROOT / "runs" / "state_tracking"))
    parser.add_argument("--page", default=None, help="results page to rebuild, e.g. docs/results/state_tracking.md")
    parser.add_argument("--tag", default=None, help="name of this sweep (default ALGEBRA-LENGTH-RECIPE)")
    parser.add_argument("--notes", default="", help="a paragraph printed under the sweep on the page")
    parser.add_argument("extra", nargs="*", help="key=value overrides for every training run")
    args = parser.parse_args(argv)
    args.test_lengths = [int(n) for n in args.test_lengths.split(",") if n]
    args.test_words, args.words_at = words_per_length(args.test_words)
    if args.test_tol is not None and args.test_tol <= 0:
        raise SystemExit(f"state_tracking: --test-tol must be above 0, got {args.test_tol}")
    args.seeds = seed_list(args.seeds, "state_tracking")
    args.models = [m for m in args.models.split(",") if m]
    if not args.models:
        raise SystemExit("state_tracking: --models names no model (e.g. explicit-1l,implicit)")
    for model in args.models:
        config_of(model, args.recipe)  # an unknown one is refused before anything trains
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.tag = args.tag or f"{args.algebra}-L{args.length}-{args.recipe}"
    return args


def main(argv: list[str] | None = None) -> int:
    from data_pipeline.synthetic.algebra import get_algebra
    from implicit_megatron.research import state_tracking_report as report

    args = parse(argv)
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(args.output) / args.tag
    todo = {model: [seed for seed in args.seeds if not finished(folder / model / f"seed{seed}", args.steps)]
            for model in args.models}
    todo = {model: seeds for model, seeds in todo.items() if seeds}
    if todo:
        print(estimate(todo, args), flush=True)
    if args.estimate:
        return 0
    runs = {}
    for model in args.models:
        runs[model] = {}
        for seed in args.seeds:
            out = folder / model / f"seed{seed}"
            train(model, seed, args, out)
            runs[model][str(seed)] = evaluate(out, args)
            print(f"[state_tracking] {model} seed {seed}: "
                  + ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in runs[model][str(seed)].items()), flush=True)
    algebra = get_algebra(args.algebra)
    settings = {"algebra": args.algebra, "length": args.length, "p": args.p, "eval_p": args.eval_p,
                "steps": args.steps, "batch": args.batch, "d_model": args.d_model, "recipe": args.recipe,
                "seeds": args.seeds, "test_words": words_note(args), "test_tol": args.test_tol,
                "chance": 1 / algebra.size if algebra.monoid_size == 1 else None,  # 1/|G| for a pure group
                "description": (f"{args.algebra} words (share of non-identity group parts p = {args.p}), trained "
                                f"{args.steps} steps x {args.batch} words of {args.length}, d_model {args.d_model}, "
                                f"recipe {args.recipe}, seeds {', '.join(map(str, args.seeds))}; "
                                f"test words per set: {words_note(args)}; test-time tolerance "
                                f"{args.test_tol or 'as trained'}.")}
    results = {"command": "python tools/research/state_tracking.py " + shlex.join(argv), "settings": settings,
               "runs": runs, "notes": args.notes}
    publish(results, folder, report, args.page, args.tag, "[state_tracking]",
            [folder / model / f"seed{args.seeds[0]}" for model in args.models])
    return 0


if __name__ == "__main__":
    sys.exit(main())
