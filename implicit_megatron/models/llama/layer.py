"""A Llama-3 style decoder layer: pre-RMSNorm attention with RoPE and a pre-RMSNorm SwiGLU MLP.

Parameter names are `transformers`' LlamaDecoderLayer's (input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj), so weights load unchanged. Additions for the
implicit model: an injection `inj` added to [q, k, v] before RoPE, and a KV-cache `step` whose
states stay valid when the same state is stepped many times (see `KVCache`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from implicit_megatron.models import kernels
from implicit_megatron.models.documents import document_starts
from implicit_megatron.models.norms import RMSNorm, as_dtype, compute_dtype


@dataclass(frozen=True)
class KVCache:
    """Keys and values of the first `length` tokens of one layer.

    The keys of tokens 0 .. length-2 live in the preallocated buffers `k`, `v` (B, n_kv_heads,
    capacity, head_dim); those of the last token are held by the state itself (`last_k`, `last_v`,
    (B, n_kv_heads, head_dim)). A step writes only `last_*` of the state it was given into the buffer
    slot length-1 -- the same values every time it is called with that state -- and returns a new
    state carrying the new token's keys. So stepping one committed state repeatedly (the implicit
    model's fixed-point iteration) and committing any of the candidates is exact, while each step
    copies O(1) data. What is not supported is stepping a discarded sibling after a descendant of
    its sibling was stepped: states of one sequence share the buffers.

    Rows of a batch may hold padding (prompts of different lengths): `real` (B, capacity) says which
    slots hold a row's real tokens (attention reads only those), `positions` (B,) each row's count of
    real tokens, the RoPE position of its next token. A step treats its token as real; `commit`
    marks it absent for the rows where it was padding.
    """

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor  # (B,) int64
    real: torch.Tensor  # (B, capacity) bool
    length: int = 0
    last_k: torch.Tensor | None = None
    last_v: torch.Tensor | None = None
    last_real: torch.Tensor | None = None  # (B,) bool: whether the last token is real, per row
    grows: ClassVar[bool] = True  # a slot per token

    def with_room(self, tokens: int) -> KVCache:
        """This cache with buffers of at least `tokens` slots: when full, copied into buffers of twice
        the capacity (or `tokens`), so that growing one token at a time costs O(1) per token.
        For callers that do not know the final length up front (transformers' `generate`)."""
        capacity = self.k.shape[2]
        if capacity >= tokens:
            return self
        b, heads, _, hd = self.k.shape
        grown = max(tokens, 2 * capacity)
        k, v = (buffer.new_zeros(b, heads, grown, hd) for buffer in (self.k, self.v))
        k[:, :, :capacity], v[:, :, :capacity] = self.k, self.v
        real = self.real.new_zeros(b, grown)
        real[:, :capacity] = self.real
        return replace(self, k=k, v=v, real=real)

    def select(self, rows: torch.Tensor, other: KVCache) -> KVCache:
        """Per row: this candidate where `rows` (B,) is true, else `other`, a candidate for the same token."""
        pick: dict[str, Any] = {
            name: torch.where(rows.view(-1, *[1] * (getattr(self, name).dim() - 1)), getattr(self, name),
                              getattr(other, name))
            for name in ("last_k", "last_v", "last_real", "positions") if getattr(self, name) is not None}
        return replace(self, **pick)

    def commit(self, real: torch.Tensor, before: KVCache) -> KVCache:
        """The state after this token, which was padding where `real` (B,) is false: those rows keep
        the position they had `before`, and the token's slot is not attended to."""
        return replace(self, last_real=real.clone(), positions=torch.where(real, self.positions, before.positions))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] on the halves of the last dimension (the Llama/NeoX RoPE layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape positions.shape + (head_dim,), computed in at least float32."""
    cd = compute_dtype(dtype)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64,
                                            device=positions.device) / head_dim)
    freqs = positions.to(cd)[..., None] * inv_freq.to(cd)
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def document_positions(seq_idx: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token inside its own document (RoPE restarts at every document)."""
    t = torch.arange(seq_idx.shape[1], device=seq_idx.device).expand_as(seq_idx)
    start = torch.where(document_starts(seq_idx), t, torch.zeros_like(t)).cummax(dim=1).values
    return t - start


class LlamaAttention(nn.Module):
    """Causal multi-head attention with optional grouped KV heads (n_kv_heads divides n_heads)."""

    rope_cos: torch.Tensor | None  # buffers (see __init__), None until the first forward
    rope_sin: torch.Tensor | None

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, rope_theta: float = 10000.0,
                 bias: bool = False, use_kernels: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads or n_heads % self.n_kv_heads:
            raise ValueError(f"d_model {d_model}, n_heads {n_heads}, n_kv_heads {self.n_kv_heads} do not split")
        self.head_dim = d_model // n_heads
        self.rope_theta, self.use_kernels = rope_theta, use_kernels
        self.q_dim, self.kv_dim = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, self.q_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, self.kv_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, self.kv_dim, bias=bias, **factory)
        self.o_proj = nn.Linear(self.q_dim, d_model, bias=bias, **factory)
        # cos, sin (T, 1, hd) of positions 0..T-1 for the longest T seen (see _rope); buffers, so that
        # whoever reads them by address (CUDA graphs) sees a new table as moved memory
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)

    def _qkv(self, x: torch.Tensor, inj: torch.Tensor | None):
        """Projections (+ injection), split into heads: (..., heads, head_dim)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if inj is not None:
            dq, dk, dv = as_dtype(inj, q.dtype).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
            q, k, v = q + dq, k + dk, v + dv
        hd = self.head_dim
        return (q.unflatten(-1, (self.n_heads, hd)), k.unflatten(-1, (self.n_kv_heads, hd)),
                v.unflatten(-1, (self.n_kv_heads, hd)))

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_kv, T, hd) -> (B, n_heads, T, hd), each KV head serving n_heads/n_kv query heads."""
        rep = self.n_heads // self.n_kv_heads
        if rep == 1:
            return x
        b, h, t, d = x.shape
        return x[:, :, None].expand(b, h, rep, t, d).reshape(b, h * rep, t, d)

    def _rope(self, t: int, dtype: torch.dtype, device: torch.device):
        """cos, sin (T, 1, hd) of positions 0..T-1: slices of one table computed for the longest
        length seen, so that a shorter forward neither recomputes nor replaces it."""
        cos = self.rope_cos
        if cos is None or cos.shape[0] < t or cos.dtype != dtype or cos.device != device:
            longest = t if cos is None or cos.dtype != dtype or cos.device != device else max(t, cos.shape[0])
            cos, sin = rope_cos_sin(torch.arange(longest, device=device), self.head_dim, self.rope_theta, dtype)
            self.rope_cos, self.rope_sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return cast(torch.Tensor, self.rope_cos)[:t], cast(torch.Tensor, self.rope_sin)[:t]  # filled above

    def _rope_documents(self, seq_idx: torch.Tensor, dtype: torch.dtype):
        """cos, sin (B, T, 1, hd) with positions restarting at every document."""
        cos, sin = rope_cos_sin(document_positions(seq_idx), self.head_dim, self.rope_theta, dtype)
        return cos.unsqueeze(-2), sin.unsqueeze(-2)

    def forward(self, x: torch.Tensor, inj: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d) normalised input; seq_idx (B, T): attend and count positions within documents."""
        b, t, _ = x.shape
        q, k, v = self._qkv(x, inj)  # (B, T, heads, hd)
        cos, sin = self._rope(t, q.dtype, x.device) if seq_idx is None else self._rope_documents(seq_idx, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        flash = kernels.flash_attn(x) if self.use_kernels and seq_idx is None else None
        if flash is not None:
            y = flash(q, k, v, causal=True)  # (B, T, H, hd); grouped KV heads natively
        else:
            q, k, v = q.transpose(1, 2), self._repeat_kv(k.transpose(1, 2)), self._repeat_kv(v.transpose(1, 2))
            if seq_idx is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                same_doc = seq_idx[:, :, None] == seq_idx[:, None, :]
                mask = same_doc & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
            y = y.transpose(1, 2)
        return self.o_proj(y.reshape(b, t, self.q_dim))

    def step(self, x_t: torch.Tensor, cache: KVCache,
             inj_t: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """x_t: (B, d) normalised input of token `cache.length` -> (out (B, d), cache one token longer)."""
        b = x_t.shape[0]
        t = cache.length
        if t >= cache.k.shape[2]:
            raise RuntimeError(f"KV cache full: capacity {cache.k.shape[2]} tokens")
        q, k, v = self._qkv(x_t, inj_t)  # (B, heads, hd)
        cos, sin = rope_cos_sin(cache.positions, self.head_dim, self.rope_theta, q.dtype)  # each row's position
        q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
        if t > 0:
            with torch.no_grad():  # idempotent: the given state's own last token into its slot
                cache.k[:, :, t - 1] = cast(torch.Tensor, cache.last_k)  # t > 0: a token was stepped
                cache.v[:, :, t - 1] = cast(torch.Tensor, cache.last_v)
                cache.real[:, t - 1] = cast(torch.Tensor, cache.last_real)

        # Scores against the cached past (a row's real tokens only) and against the token itself,
        # one softmax over both.
        rep, hd = self.n_heads // self.n_kv_heads, self.head_dim
        cd = compute_dtype(q.dtype)
        qg = q.view(b, self.n_kv_heads, rep, hd).to(cd) * hd ** -0.5
        past_k, past_v = cache.k[:, :, :t].to(cd), cache.v[:, :, :t].to(cd)  # (B, kv, t, hd)
        past = torch.einsum("bgrd,bgsd->bgrs", qg, past_k).masked_fill(~cache.real[:, None, None, :t], float("-inf"))
        scores = torch.cat([past, torch.einsum("bgrd,bgd->bgr", qg, k.to(cd))[..., None]], dim=-1)
        p = scores.softmax(dim=-1)
        y = torch.einsum("bgrs,bgsd->bgrd", p[..., :t], past_v) + p[..., t:] * v.to(cd)[:, :, None]
        out = self.o_proj(y.reshape(b, self.q_dim).to(x_t.dtype))
        new = KVCache(cache.k, cache.v, cache.positions + 1, cache.real, t + 1, k.to(cache.k.dtype),
                      v.to(cache.v.dtype), torch.ones_like(cache.positions, dtype=torch.bool))
        return out, new


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, ffn_dim: int, bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(d_model, ffn_dim, bias=bias, **factory)
        self.up_proj = nn.Linear(d_model, ffn_dim, bias=bias, **factory)
        self.down_proj = nn.Linear(ffn_dim, d_model, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """h = z + attn(norm(z)); out = h + mlp(norm(h))."""

    def __init__(self, d_model: int, n_heads: int, ffn_dim: int, n_kv_heads: int | None = None,
                 rope_theta: float = 10000.0, attention_bias: bool = False, norm_eps: float = 1e-5,
                 layer_idx: int | None = None, use_kernels: bool = True, residual_in_fp32: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.layer_idx = layer_idx
        self.residual_in_fp32 = residual_in_fp32  # each residual sum in float32 (the released models)
        self.input_layernorm = RMSNorm(d_model, eps=norm_eps, **factory)
        self.self_attn = LlamaAttention(d_model, n_heads, n_kv_heads, rope_theta, attention_bias,
                                        use_kernels, **factory)
        self.post_attention_layernorm = RMSNorm(d_model, eps=norm_eps, **factory)
        self.mlp = LlamaMLP(d_model, ffn_dim, **factory)

    @property
    def injection_width(self) -> int:
        """Width of `inj`: [q, k, v] = q_dim + 2 * kv_dim (3 * d_model without grouped KV heads)."""
        return self.self_attn.q_dim + 2 * self.self_attn.kv_dim

    def forward(self, z: torch.Tensor, inj: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        """z: (B, T, d); inj: (B, T, injection_width) added to [q, k, v] before RoPE."""
        h = self._residual(z + self.self_attn(self._normed(self.input_layernorm, z), inj, seq_idx))
        return self._residual(h + self.mlp(self._normed(self.post_attention_layernorm, h)))

    def _normed(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return norm(as_dtype(x, norm.weight.dtype))

    def _residual(self, x: torch.Tensor) -> torch.Tensor:
        return as_dtype(x, compute_dtype(x.dtype)) if self.residual_in_fp32 else x

    def allocate_state(self, batch_size: int, max_seq_len: int, device=None, dtype=None) -> KVCache:
        """An empty cache with room for `max_seq_len` tokens."""
        weight = self.self_attn.k_proj.weight
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        shape = (batch_size, self.self_attn.n_kv_heads, max_seq_len, self.self_attn.head_dim)
        return KVCache(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype),
                       torch.zeros(batch_size, dtype=torch.long, device=device),
                       torch.zeros(batch_size, max_seq_len, dtype=torch.bool, device=device))

    def step(self, z_t: torch.Tensor, state: KVCache,
             inj_t: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """One token z_t (B, d) at position state.length -> (out (B, d), candidate state)."""
        a, new_state = self.self_attn.step(self._normed(self.input_layernorm, z_t), state, inj_t)
        h = self._residual(z_t + a)
        return self._residual(h + self.mlp(self._normed(self.post_attention_layernorm, h))), new_state


@torch.no_grad()
def init_weights_(backbone: nn.Module, n_layers: int, init_std: float) -> None:
    """GPT-2 / Megatron: every Linear ~ N(0, init_std) with zero bias; the two projections that write
    into the residual stream (o_proj, down_proj) ~ N(0, init_std / sqrt(2 * n_layers))."""
    for name, module in backbone.named_modules():
        if isinstance(module, nn.Linear):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            residual = name.endswith(("o_proj", "down_proj"))
            nn.init.normal_(module.weight, mean=0.0, std=init_std / math.sqrt(2 * n_layers) if residual else init_std)
