"""Fixed-point search without gradient: z^0 = 0, z^s = F(z^{s-1}) until converged or capped.

The stop rule is the per-sample relative residual ||F(z) - z|| / ||F(z)|| over (T, d): stop when
its batch maximum is below `tol`. In a distributed run that maximum is all-reduced (MAX) across
the data-parallel group, so every rank runs the same number of passes: ranks that disagree
crash ZeRO-3 on gloo and hang it on NCCL. `tol=None` is a bounded phase: exactly `max_iter` passes.

`released_solve` is the evaluation of the code released with the paper, whose numbers the
paper's tables report: damped passes, one stop test over the whole batch, a last undamped pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from implicit_megatron.config import AndersonSettings
from implicit_megatron.implicit.damping import damped

Function = Callable[[torch.Tensor], torch.Tensor]
Step = Callable[[torch.Tensor, bool], tuple[torch.Tensor, "torch.Tensor | None"]]


@dataclass
class SolverStats:
    """What one solve did: passes through F, final residual and convergence per sample."""

    passes: int  # passes without gradient
    residual: torch.Tensor  # (B,) relative residual of the last pass
    converged: torch.Tensor  # (B,) bool: residual < tol (all True in a bounded phase)
    phantom_passes: int = 0  # passes with gradient that followed
    row_passes: torch.Tensor | None = None  # (B,) passes of each sample, where samples stop on their own

    @property
    def passes_per_sample(self) -> torch.Tensor:
        """(B,) passes without gradient of each sample (all `passes` under a batch-wide stop)."""
        if self.row_passes is not None:
            return self.row_passes
        return torch.full(self.residual.shape, self.passes, dtype=torch.long, device=self.residual.device)

    @property
    def total_passes(self) -> int:
        return self.passes + self.phantom_passes

    @property
    def converged_frac(self) -> float:
        return self.converged.float().mean().item()


def relative_residual(f_z: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """||F(z) - z|| / ||F(z)|| per sample, over every dimension but the first.

    The norms accumulate in at least float32 without materialising float32 copies of the iterate.
    """
    dtype = torch.promote_types(f_z.dtype, torch.float32)
    diff = torch.linalg.vector_norm((f_z - z).flatten(1), dim=1, dtype=dtype)
    norm = torch.linalg.vector_norm(f_z.flatten(1), dim=1, dtype=dtype)
    return diff / norm.clamp_min(torch.finfo(dtype).tiny)


def position_residual(f_z: torch.Tensor, z: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """||F(z) - z|| / ||F(z)|| (or / (eps + ||z||), the released ratio) per position: (B, T) over d."""
    dtype = torch.promote_types(f_z.dtype, torch.float32)
    diff = torch.linalg.vector_norm(f_z - z, dim=-1, dtype=dtype)
    if eps:
        return diff / (eps + torch.linalg.vector_norm(z, dim=-1, dtype=dtype))
    return diff / torch.linalg.vector_norm(f_z, dim=-1, dtype=dtype).clamp_min(torch.finfo(dtype).tiny)


def any_left(active: torch.Tensor, group: dist.ProcessGroup | None = None) -> bool:
    """Whether any position is still iterating on any rank of the data-parallel group."""
    return agreed_max(active.any().float(), group) > 0


def agreed_max(value: torch.Tensor, group: dist.ProcessGroup | None = None) -> float:
    """The maximum of `value` over the data-parallel group (itself outside a distributed run)."""
    value = value.detach().float().max().reshape(1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return value.item()


def eager_step(f: Function) -> Step:
    """The plain pass: F(z), with the residual only where the solver needs it."""

    def step(z: torch.Tensor, need_residual: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        f_z = f(z)
        return f_z, relative_residual(f_z, z) if need_residual else None

    return step


@torch.no_grad()
def solve(f: Function, z0: torch.Tensor, max_iter: int, tol: float | None,
          anderson: AndersonSettings | None = None, group: dist.ProcessGroup | None = None,
          per_sample: bool = False, per_token: bool = False) -> tuple[torch.Tensor, SolverStats]:
    """Iterate F from z0; return the last F(z) and statistics. Every pass calls F exactly once."""
    return solve_with(eager_step(f), z0, max_iter, tol, anderson, group, per_sample, per_token)


@torch.no_grad()
def solve_with(step: Step, z0: torch.Tensor, max_iter: int, tol: float | None,
               anderson: AndersonSettings | None = None, group: dist.ProcessGroup | None = None,
               per_sample: bool = False, per_token: bool = False) -> tuple[torch.Tensor, SolverStats]:
    """`solve` over a pass `step(z, need_residual) -> (F(z), residual or None)`. With a tolerance it
    returns, per sample, the iterate of lowest residual (see `_keep_lowest`).

    `per_sample` (evaluation): each sample keeps what it had at the first pass where its own
    residual fell below tol, as it would alone, and the solve ends when every sample has (on
    every rank); otherwise the batch's largest residual stops all samples at once.
    `per_token` (evaluation, eager steps only: it reads z after the step): the same per position,
    with each position's own residual over d. The iteration itself runs on for every position, so
    under a causal backbone what a position keeps depends on the tokens up to it alone: not on the
    batch, on padding after it, or on what follows it (Anderson mixing, per sequence, would undo this).

    A step may return F(z) in a buffer that its next call overwrites (a replayed CUDA graph), so the
    residual comes from the step itself, and Anderson mixing keeps its own copies. A bounded phase
    asks for the residual of the last pass only; a free phase asks every pass, and that one number
    per pass (agreed over the ranks) is the only thing the host waits for.
    """
    history = _AndersonHistory(anderson) if anderson is not None and anderson.enabled else None
    if max_iter == 0:  # (0+k): the phantom steps alone, e.g. to compare with unrolled backprop
        ones = torch.ones(z0.shape[0], dtype=torch.bool, device=z0.device)
        return z0, SolverStats(0, torch.zeros(z0.shape[0], device=z0.device), ones)
    z, passes, best, tokens = z0, 0, None, None
    active = torch.ones(z0.shape[0], dtype=torch.bool, device=z0.device)
    row_passes = torch.zeros(z0.shape[0], dtype=torch.long, device=z0.device)
    while passes < max_iter:
        passes += 1
        last = passes == max_iter
        f_z, residual = step(z, tol is not None or last)
        row_passes += active
        if tol is not None and per_token:
            tokens = _keep_per_token(tokens, f_z, position_residual(f_z, z), tol)
            active = ~tokens[2].all(dim=1)
            if not any_left(~tokens[2], group):
                break
        elif tol is not None:
            assert residual is not None  # asked for: tol is set
            best = _keep_lowest(best, f_z, residual, active if per_sample else None)
            if per_sample:
                active &= ~(residual < tol)
            if agreed_max(residual.masked_fill(~active, 0), group) < tol:
                break
        if not last:
            z = history.next_iterate(z, f_z.clone()) if history is not None else f_z
    if tokens is not None:
        f_z, lowest, stopped = tokens
        residual = lowest.flatten(1).max(dim=1).values  # the largest of its positions' residuals
        return f_z, SolverStats(passes, residual, stopped.flatten(1).all(dim=1), row_passes=row_passes)
    if best is not None:
        f_z, residual = best
    assert residual is not None  # the last pass asks for it, and a pass that stops early has tol set
    converged = residual < tol if tol is not None else torch.ones_like(residual, dtype=torch.bool)
    return f_z, SolverStats(passes, residual, converged, row_passes=row_passes if per_sample else None)


@torch.no_grad()
def released_solve(f: Function, z0: torch.Tensor, cap: int, tol: float | None, damping: float,
                   group: dist.ProcessGroup | None = None, over_ranks: bool = True,
                   per_sample: bool = False, per_token: bool = False) -> tuple[torch.Tensor, SolverStats]:
    """The released evaluation rule: from z = z0, up to cap - 1 times

        z_next = F(z);  r = ||z_next - z|| / (1e-6 + ||z||);  z = (1 - damping) z + damping z_next;
        stop if r < tol,

    with the norms over the whole batch (the data-parallel group's, agreed over the ranks when
    `over_ranks`), then one undamped pass: F(z) is returned. At most `cap` passes in all. The
    statistics hold the same ratio per sample, for the metrics; the stop test is the batch's.
    `per_sample` (evaluation): the stop test is each sample's own ratio; a sample that passed it
    is frozen while the others go on (until every sample has, on every rank), then one undamped
    pass of all: each sample gets what it would alone. `per_token`: see `_released_per_token`.
    """
    if per_token and tol is not None:
        return _released_per_token(f, z0, cap, tol, damping, group if over_ranks else None)
    z, loops, residual = z0, 0, torch.zeros(z0.shape[0], device=z0.device)
    active = torch.ones(z0.shape[0], dtype=torch.bool, device=z0.device)
    row_loops = torch.zeros(z0.shape[0], dtype=torch.long, device=z0.device)
    dtype = torch.promote_types(z0.dtype, torch.float32)
    while loops < cap - 1:
        loops += 1
        z_next = f(z)
        diff_sq = torch.linalg.vector_norm((z_next - z).flatten(1), dim=1, dtype=dtype).square()
        norm_sq = torch.linalg.vector_norm(z.flatten(1), dim=1, dtype=dtype).square()
        ratio = diff_sq.sqrt() / (1e-6 + norm_sq.sqrt())
        residual = torch.where(active, ratio, residual)
        z = torch.where(active.view(-1, *[1] * (z.dim() - 1)), damped(z, z_next, damping), z)
        row_loops += active
        if tol is None:
            continue
        if per_sample:
            active &= ~(ratio < tol)
            totals = active.any().to(dtype).reshape(1)  # summed over the ranks: 0 when all stopped
        else:
            totals = torch.stack([diff_sq.sum(), norm_sq.sum()])
        if over_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(totals, group=group)
        if (totals[0] == 0 if per_sample else totals[0].sqrt() / (1e-6 + totals[1].sqrt()) < tol).item():
            break
    converged = residual < tol if tol is not None else torch.ones_like(residual, dtype=torch.bool)
    row_passes = row_loops + 1 if per_sample else None
    return f(z), SolverStats(loops + 1, residual, converged, row_passes=row_passes)


def _released_per_token(f: Function, z0: torch.Tensor, cap: int, tol: float, damping: float,
                        group: dist.ProcessGroup | None) -> tuple[torch.Tensor, SolverStats]:
    """The released rule with each position's own stop test: position t stops at the first loop k
    where ||F(z)_t - z_t|| / (1e-6 + ||z_t||) < tol and returns F of the next damped iterate, as
    the released rule's last undamped pass would (the next loop's F(z), or the final pass). Every
    position is iterated until all have stopped (or the cap), so under a causal backbone a
    position's result depends on the tokens up to it alone: not on the batch, on padding after
    it, or on the tokens that follow it."""
    z, loops = z0, 0
    out, residual = torch.zeros_like(z0), torch.zeros(z0.shape[:2], device=z0.device)
    active = torch.ones(z0.shape[:2], dtype=torch.bool, device=z0.device)  # still iterating
    pending = torch.zeros_like(active)  # stopped last loop: this loop's F(z) is its result
    row_loops = torch.zeros(z0.shape[0], dtype=torch.long, device=z0.device)
    while loops < cap - 1:
        loops += 1
        z_next = f(z)
        out = torch.where(pending[..., None], z_next, out)
        ratio = position_residual(z_next, z, eps=1e-6)
        residual = torch.where(active, ratio, residual)
        row_loops += active.any(dim=1)
        pending = active & (ratio < tol)
        active &= ~pending
        z = damped(z, z_next, damping)
        if not any_left(active, group):
            break
    out = torch.where((pending | active)[..., None], f(z), out)
    return out, SolverStats(loops + 1, residual.max(dim=1).values, ~active.any(dim=1), row_passes=row_loops + 1)


def _keep_per_token(kept, f_z: torch.Tensor, residual: torch.Tensor, tol: float):
    """(F(z), lowest residual, stopped) per position (B, T): a position keeps its F(z) of lowest
    residual until the first pass that brings it below tol, then keeps that one."""
    if kept is None:
        return f_z.clone(), residual.clone(), residual < tol
    out, lowest, stopped = kept
    better = (residual < lowest) & ~stopped
    return (torch.where(better[..., None], f_z, out), torch.where(better, residual, lowest),
            stopped | (residual < tol))


def _keep_lowest(best, f_z: torch.Tensor, residual: torch.Tensor, active: torch.Tensor | None = None):
    """Per sample, the iterate of lowest residual so far and that residual: a solve that stops at
    a tolerance returns it, as the released code's solver (torchdeq) does. Where the residual
    falls monotonically this is the last iterate; where the cap is hit on an oscillating sample
    it is the best one seen. Samples not `active` (stopped on their own) keep what they have."""
    if best is None:
        return f_z.clone(), residual.clone()
    kept, kept_residual = best
    better = residual < kept_residual
    if active is not None:
        better &= active
    return (torch.where(better.view(-1, *[1] * (f_z.dim() - 1)), f_z, kept),
            torch.where(better, residual, kept_residual))


class _AndersonHistory:
    """Anderson acceleration (type II) over the last `window` iterates, per sample.

    Solves min_a ||sum_i a_i g_i||^2 subject to sum_i a_i = 1, with g_i = F(x_i) - x_i and Tikhonov
    regularisation, then mixes x_next = sum_i a_i (F(x_i) - (1 - beta) g_i). The history stays in
    the iterate's dtype; only the small (window + 1)^2 system is solved in float64. A sample whose
    system is singular takes the plain iterate F(x) for that pass; the choice is made on the
    device, so a pass reads nothing back but the stop rule's residual.
    """

    def __init__(self, settings: AndersonSettings):
        self.settings = settings
        self.fs: list[torch.Tensor] = []  # F(x_i), flattened per sample
        self.gs: list[torch.Tensor] = []  # g_i

    def next_iterate(self, x: torch.Tensor, f_x: torch.Tensor) -> torch.Tensor:
        window = self.settings.window
        self.fs = [*self.fs, f_x.flatten(1)][-window:]
        self.gs = [*self.gs, (f_x - x).flatten(1)][-window:]
        m = len(self.fs)
        if m < 2:
            return f_x
        G = torch.stack(self.gs, dim=1)  # (B, m, n)
        gram = torch.einsum("bin,bjn->bij", G.float(), G.float()).double()
        batch = gram.shape[0]
        system = torch.zeros(batch, m + 1, m + 1, dtype=gram.dtype, device=gram.device)
        system[:, 0, 1:] = 1
        system[:, 1:, 0] = 1
        scale = gram.diagonal(dim1=1, dim2=2).mean(dim=1).clamp_min(1e-30)
        eye = torch.eye(m, dtype=gram.dtype, device=gram.device)
        system[:, 1:, 1:] = gram + self.settings.regularization * scale[:, None, None] * eye
        rhs = torch.zeros(batch, m + 1, 1, dtype=gram.dtype, device=gram.device)
        rhs[:, 0] = 1
        solution, info = torch.linalg.solve_ex(system, rhs)
        solved = (info == 0) & torch.isfinite(solution).flatten(1).all(1)  # per sample, on the device
        alpha = torch.where(solved[:, None, None], solution[:, 1:], 0.0).to(G.dtype)  # (B, m, 1)
        F = torch.stack(self.fs, dim=1)
        mixed = (alpha * (F - (1 - self.settings.mixing) * G)).sum(1)
        return torch.where(solved.view(-1, *[1] * (x.dim() - 1)), mixed.view_as(x), f_x)
