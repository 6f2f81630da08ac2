"""The training loop: phases, LR, micro-batches, validation, logging, checkpoints.

    python -m implicit_megatron.train CONFIG [key=value ...]      (one process per rank)

Everything a step needs to resume exactly (step, consumed samples, data position, RNG) travels in
the checkpoint's client state; the LR is a function of the global step, so nothing else does.
"""

from __future__ import annotations

import collections
import json
import math
import os
import signal
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

from data_pipeline.tokenizer import load_tokenizer
from implicit_megatron.builder import build_model
from implicit_megatron.checkpoints import layout, safe_load, universal
from implicit_megatron.config import Config, PhaseConfig, phase_bounds
from implicit_megatron.errors import RunRefused
from implicit_megatron.models.lm import seq_idx_from_eod
from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.tracking import (
    Tracker,
    append_metrics,
    drop_metrics_after,
    read_metrics,
    validation_text,
)
from implicit_megatron.train import checkpoint, handoff, stopping
from implicit_megatron.train.catbabi_task import group_hits
from implicit_megatron.train.curriculum import recorded_bounds, run_bounds, trained_bounds
from implicit_megatron.train.engine import build_engine, init_distributed
from implicit_megatron.train.flops import peak_flops_per_device, step_flops
from implicit_megatron.train.guards import DivergenceWatch
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.train.step_metrics import IntervalMetrics, read_on_host, reduce_over_ranks, step_flags
from implicit_megatron.train.tasks import build_task

NAN_LOSS_AT_STEP = "IMPLICIT_MEGATRON_NAN_LOSS_AT_STEP"  # a step (1-based) whose loss is made NaN
LOSS_JUMP_AT_STEP = "IMPLICIT_MEGATRON_LOSS_JUMP_AT_STEP"  # a step whose reported loss is made 1000x
STOP_FILE = "stop-requested"  # in the output folder: stop as SIGTERM would (written by launch/pretrain.sh)
PREEMPTED_FILE = "preempted.json"  # in the output folder: this launch stopped early, with its checkpoint


@dataclass
class Progress:
    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    phase: str | None = None
    nonfinite_steps: int = 0  # in a row; their updates are skipped
    skipped_steps: int = 0  # non-finite steps of this launch, in all
    unconverged_intervals: int = 0  # log intervals in a row in which no sample's solve converged

MIN_LOSS_JUMP = 0.5  # nats: a smaller rise is no jump, whatever the ratio (Trainer._loss_jumped)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over the labelled positions; 0 where none is (a catbAbI window without an answer)."""
    total = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp_min(1)


