"""A picture of one or more runs, for looking instead of reading: one PNG, no server.

    python tools/plot_run.py RUN_DIR [RUN_DIR ...] --output FILE.png [--title TEXT]

RUN_DIR is a run's output folder (train.output_dir: metrics.jsonl and config.yaml). The panels
draw, against tokens seen (step x global batch x sequence length): training and validation loss,
perplexity (validation, and exp of the training loss), learning rate, solver passes per forward
(training and validation), the solver's relative residual (the interval's worst), and the
gradient norm (or accuracy, for tasks that report it). Each run has its colour, training solid
and validation dashed with dots; the curriculum's phases are shaded (bounded, free, the unrolled
warm-up; named in the legend with their passes) and each run's phase changes are dotted lines.
A step logged twice (a resumed launch) counts once, with its last values. Needs matplotlib (the `eval` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's output folder (metrics.jsonl, config.yaml)")
    p.add_argument("--output", required=True, help="the PNG to write")
    p.add_argument("--title", default=None, help="default: the runs' names")
    args = p.parse_args(argv)
    if Path(args.output).suffix.lower() != ".png":
        p.error(f"--output {args.output}: give a .png file")
    from implicit_megatron.utils.output_paths import output_problem

    problem = output_problem(args.output, folder=False)
    if problem:
        p.error(f"--output {args.output}: {problem}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from implicit_megatron.evaluation.plots import pyplot
    from implicit_megatron.evaluation.run_plot import NotARunError, plot, read_run
    from implicit_megatron.utils.typed_yaml import ConfigError

    try:
        pyplot()  # a missing matplotlib is said before any run is read
    except ImportError as err:
        print(f"plot_run: {err}", file=sys.stderr)
        return 2
    try:
        runs = [read_run(folder) for folder in args.runs]
    except NotARunError as err:
        print(f"plot_run: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"plot_run: config error: {err}", file=sys.stderr)
        return 2
    empty = [str(run.folder) for run in runs if not run.steps]
    if empty:
        print(f"plot_run: no logged step in {', '.join(empty)} (metrics.jsonl is empty)", file=sys.stderr)
        return 2
    print(f"plot_run: wrote {plot(runs, Path(args.output), args.title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
