"""Optional fused kernels (mamba_ssm, causal_conv1d, flash-attn), imported on first use.

The packages need a GPU toolchain; on machines without them every model runs its PyTorch path.
Lookups are cached, and `set_kernels_enabled(False)` forces the PyTorch path everywhere (the
kernel validation tool compares the two paths on the same module this way).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_enabled = True


def set_kernels_enabled(enabled: bool) -> None:
    """Globally allow (default) or forbid the fused kernels."""
    global _enabled
    _enabled = enabled


def kernels_enabled() -> bool:
    return _enabled


@dataclass(frozen=True)
class MambaKernels:
    """The five entry points the Mamba2 mixer uses, with mamba_ssm's / causal_conv1d's signatures."""

    mamba_chunk_scan_combined: Callable[..., Any]
    mamba_split_conv1d_scan_combined: Callable[..., Any]
    selective_state_update: Callable[..., Any]
    causal_conv1d_fn: Callable[..., Any]
    causal_conv1d_update: Callable[..., Any]


@functools.cache
def _load_mamba_kernels() -> MambaKernels | None:
    # mamba_ssm's Triton kernels autotune at first use, in every process (each rank, each tool) anew:
    # minutes on a fresh node. Triton keeps the choices on disk beside its compiled kernels when asked
    # to at import time; a choice only picks among correct configurations, so a stale one costs speed,
    # never results. A user's own setting wins.
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    try:  # importing mamba_ssm can fail in many ways without a GPU (triton, CUDA libraries)
        from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
        from mamba_ssm.ops.triton.ssd_combined import (
            mamba_chunk_scan_combined,
            mamba_split_conv1d_scan_combined,
        )
    except Exception:
        return None
    return MambaKernels(mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined,
                        selective_state_update, causal_conv1d_fn, causal_conv1d_update)


@functools.cache
def _load_flash_attn() -> Callable[..., Any] | None:
    try:
        from flash_attn import flash_attn_func
    except Exception:
        return None
    return flash_attn_func


def mamba_kernels(x: torch.Tensor) -> MambaKernels | None:
    """The Mamba kernels if they are enabled, importable and `x` lives on a GPU; else None."""
    if not (_enabled and x.is_cuda):
        return None
    return _load_mamba_kernels()


def flash_attn(x: torch.Tensor) -> Callable[..., Any] | None:
    """flash_attn_func if enabled, importable, and `x` is a half-precision GPU tensor; else None."""
    if not (_enabled and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)):
        return None
    return _load_flash_attn()


def installed() -> dict[str, bool]:
    """Which kernel packages import on this machine (for tools and logs)."""
    return {"mamba_ssm+causal_conv1d": _load_mamba_kernels() is not None,
            "flash_attn": _load_flash_attn() is not None}
