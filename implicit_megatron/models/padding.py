"""Padded batches in simultaneous mode: rows of different lengths, padding anywhere in a row.

Each row's real tokens are moved, in order, behind its padding, and the padding becomes a document
of its own (seq_idx 0, the real tokens 1): Mamba2 resets its conv and SSM states at the boundary
and Llama attends and counts RoPE positions within a document, so no pad enters a real token's
computation and a row's real tokens are computed as they are alone. Back in the row's layout, z at
a padded position repeats the row's last real z before it (zeros before any), so that the logits
at a right-padded row's end are those of its last real token, as transformers' `generate` reads them.
"""

from __future__ import annotations

from typing import TypeGuard

import torch


def has_padding(attention_mask: torch.Tensor | None) -> TypeGuard[torch.Tensor]:
    return attention_mask is not None and not bool(attention_mask.bool().all())


def padded_core(core, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """z (B, T, d) of the embedded tokens x (B, T, d), where attention_mask (B, T) is 0 at padding."""
    mask = attention_mask.to(device=x.device, dtype=torch.bool)
    order = torch.sort(mask.int(), dim=1, stable=True).indices  # padding first, then the real tokens in order
    packed = mask.gather(1, order)
    index = order[..., None].expand_as(x)
    z_packed = core(x.gather(1, index), seq_idx=packed.int(), keep=packed)
    return repeat_last_real(torch.empty_like(z_packed).scatter_(1, index, z_packed), mask)


def repeat_last_real(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """z (B, T, d) with each padded position (mask false) holding the row's last real z before it."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    source = torch.where(mask, positions, -1).cummax(dim=1).values
    z = z.gather(1, source.clamp_min(0)[..., None].expand_as(z))
    return z * (source >= 0)[..., None].to(z.dtype)
