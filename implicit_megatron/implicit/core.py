"""ImplicitCore: the backbone self-iterated to a fixed point, the paper's method written once.

Simultaneous mode (training, evaluation; `ImplicitCore._fixed_point`): the input enters every pass
through the injection; the solver finds z* from z^0 = 0 without gradient; the statistics of that
solve are recorded; then, in training, `phantom_steps` damped passes carry the gradient: the paper's
(s+k). Evaluation returns the solver's z* itself, as the released code (torchdeq) does. The passes
run eagerly (`EagerPasses`) or replayed from CUDA graphs (`graph_runtime.GraphedPasses`), behind
one interface. Sequential mode (generation) is in sequential.py.

The explicit baseline goes through the same module: one pass from z^0 = embedding, no injection.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn

from implicit_megatron.config import SolverSettings
from implicit_megatron.implicit import sequential, weight_norm
from implicit_megatron.implicit.graph_runtime import CaptureFailed, GraphRuntime
from implicit_megatron.implicit.injection import Injection
from implicit_megatron.implicit.iteration import Function, SolverStats, StopRule, eager, iterate
from implicit_megatron.implicit.phantom import phantom_steps
from implicit_megatron.implicit.solver import solve_rule, unrolled

if TYPE_CHECKING:
    from implicit_megatron.models.backbone import BackboneState


class Passes(Protocol):
    """One forward's passes through F, eager (`EagerPasses`) or graphed (`graph_runtime.GraphedPasses`)."""

    def explicit(self, x: torch.Tensor) -> torch.Tensor:
        """The explicit model's one pass, from z0 = x, without injection."""

    def solve(self, z0: torch.Tensor, inj: torch.Tensor | None, rule: StopRule,
              group) -> tuple[torch.Tensor, SolverStats]:
        """The fixed point without gradient, and what the solve did."""

    def phantom(self, z_star: torch.Tensor, inj: torch.Tensor | None, steps: int, damping: float) -> torch.Tensor:
        """`steps` damped passes with gradient from the detached fixed point."""


