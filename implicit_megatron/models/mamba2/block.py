"""The Mamba2 block of the backbone: z + mixer(RMSNorm(z)), as mamba_ssm's Block without an MLP."""

from __future__ import annotations

import math

import torch
from torch import nn

from implicit_megatron.models.mamba2.mixer import Mamba2, Mamba2State
from implicit_megatron.models.norms import RMSNorm, as_dtype, compute_dtype


class Mamba2Block(nn.Module):
    """Pre-norm residual block; `mixer` takes mamba_ssm's Mamba2 keywords (`mixer_kwargs`)."""

    def __init__(self, d_model: int, layer_idx: int, norm_eps: float = 1e-5, residual_in_fp32: bool = False,
                 device=None, dtype=None, **mixer_kwargs) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.residual_in_fp32 = residual_in_fp32
        self.norm = RMSNorm(d_model, eps=norm_eps, device=device, dtype=dtype)
        self.mixer = Mamba2(d_model, layer_idx=layer_idx, norm_eps=norm_eps, device=device, dtype=dtype,
                            **mixer_kwargs)

    @property
    def injection_width(self) -> int:
        return self.mixer.injection_width

    def forward(self, z: torch.Tensor, inj: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        out = z + self.mixer(self.norm(as_dtype(z, self.norm.weight.dtype)), inj, seq_idx)
        return as_dtype(out, compute_dtype(out.dtype)) if self.residual_in_fp32 else out

    def allocate_state(self, batch_size: int, max_seq_len: int, device=None, dtype=None) -> Mamba2State:
        return self.mixer.allocate_state(batch_size, device, dtype)  # constant size: max_seq_len unused

    def step(self, z_t: torch.Tensor, state: Mamba2State,
             inj_t: torch.Tensor | None = None) -> tuple[torch.Tensor, Mamba2State]:
        out, state = self.mixer.step(self.norm(as_dtype(z_t, self.norm.weight.dtype)), state, inj_t)
        out = z_t + out
        return (as_dtype(out, compute_dtype(out.dtype)) if self.residual_in_fp32 else out), state


@torch.no_grad()
def init_weights_(backbone: nn.Module, n_layers: int) -> None:
    """mamba_ssm's `_init_weights` (rescale_prenorm_residual=True, one residual per layer): Linear
    layers keep PyTorch's default init with zero biases; out_proj is re-drawn kaiming-uniform and
    divided by sqrt(n_layers); the mixer keeps its own dt_bias / A_log / D / conv init."""
    for name, module in backbone.named_modules():
        if isinstance(module, nn.Linear):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            if name.endswith("out_proj"):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
                module.weight /= math.sqrt(n_layers)
