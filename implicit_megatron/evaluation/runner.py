"""The tasks of tools/evaluate.py: run what was asked, share what tasks have in common, write files.

ppl and extrapolation share one simultaneous pass per length (ppl is the first length), dynamics
reads that pass's solver statistics, and dynamics and duality share one sequential-mode pass
over the first `sequential_windows` windows of the first length. Outputs: results.json,
results.md (the paper's table layouts) and PNG plots in `output`, and MLflow when `run_dir` is set.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from implicit_megatron.errors import first_line
from implicit_megatron.evaluation import plots, report
from implicit_megatron.evaluation.duality import compare_modes
from implicit_megatron.evaluation.dynamics import summarize
from implicit_megatron.evaluation.lm_eval_data import check_tasks
from implicit_megatron.evaluation.lm_eval_options import LmEvalOptions
from implicit_megatron.evaluation.lm_eval_run import run_lm_eval
from implicit_megatron.evaluation.loading import LoadedModel, classify, load_model
from implicit_megatron.evaluation.merge import merge_into, remove_stale_plots
from implicit_megatron.evaluation.perplexity import NLLResult, position_buckets, token_nll
from implicit_megatron.evaluation.phases import SolverChoice
from implicit_megatron.evaluation.sequential import SequentialResult, run_sequential
from implicit_megatron.evaluation.windows import check_prefix, load_windows
from implicit_megatron.utils.output_paths import output_problem
from implicit_megatron.utils.own_files import foreign_entry, foreign_entry_inside
from implicit_megatron.utils.safe_write import out_of_room, replace_text

TASKS = ("ppl", "extrapolation", "dynamics", "duality", "lm_eval")
DATA_TASKS = ("ppl", "extrapolation", "dynamics", "duality")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


@dataclass
class EvalOptions:
    model: str  # a checkpoint folder or an exported folder
    data: str | None = None  # shard prefix ({prefix}_test.bin/.idx)
    tasks: list[str] = field(default_factory=lambda: list(DATA_TASKS))
    seq_lens: list[int] | None = None  # None: the trained length x 1, 2, 4, 8
    batch_size: int = 8
    max_windows: int | None = None  # per length in simultaneous mode (None: the whole split)
    sequential_windows: int = 8  # windows run token by token for dynamics and duality
    position_buckets: int = 32
    split: str = "test"
    seed: int | None = None  # packing seed (None: the run's data.seed)
    output: str | None = None  # None: <run>/evaluation, or <export>/evaluation
    allow_tokenizer_mismatch: bool = False  # evaluate data built with another tokenizer than the model's
    device: str = "cpu"
    dtype: str = "fp32"
    solver: SolverChoice = field(default_factory=SolverChoice)
    lm_eval: LmEvalOptions = field(default_factory=LmEvalOptions)
    run_dir: str | None = None  # log to this run's MLflow store


def check_options(options: EvalOptions) -> None:
    """Refuse a path that is no model, bad task names and missing data (shards, lm-eval data sets)
    before a model is loaded; the model first, as the first argument."""
    classify(options.model)
    unknown = [t for t in options.tasks if t not in TASKS]
    if unknown or not options.tasks:
        raise ValueError(f"unknown task(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(TASKS)}")
    if any(t in DATA_TASKS for t in options.tasks):
        if not options.data:
            raise ValueError(f"tasks {', '.join(t for t in options.tasks if t in DATA_TASKS)} need --data PREFIX")
        check_prefix(options.data, options.split)
    if options.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {options.dtype!r}; choose from {', '.join(DTYPES)}")
    out = output_folder(options)
    # a received export's or run's evaluation/ (or what it holds) as a link: results would be written
    # into, and read from, whatever it names; a folder you name with --output may itself be a link
    inside = foreign_entry_inside if options.output else foreign_entry
    problem = output_problem(out, folder=True) or inside(out)
    if problem:
        raise ValueError(f"{'--output ' if options.output else 'the results folder '}{out}: {problem}")
    if "lm_eval" in options.tasks:  # unknown tasks, or data that cannot be had offline, in one line
        check_tasks(options.lm_eval)
    if options.run_dir:  # where results will be logged: the run folder's own store, checked now
        from implicit_megatron.evaluation.mlflow_results import check_destination

        check_destination(options.run_dir)


def output_folder(options: EvalOptions) -> Path:
    """--output, or <export>/evaluation, or <run>/evaluation beside the run's checkpoints/ folder."""
    if options.output:
        return Path(options.output)
    kind, folder, _ = classify(options.model)
    return folder / "evaluation" if kind == "export" else folder.parent / "evaluation"


