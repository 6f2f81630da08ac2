"""The loop's concerns through their hooks (train/callbacks/): what each decides at a step's end,
that a held-back action is not taken whoever wanted it, that the Hooks carry the decisions out in
one order (report, validate, save), and that the order callbacks run in is their priority, not the
order they were registered in. Stand-in actions record what the trainer was asked to do."""

from __future__ import annotations

import random

import pytest
import torch

from implicit_megatron.errors import RunStopped
from implicit_megatron.run_control import StopSignals
from implicit_megatron.train.callbacks import Callback, Hooks, StepControl, StepEnd
from implicit_megatron.train.callbacks.checkpointing import CheckpointCadence
from implicit_megatron.train.callbacks.loss_jump import LossJumpGuard
from implicit_megatron.train.callbacks.nonfinite import NonFinite
from implicit_megatron.train.callbacks.preemption import Preemption
from implicit_megatron.train.callbacks.validation import ValidationCadence


class Actions:
    """The trainer's side: what it was asked to do, in order."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []
        self.step = 0

    def report(self, step: int) -> dict[str, float]:
        self.done.append(("report", step))
        return {"train/loss": 2.0}

    def evaluate(self) -> dict[str, float]:
        self.done.append(("validate", self.step))
        return {"val/loss": 1.0}

    def save(self) -> str:
        self.done.append(("save", self.step))
        return f"step{self.step}"

    def of(self, what: str) -> list[int]:
        return [step for action, step in self.done if action == what]


def step_end(step: int, last: int = 10, finite: bool = True, in_row: int = 0, stop: bool = False) -> StepEnd:
    return StepEnd(step=step, last_step=last, finite=finite, stop_agreed=stop,
                   losses=[torch.tensor(2.0 if finite else float("nan"))], nonfinite_in_row=in_row)


def cadences(tmp_path, *extra: Callback, logged: list | None = None) -> Hooks:
    said = logged if logged is not None else []
    return Hooks([*extra, NonFinite(3, tmp_path / "checkpoints", said.append, lambda metrics, step: None),
                  ValidationCadence(4), CheckpointCadence(5, ends_phase=lambda step: step == 7)])


def end_step(hooks: Hooks, end: StepEnd) -> tuple[StepControl, Actions]:
    actions = Actions()
    actions.step = end.step
    return hooks.step_end(end, actions), actions


@pytest.mark.parametrize("step,validated,saved", [(3, [], []), (4, [4], []), (5, [], [5]), (7, [], [7]),
                                                  (10, [10], [10]), (20, [20], [20])])
def test_validation_and_checkpoints_come_at_their_cadence_and_at_the_end(tmp_path, step, validated, saved):
    control, actions = end_step(cadences(tmp_path), step_end(step, last=10 if step <= 10 else 20))
    assert (actions.of("validate"), actions.of("save"), control.ending) == (validated, saved, None)


def test_a_nonfinite_step_is_neither_validated_nor_saved_unless_it_is_the_last(tmp_path):
    logged: list[str] = []
    control, actions = end_step(cadences(tmp_path, logged=logged), step_end(10, last=20, finite=False, in_row=1))
    assert set(control.held) == {"validate", "save"} and not actions.of("validate") and not actions.of("save")
    assert logged[0] == "step 10: non-finite loss (1 in a row); its update is skipped"
    control, actions = end_step(cadences(tmp_path), step_end(20, last=20, finite=False, in_row=2))
    assert actions.of("save") == [20] and not actions.of("validate") and control.ending == ("FINISHED", True, None)
    with pytest.raises(RunStopped, match="3 non-finite losses in a row"):
        end_step(cadences(tmp_path), step_end(12, last=20, finite=False, in_row=3))


def test_a_validation_held_back_is_owed_and_comes_after_the_next_step_in_this_launch_or_the_next(tmp_path):
    validation = ValidationCadence(4)
    hooks = Hooks([NonFinite(3, tmp_path / "checkpoints", lambda m: None, lambda metrics, step: None), validation])
    end_step(hooks, step_end(8, last=20, finite=False, in_row=1))
    assert validation.state_dict() == {"validation_owed": True}
    _, actions = end_step(hooks, step_end(9, last=20))
    assert actions.of("validate") == [9] and validation.state_dict() == {"validation_owed": False}
    resumed = ValidationCadence(4)
    resumed.resume({"validation_owed": True}, 8, same_run=True)
    _, actions = end_step(Hooks([resumed]), step_end(9, last=20))
    assert actions.of("validate") == [9]
    handed_off = ValidationCadence(4)
    handed_off.resume({"validation_owed": True}, 8, same_run=False)  # another phase's owes this one nothing
    assert not end_step(Hooks([handed_off]), step_end(9, last=20))[1].of("validate")


def test_a_graceful_stop_saves_without_validating_and_ends_the_launch(tmp_path):
    stop = Preemption(StopSignals({}), tmp_path, rank=1)
    control, actions = end_step(cadences(tmp_path, stop), step_end(8, last=20, stop=True))
    assert actions.done == [("save", 8)] and control.saved == "step8"
    assert control.ending == ("KILLED", False, "another rank's stop request")


def test_a_callback_may_hold_back_a_due_checkpoint(tmp_path):
    class Veto(Callback):
        def allows_save(self, step):
            return False

    _, actions = end_step(cadences(tmp_path, Veto()), step_end(5))
    assert actions.of("save") == []


def test_the_loss_jump_guard_sees_finite_steps_only_and_vetoes_a_jump(one_rank, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo")  # the veto is agreed over the ranks
    guard = LossJumpGuard(factor=2.0, log=lambda m: None, device=torch.device("cpu"))
    hooks = cadences(tmp_path, guard)
    for step in range(1, 6):
        guard.on_step_end(step_end(step), StepControl())
    guard.on_step_end(step_end(6, finite=False, in_row=1), StepControl())  # not counted: a NaN would poison the mean
    guard.on_step_end(StepEnd(7, 10, True, False, [torch.tensor(9.0)], 0), StepControl())
    assert not hooks.allow_save(5)
    guard.on_step_end(step_end(8), StepControl())
    assert hooks.allow_save(5)


def test_the_loss_jump_window_goes_with_the_checkpoint_to_a_resume_of_the_same_run(one_rank, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    guard = LossJumpGuard(factor=2.0, log=lambda m: None, device=torch.device("cpu"))
    for step in range(1, 21):
        guard.on_step_end(step_end(step), StepControl())
    assert guard.allows_save(20)
    state = guard.state_dict()
    assert state == {"loss_jump_window": [2.0] * 20}
    resumed = LossJumpGuard(factor=2.0, log=lambda m: None, device=torch.device("cpu"))
    resumed.resume(state, 20, same_run=True)
    resumed.on_step_end(StepEnd(21, 40, True, False, [torch.tensor(9.0)], 0), StepControl())
    assert not resumed.allows_save(21)  # judged against the steps before the resume
    fresh = LossJumpGuard(factor=2.0, log=lambda m: None, device=torch.device("cpu"))
    fresh.resume(state, 20, same_run=False)  # a handoff: the next phase's losses are its own
    fresh.on_step_end(StepEnd(21, 40, True, False, [torch.tensor(9.0)], 0), StepControl())
    assert fresh.allows_save(21)


def test_every_one_is_asked_to_stop_or_to_allow():
    asked = []

    class Asking(Callback):
        def __init__(self, name, answer):
            self.name, self.answer = name, answer

        def stop_asked(self):
            asked.append(self.name)
            return self.answer

        def allows_save(self, step):
            asked.append(self.name)
            return not self.answer

    hooks = Hooks([Asking("a", True), Asking("b", False)])
    assert hooks.stop_asked() and asked == ["a", "b"]  # every one reads its flag (a stop request, a deadline)
    assert not hooks.allow_save(1) and asked == ["a", "b", "a", "b"]  # a collective on every rank


def test_callbacks_run_in_the_order_of_their_priorities_whatever_the_order_given():
    class Named(Callback):
        def __init__(self, name: str, priority: int) -> None:
            self.name, self.priority = name, priority

    given = [Named(name, priority) for name, priority in (("a", 10), ("b", 90), ("c", 50), ("d", 0))]
    for seed in range(5):
        shuffled = list(given)
        random.Random(seed).shuffle(shuffled)
        assert [c.name for c in Hooks(shuffled)] == ["b", "c", "a", "d"]


def test_a_stop_and_a_non_finite_last_step_end_the_same_way_in_any_order(tmp_path):
    """The decisions do not depend on the order: the first end by priority names the status."""
    for seed in range(4):
        parts = [Preemption(StopSignals({}), tmp_path, rank=1),
                 NonFinite(3, tmp_path / "checkpoints", lambda m: None, lambda metrics, step: None),
                 ValidationCadence(4), CheckpointCadence(5)]
        random.Random(seed).shuffle(parts)
        control, actions = end_step(Hooks(parts), step_end(20, last=20, finite=False, in_row=1, stop=True))
        assert actions.done == [("save", 20)] and control.ending[0] == "KILLED"
