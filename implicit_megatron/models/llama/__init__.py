"""The Llama backbone: layer.py (a Llama-3 decoder layer with transformers' parameter names and its
KV cache), spec.py (what the rest of the package knows of it).

`implicit_megatron.models.llama.LlamaDecoderLayer` and `.KVCache` are the layer module's, imported on
first use: the spec, which the config check reads, needs no torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KVCache", "LlamaDecoderLayer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from implicit_megatron.models.llama import layer

        return getattr(layer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
