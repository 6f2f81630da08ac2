"""What a launch reports: its start in MLflow, each log interval's training metrics and each
validation, agreed over the ranks, into the log line, metrics.jsonl and MLflow (rank 0); its end:
the run's last line where it reached its last step, and MLflow's status however it ended. A log
interval ends every train.log_interval steps, at the launch's last and at a graceful stop; the
report itself is the trainer's action (Actions.report), which calls `report` here. The watches
that warn about a diverging loss or solves that never converge read what `report` returns
(on_metrics)."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from implicit_megatron.checkpoints.layout import DamagedCheckpoint, checkpoint_dir, read_latest
from implicit_megatron.config import Config
from implicit_megatron.errors import RunStopped
from implicit_megatron.tracking.launches_file import LAUNCHES_FILE, append_launch
from implicit_megatron.tracking.metrics_file import METRICS_FILE, append_metrics
from implicit_megatron.tracking.tracker import Tracker
from implicit_megatron.train.callbacks import Callback, FitEnd, StepControl, StepEnd
from implicit_megatron.train.log_line import timers_line, training_line, validation_lines, validation_text
from implicit_megatron.train.step_metrics import reduce_over_ranks

MEANS = ("train/loss", "train/grad_norm", "train/accuracy", "solver/iterations", "solver/converged_frac")


class Reporting(Callback):
    priority = 50

    def __init__(self, cfg: Config, rank: int, device: torch.device, log, parameters: int | None = None,
                 resumed: bool = False, phase_of=lambda step: None) -> None:
        """`parameters`: the model's count, for MLflow; `resumed`: the launch starts from a checkpoint
        of its own folder (it continues the run's records); `phase_of(step)`: the phase's name."""
        self.cfg, self.rank, self.device, self.log = cfg, rank, device, log
        self.parameters, self.resumed, self.phase_of = parameters, resumed, phase_of
        self.tracker = Tracker(cfg, active=rank == 0)
        self.last_eval: dict[str, float] = {}
        self.last_eval_step: int | None = None
        self.first_step, self.last_step, self.started = 0, cfg.train.steps, time.monotonic()

    def on_fit_start(self, start: int, end: int) -> None:
        """This launch trains steps start+1..end: elapsed time and the ETA (to `end`) count from here."""
        self.first_step, self.last_step, self.started = start, end, time.monotonic()
        self.tracker.begin(start, self.parameters, self.resumed, dist.get_world_size())
        if self.rank == 0:  # where this launch begins, for tools/plot_run.py
            try:
                append_launch(self.cfg.output_dir, start, self.resumed, dist.get_world_size(), self.phase_of(start))
            except OSError as err:  # a plot's mark is not worth a run: metrics.jsonl's own write says a full disk
                self.log(f"warning: {LAUNCHES_FILE} in {self.cfg.output_dir} not written ({err.strerror or err})")

    def on_step_start(self, step: int) -> None:
        self.tracker.set_phase(self.phase_of(step))

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        if end.step % self.cfg.train.log_interval == 0 or end.step == end.last_step or end.stop_agreed:
            control.report = True

    def on_validation(self, results: dict[str, float], step: int) -> None:
        self.validation(results, step)

    def on_fit_end(self, end: FitEnd) -> None:
        if end.completed:
            self.summary(end.step, end.skipped_steps)
        self.tracker.finish(end.status)

    def report(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        """Training metrics averaged over the ranks (the solver's residual: the worst rank's), as
        recorded and returned; validation results arrive reduced already."""
        if not metrics:
            return {}
        keys = [k for k in MEANS if k in metrics]
        world = dist.get_world_size()
        reduced = {k: v / world for k, v in zip(keys, reduce_over_ranks([metrics[k] for k in keys], self.device))}
        if "solver/residual" in metrics:
            (reduced["solver/residual"],) = reduce_over_ranks([metrics["solver/residual"]], self.device,
                                                              dist.ReduceOp.MAX)
        metrics = {**metrics, **reduced, **memory_metrics()}
        self._record(metrics, step)
        elapsed = time.monotonic() - self.started
        done = step - self.first_step
        eta = elapsed / done * (self.last_step - step) if done > 0 else None
        self.log(training_line(metrics, step, self.cfg.train.steps, elapsed, eta))
        timers = {k: v for k, v in metrics.items() if k.startswith("timers/")}
        if timers:
            self.log(timers_line(timers))
        return metrics

    def validation(self, results: dict[str, float], step: int) -> None:
        """Results arrive reduced over the ranks already."""
        self.last_eval, self.last_eval_step = results, step
        if results:
            self._record(results, step)
            for line in validation_lines(results, step):
                self.log(line)

    def _record(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log(metrics, step)
        if self.rank == 0:  # a plain record next to the checkpoints, for scripts and tests
            try:
                append_metrics(self.cfg.output_dir, step, metrics)
            except OSError as err:  # a full disk: the run cannot keep its record, and says so in one line
                raise RunStopped(f"{Path(self.cfg.output_dir) / METRICS_FILE}: could not be written at step {step} "
                                 f"({err.strerror or err}); {self._saved()}") from None

    def _saved(self) -> str:
        """What a resume would start from, as the run's folder holds it now."""
        try:
            tag = read_latest(checkpoint_dir(self.cfg))
        except (OSError, DamagedCheckpoint):
            tag = None
        return f"the checkpoint `latest` names ({tag}) is intact" if tag else "no checkpoint of this run was saved"

    def val_loss_at(self, step: int) -> float | None:
        """The validation loss of the weights at `step`, where a validation ran there."""
        return self.last_eval.get("val/loss") if self.last_eval_step == step else None

    def summary(self, step: int, skipped: int) -> None:
        measure = f": {validation_text(self.last_eval)}" if "val/loss" in self.last_eval else ""
        skipped_text = (f"; {skipped} steps skipped with non-finite losses (their updates not applied)"
                        if skipped else "")
        self.log(f"done at step {step}{measure}{skipped_text}; checkpoints in {checkpoint_dir(self.cfg)}")
        if step == self.cfg.train.steps:  # the run's end, not a phase launch's: what a user does next
            self.log(next_steps(self.cfg, self.parameters))


def next_steps(cfg: Config, parameters: int | None) -> str:
    """The model's size, and the commands that use what the run left (README: Use a trained model)."""
    out, python = cfg.output_dir, ".venv/bin/python" if os.path.exists(".venv/bin/python") else "python"
    size = f"{parameters:,} parameters; " if parameters else ""
    return (f"the model: {size}next: {python} tools/convert_checkpoint.py export {out} {out}/export (a transformers "
            f"folder), {python} tools/generate.py {checkpoint_dir(cfg)} --prompt TEXT (generation), {python} "
            f"tools/plot_run.py {out} (the run's curves); README.md: Use a trained model")


def memory_metrics() -> dict[str, float]:
    """This rank's peak memory: the GPU's allocated bytes where there is one, and the host's RSS."""
    memory = {"memory/host_rss_gib": peak_host_rss_gib()}
    if torch.cuda.is_available():
        memory["memory/max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return memory


def peak_host_rss_gib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20
