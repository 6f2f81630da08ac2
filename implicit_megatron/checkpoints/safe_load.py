"""Checkpoint files read without running code from them: torch's weights-only unpickler, allow-listed.

A `.pt` file is a pickle; loaded with `weights_only=False` (as DeepSpeed's own loaders do) a file
from elsewhere can run arbitrary code. Every file a resume, handoff or export reads is first opened
here with `weights_only=True`, memory-mapped so that no tensor data is read, with the few
non-tensor types DeepSpeed's files hold allowed by name (`allowed`). A file that needs anything else
is refused, naming the file and the type, unless the user trusts its origin:
`checkpoint.trust_pickle: true` in training, `--trust-checkpoint` in the tools (`set_trust`).
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import torch

from implicit_megatron.utils.lean_imports import import_deepspeed


@functools.cache
def allowed() -> list:
    """The non-tensor types checkpoint files may hold: DeepSpeed's loss scaler, ZeRO stage and
    parameter fragment records (classes rebuilt from their fields, no code called), and numpy arrays
    (the random state of checkpoints written before it was saved as a tensor)."""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's import logs; stdout may be a tool's answer
        import_deepspeed()
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    from numpy._core.multiarray import _reconstruct

    return [LossScaler, ZeroStageEnum, fragment_address, np.ndarray, np.dtype, np.dtypes.UInt32DType,
            _reconstruct]


_trust = False
_torch_load = torch.load  # torch's own: `weights_only_loads` replaces torch.load while it lasts


class UnsafeCheckpoint(ValueError):
    """A checkpoint file that would run code, or build types outside the allow-list, when loaded."""


def set_trust(trust: bool) -> None:
    """Load files that need more than the allow-list with the full unpickler (their code runs)."""
    global _trust
    _trust = trust


def load(path: str | Path, **kwargs):
    """torch.load(path) with the weights-only unpickler (the full one only where trusted)."""
    try:
        with torch.serialization.safe_globals(allowed()):
            return _torch_load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as err:
        if _trust:
            return _torch_load(path, weights_only=False, **kwargs)
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f"the global {found.group(1)}" if found else "an object"
        raise UnsafeCheckpoint(
            f"{path}: refused to load: it holds {what}, which a weights-only load does not build (a file from "
            "elsewhere could run code this way). If you trust where this checkpoint comes from, set "
            "checkpoint.trust_pickle=true (training) or pass --trust-checkpoint (tools)") from None


def weights_only_problem(path: str | Path) -> str | None:
    """Why `path` does not load with the weights-only unpickler (None: it does), whatever the trust
    setting: for files this project wrote itself, which never need more."""
    try:
        with torch.serialization.safe_globals(allowed()):
            _torch_load(path, weights_only=True, map_location="cpu", mmap=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, ValueError) as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        return f"it holds the global {found.group(1)}" if found else f"{type(err).__name__}: {str(err)[:200]}"
    return None


def verify(path: str | Path) -> None:
    """Raise UnsafeCheckpoint unless `path` loads with the weights-only unpickler (no tensor data is
    read: the file is memory-mapped); DeepSpeed may then load it its own way."""
    load(path, map_location="cpu", mmap=True)


def guarded_load(f, *args, weights_only=None, **kwargs):
    """torch.load as `load` does it, whatever `weights_only` the caller passes (DeepSpeed's loaders
    pass False)."""
    return load(f, *args, **kwargs)


@contextlib.contextmanager
def weights_only_loads():
    """Every torch.load made inside, by DeepSpeed's engine, its consolidation or its converters
    (which ask for the full unpickler), goes through `load`: whichever file they pick, none runs code."""
    torch.load = guarded_load
    try:
        yield
    finally:
        torch.load = _torch_load
