"""The damped update z <- (1 - lambda) z + lambda F(z): the one formula of every damped iteration.

The phantom steps, the released evaluation rule (simultaneous, per position and per token in
sequential mode), the unrolled warm-up and sequential mode's phantom passes all take their next
iterate from here, so the method's damping is written once.
"""

from __future__ import annotations

import torch


def damped(z: torch.Tensor, f_z: torch.Tensor, damping: float) -> torch.Tensor:
    """(1 - damping) * z + damping * F(z); F(z) itself when damping is 1 (no arithmetic on z)."""
    return f_z if damping == 1.0 else (1.0 - damping) * z + damping * f_z
