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
from typing import Any, ClassVar, Protocol, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from implicit_megatron.config import ModelConfig
from implicit_megatron.models.norms import RMSNorm, as_dtype
from implicit_megatron.models.registry import spec_of


class LayerState(Protocol):
    """One layer's state in sequential mode after some tokens (Mamba2State, the KV cache KVCache): a
    frozen dataclass whose tensors are batch-first."""

    grows: ClassVar[bool]  # whether it grows with the tokens (a KV cache) or keeps its size (Mamba2)
    __dataclass_fields__: ClassVar[dict[str, Any]]

    def select(self, rows: torch.Tensor, other: Any) -> LayerState:
        """Per row: this state where `rows` (B,) is true, else `other` (a candidate of the same token)."""

    def commit(self, real: torch.Tensor, before: Any) -> LayerState:
        """The state after this token, which was padding where `real` (B,) is false (those rows keep
        `before`)."""

    def with_room(self, tokens: int) -> LayerState:
        """This state able to hold `tokens` tokens."""


BackboneState = tuple[LayerState, ...]


def select_state(rows: torch.Tensor, state: BackboneState, other: BackboneState) -> BackboneState:
    """Per row: `state` where `rows` (B,) is true, else `other` (two candidates for the same token)."""
    return tuple(mine.select(rows, theirs) for mine, theirs in zip(state, other, strict=True))


def commit_state(candidate: BackboneState, real: torch.Tensor, before: BackboneState) -> BackboneState:
    """The state after a token that was padding where `real` (B,) is false: those rows keep `before`
    (Mamba2's conv and SSM states; Llama's positions, the token's KV slot marked absent)."""
    return tuple(mine.commit(real, old) for mine, old in zip(candidate, before, strict=True))


class Backbone(nn.Module):
    """`layers` (the blocks of model.arch's spec: Mamba2Block, LlamaDecoderLayer) and `norm_f`; see the
    module docstring."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None) -> None:
        super().__init__()
        spec = spec_of(cfg.arch)
        self.arch = cfg.arch
        self.d_model = cfg.d_model
        self.layers = nn.ModuleList(spec.build_layer(cfg, i, device, dtype) for i in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.checkpoint_layers = False  # recompute each layer in backward (activation checkpointing)
        spec.init_weights_(self, cfg)  # the backbone's reference initialisation (the embedding is the model's)

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
        return as_dtype(self.norm_f(z), dtype)

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
        return as_dtype(self.norm_f(z_t), dtype), tuple(new_state)


@torch.no_grad()
def released_init_(backbone: Backbone, injection: nn.Module | None, cfg: ModelConfig, rescale_residual: bool) -> None:
    """The released models' initialisation (`model.init: released`), applied before weight norm.

    Every Linear of the backbone and of the injection keeps PyTorch's default (kaiming-uniform)
    weights and has zero biases. The projections into the residual stream (the spec's: Mamba2's
    out_proj; Llama's o_proj and down_proj) are re-drawn and divided by sqrt(residuals per layer x
    n_layers) only when `rescale_residual`: the released code renames them to `weight_v` when it
    applies weight norm, so its implicit models skip the rescale and its explicit ones get it.
    """
    residuals = spec_of(cfg.arch).residual_projections
    modules = list(backbone.named_modules())
    if injection is not None:
        modules += list(injection.named_modules(prefix="injection"))
    for name, module in modules:
        if not isinstance(module, nn.Linear):
            continue
        nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        if module.bias is not None:
            nn.init.zeros_(module.bias)
        if rescale_residual and name.endswith(residuals):
            module.weight /= math.sqrt(len(residuals) * cfg.n_layers)
