"""The Mamba2 backbone: mixer.py (mamba_ssm's Mamba2 mixer in PyTorch), ssd.py (its chunked scan),
block.py (the residual block of the stack), spec.py (what the rest of the package knows of it).

`implicit_megatron.models.mamba2.Mamba2` and `.Mamba2State` are the mixer module's, imported on first
use: the spec, which the config check reads, needs no torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Mamba2", "Mamba2State"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from implicit_megatron.models.mamba2 import mixer

        return getattr(mixer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
