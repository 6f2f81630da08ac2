"""The stack of L blocks plus the final RMSNorm: one call is F_theta of the paper.

Contract used by the explicit and implicit cores:

    backbone(z, inj=None, seq_idx=None) -> z'          z (B, T, d) -> all blocks -> norm_f
    backbone.allocate_state(batch_size, max_seq_len, device, dtype) -> state   (tuple, one per layer)
    backbone.step(z_t, state, inj_t=None) -> (z_t', candidate_state)         z_t (B, d), inj_t (B, width)
    backbone.injection_width                                                 width of inj's last dim

The same `inj` is added in every layer (Mamba2: to in_proj's output; Llama: to [q, k, v]).
`step` never changes the state it is given (see Mamba2.step and KVCache), so the implicit model can
iterate one token under one committed state and keep only the converged candidate.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from implicit_megatron.config import ModelConfig
from implicit_megatron.models.llama import KVCache, LlamaDecoderLayer
from implicit_megatron.models.mamba2 import Mamba2, Mamba2State
from implicit_megatron.models.norms import RMSNorm, compute_dtype

LayerState = Mamba2State | KVCache
BackboneState = tuple[LayerState, ...]


def select_state(rows: torch.Tensor, state: BackboneState, other: BackboneState) -> BackboneState:
    """Per row: `state` where `rows` (B,) is true, else `other` (two candidates for the same token)."""
    return tuple(mine.select(rows, cast(Any, theirs)) for mine, theirs in zip(state, other, strict=True))


def commit_state(candidate: BackboneState, real: torch.Tensor, before: BackboneState) -> BackboneState:
    """The state after a token that was padding where `real` (B,) is false: those rows keep `before`
    (Mamba2's conv and SSM states; Llama's positions, the token's KV slot marked absent)."""
    return tuple(mine.commit(real, cast(Any, old)) for mine, old in zip(candidate, before, strict=True))


class Mamba2Block(nn.Module):
    """Pre-norm residual block: z + mixer(norm(z)), as mamba_ssm's Block without an MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None, dtype=None) -> None:
        super().__init__()
        s = cfg.mamba2
        self.layer_idx = layer_idx
        self.residual_in_fp32 = cfg.residual_in_fp32
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.mixer = Mamba2(
            cfg.d_model, d_state=s.d_state, d_conv=s.d_conv, expand=s.expand, headdim=s.headdim,
            ngroups=s.ngroups, A_init_range=cast("tuple[float, float]", tuple(s.A_init_range)), dt_min=s.dt_min,
            dt_max=s.dt_max, dt_init_floor=s.dt_init_floor, bias=s.bias, conv_bias=s.conv_bias, chunk_size=s.chunk_size,
            layer_idx=layer_idx, norm_eps=cfg.norm_eps, use_kernels=cfg.use_kernels, device=device, dtype=dtype)

    @property
    def injection_width(self) -> int:
        return self.mixer.injection_width

    def forward(self, z: torch.Tensor, inj: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        out = z + self.mixer(self.norm(z.to(self.norm.weight.dtype)), inj, seq_idx)
        return out.to(compute_dtype(out.dtype)) if self.residual_in_fp32 else out

    def allocate_state(self, batch_size: int, max_seq_len: int, device=None, dtype=None) -> Mamba2State:
        return self.mixer.allocate_state(batch_size, device, dtype)  # constant size: max_seq_len unused

    def step(self, z_t: torch.Tensor, state: Mamba2State,
             inj_t: torch.Tensor | None = None) -> tuple[torch.Tensor, Mamba2State]:
        out, state = self.mixer.step(self.norm(z_t.to(self.norm.weight.dtype)), state, inj_t)
        out = z_t + out
        return (out.to(compute_dtype(out.dtype)) if self.residual_in_fp32 else out), state


def _build_layer(cfg: ModelConfig, i: int, device, dtype) -> nn.Module:
    if cfg.arch == "mamba2":
        return Mamba2Block(cfg, i, device=device, dtype=dtype)
    s = cfg.llama
    return LlamaDecoderLayer(cfg.d_model, s.n_heads, cfg.ffn_dim, n_kv_heads=s.n_kv_heads,
                             rope_theta=s.rope_theta, attention_bias=s.attention_bias, norm_eps=cfg.norm_eps,
                             layer_idx=i, use_kernels=cfg.use_kernels, residual_in_fp32=cfg.residual_in_fp32,
                             device=device, dtype=dtype)


class Backbone(nn.Module):
    """`layers` (Mamba2Block or LlamaDecoderLayer) and `norm_f`; see the module docstring."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None) -> None:
        super().__init__()
        if cfg.arch not in ("mamba2", "llama"):
            raise ValueError(f"unknown architecture {cfg.arch!r}")
        self.arch = cfg.arch
        self.d_model = cfg.d_model
        self.layers = nn.ModuleList(_build_layer(cfg, i, device, dtype) for i in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.checkpoint_layers = False  # recompute each layer in backward (activation checkpointing)
        init_backbone_(self, cfg)

    @property
    def injection_width(self) -> int:
        return cast(int, self.layers[0].injection_width)

    def forward(self, z: torch.Tensor, inj: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        dtype = z.dtype  # the iterate keeps its dtype between passes (see model.residual_in_fp32)
        for layer in self.layers:
            if self.checkpoint_layers and torch.is_grad_enabled():
                z = checkpoint(layer, z, inj, seq_idx, use_reentrant=False)
            else:
                z = layer(z, inj, seq_idx)
        return self.norm_f(z).to(dtype)

    def compile_blocks(self, backend: str = "inductor") -> None:
        """torch.compile every block in place: the elementwise work between matmuls (norms, RoPE,
        SwiGLU, residuals) fuses into few kernels. The fused Mamba2 kernels are not compiled further.
        All blocks of a kind share their compiled code (weight norm is `implicit.weight_norm`'s,
        whose layers share one class), so compiles do not grow with depth."""
        for layer in self.layers:
            layer.compile(dynamic=False, backend=backend)

    def allocate_state(self, batch_size: int, max_seq_len: int, device=None, dtype=None) -> BackboneState:
        """Per-layer zero state: Mamba2State (conv, ssm) or an empty KVCache of `max_seq_len` tokens."""
        return tuple(cast(Any, layer).allocate_state(batch_size, max_seq_len, device, dtype) for layer in self.layers)

    def step(self, z_t: torch.Tensor, state: BackboneState,
             inj_t: torch.Tensor | None = None) -> tuple[torch.Tensor, BackboneState]:
        """One token z_t (B, d) -> (normalised z_t' (B, d), candidate state); `state` stays valid."""
        new_state, dtype = [], z_t.dtype
        for layer, layer_state in zip(self.layers, state, strict=True):
            z_t, layer_state = cast(Any, layer).step(z_t, layer_state, inj_t)
            new_state.append(layer_state)
        return self.norm_f(z_t).to(dtype), tuple(new_state)


@torch.no_grad()
def init_backbone_(backbone: Backbone, cfg: ModelConfig) -> None:
    """The reference initialisation of each architecture (the embedding is the LanguageModel's).

    Mamba2 (mamba_ssm's `_init_weights`, rescale_prenorm_residual=True, one residual per layer):
    Linear layers keep PyTorch's default init with zero biases; out_proj is re-drawn kaiming-uniform
    and divided by sqrt(n_layers); the mixer keeps its own dt_bias / A_log / D / conv init.
    Llama (GPT-2 / Megatron): every Linear ~ N(0, init_std) with zero bias; the two projections
    that write into the residual stream (o_proj, down_proj) ~ N(0, init_std / sqrt(2 * n_layers)).
    """
    for name, module in backbone.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if module.bias is not None:
            nn.init.zeros_(module.bias)
        if cfg.arch == "mamba2":
            if name.endswith("out_proj"):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
                module.weight /= math.sqrt(cfg.n_layers)
        else:
            residual = name.endswith(("o_proj", "down_proj"))
            std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if residual else cfg.init_std
            nn.init.normal_(module.weight, mean=0.0, std=std)


@torch.no_grad()
def released_init_(backbone: Backbone, injection: nn.Module | None, cfg: ModelConfig, rescale_residual: bool) -> None:
    """The released models' initialisation (`model.init: released`), applied before weight norm.

    Every Linear of the backbone and of the injection keeps PyTorch's default (kaiming-uniform)
    weights and has zero biases. The projections into the residual stream (Mamba2's out_proj; Llama's
    o_proj and down_proj) are re-drawn and divided by sqrt(residuals per layer x n_layers) only when
    `rescale_residual`: the released code renames them to `weight_v` when it applies weight norm,
    so its implicit models skip the rescale and its explicit ones get it.
    """
    per_layer = 1 if cfg.arch == "mamba2" else 2
    modules = list(backbone.named_modules())
    if injection is not None:
        modules += list(injection.named_modules(prefix="injection"))
    for name, module in modules:
        if not isinstance(module, nn.Linear):
            continue
        nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        if module.bias is not None:
            nn.init.zeros_(module.bias)
        if rescale_residual and name.endswith(("out_proj", "o_proj", "down_proj")):
            module.weight /= math.sqrt(per_layer * cfg.n_layers)