class EagerPasses:
    """One forward's passes as plain PyTorch calls. `keep` (B, T), false at padding, zeroes z
    there in every pass, so padding never counts in a stop rule."""

    def __init__(self, core: ImplicitCore, seq_idx: torch.Tensor | None, keep: torch.Tensor | None,
                 dtype: torch.dtype) -> None:
        self.core, self.seq_idx = core, seq_idx
        self.keep = None if keep is None else keep[..., None].to(dtype)

    def function(self, inj: torch.Tensor | None) -> Function:
        """F: z -> backbone(z, inj)."""

        def f(z: torch.Tensor) -> torch.Tensor:
            f_z = self.core.backbone(z, inj, seq_idx=self.seq_idx)
            return f_z if self.keep is None else f_z * self.keep

        return f

    def explicit(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(None)(x)

    def solve(self, z0: torch.Tensor, inj: torch.Tensor | None, rule: StopRule,
              group) -> tuple[torch.Tensor, SolverStats]:
        with torch.no_grad(), self.core.weights_once(with_gradient=False):
            solution = iterate(eager(self.function(inj)), z0, rule, group=group)
        return solution.z, solution.stats

    def phantom(self, z_star: torch.Tensor, inj: torch.Tensor | None, steps: int, damping: float) -> torch.Tensor:
        with self.core.weights_once(with_gradient=True):
            return phantom_steps(self.function(inj), z_star, steps, damping)


class ImplicitCore(nn.Module):
    """x (B, T, d) = embedding -> z (B, T, d), the (normalised) fixed point of the backbone.

    Every pass reads each parametrised (weight-normalised) weight computed once per forward: once
    without gradient for the solve, once with it for the phantom steps. On a GPU the passes run as
    CUDA graphs (`cuda_graphs`: "auto" where possible, "on" or "off"); see implicit.graph_runtime.
    `last_stats` holds what the last forward's solve did (None for the explicit model), read by
    the model's `solver_stats()`.
    """

    def __init__(self, backbone: nn.Module, settings: SolverSettings | None, injection: Injection | None,
                 group=None, cuda_graphs: str = "auto"):
        super().__init__()
        self.backbone = backbone
        self.injection = injection
        self.settings = settings  # None: the explicit model (one pass, no injection)
        self.group = group  # data-parallel process group the stop rule is agreed over (None: world)
        self.last_stats: SolverStats | None = None
        self.graphs = GraphRuntime(backbone, cuda_graphs)
        self._normed: tuple[int, list[nn.Module]] | None = None  # (weight_norm.changes, the layers)
        self.timer = None  # name -> a context manager timing the solve and the phantom passes (train.timers)

    @property
    def implicit(self) -> bool:
        return self.settings is not None

    @property
    def cuda_graphs(self) -> str:
        """implicit.cuda_graphs: "auto", "on" or "off" (the runtime turns "auto" off when graphs fail)."""
        return self.graphs.mode

    @cuda_graphs.setter
    def cuda_graphs(self, mode: str) -> None:
        self.graphs.mode = mode

    @property
    def graph_blocker(self) -> str | None:
        """What makes graphs impossible (ZeRO-3), set by whoever knows it."""
        return self.graphs.blocker

    @graph_blocker.setter
    def graph_blocker(self, reason: str | None) -> None:
        self.graphs.blocker = reason

    def set_phase(self, **changes) -> None:
        """Switch solver settings, e.g. set_phase(max_iter=24, tol=0.05, phantom_steps=4)."""
        self.settings = replace(cast(SolverSettings, self.settings), **changes)  # an implicit core's
        self.graphs.phase_changed()

    # ------------------------------------------------------------------ simultaneous mode

    def forward(self, x: torch.Tensor, seq_idx: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """`keep` (B, T) bool, false at padding (which seq_idx must hold in documents of its own, see
        models.padding): z is zero there in every pass, so padding never counts in a stop rule."""
        if keep is None:
            graphed = self.graphs.passes_for(x, seq_idx, self._graphable(), self.training, bool(self.weight_normed()))
            if graphed is not None:
                try:
                    return self._fixed_point(x, graphed)
                except CaptureFailed:
                    pass  # logged; this and every later forward run eagerly
        return self._fixed_point(x, EagerPasses(self, seq_idx, keep, x.dtype))

    def _fixed_point(self, x: torch.Tensor, passes: Passes) -> torch.Tensor:
        """The method: injection, solve without gradient, statistics, phantom steps with gradient."""
        if not self.implicit:
            return passes.explicit(x)
        s = self.settings
        assert s is not None  # implicit
        inj = self.injection(x) if self.injection is not None else None
        z0 = torch.zeros_like(x)
        if s.gradient != "phantom" and torch.is_grad_enabled():  # the ablations
            assert isinstance(passes, EagerPasses)  # never graphed (`_graphable`)
            z, self.last_stats = unrolled(passes.function(inj), z0, s)
            return z
        with self._timed("solve"):
            z_star, stats = passes.solve(z0, inj, solve_rule(s, self.training), self.group)
        if s.stop_tol(self.training) is None and s.eval_tol is not None:  # bounded: converged means below eval_tol
            stats.converged = stats.residual < s.eval_tol
        if self.training:
            stats.phantom_passes = s.phantom_steps
        self.last_stats = stats
        if not self.training:  # evaluation returns the fixed point itself, as torchdeq does
            return z_star
        with self._timed("phantom"):
            return passes.phantom(z_star, inj, s.phantom_steps, s.damping)

    def _graphable(self) -> bool:
        """Whether this forward's passes may replay graphs: not the released evaluation rule, the
        per-token stop (both read z after each pass) or unrolled gradients; the explicit model only
        with gradient (its one pass without gradient gains nothing from a graph)."""
        s = self.settings
        if s is None:
            return torch.is_grad_enabled()
        rule = solve_rule(s, self.training)
        return not (rule.residual == "released" or rule.scope == "position"
                    or (s.gradient != "phantom" and torch.is_grad_enabled()))

    def _timed(self, name: str):
        """The trainer's timer around a part of a training forward (evaluation is not timed)."""
        return self.timer(name) if self.timer is not None and self.training else contextlib.nullcontext()

    def weights_once(self, with_gradient: bool):
        """Every pass within the context reads each weight-normalised weight computed once, here.
        With gradient, not where a pass is recomputed in backward (activation checkpointing: the
        recomputation must compute the weight as the forward did) or where ZeRO-3 releases g and v
        after each layer's backward: there every read computes the weight again."""
        layers = self.weight_normed()
        if not layers or (with_gradient and (getattr(self.backbone, "checkpoint_layers", False)
                                             or self.graph_blocker is not None)):
            return contextlib.nullcontext()
        return weight_norm.reading(layers, weight_norm.compute(layers))

    def weight_normed(self) -> list[nn.Module]:
        """The backbone's weight-normalised layers, listed again only when weight norm was applied
        or removed somewhere since."""
        if self._normed is None or self._normed[0] != weight_norm.changes:
            self._normed = (weight_norm.changes, [layer for _, layer in weight_norm.weight_normed(self.backbone)])
        return self._normed[1]

    # ------------------------------------------------------------------ sequential mode (sequential.py)

    def forward_sequential(self, x: torch.Tensor, state=None, max_len: int | None = None,
                           mask: torch.Tensor | None = None, last: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, BackboneState, list[SolverStats]]:
        """x (B, T, d) one token at a time: see sequential.forward_sequential."""
        return sequential.forward_sequential(self, x, state, max_len, mask, last)

    def step(self, x_t: torch.Tensor, inj_t: torch.Tensor | None, state, real: torch.Tensor | None = None,
             start: torch.Tensor | None = None) -> tuple[torch.Tensor, object, SolverStats]:
        """One token under the committed `state`: see sequential.step."""
        return sequential.step(self, x_t, inj_t, state, real, start)
