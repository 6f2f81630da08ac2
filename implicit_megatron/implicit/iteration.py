"""The fixed-point iteration, written once: every solve of the method is `iterate` under a StopRule.

A solve runs passes of F from z0. After each pass a stop rule says

- what is tested: the whole batch (one test), each sample (a row, frozen once it stops) or each
  position (all positions iterate on, each keeps what it had when it stopped: under a causal
  backbone a position's result then depends on the tokens up to it alone);
- with which residual: the solver's ||F(z) - z|| / ||F(z)|| (a batch stops when its largest
  sample's is below tol), or the released code's ||F(z) - z|| / (1e-6 + ||z||) (a batch stops on
  the norms pooled over its rows);
- the next iterate: z <- (1 - damping) z + damping F(z) (Anderson mixing instead, where asked);
- what the solve returns: the F(z) of lowest residual up to the stop (torchdeq's, the solver's),
  the last iterate, or F of the iterate after the stop (the released rule's last undamped pass).

Training's solve, both evaluation rules at every scope, the passes replayed from CUDA graphs (a
pass that computes its residual inside the graph) and sequential mode's token solve (a pass that
also returns a candidate state, rows that are padding never iterated) all call `iterate`; the
rules for each mode are built in solver.py. In a distributed run the stop decision is agreed over
the data-parallel group, so every rank runs the same passes (ZeRO-3 deadlocks otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.distributed as dist

from implicit_megatron.config import AndersonSettings
from implicit_megatron.implicit.anderson import AndersonHistory
from implicit_megatron.implicit.damping import damped
from implicit_megatron.models.backbone import BackboneState, select_state

Function = Callable[[torch.Tensor], torch.Tensor]
# A pass: z, whether the residual is needed -> (F(z), the solver's residual per sample where the pass
# computes it itself (a CUDA graph; None: iterate computes it), the candidate state (sequential mode))
Scope = Literal["batch", "sample", "position"]  # what a stop test measures: the batch, each row, each position
Pass = Callable[[torch.Tensor, bool], tuple[torch.Tensor, "torch.Tensor | None", Any]]


@dataclass(frozen=True)
class StopRule:
    """When a solve's passes stop, and what it returns (see the module docstring)."""

    cap: int  # passes at most, a last undamped one ("next") included
    tol: float | None = None  # None: exactly `cap` passes
    scope: Scope = "batch"
    residual: Literal["solver", "released"] = "solver"
    damping: float = 1.0  # of the update between passes
    keep: Literal["lowest", "last", "next"] = "last"
    undamped_first: bool = False  # the first update is F(z) itself (the unrolled warm-up)
    anderson: AndersonSettings | None = None  # Anderson mixing as the update, where enabled


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


@dataclass
class Solution:
    z: torch.Tensor  # what the rule keeps
    stats: SolverStats
    state: Any = None  # the candidate state of the kept passes (sequential mode); None where no pass ran


def eager(f: Function) -> Pass:
    """A pass of plain PyTorch calls, F(z) -> F(z)."""
    return lambda z, need_residual: (f(z), None, None)


def stateful(f: Callable[[torch.Tensor], tuple[torch.Tensor, Any]]) -> Pass:
    """A pass of sequential mode, z -> (F(z), the candidate state after this token)."""

    def step(z: torch.Tensor, need_residual: bool):
        f_z, state = f(z)
        return f_z, None, state

    return step


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


def agreed_max(value: torch.Tensor, group: dist.ProcessGroup | None = None) -> float:
    """The maximum of `value` over the data-parallel group (itself outside a distributed run)."""
    value = value.detach().float().max().reshape(1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return value.item()


def _agreed_sum(values: torch.Tensor, group) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(values, group=group)
    return values


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *[1] * (like.dim() - 1))


