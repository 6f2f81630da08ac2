"""The trainer's concerns, each a Callback at fixed points of the loop (train/loop.py names none).

One module per concern, holding its logic: stall.py (the stall watch), phases.py (the curriculum's
phase of each step), preemption.py (a graceful stop), nonfinite.py (skipped updates, the stop after
too many in a row), loss_jump.py (no checkpoint of a jumped loss), reporting.py (log lines,
metrics.jsonl, MLflow; the run's last line), divergence.py and convergence.py (warnings),
validation.py and checkpointing.py (their cadences), timers.py (where a step's time went).

A callback receives each event's data, never the trainer: what it acts on is given to it when it
is made (a log function, the tracker, the core). At a step's end every callback records its
decisions in one StepControl (report, validate, save, hold back, end), whatever the order; the
Hooks then carry them out in a fixed order through the trainer's Actions (report, then validate,
then save), telling the callbacks of each. The order callbacks are called in is their `priority`
(higher first), never the order they were registered in. A callback with state gives it to each
checkpoint (`state_dict`: keys of the client state, train/run_state.py) and takes it back when a
launch starts from one (`resume`). `register` adds a callback to every Trainer started afterwards
in this process: the test suite injects its faults this way (tests/support/faults/sitecustomize.py),
so nothing in the project reads fault settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch

from implicit_megatron.train.run_state import gathered


@dataclass(frozen=True)
class StepEnd:
    """A trained step, as every rank agrees on it."""

    step: int  # counted from 1
    last_step: int  # this launch's
    finite: bool  # its losses and gradient, on every rank (else its update was dropped)
    stop_agreed: bool  # some rank was asked to stop: every rank stops after this step
    losses: list[torch.Tensor]  # each micro-batch's, on the device
    nonfinite_in_row: int  # non-finite steps in a row, this one included


@dataclass(frozen=True)
class FitEnd:
    """How the launch's training ends: `status` for MLflow; `completed`: its last step was trained."""

    status: str  # FINISHED, KILLED or FAILED
    completed: bool
    step: int
    skipped_steps: int  # non-finite steps of this launch


@dataclass
class StepControl:
    """What the callbacks decided at a step's end, whatever their order: a report, a validation and
    a save wanted or held back (a held-back action is not taken, whoever wanted it), the launch's
    end (the first callback to end it names the status); and what was saved."""

    report: bool = False
    validate: bool = False
    save: bool = False
    held: dict[str, str] = field(default_factory=dict)  # action -> why
    ending: tuple[str, bool, str | None] | None = None  # (status, completed, reason)
    saved: str | None = None  # the tag the save wrote

    def hold(self, action: str, why: str) -> None:
        self.held.setdefault(action, why)

    def end(self, status: str, completed: bool, reason: str | None = None) -> None:
        self.ending = self.ending or (status, completed, reason)

    def wants(self, action: str) -> bool:
        return bool(getattr(self, action)) and action not in self.held


