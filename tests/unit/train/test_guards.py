"""The loss-jump guard: a loss several times its recent mean skips a checkpoint only when it is also
MIN_LOSS_JUMP nats above it, so a solved task's near-zero losses never cost a save."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.processes import free_port

from implicit_megatron.train.guards import MIN_LOSS_JUMP, LossJumpGuard


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def jumped(loss: float, recent: list[float]) -> bool:
    guard = LossJumpGuard(4.0, log=lambda message: None)
    guard.recent.extend(recent)
    return guard.jumped(loss, torch.device("cpu"))


def test_a_spike_is_a_jump_and_noise_near_zero_is_not(one_process_group):
    assert jumped(13.0, [3.0] * 20)  # a divergence: over 4x and 10 nats above
    assert not jumped(11.0, [3.0] * 20)  # under 4x
    assert not jumped(0.0457, [0.005] * 20)  # 9x, but 0.04 nats: the S3 run that lost its final checkpoint
    assert jumped(4 * 0.2 + MIN_LOSS_JUMP + 0.01, [0.2] * 20)
    assert not jumped(5.0, [])  # nothing to compare with yet


def test_a_checkpoint_is_held_back_at_a_jump_and_the_step_losses_stay_on_the_device(one_process_group):
    said = []
    guard = LossJumpGuard(4.0, log=said.append)
    for loss in [3.0] * 20:
        guard.add(torch.tensor(loss))
    assert guard.allows_save(20, torch.device("cpu")) and not said
    guard.add(torch.tensor(13.0))
    assert not guard.allows_save(21, torch.device("cpu"))
    assert said == ["warning: no checkpoint at step 21: the loss jumped beyond checkpoint.max_loss_jump=4.0 x "
                    "its recent mean; the previous checkpoint stays the latest"]
