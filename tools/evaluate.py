"""Evaluate a trained model as the paper does.

    python tools/evaluate.py CHECKPOINT_OR_EXPORT --data PREFIX [--tasks ppl,extrapolation,dynamics,duality,lm_eval]
        [--seq-lens 2048,4096,8192,16384] [--max-iter N] [--tol EPS] [--fixed-depth] [--phase NAME] [--batch-size N]
        [--eval-stop token|sequence|batch] [--max-windows N] [--sequential-windows N] [--output DIR]
        [--device cpu|cuda] [--dtype fp32|bf16]
        [--run RUN_DIR] [--lm-eval-tasks T1,T2] [--lm-eval-include PATH] [--lm-eval-backend implicit_megatron|hf]

CHECKPOINT_OR_EXPORT is a run's checkpoints/ folder (any ZeRO stage; its `latest` tag), one tag folder in it, or
a folder written by tools/convert_checkpoint.py export. The solver runs the (s+k) phase the weights
were trained in (a checkpoint's tag names it; an export is taken as the end of its run), capped
at max_iter x eval_factor passes and stopping at the phase's tolerance (a bounded phase: at
implicit.eval_tol, or at exactly max_iter passes with --fixed-depth); --phase, --max-iter and --tol override.
Each position stops at its own residual, so no score depends on what shares its batch or pads it;
--eval-stop batch is the released code's one stop test over the batch, for paper fidelity.

Tasks: ppl (test-split perplexity at the first length), extrapolation (perplexity and
per-position perplexity at every length), dynamics (solver passes and final relative residual),
duality (greedy match and perplexity difference of simultaneous and sequential mode), lm_eval
(lm-evaluation-harness; the paper's seven tasks by default, which need the Hub or its data sets in
the local cache: where they cannot be had, one line names the tasks and data sets missing before
the model loads; offline, name local task YAMLs with --lm-eval-include). Each length's windows show
a progress bar on stderr. Writes results.json, results.md (the paper's table layouts) and PNG plots
to --output (default: the run's evaluation/ folder); --run logs them to that run's MLflow store.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive lengths, got {text!r}")
    return values


def names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def parse(argv: list[str] | None):
    from implicit_megatron.config.schema import EVAL_STOPS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a run's checkpoints/ folder or an exported folder")
    p.add_argument("--data", default=None, help="shard prefix: {prefix}_test.bin/.idx")
    p.add_argument("--tasks", type=names, default=["ppl", "extrapolation", "dynamics", "duality"])
    p.add_argument("--seq-lens", type=int_list, default=None, help="default: the trained length x 1,2,4,8")
    p.add_argument("--split", default="test")
    p.add_argument("--seed", type=int, default=None, help="packing seed (default: the run's data.seed)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-windows", type=int, default=None, help="windows per length (default: the whole split)")
    p.add_argument("--sequential-windows", type=int, default=8, help="windows run token by token")
    p.add_argument("--position-buckets", type=int, default=32)
    p.add_argument("--phase", default=None, help="evaluate with this curriculum phase's (s+k) and tolerance")
    p.add_argument("--max-iter", type=int, default=None, help="cap on solver passes per forward")
    p.add_argument("--tol", type=float, default=None, help="stopping tolerance of the relative residual")
    p.add_argument("--fixed-depth", action="store_true",
                   help="a bounded phase at exactly its max_iter passes instead of stopping at implicit.eval_tol")
    p.add_argument("--eval-stop", choices=EVAL_STOPS, default="token",
                   help="token (default): each position stops at its own residual, so no score moves with the "
                        "batch or its padding; sequence: each sequence at its own; batch: the released code's one "
                        "stop test over the batch (paper fidelity)")
    p.add_argument("--output", default=None, help="results folder (default: the run's or export's evaluation/)")
    p.add_argument("--allow-tokenizer-mismatch", action="store_true",
                   help="evaluate --data built with another tokenizer than the model's")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp64"))
    p.add_argument("--run", dest="run_dir", default=None, help="a run folder: log to its MLflow store")
    p.add_argument("--lm-eval-tasks", type=names, default=None, help="default: the paper's seven tasks")
    p.add_argument("--lm-eval-include", default=None, help="a folder of local lm-eval task YAMLs")
    p.add_argument("--lm-eval-defaults", action="store_true",
                   help="with --lm-eval-include, also load lm-eval's own task list (slow)")
    p.add_argument("--lm-eval-backend", default="implicit_megatron", choices=("implicit_megatron", "hf"))
    p.add_argument("--lm-eval-limit", type=int, default=None, help="documents per task")
    p.add_argument("--lm-eval-fewshot", type=int, default=None)
    p.add_argument("--lm-eval-mode", default="simultaneous", choices=("simultaneous", "sequential"),
                   help="how the implicit_megatron backend scores (generation is always sequential)")
    p.add_argument("--lm-eval-max-length", type=int, default=None, help="default: the trained length")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="load checkpoint files whose pickles need more than tensors (their code runs)")
    return p.parse_args(argv)


def progress_bars():
    """A bar per length on stderr: redrawn as batches finish on a terminal, every 30 s in a log."""
    from functools import partial

    from tqdm import tqdm

    return partial(tqdm, file=sys.stderr, dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 30.0)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "lm_eval" in args.tasks:  # before a model is loaded
        from implicit_megatron.utils.extras import missing

        problem = missing("lm_eval", "--tasks lm_eval")
        if problem is not None:
            print(f"evaluate: {problem}", file=sys.stderr)
            return 2
    from implicit_megatron.checkpoints import safe_load
    from implicit_megatron.evaluation.lm_eval_options import PAPER_TASKS, LmEvalOptions
    from implicit_megatron.evaluation.loading import NotAModelError
    from implicit_megatron.evaluation.phases import SolverChoice
    from implicit_megatron.evaluation.runner import EvalOptions, OutputNotWritten, run_evaluation
    from implicit_megatron.utils.typed_yaml import ConfigError

    safe_load.set_trust(args.trust_checkpoint)
    lm_eval = LmEvalOptions(tasks=args.lm_eval_tasks or list(PAPER_TASKS), include_path=args.lm_eval_include,
                            include_defaults=True if args.lm_eval_defaults else None, backend=args.lm_eval_backend,
                            batch_size=args.batch_size, max_length=args.lm_eval_max_length,
                            limit=args.lm_eval_limit, num_fewshot=args.lm_eval_fewshot, mode=args.lm_eval_mode)
    options = EvalOptions(model=args.model, data=args.data, tasks=args.tasks, seq_lens=args.seq_lens,
                          batch_size=args.batch_size, max_windows=args.max_windows,
                          sequential_windows=args.sequential_windows, position_buckets=args.position_buckets,
                          split=args.split, seed=args.seed, output=args.output,
                          allow_tokenizer_mismatch=args.allow_tokenizer_mismatch, device=args.device,
                          dtype=args.dtype, solver=SolverChoice(args.phase, args.max_iter, args.tol, args.fixed_depth,
                                                                  args.eval_stop),
                          lm_eval=lm_eval, run_dir=args.run_dir)
    try:
        results = run_evaluation(options, bars=progress_bars())
    except (NotAModelError, FileNotFoundError, ConnectionError, ValueError, ConfigError, ImportError,
            OutputNotWritten) as err:
        print(f"evaluate: {err}", file=sys.stderr)
        return 2
    out = Path(results["files"][0]).parent
    print((out / "results.md").read_text())
    print(f"wrote {', '.join(results['files'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
