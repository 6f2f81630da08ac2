"""The loop's concerns through their hooks (train/callbacks/): the order a step's end runs them in,
what each decides, and what stops the rest. A stand-in trainer holds what the callbacks ask of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from implicit_megatron.errors import RunStopped
from implicit_megatron.train.callbacks import Callback, Hooks
from implicit_megatron.train.callbacks.checkpointing import CheckpointCallback
from implicit_megatron.train.callbacks.loss_jump import LossJumpCallback
from implicit_megatron.train.callbacks.nonfinite import NonFiniteCallback
from implicit_megatron.train.callbacks.validation import ValidationCallback
from implicit_megatron.train.guards import LossJumpGuard
from implicit_megatron.train.loop import Progress
from implicit_megatron.train.train_step import StepResult


def trainer(tmp_path, step: int, last: int = 10, nonfinite: int = 0, **train) -> SimpleNamespace:
    saved, logged = [], []
    cfg = SimpleNamespace(train=SimpleNamespace(eval_interval=4, max_nonfinite_in_row=3, **train),
                          checkpoint=SimpleNamespace(interval=5), output_dir=str(tmp_path))
    t = SimpleNamespace(cfg=cfg, progress=Progress(step=step, nonfinite_steps=nonfinite), last_step=last,
                        saved=saved, logged=logged, validated=[], engine=SimpleNamespace(device=torch.device("cpu")),
                        phases=SimpleNamespace(ends_after=lambda s: s == 7), log=logged.append,
                        reporter=SimpleNamespace(tracker=SimpleNamespace(log=lambda m, s: logged.append(m)),
                                                 validation=lambda r, s: None))
    t.save = lambda: saved.append(t.progress.step) or "tag"
    t.evaluate = lambda: t.validated.append(t.progress.step) or {}
    return t


FINITE = StepResult(finite=True, stop_agreed=False, losses=[torch.tensor(2.0)])
NOT_FINITE = StepResult(finite=False, stop_agreed=False, losses=[torch.tensor(float("nan"))])


def cadences(t, *extra: Callback) -> Hooks:
    hooks = Hooks([*extra, NonFiniteCallback(), ValidationCallback(), CheckpointCallback()])
    t.hooks = hooks
    return hooks


@pytest.mark.parametrize("step,validated,saved", [(3, [], []), (4, [4], []), (5, [], [5]), (7, [], [7]),
                                                  (10, [10], [10]), (20, [20], [20])])
def test_validation_and_checkpoints_come_at_their_cadence_and_at_the_end(tmp_path, step, validated, saved):
    t = trainer(tmp_path, step, last=10 if step <= 10 else 20)
    control = cadences(t).step_end(t, FINITE)
    assert (t.validated, t.saved, control.ended) == (validated, saved, False)


def test_a_nonfinite_step_is_neither_validated_nor_saved_unless_it_is_the_last(tmp_path):
    t = trainer(tmp_path, step=10, last=20, nonfinite=1)
    control = cadences(t).step_end(t, NOT_FINITE)
    assert control.skip_rest and not t.validated and not t.saved
    assert t.logged[0] == "step 10: non-finite loss (1 in a row); its update is skipped"
    last = trainer(tmp_path, step=20, last=20, nonfinite=2)
    control = cadences(last).step_end(last, NOT_FINITE)
    assert last.saved == [20] and not last.validated and control.ended and control.completed
    with pytest.raises(RunStopped, match="3 non-finite losses in a row"):
        too_many = trainer(tmp_path, step=12, last=20, nonfinite=3)
        cadences(too_many).step_end(too_many, NOT_FINITE)


def test_a_callback_may_hold_back_a_due_checkpoint(tmp_path):
    class Veto(Callback):
        def allows_save(self, trainer, step):
            return False

    t = trainer(tmp_path, step=5)
    cadences(t, Veto()).step_end(t, FINITE)
    assert t.saved == []


def test_the_loss_jump_guard_sees_finite_steps_only_and_vetoes_a_jump(one_rank, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo")  # the veto is agreed over the ranks
    guard = LossJumpCallback(LossJumpGuard(factor=2.0, log=lambda m: None))
    t = trainer(tmp_path, step=5)
    hooks = cadences(t, guard)
    for _ in range(5):
        guard.on_step_end(t, FINITE, None)
    guard.on_step_end(t, NOT_FINITE, None)  # not counted: a NaN would make every later mean NaN
    guard.on_step_end(t, StepResult(True, False, [torch.tensor(9.0)]), None)
    assert not hooks.allow_save(t, 5)
    guard.on_step_end(t, FINITE, None)
    assert hooks.allow_save(t, 5)


def test_hooks_run_in_order_and_every_one_is_asked_to_stop_or_to_allow():
    asked = []

    class Asking(Callback):
        def __init__(self, name, answer):
            self.name, self.answer = name, answer

        def stop_asked(self, trainer):
            asked.append(self.name)
            return self.answer

        def allows_save(self, trainer, step):
            asked.append(self.name)
            return not self.answer

    hooks = Hooks([Asking("a", True), Asking("b", False)])
    assert hooks.stop_asked(None) and asked == ["a", "b"]  # every one reads its flag (a stop file, a deadline)
    assert not hooks.allow_save(None, 1) and asked == ["a", "b", "a", "b"]  # a collective on every rank
