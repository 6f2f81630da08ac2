"""Shared helpers for the model tests: float64 references from `transformers`."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode


class KeepFloat64(TorchFunctionMode):
    """Turn the reference's float32 up-casts into no-ops on float64 tensors.

    `transformers` computes norms, the Mamba2 scan and the attention softmax "in float32" by casting;
    on float64 inputs that would round the reference to float32. Inside this mode a cast of a float64
    tensor to float32 keeps float64, so the reference runs its own code entirely in float64.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if self_t is not None and self_t.dtype == torch.float64:
            if func is torch.Tensor.float:
                return self_t
            if func is torch.Tensor.to:
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
                if kwargs.get("dtype") is torch.float32:
                    kwargs["dtype"] = torch.float64
            if kwargs.get("dtype") is torch.float32 and func is torch.nn.functional.softmax:
                kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


@pytest.fixture
def rel_err():
    """max |a - b| / max |b| of two tensors."""
    return _rel_err


@pytest.fixture
def float64_reference():
    """A context in which `transformers`' float32 casts of float64 tensors keep float64."""
    return KeepFloat64()


@pytest.fixture(autouse=True)
def _float64_seed_one_thread():
    """float64 by default, a fixed seed, and one intra-op thread: these tensors are too small to
    gain from a thread pool, and a busy machine makes its barriers cost milliseconds per matmul."""
    old_dtype, old_threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old_dtype)
    torch.set_num_threads(old_threads)
