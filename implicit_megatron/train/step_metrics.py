"""What training steps report, kept on the device and read by the host once per log interval.

Every `.item()` or `.tolist()` of a GPU tensor makes the host wait until the GPU has caught up, and
a host that waits cannot queue the next kernels. A training step reads one thing: whether the
step's losses (and, where the trainer checks it, the gradient norm) are finite on every rank and
whether any rank was asked to stop (`step_flags`, one all-reduce). Losses, accuracy, solver
statistics and gradient norms stay on the device until the log interval ends (`IntervalMetrics`);
the solver's own stop rule reads one number per pass in a free phase, which it needs.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.distributed as dist


def read_on_host(*groups: list[torch.Tensor]) -> list[list[float]]:
    """Many device scalars in one transfer: each .item() would wait for the GPU on its own."""
    flat = [t.reshape(()).float() for group in groups for t in group]
    values = torch.stack(flat).tolist() if flat else []
    out, start = [], 0
    for group in groups:
        out.append(values[start:start + len(group)])
        start += len(group)
    return out


def reduce_over_ranks(values: list[float], device: torch.device, op=dist.ReduceOp.SUM) -> list[float]:
    """All-reduce a few numbers; the tensor lives on the engine's device (NCCL has no CPU backend)."""
    t = torch.tensor(values, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def step_flags(losses: list[torch.Tensor], grad_norm: torch.Tensor | None, stop: bool,
               device: torch.device) -> tuple[bool, bool]:
    """(finite, stop) agreed over the ranks: every loss and the gradient norm finite on every rank;
    any rank asked to stop. The one host read of a training step."""
    values = [*losses, *([] if grad_norm is None else [grad_norm])]
    finite = torch.isfinite(torch.stack([v.detach().float().reshape(()) for v in values])).all()
    flags = torch.stack([(~finite).float(), torch.tensor(float(stop), device=finite.device)]).to(device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    nonfinite, stop_any = flags.tolist()
    return not nonfinite, bool(stop_any)


class IntervalMetrics:
    """The finite steps of one log interval: their losses, accuracies, solver statistics and
    gradient norms on the device, their passes and FLOPs counted on the host, and the wall time.
    `read()` returns the interval's means (the residual: its maximum) in one transfer and starts a
    new interval."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.losses: list[torch.Tensor] = []  # one per micro-batch
        self.correct: list[torch.Tensor] = []
        self.residual: list[torch.Tensor] = []
        self.converged: list[torch.Tensor] = []
        self.grad_norms: list[torch.Tensor] = []  # one per step that has one
        self.steps = self.micro_batches = self.passes = 0
        self.flops = 0.0
        self.started = time.perf_counter()
        self.excluded = 0.0  # seconds of validation and checkpointing within the interval

    @contextlib.contextmanager
    def paused(self):
        """Time that is not training (validation, checkpoints): left out of ms/step and tokens/s."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - start

    def add_step(self, losses: list[torch.Tensor], correct: list[torch.Tensor], residual: list[torch.Tensor],
                 converged: list[torch.Tensor], passes: int, grad_norm, flops: float) -> None:
        """One finite step: per-micro-batch tensors, the solver passes of the step, its gradient norm
        (a tensor, a float, or None where the engine reports none) and its FLOPs per device."""
        self.losses += [t.detach() for t in losses]
        self.correct += correct
        self.residual += residual
        self.converged += converged
        if grad_norm is not None:
            self.grad_norms.append(grad_norm.detach() if torch.is_tensor(grad_norm)
                                   else torch.tensor(float(grad_norm)))
        self.steps += 1
        self.micro_batches += len(losses)
        self.passes += passes
        self.flops += flops

    def read(self, tokens_per_step: int, peak_flops: float | None) -> dict[str, float]:
        """The interval's metrics (empty when it had no finite step); starts the next interval."""
        if not self.steps:
            self.reset()
            return {}
        device = self.losses[0].device
        device_norms = [t.to(device) for t in self.grad_norms]
        losses, correct, residual, converged, norms = read_on_host(self.losses, self.correct, self.residual,
                                                                   self.converged, device_norms)
        seconds = time.perf_counter() - self.started - self.excluded  # the read waited for the GPU: the work is done
        metrics = {"train/loss": sum(losses) / len(losses),
                   "train/tokens_per_s": tokens_per_step * self.steps / seconds,
                   "train/step_seconds": seconds / self.steps}
        if correct:
            metrics["train/accuracy"] = sum(correct) / len(correct)
        if norms:
            metrics["train/grad_norm"] = sum(norms) / len(norms)
        if residual:
            metrics.update({"solver/iterations": self.passes / self.micro_batches, "solver/residual": max(residual),
                            "solver/converged_frac": sum(converged) / len(converged)})
        if peak_flops:
            metrics["train/mfu"] = self.flops / seconds / peak_flops
        if any(not math.isfinite(v) for v in metrics.values()):
            metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
        self.reset()
        return metrics
