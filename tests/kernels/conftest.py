"""The kernel tier: mamba_ssm's own Triton kernels run on CPU under Triton's interpreter
(support.mamba_ssm_on_cpu), float32, against the PyTorch path on the same module and weights.

Every test here is marked `kernels` (tests/conftest.py), which `--quick` leaves out. Where triton or
mamba_ssm is not installed, each module is skipped with the one-line reason.
"""

from __future__ import annotations

import pytest
import torch
from support.mamba_ssm_on_cpu import on_cpu

from implicit_megatron.models import kernels


@pytest.fixture(scope="module")
def real_kernels():
    """mamba_ssm's kernels, importable and runnable on CPU tensors for this module."""
    with on_cpu() as loaded:
        yield loaded


@pytest.fixture
def fused(real_kernels, monkeypatch):
    """Every mixer takes its fused path on CPU tensors, through the real kernels (unless the PyTorch
    path is forced with kernels.set_kernels_enabled(False))."""
    monkeypatch.setattr(kernels, "mamba_kernels", lambda x: real_kernels if kernels.kernels_enabled() else None)
    torch.manual_seed(0)
    return real_kernels
