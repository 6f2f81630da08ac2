"""The loss-jump guard: a loss several times its recent mean skips a checkpoint only when it is also
MIN_LOSS_JUMP nats above it, so a solved task's near-zero losses never cost a save. The divergence
watch: the checkpoint it names survives pruning until a later one is known good."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.processes import free_port

from implicit_megatron.checkpoints.layout import prune, read_held
from implicit_megatron.train.callbacks import StepControl, StepEnd
from implicit_megatron.train.callbacks.divergence import DivergenceWatch
from implicit_megatron.train.callbacks.loss_jump import MIN_LOSS_JUMP, LossJumpGuard


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def jumped(loss: float, recent: list[float]) -> bool:
    guard = LossJumpGuard(4.0, log=lambda message: None, device=torch.device("cpu"))
    guard.recent.extend(recent)
    return guard.jumped(loss)


def step_end(step: int, loss: float, finite: bool = True) -> StepEnd:
    return StepEnd(step=step, last_step=100, finite=finite, stop_agreed=False, losses=[torch.tensor(loss)],
                   nonfinite_in_row=0 if finite else 1)


def test_a_spike_is_a_jump_and_noise_near_zero_is_not(one_process_group):
    assert jumped(13.0, [3.0] * 20)  # a divergence: over 4x and 10 nats above
    assert not jumped(11.0, [3.0] * 20)  # under 4x
    assert not jumped(0.0457, [0.005] * 20)  # 9x, but 0.04 nats: the S3 run that lost its final checkpoint
    assert jumped(4 * 0.2 + MIN_LOSS_JUMP + 0.01, [0.2] * 20)
    assert not jumped(5.0, [])  # nothing to compare with yet


def test_a_checkpoint_is_held_back_at_a_jump_and_the_step_losses_stay_on_the_device(one_process_group):
    said = []
    guard = LossJumpGuard(4.0, log=said.append, device=torch.device("cpu"))
    for step, loss in enumerate([3.0] * 20, 1):
        guard.on_step_end(step_end(step, loss), StepControl())
    assert all(v.device.type == "cpu" and v.dim() == 0 for v in guard.unread) and len(guard.unread) == 20
    assert guard.allows_save(20) and not said
    guard.on_step_end(step_end(21, 13.0), StepControl())
    assert not guard.allows_save(21)
    assert said == ["warning: no checkpoint at step 21: the loss jumped beyond checkpoint.max_loss_jump=4.0 x "
                    "its recent mean; the previous checkpoint stays the latest"]


def test_the_checkpoint_a_divergence_names_outlives_keep_last_until_a_later_one_is_good(tmp_path):
    checkpoints = tmp_path / "checkpoints"

    def saved(step: int) -> list[str]:
        (checkpoints / f"step{step}").mkdir(parents=True)
        prune(checkpoints, keep_last=1, latest=f"step{step}")
        return sorted(p.name for p in checkpoints.iterdir() if p.is_dir())

    watch = DivergenceWatch(vocab_size=100, checkpoints=checkpoints)  # ln(100) = 4.6
    assert watch.observe(6.0, 1) is None and saved(1) == ["step1"]
    assert watch.observe(5.0, 2) is None and saved(2) == ["step2"]
    assert watch.observe(9.0, 3) is None
    warning = watch.observe(9.5, 4)
    assert f"the last checkpoint before the rise is {checkpoints / 'step2'}" in warning
    assert "step2" in read_held(checkpoints)
    assert saved(3) == ["step2", "step3"] and saved(4) == ["step2", "step4"]  # keep_last=1 would prune step2
    assert watch.observe(5.1, 5) is None and watch.observe(5.05, 6) is None  # back down: released at step 6
    assert saved(6) == ["step2", "step6"]  # saved at the release step: not yet known good
    assert saved(7) == ["step7"] and read_held(checkpoints) == {}
    assert watch.observe(9.0, 8) is None and "the run is diverging" in watch.observe(9.0, 9)  # a new rise warns
