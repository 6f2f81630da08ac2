"""No checkpoint at a step whose loss jumped (checkpoint.max_loss_jump): a loss more than `factor` x
the mean of the 20 finite steps before it, and that mean plus MIN_LOSS_JUMP nats, on any rank
(agreed: a save is collective); a warning says so. The floor matters near zero: a solved word
problem's loss moves from 0.005 to 0.05 without diverging, and the ratio alone once cost a run its
final checkpoint. Step losses stay on the device until a checkpoint is due; the window goes with
each checkpoint, so a resumed launch judges its first checkpoint against the steps before it."""

from __future__ import annotations

import collections

import torch
import torch.distributed as dist

from implicit_megatron.train.callbacks import Callback, StepControl, StepEnd
from implicit_megatron.train.step_metrics import read_on_host, reduce_over_ranks

MIN_LOSS_JUMP = 0.5  # nats: a smaller rise is no jump, whatever the ratio
WINDOW = 20


class LossJumpGuard(Callback):
    priority = 60

    def __init__(self, factor: float | None, log, device: torch.device) -> None:
        self.factor, self.log, self.device = factor, log, device
        self.recent: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.unread: list[torch.Tensor] = []

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        if end.finite:  # a NaN would make every later mean NaN
            self.unread.append(torch.stack(end.losses).mean().detach())

    def allows_save(self, step: int) -> bool:
        """Whether the latest step may be checkpointed (every rank gets the same answer)."""
        values = self._read()
        loss = values[-1] if values else float("nan")
        self.recent.extend(values[:-1])
        jumped = self.jumped(loss)
        if jumped:
            self.log(f"warning: no checkpoint at step {step}: the loss jumped beyond checkpoint.max_loss_jump="
                     f"{self.factor} x its recent mean; the previous checkpoint stays the latest")
        self.recent.append(loss)
        return not jumped

    def jumped(self, loss: float) -> bool:
        """Whether `loss` jumped against the recent losses on any rank."""
        mean = sum(self.recent) / len(self.recent) if self.recent else None
        jump = bool(self.factor and mean is not None and loss > self.factor * mean and loss > mean + MIN_LOSS_JUMP)
        (flag,) = reduce_over_ranks([1.0 if jump else 0.0], self.device, dist.ReduceOp.MAX)
        return bool(flag)

    def _read(self) -> list[float]:
        (values,) = read_on_host(self.unread)
        self.unread = []
        return values

    def state_dict(self) -> dict:
        return {"loss_jump_window": [v for v in self.recent if v == v]}  # no NaN (a save reads `unread` first)

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        saved = state.get("loss_jump_window")
        if same_run and isinstance(saved, list):
            self.recent.extend(float(v) for v in saved)
