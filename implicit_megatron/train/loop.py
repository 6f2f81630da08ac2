"""The training loop: this launch's steps, each over its micro-batches, and what comes between them.

    python -m implicit_megatron.train CONFIG [key=value ...]      (one process per rank)

Around the loop, each concern is a component with one job: the Checkpointer (where the launch
starts, resuming, saving), Phases (which phase a step is in), IntervalMetrics (what steps report,
read from the device once per log interval), the Reporter (log line, metrics.jsonl, MLflow, the
warnings about divergence and convergence), the LossJumpGuard (no checkpoint of a jumped loss),
Preemption (a graceful stop) and the registered callbacks (hooks the tests inject faults with).
Everything a step needs to resume exactly (step, consumed samples, data position, RNG) travels in
the checkpoint's client state; the LR is a function of the global step, so nothing else does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from data_pipeline.tokenizer import load_tokenizer
from implicit_megatron.builder import build_training_model
from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.layout import checkpoint_dir
from implicit_megatron.config import Config
from implicit_megatron.models.lm import seq_idx_from_eod
from implicit_megatron.tracking.metrics_file import read_metrics
from implicit_megatron.tracking.run_record import apply_environment
from implicit_megatron.train import callbacks, stopping
from implicit_megatron.train.checkpointer import Checkpointer
from implicit_megatron.train.curriculum import Phases
from implicit_megatron.train.engine import build_engine, init_distributed, local_device
from implicit_megatron.train.flops import peak_flops_per_device, step_flops
from implicit_megatron.train.guards import LossJumpGuard, nonfinite_stop
from implicit_megatron.train.log_line import validation_text
from implicit_megatron.train.reporting import Reporter
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.train.stall_watch import StallWatch
from implicit_megatron.train.step_metrics import IntervalMetrics, step_flags
from implicit_megatron.train.tasks import build_task
from implicit_megatron.train.timers import StepTimers
from implicit_megatron.train.validation import accuracy, evaluate, lm_loss
from implicit_megatron.utils.safe_write import replace_text


@dataclass
class Progress:
    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    phase: str | None = None
    nonfinite_steps: int = 0  # in a row; their updates are skipped
    skipped_steps: int = 0  # non-finite steps of this launch, in all


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
        self.callbacks = callbacks.registered()
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
        self.backbone_params = sum(p.numel() for p in self.model.core.backbone.parameters())
        self.checkpointer = Checkpointer(cfg, self.rank, self.world, self.log, self._before_latest)
        self.stall.doing("start-up: preparing the checkpoint to start from")
        source = self.checkpointer.prepare(self.model)  # before the engine: it may name a universal load
        self.stall.doing("start-up: building the engine")
        self.engine = build_engine(cfg, self.model, load_universal=source is not None and source.how == "universal")
        stopping.check()  # a SIGTERM while the engine was built
        self.accum = self.engine.gradient_accumulation_steps()
        self.batches = self.task.train_batches(self.rank, self.world, self.accum)
        self.progress = Progress()
        self.phases = Phases(cfg, self.log)
        self.reporter = Reporter(cfg, self.rank, self.engine.device, self.log)
        self.loss_jump = LossJumpGuard(cfg.checkpoint.max_loss_jump, self.log)
        self.preemption = stopping.Preemption(cfg.output_dir, self.rank, cfg.train.exit_after_minutes)
        self.interval = IntervalMetrics()
        self.peak_flops = peak_flops_per_device(cfg)
        self.eod_id = load_tokenizer(cfg.data.tokenizer).eod_id if cfg.model.separate_documents else None

    @property
    def source(self):
        """The checkpoint this launch starts from (None: a fresh start)."""
        return self.checkpointer.source

    def resume(self) -> None:
        self.stall.doing("start-up: loading the checkpoint")
        state = self.checkpointer.resume(self.engine, self.task, self.batches, self.progress)
        self.phases.resume(state, self.progress.step)

    # ---------------------------------------------------------------- loop

    def fit(self) -> None:
        """Train to the end of this launch. However it ends (a refusal in the resume included), the
        stall watch ends first: a heartbeat thread still inside a store call while the process group
        is torn down aborts the process ("terminate called without an active exception")."""
        try:
            self._fit()
        finally:
            self.stall.done()

    def _fit(self) -> None:
        for callback in self.callbacks:
            callback.on_start_up_done(self.cfg)
        stopping.check()  # the last point of the start-up: from here a SIGTERM saves a checkpoint
        self.preemption.install()
        self.resume()
        start, end = self.phases.steps_of_this_launch(self.progress.step)
        if start >= end:
            last = [r for r in read_metrics(self.cfg.output_dir) if "val/loss" in r]
            final = f"; the last one, at step {last[-1]['step']}: {validation_text(last[-1])}" if last else ""
            self.log(f"already complete: step {start} of {end} (train.steps); nothing to train{final}")
            self.reporter.tracker.finish("FINISHED")
            return
        status, t, p = "FINISHED", self.cfg.train, self.progress
        self.reporter.begin(start, end, sum(param.numel() for param in self.model.parameters()),
                            resumed=self.checkpointer.from_own_folder)
        try:
            self.interval.reset()
            for step in range(start, end):
                self.stall.doing(f"step {step + 1}")
                self.phases.apply(step, self.engine.module.core, p)
                self.reporter.tracker.set_phase(getattr(self.phases.at(step), "name", None))
                self.train_step(step)
                if p.step % t.log_interval == 0 or p.step == end or self.preemption.agreed:
                    self.reporter.report(self.interval_metrics(), p.step, self.engine.module.core.settings)
                if self.preemption.agreed:  # save at once, skip validation (grace periods are short)
                    self.preemption.record(p.step, None if p.nonfinite_steps else self.save())
                    self.log(f"stopped by {self.preemption.why} after step {p.step}; launch again to resume")
                    status = "KILLED"
                    return
                if p.nonfinite_steps:
                    self.log(f"step {p.step}: non-finite loss ({p.nonfinite_steps} in a row); its update is skipped")
                    self.reporter.tracker.log({"train/nonfinite_steps": p.nonfinite_steps}, p.step)
                    nonfinite_stop(p.nonfinite_steps, t.max_nonfinite_in_row, checkpoint_dir(self.cfg))
                    if p.step < end:
                        continue  # no validation and no checkpoint at a diverged step
                    self.save()  # the last step: the weights are those of the last finite update
                    break
                if p.step % t.eval_interval == 0 or p.step == end:
                    self.stall.doing(f"the validation after step {p.step}")
                    self.reporter.validation(self.evaluate(), p.step)
                due = p.step % self.cfg.checkpoint.interval == 0 or p.step == end or self.phases.ends_after(p.step)
                if due and self.loss_jump.allows_save(p.step, self.engine.device):
                    self.stall.doing(f"the checkpoint of step {p.step}")
                    self.save()
            self.reporter.summary(p.step, p.skipped_steps)
        except KeyboardInterrupt:  # a second Ctrl-C (the first asks for a saved stop)
            status = "KILLED"
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.stall.done()  # before the tracker's last writes: the neighbour stops watching this rank
            self.reporter.tracker.finish(status)

    def train_step(self, step: int) -> None:
        """One optimizer step over `accum` micro-batches. The host reads one pair of flags (finite,
        stop) per step; what the step reports stays on the device until the log interval ends."""
        lr = learning_rate(step, self.cfg)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        losses, correct, residual, converged, passes, phantom = [], [], [], [], 0, 0
        grad_norm = None
        timed = self.timers.section
        for _ in range(self.accum):
            with timed("data"):
                inputs, labels = (t.to(self.engine.device)
                                  for t in self.task.inputs_and_targets(next(self.batches)))
            with timed("forward"):
                if self.task.reports_accuracy:
                    logits = self.forward(inputs)
                    loss = lm_loss(logits, labels)
                    correct.append(accuracy(logits, labels, self.cfg.model.vocab_size))
                else:
                    loss = self.forward(inputs, labels)
            for callback in self.callbacks:
                loss = callback.on_loss(step + 1, loss)
            with timed("backward"):
                self.engine.backward(loss)
            losses.append(loss.detach().float())
            if self.engine.is_gradient_accumulation_boundary():
                grad_norm = self._grad_norm()
                finite, self.preemption.agreed = step_flags(losses, grad_norm, self.preemption.asked(),
                                                            self.engine.device)
                if not finite:
                    self._drop_gradients()
            with timed("optimizer"):
                self.engine.step()
            stats = self.model.solver_stats()
            if stats is not None:
                passes, phantom = passes + stats.passes, phantom + stats.phantom_passes
                residual.append(stats.residual.detach().float().max())
                converged.append(stats.converged.float().mean())
        self.timers.count_step()
        p = self.progress
        p.step += 1
        p.consumed_samples += self.cfg.train.global_batch_size
        p.consumed_tokens += self.cfg.train.global_batch_size * self.cfg.data.seq_len
        p.nonfinite_steps = 0 if finite else p.nonfinite_steps + 1
        p.skipped_steps += 0 if finite else 1
        if not finite:
            return
        for callback in self.callbacks:
            losses = callback.on_step_losses(p.step, losses)
        self.loss_jump.add(torch.stack(losses).mean())
        self.interval.add_step(losses, correct, residual, converged, passes,
                               self.engine.get_global_grad_norm() if grad_norm is None else grad_norm,
                               self._step_flops(passes, phantom))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or with labels the mean loss (computed without the whole batch's logits)."""
        kwargs = {} if labels is None else {"labels": labels}
        if self.eod_id is not None:
            kwargs["seq_idx"] = seq_idx_from_eod(inputs, self.eod_id)
        return self.engine(inputs, **kwargs)

    # ---------------------------------------------------------------- between steps

    def interval_metrics(self) -> dict[str, float]:
        metrics = self.interval.read(self.cfg.train.global_batch_size * self.cfg.data.seq_len, self.peak_flops)
        if not metrics:
            return {}
        metrics.update({"train/lr": learning_rate(self.progress.step - 1, self.cfg),
                        "train/consumed_samples": self.progress.consumed_samples, **self.timers.read()})
        return metrics

    def evaluate(self) -> dict[str, float]:
        with self.interval.paused():
            return evaluate(self.engine, self.task, self.forward, self.cfg.model.vocab_size, self.rank, self.world)

    def save(self) -> str:
        with self.interval.paused():
            return self.checkpointer.save(self.engine, self.progress, self.batches, self.task,
                                          self.phases.recorded(), self.reporter.val_loss_at(self.progress.step))

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[train] {message}", flush=True)

    def _before_latest(self, tag: str) -> None:
        for callback in self.callbacks:
            callback.before_latest(tag)

    def _step_flops(self, passes: int, phantom: int) -> float:
        """FLOPs per device of a step with these passes (summed over its micro-batches)."""
        if not self.peak_flops:
            return 0.0
        implicit = self.engine.module.core.implicit
        solver, with_grad = (passes / self.accum, phantom / self.accum) if implicit else (0, 1)
        tokens = self.cfg.train.global_batch_size * self.cfg.data.seq_len / self.world
        return step_flops(self.cfg, self.backbone_params, tokens, self.cfg.data.seq_len, solver, with_grad)

    def _grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm before clipping where DeepSpeed does not report it (ZeRO-0:
        gradients are whole and already averaged over ranks at the accumulation boundary), on the
        device."""
        if self.cfg.distributed.zero_stage != 0 or self.cfg.distributed.precision != "fp32":
            return None  # DeepSpeed's optimizer wrappers report the norm and handle overflow themselves
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))

    def _drop_gradients(self) -> None:
        """Keep the parameters where they are under ZeRO-0: zero gradients and a zero learning rate
        (Adam's moment estimates decay by one step). ZeRO 1-3 discard an update whose gradient norm
        is not finite themselves."""
        for param in self.engine.module.parameters():
            if param.grad is not None:
                param.grad.zero_()
        for group in self.engine.optimizer.param_groups:
            group["lr"] = 0.0