def _where(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """`new` where the (B,) or (B, T) mask holds, else `old`, for iterates (B, T, d)."""
    return torch.where(mask[..., None] if mask.dim() == 2 else _rows(mask, new), new, old)


def _select(mask: torch.Tensor, new: BackboneState | None, old: BackboneState | None) -> BackboneState | None:
    """Per row: candidate state `new` where `mask` (B,) holds, else `old`. Where nothing is kept yet
    `new` is taken for every row: each row's own is taken again when the rule keeps it."""
    if old is None or new is None:
        return new if old is None else old
    return select_state(mask, new, old)


class _Measure:
    """This pass's residual per unit (row or position), for the rule's test and statistics."""

    def __init__(self, rule: StopRule, f_z: torch.Tensor, z: torch.Tensor, computed: torch.Tensor | None) -> None:
        self.diff = self.norm = None
        with torch.no_grad():
            if rule.scope == "position":
                self.r = position_residual(f_z, z, eps=1e-6 if rule.residual == "released" else 0.0)
            elif rule.residual == "solver":
                self.r = computed if computed is not None else relative_residual(f_z, z)
            else:
                dtype = torch.promote_types(z.dtype, torch.float32)
                self.diff = torch.linalg.vector_norm((f_z - z).flatten(1), dim=1, dtype=dtype)
                self.norm = torch.linalg.vector_norm(z.flatten(1), dim=1, dtype=dtype)
                self.r = self.diff / (1e-6 + self.norm)

    def batch_below(self, tol: float, active: torch.Tensor, group, over_ranks: bool) -> bool:
        """The batch's one test over its active rows: the largest residual (solver), or the ratio of
        the norms pooled over the rows (released), over the ranks of the group."""
        group_or_none = group if over_ranks else None
        if self.diff is None:
            if over_ranks:
                return agreed_max(self.r.masked_fill(~active, 0), group_or_none) < tol
            return bool(self.r.masked_fill(~active, 0).max() < tol)
        assert self.norm is not None  # measured with the difference
        pooled = torch.stack([self.diff.masked_fill(~active, 0).square().sum(),
                              self.norm.masked_fill(~active, 0).square().sum()])
        if over_ranks:
            pooled = _agreed_sum(pooled, group)
        return bool(pooled[0].sqrt() / (1e-6 + pooled[1].sqrt()) < tol)


def iterate(step: Pass, z0: torch.Tensor, rule: StopRule, *, rows: torch.Tensor | None = None, group=None,
            over_ranks: bool = True) -> Solution:
    """Iterate `step` from z0 under `rule`. `rows` (B,) bool, false where a row is padding: it is not
    iterated at all and counts as converged (sequential mode). `over_ranks`: agree the stop over
    `group` (None: the world), which only the simultaneous solves do. Every pass calls F once; a
    pass's F(z) may live in a buffer its next call overwrites (a replayed CUDA graph): what is kept
    is copied."""
    kept = _Kept(rule, z0, rows)
    z, passes = z0, 0
    while passes < kept.loop_cap and kept.any_real:
        passes += 1
        final = passes == kept.loop_cap
        f_z, computed, state = step(z, rule.tol is not None or final)
        measure = _Measure(rule, f_z, z, computed) if rule.tol is not None or final else None
        iterated = kept.active  # this pass's rows or positions: it counts for them, and they move on
        kept.take(f_z, measure, state)
        stop = rule.tol is not None and kept.test(cast(_Measure, measure), group, over_ranks)
        if kept.keep == "lowest" and (stop or final):
            break  # what is kept is kept: no next iterate
        z = kept.next_iterate(z, f_z, iterated, first=passes == 1, final=stop or final)
        if stop:
            break
    if kept.keep == "next" and kept.any_real:  # the last undamped pass, of all that have no F(z) yet
        passes += 1
        f_z, _, state = step(z, False)
        kept.take_final(f_z, state)
    return kept.solution(z, passes)


class _Kept:
    """What a solve keeps per row or position (`units`) as its passes go: which still iterate, the
    F(z) and residual the rule keeps, the candidate state, each row's passes."""

    def __init__(self, rule: StopRule, z0: torch.Tensor, rows: torch.Tensor | None) -> None:
        b = z0.shape[0]
        self.rule, self.rows, self.per_position = rule, rows, rule.scope == "position"
        self.keep = "last" if rule.keep == "lowest" and rule.tol is None else rule.keep  # no test, no lowest
        self.real = torch.ones(b, dtype=torch.bool, device=z0.device) if rows is None else rows.clone()
        self.any_real = rows is None or bool(rows.any())  # asked once: a host read per pass would stall a GPU
        self.active = self.real[:, None].expand(z0.shape[:2]).clone() if self.per_position else self.real.clone()
        self.residual = torch.zeros(self.active.shape, device=z0.device,
                                    dtype=torch.promote_types(z0.dtype, torch.float32))
        self.pending = torch.zeros_like(self.active)  # stopped on the last pass: the next F(z) is theirs ("next")
        self.row_passes = torch.zeros(b, dtype=torch.long, device=z0.device)
        self.out: torch.Tensor | None = torch.zeros_like(z0) if self.keep == "next" else None
        self.state: BackboneState | None = None
        self.loop_cap = rule.cap - 1 if self.keep == "next" else rule.cap
        enabled = rule.anderson is not None and rule.anderson.enabled
        self.history = AndersonHistory(cast(AndersonSettings, rule.anderson)) if enabled else None

    def take(self, f_z: torch.Tensor, measure: _Measure | None, state: BackboneState | None) -> None:
        """A pass of the units still active: count it, keep what the rule keeps of it."""
        if self.keep == "next":  # those that stopped on the last pass take this F(z)
            self.out = _where(self.pending, f_z, cast(torch.Tensor, self.out))
            self.state = _select(self.pending, state, self.state)
        self.row_passes += self.active.any(1) if self.per_position else self.active
        if self.keep == "lowest":
            r = cast(_Measure, measure).r  # a tolerance: measured on every pass
            if self.out is None:
                self.out, self.residual = f_z.clone(), r.clone()
            else:
                better = (r < self.residual) & self.active
                self.out, self.residual = _where(better, f_z, self.out), torch.where(better, r, self.residual)
        elif measure is not None:
            self.residual = torch.where(self.active, measure.r, self.residual)
        if self.keep == "last":
            self.state = _select(self.active, state, self.state)

    def test(self, measure: _Measure, group, over_ranks: bool) -> bool:
        """The stop test: which units stop; whether none is left (on any rank)."""
        tol, before = cast(float, self.rule.tol), self.active
        if self.rule.scope == "batch":
            stop = measure.batch_below(tol, self.active, group, over_ranks)
            self.active = torch.zeros_like(self.active) if stop else self.active
        else:
            self.active = self.active & ~(measure.r < tol)
            left = self.active.any().float()
            stop = (agreed_max(left, group) if over_ranks else left.item()) == 0
        self.pending = before & ~self.active
        return stop

    def next_iterate(self, z: torch.Tensor, f_z: torch.Tensor, iterated: torch.Tensor, first: bool,
                     final: bool) -> torch.Tensor:
        """The damped update (Anderson mixing instead, between passes), for the units just iterated:
        a row that stopped stays where it is; positions all move on (later ones read earlier ones)."""
        if self.history is not None and not final:
            nxt = self.history.next_iterate(z, f_z.clone())
        else:
            nxt = f_z if self.rule.undamped_first and first else damped(z, f_z, self.rule.damping)
        if self.per_position or (self.rule.scope == "batch" and self.rows is None):
            return nxt
        return _where(iterated, nxt, z)

    def take_final(self, f_z: torch.Tensor, state: BackboneState | None) -> None:
        """The released rule's last undamped pass: F(z) of all that stopped on the last pass or never."""
        left = self.pending | self.active
        self.out = _where(left, f_z, cast(torch.Tensor, self.out))
        self.state = _select(left, state, self.state)
        self.row_passes += self.real

    def solution(self, z: torch.Tensor, passes: int) -> Solution:
        out = z if self.keep == "last" or self.out is None else self.out  # no pass: z0
        if self.per_position:
            stats = SolverStats(passes, self.residual.max(dim=1).values, ~self.active.any(dim=1),
                                row_passes=self.row_passes)
        else:
            tol = self.rule.tol
            converged = self.residual < tol if tol is not None else torch.ones_like(self.real)
            per_row = self.rule.scope == "sample" or self.rows is not None
            stats = SolverStats(passes, self.residual, converged | ~self.real,
                                row_passes=self.row_passes if per_row else None)
        return Solution(out, stats, self.state)
