"""What a checkpoint keeps of a run besides the engine's files: each part of the run gives its
state (`state_dict`) and takes it back (`load_state_dict`); the checkpointer stores what they give
and adds what is the checkpoint's own (run_id, config, data_signature, git_commit, the universal
checkpoint's info).

    part                          keys of the client state (rank 0's, in the engine's files)
    Progress (progress.py)        step, consumed_samples, consumed_tokens, phase
    DataPosition (here)           data (the batch stream's position), data_fingerprint (the order's digest)
    RngState (here)               every generator, in a file of each rank's own (rng_rank{r}.pt)
    the loop's callbacks          their own (callbacks/*.py: phase_bounds, loss_jump_window, divergence,
                                  unconverged_intervals, validation_owed), given through Hooks.state_dict

A key given by two parts is refused: one would overwrite the other in every checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np
import torch


class GivesState(Protocol):
    def state_dict(self) -> dict: ...


def gathered(parts: Sequence[GivesState]) -> dict:
    """Every part's state in one client state."""
    client: dict = {}
    for part in parts:
        state = part.state_dict()
        shared = sorted(set(client) & set(state))
        if shared:
            raise ValueError(f"{type(part).__name__} gives checkpoint keys another part gives already: {shared}")
        client.update(state)
    return client


class DataPosition:
    """The batch stream's position, and the task's digest of the order of the samples seen so far
    (a resume compares it: checkpointer._check_data_signature)."""

    def __init__(self, batches, task, progress) -> None:
        self.batches, self.task, self.progress = batches, task, progress

    def state_dict(self) -> dict:
        return {"data": self.batches.state_dict(),
                "data_fingerprint": self.task.order_fingerprint(self.batches, self.progress.consumed_samples)}

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state["data"])

    def fingerprint(self, consumed: int) -> str:
        return self.task.order_fingerprint(self.batches, consumed)


class RngState:
    """Every generator of this rank (Python, numpy, torch, CUDA), in types a weights-only load
    builds (numpy's array as a tensor)."""

    def state_dict(self) -> dict:
        kind, keys, pos, has_gauss, gauss = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
        numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
        state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        random.setstate(state["python"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
