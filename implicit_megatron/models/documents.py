"""Packed documents in one row: where each begins (both backbones keep state and attention within one)."""

from __future__ import annotations

import torch


def document_starts(seq_idx: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True where a new document begins (seq_idx changes), never at t = 0."""
    starts = torch.zeros_like(seq_idx, dtype=torch.bool)
    starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    return starts