def vocabulary_mismatch(prefix: str, top: int, vocab: int, loaded: LoadedModel) -> str:
    """Why data tokenized for another vocabulary cannot be evaluated (its ids index past the model's)."""
    from data_pipeline.shard_check import ShardError, read_stats

    built = ""
    try:
        stats = read_stats(prefix) or {}
        built = f", tokenized with {stats['tokenizer']} ({stats['vocab_size']} tokens)"
    except (ShardError, KeyError):
        pass
    return (f"--data {prefix}{built} holds token id {top}, beyond the vocabulary of the model {loaded.source} "
            f"({vocab} tokens): evaluate it on data tokenized with the model's own tokenizer "
            f"({loaded.cfg.data.tokenizer})")


class Evaluation:
    """One model on one data prefix; each result is computed at most once."""

    def __init__(self, options: EvalOptions, log: Callable[[str], None], bars: Callable | None = None):
        self.options, self.log, self.bars = options, log, bars
        self.loaded = load_model(options.model, options.device, DTYPES[options.dtype], options.solver)
        if options.data and not options.allow_tokenizer_mismatch:
            from data_pipeline.shard_tokenizer import other_tokenizer

            problem = other_tokenizer(options.data, self.loaded.tokenizer.path)
            if problem:
                raise ValueError(f"--data {options.data}: {problem}: the perplexity would be of other tokens. "
                                 "Evaluate on shards built with the model's tokenizer, or pass "
                                 "--allow-tokenizer-mismatch")
        cfg = self.loaded.cfg
        self.train_len = cfg.data.seq_len
        self.lengths = options.seq_lens or [self.train_len * f for f in (1, 2, 4, 8)]
        self.seed = options.seed if options.seed is not None else cfg.data.seed
        self._nll: dict[int, NLLResult] = {}
        self._sequential: tuple[NLLResult, SequentialResult] | None = None

    def windows(self, length: int, count: int | None) -> torch.Tensor:
        data = cast(str, self.options.data)  # the tasks that read windows are those of --data
        windows = load_windows(data, length, self.seed, self.options.split, count)
        vocab = self.loaded.cfg.model.vocab_size
        if windows.numel() and int(windows.max()) >= vocab:
            raise ValueError(vocabulary_mismatch(data, int(windows.max()), vocab, self.loaded))
        return windows

    def nll(self, length: int) -> NLLResult:
        if length not in self._nll:
            start = time.time()
            windows = self.windows(length, self.options.max_windows)
            self._nll[length] = self._measure(length, windows, start)
            self.log(f"simultaneous mode, length {length}: {len(windows)} windows, ppl "
                     f"{self._nll[length].ppl:.3f} ({time.time() - start:.1f} s)")
        return self._nll[length]

    def _measure(self, length: int, windows: torch.Tensor, start: float) -> NLLResult:
        """token_nll with a progress bar for the length (`bars`), or a log line every 30 s."""
        model, batch_size = self.loaded.model, self.options.batch_size
        if self.bars is None:
            return token_nll(model, windows, batch_size, progress=lambda done: self.log(
                f"length {length}: {done}/{len(windows)} windows ({time.time() - start:.0f} s)"))
        with self.bars(desc=f"[evaluate] length {length}", total=len(windows), unit="window") as bar:
            result = token_nll(model, windows, batch_size, progress=lambda done: bar.update(done - bar.n), every=0.0)
            bar.update(len(windows) - bar.n)
        return result

    def sequential(self) -> tuple[NLLResult, SequentialResult]:
        """Both modes on the same windows of the first length, batched alike."""
        if self._sequential is None:
            start = time.time()
            windows = self.windows(self.lengths[0], self.options.sequential_windows)
            simultaneous = token_nll(self.loaded.model, windows, self.options.batch_size)
            sequential = run_sequential(self.loaded.model, windows, self.options.batch_size)
            self._sequential = (simultaneous, sequential)
            self.log(f"sequential mode, length {self.lengths[0]}: {len(windows)} windows "
                     f"({time.time() - start:.1f} s)")
        return self._sequential

    # ---------------------------------------------------------------- tasks

    def ppl(self) -> dict:
        r = self.nll(self.lengths[0])
        return {"seq_len": r.seq_len, "windows": r.nll.shape[0], "tokens": r.tokens, "nll": r.mean_nll,
                "ppl": r.ppl}

    def extrapolation(self) -> dict:
        lengths = {}
        for length in self.lengths:
            r = self.nll(length)
            lengths[str(length)] = {"ppl": r.ppl, "nll": r.mean_nll, "windows": r.nll.shape[0], "tokens": r.tokens,
                                    "positions": position_buckets(r.nll, self.options.position_buckets)}
        return {"train_seq_len": self.train_len, "lengths": lengths}

    def dynamics(self) -> dict:
        _, sequential = self.sequential()
        return summarize(self.nll(self.lengths[0]), sequential, self.options.position_buckets,
                         self.loaded.solver["phantom_steps"]).to_dict()

    def duality(self) -> dict:
        simultaneous, sequential = self.sequential()
        return compare_modes(simultaneous, sequential, self.options.position_buckets).to_dict()

    def lm_eval(self) -> dict:
        return run_lm_eval(self.loaded, self.options.lm_eval)

    def model_info(self) -> dict:
        loaded = self.loaded
        step = re.search(r"step(\d+)$", loaded.tag or "")
        return {"label": loaded.label, "name": loaded.cfg.name, "source": loaded.source, "kind": loaded.kind,
                "tag": loaded.tag, "step": int(step.group(1)) if step else None, "solver": loaded.solver,
                "arch": loaded.cfg.model.arch, "parameters": loaded.model.num_parameters(),
                "train_seq_len": self.train_len}


