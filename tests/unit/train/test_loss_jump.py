"""The loss-jump guard: a loss several times its recent mean skips a checkpoint only when it is also
MIN_LOSS_JUMP nats above it, so a solved task's near-zero losses never cost a save."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from support.processes import free_port

from implicit_megatron.train.loop import MIN_LOSS_JUMP, Trainer


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def jumped(loss: float, recent: list[float]) -> bool:
    trainer = SimpleNamespace(cfg=SimpleNamespace(checkpoint=SimpleNamespace(max_loss_jump=4.0)),
                              recent_losses=collections.deque(recent, maxlen=20),
                              engine=SimpleNamespace(device=torch.device("cpu")),
                              progress=SimpleNamespace(step=7), log=lambda message: None)
    return Trainer._loss_jumped(trainer, loss)


def test_a_spike_is_a_jump_and_noise_near_zero_is_not(one_process_group):
    assert jumped(13.0, [3.0] * 20)  # a divergence: over 4x and 10 nats above
    assert not jumped(11.0, [3.0] * 20)  # under 4x
    assert not jumped(0.0457, [0.005] * 20)  # 9x, but 0.04 nats: the S3 run that lost its final checkpoint
    assert jumped(4 * 0.2 + MIN_LOSS_JUMP + 0.01, [0.2] * 20)
    assert not jumped(5.0, [])  # nothing to compare with yet
