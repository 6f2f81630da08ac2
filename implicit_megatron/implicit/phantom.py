"""Phantom gradients (Geng et al., 2021): k damped steps with autograd from the solver's output.

    z <- (1 - lambda) * z + lambda * F(z),   k times, starting from the detached fixed point.

Backward then sees only these k applications of F, so the memory of a training step is that of
k passes whatever the number of passes the solver made. With k = s, lambda = 1 and the same start
this is exactly backpropagation through the unrolled iteration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from implicit_megatron.implicit.damping import damped


def phantom_steps(f: Callable[[torch.Tensor], torch.Tensor], z_star: torch.Tensor, steps: int,
                  damping: float) -> torch.Tensor:
    z = z_star.detach()
    for _ in range(steps):
        z = damped(z, f(z), damping)
    return z