def run_evaluation(options: EvalOptions, log: Callable[[str], None] | None = None,
                   bars: Callable | None = None) -> dict:
    """Run the tasks, write the output files, log to MLflow; returns the results dict. `bars`: a
    progress bar factory (tqdm's signature) for each length's windows; None logs every 30 s instead."""
    log = log or (lambda message: print(f"[evaluate] {message}", file=sys.stderr, flush=True))
    check_options(options)
    evaluation = Evaluation(options, log, bars)
    log(f"{evaluation.loaded.label} from {options.model}: {report.describe_solver(evaluation.loaded.solver)}")
    results: dict = {"model": evaluation.model_info(),
                     "data": {"prefix": options.data, "split": options.split, "seed": evaluation.seed},
                     "seconds": {}}
    for task in TASKS:
        if task in options.tasks:
            start = time.time()
            results[task] = getattr(evaluation, task)()
            results["seconds"][task] = round(time.time() - start, 2)
    out = output_folder(options)
    results = merge_into(out, results, log)
    remove_stale_plots(out, results, log)
    files = write_outputs(results, out)
    results["files"] = [str(f) for f in files]
    if options.run_dir:
        results["mlflow_run_id"] = log_mlflow(options.run_dir, evaluation.loaded, results, files)
        log(f"logged to MLflow run {results['mlflow_run_id']} in {options.run_dir}")
    replace_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    return results


class OutputNotWritten(OSError):
    """An output file met a full disk, a quota or a file-size limit; the message names it and what is whole."""


def write_outputs(results: dict, out: Path) -> list[Path]:
    """results.json, results.md and the plots the results allow, each written whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    label = results["model"]["label"]
    writes: list[tuple[Path, Callable[[Path], object]]] = [
        (out / "results.json", lambda p: replace_text(p, json.dumps(results, indent=2) + "\n")),
        (out / "results.md", lambda p: replace_text(p, report.render(results)))]
    if "extrapolation" in results:
        writes.append((out / "per_position_ppl.png", lambda p: plots.per_position_plot(
            results["extrapolation"], results["model"]["train_seq_len"], label, p)))
    if "dynamics" in results:
        writes.append((out / "iterations_per_token.png", lambda p: plots.passes_plot(results["dynamics"], label, p)))
    if "duality" in results:
        writes.append((out / "duality.png", lambda p: plots.duality_plot(results["duality"], label, p)))
    files: list[Path] = []
    for path, write in writes:
        try:
            write(path)
        except OSError as err:
            if not out_of_room(err):
                raise
            whole = f"written whole before it: {', '.join(f.name for f in files)}" if files else "nothing written"
            raise OutputNotWritten(f"{path}: not written ({first_line(err)}); {whole}") from None
        files.append(path)
    return files


def log_mlflow(run_dir: str, loaded: LoadedModel, results: dict, files: list[Path]) -> str:
    from implicit_megatron.evaluation.mlflow_results import log_results

    return log_results(run_dir, loaded.cfg.name, results, files)
