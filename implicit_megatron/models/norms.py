"""RMS normalisations shared by the Mamba2 and Llama blocks.

Both compute their statistics in at least float32 (so bf16 activations normalise accurately) and in
float64 when the input is float64 (so tests can compare against references at 1e-12).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision reductions run in: float32 for half types, the input's own otherwise."""
    return torch.promote_types(dtype, torch.float32)


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in `dtype`: cast only where it is another (a cast to its own dtype still costs a dispatch,
    about 20 per layer and pass in float32)."""
    return t if t.dtype == dtype else t.to(dtype)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in x's dtype (no cast)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """y = weight * x / rms(x): the pre-norm of every block and the final norm of the backbone."""

    def __init__(self, d: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_normalize(as_dtype(x, compute_dtype(x.dtype)), self.eps)
        return self.weight * as_dtype(y, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedRMSNorm(nn.Module):
    """Mamba2's output norm: RMSNorm(y * silu(z)) per group of channels (norm_before_gate=False).

    Normalising per group (d / ngroups channels) keeps the groups independent, which is what lets
    mamba_ssm shard a mixer by groups; with ngroups = 1 it is a plain RMSNorm of the gated output.
    """

    def __init__(self, d: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = d if group_size is None else group_size
        if d % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide {d}")
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, y: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        dtype = y.dtype
        cd = compute_dtype(dtype)
        y = as_dtype(y, cd)
        gate = None if z is None else F.silu(as_dtype(z, cd))
        if gate is not None and not self.norm_before_gate:
            y = y * gate
        shape = y.shape
        y = rms_normalize(y.reshape(*shape[:-1], -1, self.group_size), self.eps).reshape(shape)
        y = y * as_dtype(self.weight, cd)
        if gate is not None and self.norm_before_gate:
            y = y * gate
        return as_dtype(y, dtype)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, eps={self.eps}, group_size={self.group_size}, "
                f"norm_before_gate={self.norm_before_gate}")
