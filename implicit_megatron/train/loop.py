"""The training loop: this launch's steps, and the hooks between them.

    python -m implicit_megatron.train CONFIG [key=value ...]      (one process per rank)

The Trainer starts a rank (the process group, the task, the model, the checkpoint to start from,
the engine), then `fit` runs this launch's steps. A step is one component (train_step.py: its
micro-batches, forward, backward, the solver's statistics); everything else is a concern in
train/callbacks/, called through its hooks in the order of their priorities: the stall watch, the
phase of a step, a graceful stop, non-finite steps, the loss-jump guard, reporting and tracking,
the warnings, the validation and checkpoint cadences, the timers. The loop itself names none of
them; what they decide at a step's end the trainer carries out (`report`, `evaluate`, `save`: the
Hooks' Actions). Everything a step needs to resume exactly (step, consumed samples, data position,
RNG, the callbacks' own state) is given by the parts that own it (train/run_state.py) to the
checkpoint; the LR is a function of the global step, so nothing else is.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from data_pipeline.tokenizer import load_tokenizer
from implicit_megatron.builder import build_training_model
from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.layout import checkpoint_dir
from implicit_megatron.config import Config
from implicit_megatron.run_control import RunEnd
from implicit_megatron.tracking.metrics_file import read_metrics
from implicit_megatron.tracking.run_record import apply_environment
from implicit_megatron.train import callbacks, stopping
from implicit_megatron.train.callbacks import FitEnd, StepEnd
from implicit_megatron.train.callbacks.checkpointing import CheckpointCadence
from implicit_megatron.train.callbacks.convergence import ConvergenceWatch
from implicit_megatron.train.callbacks.divergence import DivergenceWatch
from implicit_megatron.train.callbacks.loss_jump import LossJumpGuard
from implicit_megatron.train.callbacks.nonfinite import NonFinite
from implicit_megatron.train.callbacks.phases import Phases
from implicit_megatron.train.callbacks.preemption import Preemption
from implicit_megatron.train.callbacks.reporting import Reporting
from implicit_megatron.train.callbacks.stall import StallWatch
from implicit_megatron.train.callbacks.timers import StepTimers
from implicit_megatron.train.callbacks.validation import ValidationCadence
from implicit_megatron.train.checkpointer import Checkpointer
from implicit_megatron.train.engine import build_engine, init_distributed, local_device
from implicit_megatron.train.flops import peak_flops_per_device
from implicit_megatron.train.log_line import validation_text
from implicit_megatron.train.progress import Progress
from implicit_megatron.train.run_state import DataPosition
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.train.step_metrics import IntervalMetrics
from implicit_megatron.train.tasks import build_task
from implicit_megatron.train.train_step import TrainStep
from implicit_megatron.train.validation import evaluate
from implicit_megatron.utils.safe_write import replace_text


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        safe_load.set_trust(cfg.checkpoint.trust_pickle)
        init_distributed(cfg)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.stall = StallWatch(cfg.distributed.timeout_minutes, self.rank, self.world,  # start-up is watched too
                                store_minutes=cfg.distributed.collective_timeout_minutes)
        try:
            self._start_up(cfg)
        except BaseException:
            self.stall.done()  # its threads must not outlive the process group (see fit)
            raise

    def _start_up(self, cfg: Config) -> None:
        self.task = build_task(cfg)
        apply_environment(cfg)  # MLflow's own variables, where the config sets no store or experiment
        if self.rank == 0:
            out = Path(cfg.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            replace_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            self.task.prepare()
        dist.barrier()
        torch.manual_seed(cfg.train.seed)
        self.timers = StepTimers(cfg.train.timers, local_device())
        self.model = build_training_model(cfg, self.timers.section if cfg.train.timers else None)
        self.checkpointer = Checkpointer(cfg, self.rank, self.world, self.log, lambda tag: self.hooks.latest(tag))
        self.stall.doing("start-up: preparing the checkpoint to start from")
        source = self.checkpointer.prepare(self.model)  # before the engine: it may name a universal load
        self.stall.doing("start-up: building the engine")
        self.engine = build_engine(cfg, self.model, load_universal=source is not None and source.loads_universal)
        stopping.check()  # a stop asked while the engine was built
        self.progress = Progress()
        self.interval = IntervalMetrics()
        self.phases = Phases(cfg, self.log, self.engine.module.core, self.progress)
        self.reporter = Reporting(cfg, self.rank, self.engine.device, self.log,
                                  parameters=sum(param.numel() for param in self.model.parameters()),
                                  resumed=self.checkpointer.from_own_folder,
                                  phase_of=lambda step: getattr(self.phases.at(step), "name", None))
        self.hooks = callbacks.Hooks([*self.concerns(cfg), *callbacks.registered()])
        eod_id = load_tokenizer(cfg.data.tokenizer).eod_id if cfg.model.separate_documents else None
        self.step = TrainStep(cfg, self.engine, self.model, self.task, self.timers, self.interval, self.hooks, eod_id,
                              peak_flops_per_device(cfg), sum(p.numel() for p in self.model.core.backbone.parameters()),
                              self.world)
        self.batches = self.task.train_batches(self.rank, self.world, self.step.accum)
        self.data = DataPosition(self.batches, self.task, self.progress)
        self.last_step = cfg.train.steps  # this launch's (fit sets it)
        self.last_saved: str | None = None  # the checkpoint this launch saved last

    def concerns(self, cfg: Config) -> list[callbacks.Callback]:
        """The loop's concerns, each given what it acts on (their priorities order them); the trainer
        keeps the ones it asks things of (the stall watch, the phases, the reporter, the timers)."""
        core, checkpoints = self.engine.module.core, checkpoint_dir(cfg)
        return [self.stall, self.phases, self.reporter, self.timers,
                Preemption(stopping.signals(), cfg.output_dir, self.rank, cfg.train.exit_after_minutes, self.log),
                NonFinite(cfg.train.max_nonfinite_in_row, checkpoints, self.log, self.reporter.tracker.log),
                LossJumpGuard(cfg.checkpoint.max_loss_jump, self.log, self.engine.device),
                DivergenceWatch(cfg.model.vocab_size, checkpoints, self.rank, self.log),
                ConvergenceWatch(cfg.train.warn_unconverged_intervals, self.log, core),
                ValidationCadence(cfg.train.eval_interval),
                CheckpointCadence(cfg.checkpoint.interval, self.phases.ends_after)]

    @property
    def source(self):
        """The checkpoint this launch starts from (None: a fresh start)."""
        return self.checkpointer.source

    def resume(self) -> None:
        self.stall.doing("start-up: loading the checkpoint")
        state = self.checkpointer.resume(self.engine, self.progress, self.data)
        if state is not None:  # each concern takes its state back
            self.hooks.resume(state, self.progress.step, self.source.resuming)

    def steps_to_train(self) -> tuple[int, int]:
        """This launch's steps, start+1..end: from where it resumed to its phase's or the run's end."""
        return self.phases.steps_of_this_launch(self.progress.step)

    # ---------------------------------------------------------------- loop

    def fit(self) -> RunEnd:
        """Train to the end of this launch; how it ended (finished, or stopped with its checkpoint).
        However it ends (a refusal in the resume included), the stall watch ends first: its threads
        must not outlive the process group (train/callbacks/stall.py)."""
        try:
            return self._fit()
        finally:
            self.stall.done()

    def _fit(self) -> RunEnd:
        self.hooks.start_up_done(self.cfg)
        stopping.check()  # the last point of the start-up: from here a stop saves a checkpoint
        self.hooks.before_resume()
        self.resume()
        start, self.last_step = self.steps_to_train()
        if start >= self.last_step:
            last = [r for r in read_metrics(self.cfg.output_dir) if "val/loss" in r]
            final = f"; the last one, at step {last[-1]['step']}: {validation_text(last[-1])}" if last else ""
            self.log(f"already complete: step {start} of {self.last_step} (train.steps); nothing to train{final}")
            self.hooks.fit_end(FitEnd("FINISHED", False, start, 0))
            return RunEnd("finished", 0, reason="already complete", step=start)
        status, completed, control = "KILLED", False, None  # KILLED: a second Ctrl-C (the first asks for a save)
        self.hooks.fit_start(start, self.last_step)
        try:
            for step in range(start, self.last_step):
                self.hooks.step_start(step)
                control = self.hooks.step_end(self.train_step(step), self)
                if control.ending:
                    break
            status, completed = control.ending[:2] if control and control.ending else ("FINISHED", True)
        except KeyboardInterrupt:  # KILLED, as set above
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.hooks.fit_end(FitEnd(status, completed, self.progress.step, self.progress.skipped_steps))
        if control and control.ending and status == "KILLED":
            return RunEnd("stopped", 0, reason=control.ending[2], step=self.progress.step, checkpoint=control.saved)
        return RunEnd("finished", 0, step=self.progress.step, checkpoint=self.last_saved)

    def train_step(self, step: int) -> StepEnd:
        """One optimizer step (train_step.py), counted in the progress."""
        result = self.step.run(step, self.batches, self.hooks.stop_asked)
        batch = self.cfg.train.global_batch_size
        self.progress.count(result.finite, batch, batch * self.cfg.data.seq_len)
        return StepEnd(step=self.progress.step, last_step=self.last_step, finite=result.finite,
                       stop_agreed=result.stop_agreed, losses=result.losses,
                       nonfinite_in_row=self.progress.nonfinite_steps)

    # ---------------------------------------------------------------- what the callbacks ask of the trainer

    def report(self, step: int) -> dict[str, float]:
        """The log interval's metrics, agreed over the ranks and reported ({}: no finite step in it)."""
        metrics = self.interval.read(self.cfg.train.global_batch_size * self.cfg.data.seq_len, self.step.peak_flops)
        if not metrics:
            return {}
        metrics.update({"train/lr": learning_rate(step - 1, self.cfg),
                        "train/consumed_samples": self.progress.consumed_samples})
        self.hooks.interval(metrics)
        return self.reporter.report(metrics, step)

    def evaluate(self) -> dict[str, float]:
        with self.interval.paused():
            return evaluate(self.engine, self.task, self.step.forward, self.cfg.model.vocab_size, self.rank,
                            self.world)

    def save(self) -> str:
        with self.interval.paused():
            self.last_saved = self.checkpointer.save(self.engine, [self.progress, self.data, self.hooks],
                                                     self.progress.tag, self.reporter.val_loss_at(self.progress.step))
        return self.last_saved

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[train] {message}", flush=True)