class Callback:
    """Every hook does nothing by default; a concern overrides the ones it needs."""

    priority: ClassVar[int] = 0  # higher first

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this concern (keys of the client state; none by default)."""
        return {}

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        """The launch starts from a checkpoint with client state `state`, at `step`; `same_run`: a
        resume of this run's own phase (else a handoff or another run's checkpoint)."""

    def on_start_up_done(self, cfg) -> None:
        """The start-up is over (engine built, checkpoint chosen and converted); training comes next."""

    def before_resume(self) -> None:
        """From here a stop saves a checkpoint; the checkpoint is loaded next."""

    def on_fit_start(self, start: int, end: int) -> None:
        """This launch trains steps start+1..end."""

    def on_step_start(self, step: int) -> None:
        """Step `step` + 1 begins (`step` counts from 0)."""

    def on_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss before its backward (`step` counts from 1); returns the loss to use."""
        return loss

    def stop_asked(self) -> bool:
        """Whether this rank is asked to stop (read once per step, agreed over the ranks with its flags)."""
        return False

    def on_step_losses(self, step: int, losses: list[torch.Tensor]) -> list[torch.Tensor]:
        """A finite step's losses as reported and as the loss-jump guard sees them (after backward)."""
        return losses

    def on_step_end(self, end: StepEnd, control: StepControl) -> None:
        """The step is done: record what should follow it in `control`."""

    def on_interval(self, metrics: dict[str, float]) -> None:
        """A log interval's figures before they are reported: a concern adds its own to `metrics`."""

    def on_metrics(self, metrics: dict[str, float], step: int) -> None:
        """A log interval's metrics, agreed over the ranks."""

    def on_validation(self, results: dict[str, float], step: int) -> None:
        """A validation's results, reduced over the ranks."""

    def allows_save(self, step: int) -> bool:
        """Whether the due checkpoint of `step` may be saved (asked on every rank: it may agree)."""
        return True

    def on_activity(self, what: str) -> None:
        """The rank does `what` from now (a validation, a checkpoint)."""

    def before_latest(self, tag: str) -> None:
        """Every rank has written checkpoint `tag`; its rename and `latest` come next."""

    def on_fit_end(self, end: FitEnd) -> None:
        """The launch's training ends."""


class Actions(Protocol):
    """What the trainer does when the callbacks decide so (train/loop.py's Trainer)."""

    def report(self, step: int) -> dict[str, float]: ...

    def evaluate(self) -> dict[str, float]: ...

    def save(self) -> str: ...


class Hooks:
    """The callbacks, in the order of their priorities (higher first; the order given breaks ties)."""

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = sorted(callbacks, key=lambda callback: -callback.priority)

    def __iter__(self):
        return iter(self.callbacks)

    def _each(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    def state_dict(self) -> dict:
        return gathered(self.callbacks)

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        self._each("resume", state, step, same_run)

    def start_up_done(self, cfg) -> None:
        self._each("on_start_up_done", cfg)

    def before_resume(self) -> None:
        self._each("before_resume")

    def fit_start(self, start: int, end: int) -> None:
        self._each("on_fit_start", start, end)

    def step_start(self, step: int) -> None:
        self._each("on_step_start", step)

    def loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        for callback in self.callbacks:
            loss = callback.on_loss(step, loss)
        return loss

    def stop_asked(self) -> bool:
        return any([callback.stop_asked() for callback in self.callbacks])  # every one asked

    def step_losses(self, step: int, losses: list[torch.Tensor]) -> list[torch.Tensor]:
        for callback in self.callbacks:
            losses = callback.on_step_losses(step, losses)
        return losses

    def step_end(self, end: StepEnd, actions: Actions) -> StepControl:
        """Every callback's decisions, then what they decided, in this order: the log interval's
        report, the validation, the checkpoint (where every callback allows it)."""
        control = StepControl()
        self._each("on_step_end", end, control)
        if control.wants("report"):
            metrics = actions.report(end.step)
            if metrics:
                self._each("on_metrics", metrics, end.step)
        if control.wants("validate"):
            self._each("on_activity", f"the validation after step {end.step}")
            self._each("on_validation", actions.evaluate(), end.step)
        if control.wants("save") and self.allow_save(end.step):
            self._each("on_activity", f"the checkpoint of step {end.step}")
            control.saved = actions.save()
        return control

    def interval(self, metrics: dict[str, float]) -> None:
        self._each("on_interval", metrics)

    def allow_save(self, step: int) -> bool:
        return all([callback.allows_save(step) for callback in self.callbacks])  # every one asked

    def latest(self, tag: str) -> None:
        self._each("before_latest", tag)

    def fit_end(self, end: FitEnd) -> None:
        self._each("on_fit_end", end)


_registered: list[Callback] = []


def register(callback: Callback) -> None:
    _registered.append(callback)


def registered() -> list[Callback]:
    return list(_registered)
