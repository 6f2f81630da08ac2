"""One token's solve in sequential mode, each row of the batch on its own.

A row stops when its own relative residual is below the tolerance (or at the cap) and is frozen
while the others iterate: its iterate, its candidate state and its passes are those it has alone,
whichever rows share its batch (every operation of a pass is per row). Rows whose token is
padding (`real` false) are not iterated at all; the core commits their old state.

`step(z) -> (F(z), candidate state)` is one pass under the committed state of the previous token.
`batch_wide` is the rule of the released code instead, for fidelity to its runs on batches: one stop
test over the batch's real rows, all of them iterated until it passes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from implicit_megatron.implicit.damping import damped
from implicit_megatron.implicit.solver import SolverStats, relative_residual
from implicit_megatron.models.backbone import BackboneState, select_state

TokenStep = Callable[[torch.Tensor], tuple[torch.Tensor, BackboneState]]


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *[1] * (like.dim() - 1))


def _norm(per_row: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The norm over `rows` of the rows' norms."""
    return per_row.masked_fill(~rows, 0).square().sum().sqrt()


def _stats(row_passes: torch.Tensor, residual: torch.Tensor, tol: float | None, real: torch.Tensor) -> SolverStats:
    converged = residual < tol if tol is not None else torch.ones_like(real)
    return SolverStats(int(row_passes.max()), residual, converged | ~real, row_passes=row_passes)


@torch.no_grad()
def solve_token(step: TokenStep, z0: torch.Tensor, real: torch.Tensor, cap: int, tol: float | None,
                batch_wide: bool = False) -> tuple[torch.Tensor, BackboneState | None, SolverStats]:
    """z^0 = z0, z^s = F(z^{s-1}) per row until ||F(z) - z|| / ||F(z)|| < tol or `cap` passes; returns
    the last F(z) of each row, its candidate state (None where no row is real) and the statistics."""
    z, candidate, active = z0, None, real.clone()
    row_passes = torch.zeros(z0.shape[0], dtype=torch.long, device=z0.device)
    residual = torch.zeros(z0.shape[0], device=z0.device, dtype=torch.promote_types(z0.dtype, torch.float32))
    for _ in range(cap):
        if not bool(active.any()):
            break
        f_z, new = step(z)
        r = relative_residual(f_z, z)
        z = torch.where(_rows(active, z), f_z, z)
        residual = torch.where(active, r, residual)
        candidate = new if candidate is None else select_state(active, new, candidate)
        row_passes += active
        if tol is not None:
            active &= ~((r.masked_fill(~active, 0).max() < tol) if batch_wide else (r < tol))
    return z, candidate, _stats(row_passes, residual, tol, real)


@torch.no_grad()
def released_token(step: TokenStep, z0: torch.Tensor, real: torch.Tensor, cap: int, tol: float | None,
                   damping: float, batch_wide: bool = False) -> tuple[torch.Tensor, BackboneState | None, SolverStats]:
    """The released evaluation rule (solver.released_solve) per row: up to cap - 1 damped passes,
    each row stopping when its own ||F(z) - z|| / (1e-6 + ||z||) < tol, then one undamped pass of
    every row, whose F(z) and state are returned. For one row this is released_solve itself (the
    released code generates one prompt at a time, where the batch's norms are the row's)."""
    z = z0
    active = real.clone()
    loops = torch.zeros(z0.shape[0], dtype=torch.long, device=z0.device)
    dtype = torch.promote_types(z0.dtype, torch.float32)
    residual = torch.zeros(z0.shape[0], device=z0.device, dtype=dtype)
    for _ in range(cap - 1):
        if not bool(active.any()):
            break
        z_next, _ = step(z)
        diff = torch.linalg.vector_norm((z_next - z).flatten(1), dim=1, dtype=dtype)
        norm = torch.linalg.vector_norm(z.flatten(1), dim=1, dtype=dtype)
        r = diff / (1e-6 + norm)
        z = torch.where(_rows(active, z), damped(z, z_next, damping), z)
        residual = torch.where(active, r, residual)
        loops += active
        if tol is not None and batch_wide:  # the norms over the batch's rows (real ones: all active)
            active &= ~(_norm(diff, active) / (1e-6 + _norm(norm, active)) < tol)
        elif tol is not None:
            active &= ~(r < tol)
    if not bool(real.any()):
        return z, None, _stats(loops, residual, tol, real)
    f_z, candidate = step(z)
    return f_z, candidate, _stats(loops + real.long(), residual, tol, real)
