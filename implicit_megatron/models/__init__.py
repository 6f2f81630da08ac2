"""Explicit backbones (Mamba2, Llama) in PyTorch, with fused kernels when present.

`implicit_megatron.build_model(cfg)` composes a Backbone with its core and the LanguageModel head.
"""

from __future__ import annotations

from implicit_megatron.models.backbone import Backbone, BackboneState, Mamba2Block
from implicit_megatron.models.llama import KVCache, LlamaDecoderLayer
from implicit_megatron.models.lm import LanguageModel, seq_idx_from_eod
from implicit_megatron.models.mamba2 import Mamba2, Mamba2State

__all__ = [
    "Backbone", "BackboneState", "KVCache", "LanguageModel", "LlamaDecoderLayer", "Mamba2", "Mamba2Block",
    "Mamba2State", "seq_idx_from_eod",
]