def mean_over_ranks(values: list[float], device: torch.device) -> list[float]:
    return [v / dist.get_world_size() for v in reduce_over_ranks(values, device)]


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        safe_load.set_trust(cfg.checkpoint.trust_pickle)
        init_distributed(cfg)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.task = build_task(cfg)
        if self.rank == 0:
            out = Path(cfg.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            self.task.prepare()
        dist.barrier()
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg)
        self.model.core.backbone.checkpoint_layers = cfg.distributed.activation_checkpointing
        if cfg.train.compile:
            self.model.core.backbone.compile_blocks()
        if cfg.distributed.zero_stage == 3:
            self.model.core.graph_blocker = "ZeRO-3 gathers and releases parameters inside the forward"
        self.backbone_params = sum(p.numel() for p in self.model.core.backbone.parameters())
        self.source = self._prepare_source()
        self.engine = build_engine(cfg, self.model, load_universal=self.source is not None
                                   and self.source.how == "universal")
        stopping.check()  # a SIGTERM while the engine was built
        self.accum = self.engine.gradient_accumulation_steps()
        self.batches = self.task.train_batches(self.rank, self.world, self.accum)
        self.progress = Progress()
        self.bounds = phase_bounds(cfg)  # each phase's steps; a resume keeps those already trained
        self.tracker = Tracker(cfg, active=self.rank == 0)
        self.stop_requested = False  # this rank was asked to stop (SIGTERM, STOP_FILE)
        self.stop_agreed = False  # some rank was, as of the last step: every rank stops after it
        self.last_eval: dict[str, float] = {}
        self.last_eval_step: int | None = None
        self.divergence = DivergenceWatch(cfg.model.vocab_size, layout.checkpoint_dir(cfg))
        self.peak_flops = peak_flops_per_device(cfg)
        self.nan_loss_at_step = int(os.environ.get(NAN_LOSS_AT_STEP, "0"))
        self.loss_jump_at_step = int(os.environ.get(LOSS_JUMP_AT_STEP, "0"))
        self.recent_losses: collections.deque[float] = collections.deque(maxlen=20)  # of finite steps
        self.unread_losses: list[torch.Tensor] = []  # step losses not yet in recent_losses
        self.interval = IntervalMetrics()
        self.eod_id = load_tokenizer(cfg.data.tokenizer).eod_id if cfg.model.separate_documents else None

    # ---------------------------------------------------------------- set-up

    def _prepare_source(self) -> handoff.Source | None:
        """Find the checkpoint to start from; convert it or load its weights as the layout requires.

        Runs before the engine exists: a universal checkpoint must be named in DeepSpeed's config,
        and weights-only starts fill the model that the engine then partitions.
        """
        chosen = [None, None]  # rank 0 reads the checkpoint files once; every rank starts from its choice
        if self.rank == 0:
            layout.remove_partial(self.cfg, self.log)
            try:
                chosen[0] = handoff.resume_tag(self.cfg, self.log)
            except (handoff.DamagedCheckpoint, OSError) as err:
                chosen[1] = str(err)
        dist.broadcast_object_list(chosen, src=0)
        if chosen[1]:
            raise RunRefused(f"checkpoint error: {chosen[1]}")
        source = handoff.find_source(self.cfg, self.world, chosen[0])
        if source is None:
            return None
        self.log(f"starting from {source.path} ({'resume' if source.resuming else 'handoff/load'}, {source.how})")
        error = None
        if source.how == "universal" and self.rank == 0:
            try:
                universal.to_universal(source.path, log=self.log)
            except (RuntimeError, OSError) as err:
                error = str(err)
        shared = [error]
        dist.broadcast_object_list(shared, src=0)  # every rank fails together instead of hanging
        if shared[0]:
            raise RuntimeError(shared[0])
        if source.how in ("weights", "pretrained"):
            fresh = handoff.load_source_weights(self.model, source, self.cfg)
            if fresh:
                self.log(f"kept the fresh initialisation of {len(fresh)} tensors: {', '.join(fresh[:4])}")
        return source

    def resume(self) -> None:
        if self.source is None:
            return
        state = checkpoint.load(self.engine, self.cfg, self.source,
                                fingerprint=lambda n: self.task.order_fingerprint(self.batches, n))
        p = self.progress
        if "step" in state:  # a model folder (how == "pretrained") starts at step 0
            # The step (and with it the LR schedule) continues across a handoff; the data position only
            # as checkpoint.load_data_state says.
            continues = self.source.resuming or self.cfg.curriculum.run_phase is not None
            if continues or self.source.load_data_state:
                p.step, p.consumed_samples = state["step"], state["consumed_samples"]
                p.consumed_tokens = state["consumed_tokens"]
            if self.source.load_data_state:
                data_state = state["data"]
                if self.cfg.checkpoint.allow_data_change or state.get("extended"):  # the index was rebuilt
                    data_state = {"consumed_samples": data_state["consumed_samples"]}
                if state.get("extended"):
                    self.log(f"train.steps raised to {self.cfg.train.steps}: the {p.consumed_samples} samples "
                             "already seen come in the same order; extending the run")
                self.batches.load_state_dict(data_state)
        self.log(f"loaded {state['loaded_from']} at step {p.step} ({p.consumed_samples} samples)")
        redone = drop_metrics_after(self.cfg.output_dir, p.step) if self.rank == 0 else []
        if redone:
            self.log(f"metrics.jsonl: removed the records of steps {redone[0]}-{redone[-1]}, which this launch "
                     "trains again")
        self.bounds, extension = run_bounds(self.cfg, recorded_bounds(state), p.step)
        if extension:
            old_steps = recorded_bounds(state)[-1][2]
            before = learning_rate(p.step - 1, replace(self.cfg, train=replace(self.cfg.train, steps=old_steps)))
            self.log(f"{extension}, at learning rate {learning_rate(p.step, self.cfg):.3g} from step {p.step} "
                     f"(the schedule over {self.cfg.train.steps} steps; step {p.step - 1} trained at {before:.3g})")

    def steps_of_this_launch(self) -> tuple[int, int]:
        if self.cfg.curriculum.run_phase is None:
            return self.progress.step, self.cfg.train.steps
        for phase, start, end in self.bounds:
            if phase.name == self.cfg.curriculum.run_phase:
                if self.progress.step < start:
                    raise RunRefused(f"phase {phase.name!r} starts at step {start}, but this run is at step "
                                     f"{self.progress.step}: run the earlier phases first")
                return self.progress.step, end
        raise AssertionError("validated config names an unknown phase")

    def phase_at(self, step: int) -> PhaseConfig | None:
        for phase, start, end in self.bounds:
            if start <= step < end:
                return phase
        return None

    def apply_phase(self, step: int) -> None:
        phase = self.phase_at(step)
        if phase is None or phase.name == self.progress.phase:
            return
        gradient = "unrolled_damped" if phase.kind == "unrolled" else self.cfg.implicit.gradient
        self.engine.module.core.set_phase(max_iter=phase.max_iter, tol=phase.tol, phantom_steps=phase.phantom_steps,
                                          gradient=gradient)
        self.progress.phase = phase.name
        shape = f"{phase.max_iter} unrolled damped passes" if phase.kind == "unrolled" else \
            f"({phase.max_iter}+{phase.phantom_steps}), tol {phase.tol}"
        self.log(f"phase {phase.name}: {shape}")

    # ---------------------------------------------------------------- loop

    def fit(self) -> None:
        stopping.check()  # the last point of the start-up: from here a SIGTERM saves a checkpoint
        signal.signal(signal.SIGTERM, self._on_sigterm)
        out = Path(self.cfg.output_dir)
        if self.rank == 0:  # a stop asked of an earlier launch is not one asked of this one
            for name in (STOP_FILE, PREEMPTED_FILE):
                (out / name).unlink(missing_ok=True)
        self.resume()
        start, end = self.steps_of_this_launch()
        t = self.cfg.train
        status = "FINISHED"
        if start >= end:
            last = [r for r in read_metrics(out) if "val/loss" in r]
            final = f"; the last one, at step {last[-1]['step']}: {validation_text(last[-1])}" if last else ""
            self.log(f"already complete: step {start} of {end} (train.steps); nothing to train{final}")
            self.tracker.finish(status)
            return
        try:
            self.interval.reset()
            for step in range(start, end):
                self.apply_phase(step)
                self.train_step(step)
                p = self.progress
                if p.step % t.log_interval == 0 or p.step == end or self.stop_agreed:
                    self.report(self.interval_metrics())
                if self.stop_agreed:  # preemption: save at once, skip evaluation (grace periods are short)
                    tag = None if p.nonfinite_steps else self.save()
                    if self.rank == 0:  # tells launch/pretrain.sh the stop was graceful (it exits 0)
                        (out / STOP_FILE).unlink(missing_ok=True)
                        (out / PREEMPTED_FILE).write_text(json.dumps({"step": p.step, "checkpoint": tag}) + "\n")
                    self.log(f"stopped by SIGTERM after step {p.step}")
                    status = "KILLED"
                    return
                if p.nonfinite_steps:
                    self._nonfinite_step()
                    if p.step < end:
                        continue  # no evaluation and no checkpoint at a diverged step
                    self.save()  # the last step: the weights are those of the last finite update
                    break
                if p.step % t.eval_interval == 0 or p.step == end:
                    self.report(self.evaluate())
                phase_ends = self.phase_at(p.step) is not self.phase_at(p.step - 1)
                due = p.step % self.cfg.checkpoint.interval == 0 or p.step == end or phase_ends
                if due:
                    loss = self._read_losses()
                    if not self._loss_jumped(loss):
                        self.save()
                    self.recent_losses.append(loss)
            self.summary()
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.tracker.finish(status)

    def train_step(self, step: int) -> None:
        """One optimizer step over `accum` micro-batches. The host reads one pair of flags (finite,
        stop) per step; what the step reports stays on the device until the log interval ends."""
        lr = learning_rate(step, self.cfg)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        losses, correct, residual, converged, passes, phantom = [], [], [], [], 0, 0
        grad_norm = None
        for _ in range(self.accum):
            inputs, labels = (t.to(self.engine.device) for t in self.task.inputs_and_targets(next(self.batches)))
            if self.task.reports_accuracy:
                logits = self.forward(inputs)
                loss = lm_loss(logits, labels)
                correct.append(self.accuracy(logits, labels))
            else:
                loss = self.forward(inputs, labels)
            if step + 1 == self.nan_loss_at_step:  # fault injection for the tests
                loss = loss * float("nan")
            self.engine.backward(loss)
            losses.append(loss.detach().float())
            if self.engine.is_gradient_accumulation_boundary():
                grad_norm = self._grad_norm()
                finite, self.stop_agreed = step_flags(losses, grad_norm, self._stop_asked(), self.engine.device)
                if not finite:
                    self._drop_gradients()
            self.engine.step()
            stats = self.engine.module.core.last_stats
            if stats is not None:
                passes, phantom = passes + stats.passes, phantom + stats.phantom_passes
                residual.append(stats.residual.detach().float().max())
                converged.append(stats.converged.float().mean())
        p = self.progress
        p.step += 1
        p.consumed_samples += self.cfg.train.global_batch_size
        p.consumed_tokens += self.cfg.train.global_batch_size * self.cfg.data.seq_len
        p.nonfinite_steps = 0 if finite else p.nonfinite_steps + 1
        p.skipped_steps += 0 if finite else 1
        if not finite:
            return
        if grad_norm is None:
            grad_norm = self.engine.get_global_grad_norm()
        if p.step == self.loss_jump_at_step:  # fault injection for the tests: a reported jump only
            losses = [loss * 1000.0 for loss in losses]
        self.unread_losses.append(torch.stack(losses).mean())
        self.interval.add_step(losses, correct, residual, converged, passes, grad_norm,
                               self._step_flops(passes, phantom))

    def _step_flops(self, passes: int, phantom: int) -> float:
        """FLOPs per device of a step with these passes (summed over its micro-batches)."""
        if not self.peak_flops:
            return 0.0
        solver, with_grad = (passes / self.accum, phantom / self.accum) if self.engine.module.core.implicit \
            else (0, 1)
        tokens = self.cfg.train.global_batch_size * self.cfg.data.seq_len / self.world
        return step_flops(self.cfg, self.backbone_params, tokens, self.cfg.data.seq_len, solver, with_grad)

    def interval_metrics(self) -> dict[str, float]:
        metrics = self.interval.read(self.cfg.train.global_batch_size * self.cfg.data.seq_len, self.peak_flops)
        if not metrics:
            return {}
        metrics.update({"train/lr": learning_rate(self.progress.step - 1, self.cfg),
                        "train/consumed_samples": self.progress.consumed_samples})
        if torch.cuda.is_available():
            metrics["memory/max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return metrics

    def _read_losses(self) -> float:
        """The losses of the steps since the last read, into recent_losses but for the last, which
        is returned (the loss-jump guard compares it with the ones before)."""
        (values,) = read_on_host(self.unread_losses)
        self.unread_losses = []
        self.recent_losses.extend(values[:-1])
        return values[-1]

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or with labels the mean loss (computed without the whole batch's logits)."""
        kwargs = {} if labels is None else {"labels": labels}
        if self.eod_id is not None:
            kwargs["seq_idx"] = seq_idx_from_eod(inputs, self.eod_id)
        return self.engine(inputs, **kwargs)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Every evaluation set of the task: loss (and perplexity or accuracy) and, for an implicit
        model, the solver's passes per forward, mean final residual and share of samples converged
        (the paper's Table 7; a capped, unconverged evaluation shows here)."""
        self.engine.eval()
        results = {}
        for name, batches in self.task.eval_sets(self.rank, self.world).items():
            loss_sum, correct, tokens, passes, forwards, residual, converged, samples = [0.0] * 8
            by_group = torch.zeros(2, self.task.groups, device=self.engine.device)  # catbAbI: per task
            for batch in batches:  # sums over tokens, so that ranks with smaller batches weigh less
                inputs, labels = (t.to(self.engine.device) for t in self.task.inputs_and_targets(batch))
                valid = labels != IGNORE_INDEX  # padding that keeps the ranks' forwards in step
                count = valid.sum().item()
                if self.task.reports_accuracy:
                    logits = self.forward(inputs)
                    if count:
                        loss_sum += lm_loss(logits, labels).item() * count
                        correct += self.accuracy(logits, labels).item() * count
                    if self.task.groups:
                        by_group += group_hits(logits, labels, self.task.accuracy_groups(batch).to(labels.device),
                                               self.cfg.model.vocab_size, self.task.groups)
                else:
                    loss = self.forward(inputs, labels)
                    loss_sum += loss.item() * count if count else 0.0
                tokens += count
                stats = self.engine.module.core.last_stats
                passes, forwards = passes + (stats.passes if stats is not None else 1), forwards + 1
                if stats is not None:
                    real = valid.flatten(1).any(1)
                    residual += (stats.residual.float() * real).sum().item()
                    converged += (stats.converged & real).sum().item()
                    samples += real.sum().item()
            loss_sum, correct, tokens, passes, forwards, residual, converged, samples = reduce_over_ranks(
                [loss_sum, correct, tokens, passes, forwards, residual, converged, samples], self.engine.device)
            if not tokens:
                continue
            loss = loss_sum / tokens
            results.update({f"{name}/loss": loss, f"{name}/solver_iterations": passes / forwards})
            if samples:
                results.update({f"{name}/solver_residual": residual / samples,
                                f"{name}/converged_frac": converged / samples})
            if self.task.reports_accuracy:
                results[f"{name}/accuracy"] = correct / tokens
            else:
                results[f"{name}/ppl"] = math.exp(min(loss, 50.0))
            if self.task.groups:
                results.update(self.task.group_metrics(name, reduce_over_ranks(by_group.flatten().tolist(),
                                                                                self.engine.device)))
        self.engine.train()
        self.last_eval, self.last_eval_step = results, self.progress.step
        return results

    def accuracy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The share of positions whose most likely class (among the real vocabulary) is the label
        (positions labelled IGNORE_INDEX not counted)."""
        valid = labels != IGNORE_INDEX
        hits = (logits[..., : self.cfg.model.vocab_size].argmax(-1) == labels) & valid
        return hits.sum() / valid.sum().clamp_min(1)

    # ---------------------------------------------------------------- outputs

    def _loss_jumped(self, loss: float) -> bool:
        """Whether any rank's loss exceeds checkpoint.max_loss_jump x the mean of its last 20 and that
        mean by MIN_LOSS_JUMP nats (agreed over the ranks: a save is collective); such a step gets no
        checkpoint, with a warning. The floor matters near zero: a solved word problem's loss moves
        from 0.005 to 0.05 without diverging, and the ratio alone once cost a run its final checkpoint."""
        factor = self.cfg.checkpoint.max_loss_jump
        mean = sum(self.recent_losses) / len(self.recent_losses) if self.recent_losses else None
        jumped = bool(factor and mean is not None and loss > factor * mean and loss > mean + MIN_LOSS_JUMP)
        (flag,) = reduce_over_ranks([1.0 if jumped else 0.0], self.engine.device, dist.ReduceOp.MAX)
        if flag:
            self.log(f"warning: no checkpoint at step {self.progress.step}: the loss jumped beyond "
                     f"checkpoint.max_loss_jump={factor} x its recent mean; the previous checkpoint stays the latest")
        return bool(flag)

    def _nonfinite_step(self) -> None:
        p, t = self.progress, self.cfg.train
        self.log(f"step {p.step}: non-finite loss ({p.nonfinite_steps} in a row); its update is skipped")
        self.tracker.log({"train/nonfinite_steps": p.nonfinite_steps}, p.step)
        if p.nonfinite_steps >= t.max_nonfinite_in_row:
            tag = layout.read_latest(layout.checkpoint_dir(self.cfg))
            last = (f"the last checkpoint before them, {layout.checkpoint_dir(self.cfg) / tag}, is intact"
                    if tag else "there is no checkpoint of this run yet")
            raise RuntimeError(f"{p.nonfinite_steps} non-finite losses in a row (train.max_nonfinite_in_row); "
                               f"{last}")

    def summary(self) -> None:
        p = self.progress
        measure = f": {validation_text(self.last_eval)}" if "val/loss" in self.last_eval else ""
        skipped = (f"; {p.skipped_steps} steps skipped with non-finite losses (their updates not applied)"
                   if p.skipped_steps else "")
        self.log(f"done at step {p.step}{measure}{skipped}; checkpoints in {layout.checkpoint_dir(self.cfg)}")

    def report(self, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        keys = [k for k in metrics if k in ("train/loss", "train/grad_norm", "train/accuracy", "solver/iterations",
                                            "solver/residual", "solver/converged_frac")]
        reduced = dict(zip(keys, mean_over_ranks([metrics[k] for k in keys], self.engine.device)))
        if "solver/residual" in metrics:  # the worst rank's residual, not the mean
            (reduced["solver/residual"],) = reduce_over_ranks([metrics["solver/residual"]], self.engine.device,
                                                              dist.ReduceOp.MAX)
        metrics = {**metrics, **reduced}
        self._watch_convergence(metrics)
        if "train/loss" in metrics:
            warning = self.divergence.observe(metrics["train/loss"], self.progress.step)
            if warning:
                self.log(warning)
        self.tracker.log(metrics, self.progress.step)
        if self.rank == 0:  # a plain record next to the checkpoints, for scripts and tests
            append_metrics(self.cfg.output_dir, self.progress.step, metrics)
        shown = "  ".join(f"{k.split('/')[-1]} {v:.4g}" for k, v in metrics.items())
        self.log(f"step {self.progress.step}/{self.cfg.train.steps}  {shown}")

    def save(self) -> str:
        p = self.progress
        tag = f"{p.phase}-step{p.step}" if p.phase else f"step{p.step}"
        client = {"step": p.step, "consumed_samples": p.consumed_samples, "consumed_tokens": p.consumed_tokens,
                  "phase": p.phase, "phase_bounds": trained_bounds(self.bounds), "data": self.batches.state_dict(),
                  "data_fingerprint": self.task.order_fingerprint(self.batches, p.consumed_samples)}
        val_loss = self.last_eval.get("val/loss") if self.last_eval_step == p.step else None
        path = checkpoint.save(self.engine, self.cfg, tag, client, val_loss)
        self.log(f"saved {path}")
        return tag

    def _watch_convergence(self, metrics: dict[str, float]) -> None:
        """A warning when, in a phase with a tolerance, no solve has converged for
        train.warn_unconverged_intervals log intervals in a row (every pass at its cap)."""
        p, limit = self.progress, self.cfg.train.warn_unconverged_intervals
        settings = self.engine.module.core.settings
        if "solver/converged_frac" not in metrics or settings is None or settings.tol is None:
            return
        p.unconverged_intervals = p.unconverged_intervals + 1 if metrics["solver/converged_frac"] == 0 else 0
        if limit and p.unconverged_intervals == limit:
            self.log(f"warning: no solve has converged to tol {settings.tol} in {limit} log intervals in a row "
                     f"(step {p.step}; every solve stops at max_iter {settings.max_iter}): the fixed point is not "
                     "being found; see README, How an implicit model is evaluated")

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[train] {message}", flush=True)

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

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_requested = True

    def _stop_asked(self) -> bool:
        """Whether this rank was asked to stop: by SIGTERM, or (rank 0) by launch/pretrain.sh, which
        writes STOP_FILE when it receives one itself. `step_flags` agrees on it over the ranks (a
        checkpoint needs them all)."""
        if self.rank == 0 and (Path(self.cfg.output_dir) / STOP_FILE).exists():
            self.stop_requested = True
        return self.stop_requested
