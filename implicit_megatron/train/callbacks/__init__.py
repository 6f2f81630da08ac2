"""The trainer's concerns, each a Callback at fixed points of the loop (train/loop.py names none).

One module per concern: stall.py (the stall watch's view of what the rank does), phases.py (the
curriculum's phase of each step), reporting.py (log lines, metrics.jsonl, MLflow; the run's last
line), warnings.py (a diverging loss, solves that never converge), preemption.py (a graceful stop:
signals, the launch's stop request, train.exit_after_minutes), nonfinite.py (skipped updates, the stop after
too many in a row), loss_jump.py (no checkpoint of a jumped loss), validation.py and
checkpointing.py (their cadences), timers.py (where a step's time went, `train.timers`). `Hooks`
calls them in that order. `register` adds a callback to every Trainer started afterwards in this
process: the test suite injects its faults this way (tests/support/faults/sitecustomize.py), so
nothing in the project reads fault settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from implicit_megatron.config import Config
    from implicit_megatron.models.lm import LanguageModel
    from implicit_megatron.train.checkpointer import Checkpointer
    from implicit_megatron.train.curriculum import Phases
    from implicit_megatron.train.progress import Progress
    from implicit_megatron.train.reporting import Reporter
    from implicit_megatron.train.step_metrics import IntervalMetrics
    from implicit_megatron.train.train_step import StepResult


class Trainer(Protocol):
    """What a callback sees of the trainer (train/loop.py's Trainer is one): named here so that the
    callbacks import nothing of the loop that calls them."""

    cfg: Config
    engine: Any  # DeepSpeed's engine
    model: LanguageModel
    checkpointer: Checkpointer
    progress: Progress
    phases: Phases
    reporter: Reporter
    interval: IntervalMetrics
    hooks: Hooks
    last_step: int

    def evaluate(self) -> dict[str, float]: ...

    def save(self) -> str: ...

    def interval_metrics(self) -> dict[str, float]: ...

    def log(self, message: str) -> None: ...


@dataclass
class StepControl:
    """What the callbacks decided after a step: the rest of its callbacks skipped (a non-finite
    step is neither validated nor saved), or the launch ended (`status` for MLflow; `completed`:
    the run reached its end, and says so; `reason` and `checkpoint`: what stopped it, and the
    checkpoint saved for the resume)."""

    skip_rest: bool = False
    ended: bool = False
    status: str = "FINISHED"
    completed: bool = True
    reason: str | None = None
    checkpoint: str | None = None

    def end(self, status: str, completed: bool, reason: str | None = None, checkpoint: str | None = None) -> None:
        self.ended, self.status, self.completed = True, status, completed
        self.reason, self.checkpoint = reason, checkpoint


class Callback:
    """Every hook does nothing by default; a concern overrides the ones it needs."""

    def on_start_up_done(self, cfg) -> None:
        """The start-up is over (engine built, checkpoint chosen and converted); training comes next."""

    def before_resume(self, trainer: Trainer) -> None:
        """From here a stop saves a checkpoint; the checkpoint is loaded next."""

    def on_fit_start(self, trainer: Trainer, start: int, end: int) -> None:
        """This launch trains steps start+1..end (trainer.last_step is `end`)."""

    def on_step_start(self, trainer: Trainer, step: int) -> None:
        """Step `step` + 1 begins (`step` counts from 0)."""

    def on_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss before its backward (`step` counts from 1); returns the loss to use."""
        return loss

    def stop_asked(self, trainer: Trainer) -> bool:
        """Whether this rank is asked to stop (read once per step, agreed over the ranks with its flags)."""
        return False

    def on_step_losses(self, step: int, losses: list[torch.Tensor]) -> list[torch.Tensor]:
        """A finite step's losses as reported and as the loss-jump guard sees them (after backward)."""
        return losses

    def on_step_end(self, trainer: Trainer, result: StepResult, control: StepControl) -> None:
        """The step is done (trainer.progress counts it); `control` says what comes next."""

    def on_interval(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        """A log interval's figures before they are reported: a concern adds its own to `metrics`."""

    def on_metrics(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        """A log interval's metrics, agreed over the ranks."""

    def allows_save(self, trainer: Trainer, step: int) -> bool:
        """Whether the due checkpoint of `step` may be saved (asked on every rank: it may agree)."""
        return True

    def on_activity(self, trainer: Trainer, what: str) -> None:
        """The rank does `what` from now (a validation, a checkpoint)."""

    def before_latest(self, tag: str) -> None:
        """Every rank has written checkpoint `tag`; its rename and `latest` come next."""

    def on_fit_end(self, trainer: Trainer, status: str, completed: bool) -> None:
        """The launch ends with MLflow status `status`; `completed`: its last step was trained."""


class Hooks:
    """The callbacks, called in order."""

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = callbacks

    def __iter__(self):
        return iter(self.callbacks)

    def _each(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    def start_up_done(self, cfg) -> None:
        self._each("on_start_up_done", cfg)

    def before_resume(self, trainer: Trainer) -> None:
        self._each("before_resume", trainer)

    def fit_start(self, trainer: Trainer, start: int, end: int) -> None:
        self._each("on_fit_start", trainer, start, end)

    def step_start(self, trainer: Trainer, step: int) -> None:
        self._each("on_step_start", trainer, step)

    def loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        for callback in self.callbacks:
            loss = callback.on_loss(step, loss)
        return loss

    def stop_asked(self, trainer: Trainer) -> bool:
        return any([callback.stop_asked(trainer) for callback in self.callbacks])  # every one asked

    def step_losses(self, step: int, losses: list[torch.Tensor]) -> list[torch.Tensor]:
        for callback in self.callbacks:
            losses = callback.on_step_losses(step, losses)
        return losses

    def step_end(self, trainer: Trainer, result: StepResult) -> StepControl:
        control = StepControl()
        for callback in self.callbacks:
            callback.on_step_end(trainer, result, control)
            if control.skip_rest or control.ended:
                break
        return control

    def interval(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self._each("on_interval", trainer, metrics)

    def metrics(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self._each("on_metrics", trainer, metrics, step)

    def allow_save(self, trainer: Trainer, step: int) -> bool:
        return all([callback.allows_save(trainer, step) for callback in self.callbacks])  # every one asked

    def activity(self, trainer: Trainer, what: str) -> None:
        self._each("on_activity", trainer, what)

    def latest(self, tag: str) -> None:
        self._each("before_latest", tag)

    def fit_end(self, trainer: Trainer, status: str, completed: bool) -> None:
        self._each("on_fit_end", trainer, status, completed)


_registered: list[Callback] = []


def register(callback: Callback) -> None:
    _registered.append(callback)


def registered() -> list[Callback]:
    return list(_registered)
