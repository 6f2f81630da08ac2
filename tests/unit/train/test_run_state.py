"""The parts of a run give and take their checkpoint state (train/run_state.py), and the keys of a
checkpoint's client state stay those older checkpoints have (resume reads both)."""

from __future__ import annotations

import random

import pytest
import torch

from implicit_megatron.train.progress import Progress
from implicit_megatron.train.run_state import DataPosition, RngState, gathered


class Stream:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"consumed_samples": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["consumed_samples"]


class Task:
    def order_fingerprint(self, batches, consumed: int) -> str:
        return f"order of {consumed}"


def test_every_part_gives_its_own_keys_and_takes_them_back():
    progress = Progress(step=12, consumed_samples=96, consumed_tokens=3072, phase="free")
    stream = Stream()
    stream.position = 96
    data = DataPosition(stream, Task(), progress)
    client = gathered([progress, data])
    assert client == {"step": 12, "consumed_samples": 96, "consumed_tokens": 3072, "phase": "free",
                      "data": {"consumed_samples": 96}, "data_fingerprint": "order of 96"}
    again, fresh = Progress(), Stream()
    again.load_state_dict(client)
    DataPosition(fresh, Task(), again).load_state_dict(client)
    assert (again.step, again.consumed_samples, again.consumed_tokens, fresh.position) == (12, 96, 3072, 96)
    assert progress.tag == "free-step12" and Progress(step=3).tag == "step3"


class Counter:
    """A part whose `step` would overwrite the progress's."""

    def state_dict(self) -> dict:
        return {"step": 7, "counted": 1}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_a_key_two_parts_give_is_refused():
    assert gathered([Progress(step=3), RngState()])["step"] == 3
    with pytest.raises(ValueError, match=r"Counter gives checkpoint keys another part gives already: \['step'\]"):
        gathered([Progress(), Counter()])


def test_the_generators_come_back_as_they_were_saved():
    import numpy as np

    saved = RngState().state_dict()
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)  # the generators move on
    RngState().load_state_dict(saved)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == drawn[:2] and torch.equal(again[2], drawn[2])
