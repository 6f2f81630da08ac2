"""Sequential mode (generation): token by token, iterate z_t under the committed per-layer state of
t-1 until converged, then commit the state once. Memory is constant in the number of passes.

One token's solve is implicit.iteration's `iterate` under solver.token_rule; this module drives it
over a sequence for a core (`ImplicitCore.forward_sequential` and `ImplicitCore.step` call it).
"""

from __future__ import annotations

import torch

from implicit_megatron.implicit.damping import damped
from implicit_megatron.implicit.iteration import SolverStats, iterate, stateful
from implicit_megatron.implicit.solver import token_rule
from implicit_megatron.models.backbone import BackboneState, commit_state


@torch.no_grad()
def forward_sequential(core, x: torch.Tensor, state=None, max_len: int | None = None,
                       mask: torch.Tensor | None = None, last: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, BackboneState, list[SolverStats]]:
    """Process x (B, T, d) one token at a time; returns z (B, T, d), the committed state and
    per-token statistics. `state` continues a previous call (generation); None starts a fresh
    one with room for `max_len` tokens (default T; Llama's KV cache needs it, Mamba2's state is
    constant in size). Packed documents are not separated here: pass one document per row.

    `mask` (B, T), 1 for real tokens and 0 for padding, anywhere in a row: padding never enters
    a row's state, and z at a padded position repeats the row's last real z (zeros before any),
    so a row's output is what its real tokens alone give. `last` (B, d) is that z from the
    previous call: the warm start's first iterate (`warm_start`) and what leading padding repeats.
    """
    batch, length, _ = x.shape
    if state is None:
        state = core.backbone.allocate_state(batch, max_len or length, device=x.device, dtype=x.dtype)
    inj = core.injection(x) if core.implicit and core.injection is not None else None
    warm = core.implicit and core.settings.warm_start
    last = torch.zeros_like(x[:, 0]) if last is None else last
    outputs, stats = [], []
    for t in range(length):
        inj_t = inj[:, t] if inj is not None else None
        real = mask[:, t].to(x.device, torch.bool) if mask is not None else None
        z_t, state, token_stats = step(core, x[:, t], inj_t, state, real, start=last if warm else None)
        if real is not None:
            z_t = torch.where(real[:, None], z_t, last)
        outputs.append(z_t)
        stats.append(token_stats)
        last = z_t
    return torch.stack(outputs, dim=1), state, stats


@torch.no_grad()
def step(core, x_t: torch.Tensor, inj_t: torch.Tensor | None, state, real: torch.Tensor | None = None,
         start: torch.Tensor | None = None) -> tuple[torch.Tensor, object, SolverStats]:
    """One token: iterate under the committed `state`, then return (z_t, new committed state).

    Each row stops on its own residual, frozen while the others iterate, so that its tokens and
    passes are those it has alone (or at the batch's one test: implicit.sequential_stop). `real` (B,) is false where the
    token is padding: that row is not iterated and keeps its state. `start` is the first iterate
    (warm start), zeros otherwise."""
    real = torch.ones(x_t.shape[0], dtype=torch.bool, device=x_t.device) if real is None else real
    if not core.implicit:
        z_t, candidate = core.backbone.step(x_t, state, None)
        stats = SolverStats(1, torch.zeros(x_t.shape[0]), torch.ones_like(real), row_passes=real.long())
        return z_t, commit_state(candidate, real, state), stats
    s = core.settings
    z0 = torch.zeros_like(x_t) if start is None else start

    def f(z: torch.Tensor):
        return core.backbone.step(z, state, inj_t)

    solution = iterate(stateful(f), z0, token_rule(s, core.training), rows=real, over_ranks=False)
    z, candidate, stats = solution.z, solution.state, solution.stats
    if core.training and s.phantom_steps:  # as in simultaneous mode (no gradient here)
        for _ in range(s.phantom_steps):
            f_z, candidate = f(z)
            z = damped(z, f_z, s.damping)
        stats.phantom_passes = s.phantom_steps
    if candidate is None:  # every row was padding
        return z, state, stats
    return z, commit_state(candidate, real, state), stats
