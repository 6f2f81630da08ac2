"""Input injection: x = embedding(tokens) enters every layer of every pass.

One module shared by all layers (paper, appendix D.3): inj = Linear(RMSNorm(x)), computed once
per forward and added inside each block (Mamba2: to in_proj's output before the split and the
conv; Llama: to q, k, v before RoPE). Its width is the backbone's `injection_width`.
"""

from __future__ import annotations

import torch
from torch import nn

from implicit_megatron.models.norms import RMSNorm


class Injection(nn.Module):
    def __init__(self, d_model: int, width: int, eps: float = 1e-5, init_std: float = 0.02, device=None,
                 dtype=None):
        super().__init__()
        self.norm = RMSNorm(d_model, eps=eps, device=device, dtype=dtype)
        self.proj = nn.Linear(d_model, width, bias=True, device=device, dtype=dtype)
        nn.init.normal_(self.proj.weight, std=init_std)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))
