"""One optimizer step over its micro-batches: the learning rate, forward, backward, the step's one
host read (finite, stop: step_metrics.step_flags), the update (dropped where not finite), and what
the step measures (losses, accuracy, the solver's statistics, FLOPs), kept on the device in
IntervalMetrics until the log interval ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from implicit_megatron.config import Config
from implicit_megatron.models.lm import seq_idx_from_eod
from implicit_megatron.train.callbacks.timers import StepTimers
from implicit_megatron.train.flops import step_flops
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.train.step_metrics import IntervalMetrics, step_flags
from implicit_megatron.train.validation import accuracy, lm_loss


@dataclass
class StepResult:
    finite: bool  # the step's losses and gradient norm, on every rank (else its update was dropped)
    stop_agreed: bool  # some rank was asked to stop: every rank stops after this step
    losses: list[torch.Tensor]  # each micro-batch's, on the device


class TrainStep:
    def __init__(self, cfg: Config, engine, model, task, timers: StepTimers, interval: IntervalMetrics, hooks,
                 eod_id: int | None, peak_flops: float | None, backbone_params: int, world: int) -> None:
        self.cfg, self.engine, self.model, self.task, self.timers = cfg, engine, model, task, timers
        self.interval, self.hooks, self.eod_id = interval, hooks, eod_id
        self.peak_flops, self.backbone_params, self.world = peak_flops, backbone_params, world
        self.accum = engine.gradient_accumulation_steps()

    def run(self, step: int, batches, stop_asked: Callable[[], bool]) -> StepResult:
        """Step `step` (from 0) over `accum` micro-batches of `batches`; `stop_asked` is read once, at
        the accumulation boundary, and agreed over the ranks with the finite flag."""
        lr = learning_rate(step, self.cfg)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        losses, correct, residual, converged, passes, phantom = [], [], [], [], 0, 0
        grad_norm, finite, stop = None, True, False
        timed = self.timers.section
        for _ in range(self.accum):
            with timed("data"):
                inputs, labels = (t.to(self.engine.device) for t in self.task.inputs_and_targets(next(batches)))
            with timed("forward"):
                if self.task.reports_accuracy:
                    logits = self.forward(inputs)
                    loss = lm_loss(logits, labels)
                    correct.append(accuracy(logits, labels, self.cfg.model.vocab_size))
                else:
                    loss = self.forward(inputs, labels)
            loss = self.hooks.loss(step + 1, loss)
            with timed("backward"):
                self.engine.backward(loss)
            losses.append(loss.detach().float())
            if self.engine.is_gradient_accumulation_boundary():
                grad_norm = self._grad_norm()
                finite, stop = step_flags(losses, grad_norm, stop_asked(), self.engine.device)
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
        if finite:
            losses = self.hooks.step_losses(step + 1, losses)
            self.interval.add_step(losses, correct, residual, converged, passes,
                                   self.engine.get_global_grad_norm() if grad_norm is None else grad_norm,
                                   self._step_flops(passes, phantom))
        return StepResult(finite, stop, losses)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or with labels the mean loss (computed without the whole batch's logits)."""
        kwargs = {} if labels is None else {"labels": labels}
        if self.eod_id is not None:
            kwargs["seq_idx"] = seq_idx_from_eod(inputs, self.eod_id)
        return self.engine(inputs, **kwargs)

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
