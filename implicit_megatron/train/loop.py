"""The training loop: this launch's steps, and the hooks between them.

    python -m implicit_megatron.train CONFIG [key=value ...]      (one process per rank)

The Trainer starts a rank (the process group, the task, the model, the checkpoint to start from,
the engine), then `fit` runs this launch's steps. A step is one component (train_step.py: its
micro-batches, forward, backward, the solver's statistics); everything else is a concern in
train/callbacks/, called through its hooks: the phase of a step, reporting and tracking, the
warnings, a graceful stop, non-finite steps, the loss-jump guard, the validation and checkpoint
cadences, the stall watch. The loop itself names none of them.
Everything a step needs to resume exactly (step, consumed samples, data position, RNG) is given by
the parts that own it (train/run_state.py) to the checkpoint; the LR is a function of the global
step, so nothing else is.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from data_pipeline.tokenizer import load_tokenizer
from implicit_megatron.builder import build_training_model
from implicit_megatron.checkpoints import safe_load
from implicit_megatron.config import Config
from implicit_megatron.run_control import RunEnd
from implicit_megatron.tracking.metrics_file import read_metrics
from implicit_megatron.tracking.run_record import apply_environment
from implicit_megatron.train import callbacks, stopping
from implicit_megatron.train.callbacks.checkpointing import CheckpointCallback
from implicit_megatron.train.callbacks.loss_jump import LossJumpCallback
from implicit_megatron.train.callbacks.nonfinite import NonFiniteCallback
from implicit_megatron.train.callbacks.phases import PhasesCallback
from implicit_megatron.train.callbacks.preemption import PreemptionCallback
from implicit_megatron.train.callbacks.reporting import ReportingCallback
from implicit_megatron.train.callbacks.stall import StallWatchCallback
from implicit_megatron.train.callbacks.timers import TimersCallback
from implicit_megatron.train.callbacks.validation import ValidationCallback
from implicit_megatron.train.callbacks.warnings import WarningsCallback
from implicit_megatron.train.checkpointer import Checkpointer
from implicit_megatron.train.curriculum import Phases
from implicit_megatron.train.engine import build_engine, init_distributed, local_device
from implicit_megatron.train.flops import peak_flops_per_device
from implicit_megatron.train.guards import LossJumpGuard
from implicit_megatron.train.log_line import validation_text
from implicit_megatron.train.progress import Progress
from implicit_megatron.train.reporting import Reporter
from implicit_megatron.train.run_state import DataPosition
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.train.stall_watch import StallWatch
from implicit_megatron.train.step_metrics import IntervalMetrics
from implicit_megatron.train.tasks import build_task
from implicit_megatron.train.timers import StepTimers
from implicit_megatron.train.train_step import StepResult, TrainStep
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
        stopping.check()  # a SIGTERM while the engine was built
        self.progress = Progress()
        self.phases = Phases(cfg, self.log)
        self.reporter = Reporter(cfg, self.rank, self.engine.device, self.log)
        self.interval = IntervalMetrics()
        preemption = PreemptionCallback(stopping.signals(), cfg.output_dir, self.rank, cfg.train.exit_after_minutes)
        self.hooks = callbacks.Hooks([  # in the order a step's end needs them
            StallWatchCallback(self.stall), PhasesCallback(),
            LossJumpCallback(LossJumpGuard(cfg.checkpoint.max_loss_jump, self.log)), ReportingCallback(),
            WarningsCallback(cfg, self.rank, self.log), preemption, NonFiniteCallback(),
            ValidationCallback(), CheckpointCallback(), TimersCallback(self.timers), *callbacks.registered()])
        eod_id = load_tokenizer(cfg.data.tokenizer).eod_id if cfg.model.separate_documents else None
        self.step = TrainStep(cfg, self.engine, self.model, self.task, self.timers, self.interval, self.hooks, eod_id,
                              peak_flops_per_device(cfg), sum(p.numel() for p in self.model.core.backbone.parameters()),
                              self.world)
        self.batches = self.task.train_batches(self.rank, self.world, self.step.accum)
        self.data = DataPosition(self.batches, self.task, self.progress)
        self.last_step = cfg.train.steps  # this launch's (fit sets it)
        self.last_saved: str | None = None  # the checkpoint this launch saved last

    @property
    def source(self):
        """The checkpoint this launch starts from (None: a fresh start)."""
        return self.checkpointer.source

    def resume(self) -> None:
        self.stall.doing("start-up: loading the checkpoint")
        self.checkpointer.resume(self.engine, self.progress, self.data, self.phases)

    def steps_to_train(self) -> tuple[int, int]:
        """This launch's steps, start+1..end: from where it resumed to its phase's or the run's end."""
        return self.phases.steps_of_this_launch(self.progress.step)

    # ---------------------------------------------------------------- loop

    def fit(self) -> RunEnd:
        """Train to the end of this launch; how it ended (finished, or stopped with its checkpoint).
        However it ends (a refusal in the resume included), the stall watch ends first: a heartbeat
        thread still inside a store call while the process group is torn down aborts the process
        ("terminate called without an active exception")."""
        try:
            return self._fit()
        finally:
            self.stall.done()

    def _fit(self) -> RunEnd:
        self.hooks.start_up_done(self.cfg)
        stopping.check()  # the last point of the start-up: from here a SIGTERM saves a checkpoint
        self.hooks.before_resume(self)
        self.resume()
        start, self.last_step = self.steps_to_train()
        if start >= self.last_step:
            last = [r for r in read_metrics(self.cfg.output_dir) if "val/loss" in r]
            final = f"; the last one, at step {last[-1]['step']}: {validation_text(last[-1])}" if last else ""
            self.log(f"already complete: step {start} of {self.last_step} (train.steps); nothing to train{final}")
            self.hooks.fit_end(self, "FINISHED", completed=False)
            return RunEnd("finished", 0, reason="already complete", step=start)
        status, completed = "KILLED", False  # a second Ctrl-C (the first asks for a saved stop)
        self.hooks.fit_start(self, start, self.last_step)
        try:
            for step in range(start, self.last_step):
                self.hooks.step_start(self, step)
                control = self.hooks.step_end(self, self.train_step(step))
                if control.ended:
                    break
            status, completed = control.status, control.completed
        except KeyboardInterrupt:  # KILLED, as set above
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.hooks.fit_end(self, status, completed)
        if status == "KILLED":
            return RunEnd("stopped", 0, reason=control.reason, step=self.progress.step, checkpoint=control.checkpoint)
        return RunEnd("finished", 0, step=self.progress.step, checkpoint=self.last_saved)

    def train_step(self, step: int) -> StepResult:
        """One optimizer step (train_step.py), counted in the progress."""
        result = self.step.run(step, self.batches, lambda: self.hooks.stop_asked(self))
        batch = self.cfg.train.global_batch_size
        self.progress.count(result.finite, batch, batch * self.cfg.data.seq_len)
        return result

    # ---------------------------------------------------------------- what the hooks ask of the trainer

    def interval_metrics(self) -> dict[str, float]:
        metrics = self.interval.read(self.cfg.train.global_batch_size * self.cfg.data.seq_len, self.step.peak_flops)
        if not metrics:
            return {}
        metrics.update({"train/lr": learning_rate(self.progress.step - 1, self.cfg),
                        "train/consumed_samples": self.progress.consumed_samples})
        self.hooks.interval(self, metrics)
        return metrics

    def evaluate(self) -> dict[str, float]:
        with self.interval.paused():
            return evaluate(self.engine, self.task, self.step.forward, self.cfg.model.vocab_size, self.rank,
                            self.world)

    def save(self) -> str:
        with self.interval.paused():
            self.last_saved = self.checkpointer.save(self.engine, [self.progress, self.phases, self.data],
                                                     self.progress.tag, self.reporter.val_loss_at(self.progress.step))
        return self.last_saved

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[train] {message}", flush=True)
