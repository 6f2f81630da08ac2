"""ImplicitCore: the backbone self-iterated to a fixed point, in two modes.

Simultaneous mode (training, evaluation): every pass runs the whole sequence through F; the solver
finds z* without gradient, then, in training, `phantom_steps` damped passes carry the gradient: the
paper's (s+k). Evaluation returns the solver's z* itself, as the released code (torchdeq) does.
Sequential mode (generation): token by token, iterate z_t under the committed per-layer state of
t-1 until converged, then commit the state once. Memory is constant in the number of passes.

The explicit baseline goes through the same module: one pass from z^0 = embedding, no injection.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, fields, replace

import torch
from torch import nn

from implicit_megatron.config import AndersonSettings, ImplicitConfig
from implicit_megatron.implicit import graphs as graphs_lib
from implicit_megatron.implicit import weight_norm
from implicit_megatron.implicit.injection import Injection
from implicit_megatron.implicit.phantom import phantom_steps
from implicit_megatron.implicit.solver import SolverStats, relative_residual, released_solve, solve, solve_with
from implicit_megatron.implicit.token_solve import released_token, solve_token
from implicit_megatron.models.backbone import commit_state

logger = logging.getLogger(__name__)


WEIGHTS_GRAPH_KEY = ("norms",)  # the cache key of the weight-norm graph, which every solver graph reads
MAX_SHAPE_GRAPHS = 8  # graphs kept for input shapes before they are evicted


class _CaptureFailed(Exception):
    """A graph could not be captured; the forward is redone eagerly."""


def _shape(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


@dataclass
class SolverSettings:
    """The knobs of one (s+k) phase; a curriculum swaps them between phases."""

    max_iter: int = 4
    tol: float | None = None  # None: a bounded phase (exactly max_iter passes in training)
    phantom_steps: int = 1
    damping: float = 0.8
    eval_factor: int = 4
    gradient: str = "phantom"  # or "unrolled" / "unrolled_damped" (ImplicitConfig.gradient)
    anderson: AndersonSettings = field(default_factory=AndersonSettings)
    eval_tol: float | None = None  # where a bounded phase's evaluation stops; None: at its fixed depth
    eval_rule: str = "released"  # implicit.solver.released_solve at evaluation; "solver": the training solver
    eval_max_iter: int | None = None  # the evaluation cap; None: max_iter x eval_factor
    eval_stop: str = "token"  # simultaneous-mode evaluation: "token", "sequence" (each its own) or "batch" (one test)
    warm_start: bool = False  # sequential mode: token t's solve starts from token t-1's fixed point
    sequential_stop: str = "row"  # sequential mode: "row" (each its own) or "batch" (the released code's)

    @classmethod
    def from_config(cls, cfg: ImplicitConfig) -> SolverSettings:
        """Each field from the config's field of the same name (ImplicitConfig holds all of them)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})

    def stop_tol(self, training: bool) -> float | None:
        """The tolerance the solver stops at: the phase's own; a bounded phase's evaluation stops at
        eval_tol (the released (4+1) models are evaluated at 0.05), or never (fixed depth)."""
        return self.tol if training or self.tol is not None else self.eval_tol

    def cap(self, training: bool) -> int:
        """Passes allowed: max_iter in training; an evaluation that stops at a tolerance allows
        eval_max_iter or eval_factor x max_iter, a fixed-depth evaluation exactly max_iter."""
        if training or self.stop_tol(False) is None:
            return self.max_iter
        return self.eval_max_iter or self.max_iter * self.eval_factor

    def released_eval(self, training: bool) -> bool:
        return not training and self.eval_rule == "released"

    def per_sample(self, training: bool) -> bool:
        """Whether each sample stops on its own residual (evaluation with eval_stop="sequence")."""
        return not training and self.eval_stop == "sequence"

    def per_token(self, training: bool) -> bool:
        """Whether each position stops on its own residual (evaluation with eval_stop="token")."""
        return not training and self.eval_stop == "token"


class ImplicitCore(nn.Module):
    """x (B, T, d) = embedding -> z (B, T, d), the (normalised) fixed point of the backbone.

    Every pass reads each parametrised (weight-normalised) weight computed once per forward: once
    without gradient for the solve, once with it for the phantom steps. On a GPU the passes run as
    CUDA graphs (`cuda_graphs`: "auto" where possible, "on" or "off"); see implicit.graphs.
    """

    def __init__(self, backbone: nn.Module, settings: SolverSettings | None, injection: Injection | None,
                 group=None, cuda_graphs: str = "auto"):
        super().__init__()
        self.backbone = backbone
        self.injection = injection
        self.settings = settings  # None: the explicit model (one pass, no injection)
        self.group = group  # data-parallel process group the stop rule is agreed over (None: world)
        self.last_stats: SolverStats | None = None
        self.cuda_graphs = cuda_graphs
        self.graph_blocker: str | None = None  # set by whoever makes graphs impossible (ZeRO-3)
        self._graphs: dict[tuple, object] = {}
        self._unverified: set[tuple] = set()  # keys of graphs not yet checked against the eager passes
        self._addresses: graphs_lib.Addresses | None = None  # of the backbone, listed at the first graph
        self._graph_addresses: tuple[int, ...] | None = None
        self._normed: tuple[int, list[nn.Module]] | None = None  # (weight_norm.changes, the layers)
        self._pool = None  # the solver graphs' memory pool
        self._seen: dict[tuple, int] = {}  # forwards per input shape (graphs for recurring shapes only)
        self._logged: set[str] = set()
        self.timer = None  # name -> a context manager timing the solve and the phantom passes (train.timers)

    def _timed(self, name: str):
        """The trainer's timer around a part of a training forward (evaluation is not timed)."""
        return self.timer(name) if self.timer is not None and self.training else contextlib.nullcontext()

    @property
    def implicit(self) -> bool:
        return self.settings is not None

    def set_phase(self, **changes) -> None:
        """Switch solver settings, e.g. set_phase(max_iter=24, tol=0.05, phantom_steps=4)."""
        self.settings = replace(self.settings, **changes)
        self._graphs = {key: g for key, g in self._graphs.items() if key[0] != "grad"}  # the old phase's
        self._unverified = {key for key in self._unverified if key[0] != "grad"}
        # passes with gradient hold memory the new phase may need; the weights and solver graphs stay

    # ------------------------------------------------------------------ simultaneous mode

    def forward(self, x: torch.Tensor, seq_idx: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """`keep` (B, T) bool, false at padding (which seq_idx must hold in documents of its own, see
        models.padding): z is zero there in every pass, so padding never counts in a stop rule."""
        if keep is None and self._use_graphs(x, seq_idx):
            try:
                return self._graphed(x, seq_idx)
            except _CaptureFailed:
                pass  # logged; this and every later forward run eagerly
        return self._eager(x, seq_idx, keep)

    def _eager(self, x: torch.Tensor, seq_idx: torch.Tensor | None, keep: torch.Tensor | None = None) -> torch.Tensor:
        keep = None if keep is None else keep[..., None].to(x.dtype)
        if not self.implicit:
            z = self.backbone(x, None, seq_idx=seq_idx)
            return z if keep is None else z * keep
        inj = self.injection(x) if self.injection is not None else None
        s = self.settings

        def f(z: torch.Tensor) -> torch.Tensor:
            f_z = self.backbone(z, inj, seq_idx=seq_idx)
            return f_z if keep is None else f_z * keep

        z0 = torch.zeros_like(x)
        if s.gradient != "phantom" and torch.is_grad_enabled():
            return self._unrolled(f, z0, s.damping if s.gradient == "unrolled_damped" else 1.0)
        cap, tol = s.cap(self.training), s.stop_tol(self.training)
        with self._timed("solve"), torch.no_grad(), self._weights_once(with_gradient=False):
            per_sample, per_token = s.per_sample(self.training), s.per_token(self.training)
            if s.released_eval(self.training):  # the paper's evaluation
                z, self.last_stats = released_solve(f, z0, cap, tol, s.damping, self.group, per_sample=per_sample,
                                                    per_token=per_token)
                return z
            z_star, stats = solve(f, z0, cap, tol, s.anderson, self.group, per_sample, per_token)
        if not self._finish_solve(stats):  # evaluation returns the fixed point itself, as torchdeq does
            return z_star
        with self._timed("phantom"), self._weights_once(with_gradient=True):
            return phantom_steps(f, z_star, s.phantom_steps, s.damping)

    def _finish_solve(self, stats: SolverStats) -> bool:
        """Record the solve's statistics; True where phantom steps follow (training)."""
        s = self.settings
        if s.stop_tol(self.training) is None and s.eval_tol is not None:  # bounded: converged means below eval_tol
            stats.converged = stats.residual < s.eval_tol
        self.last_stats = stats
        if self.training:
            stats.phantom_passes = s.phantom_steps
        return self.training

    def _unrolled(self, f, z: torch.Tensor, damping: float) -> torch.Tensor:
        """Backpropagation through every one of max_iter passes: z = F(0), then z <- (1 - damping) z
        + damping F(z). Undamped, the weight-tied ablation; damped, the released warm-up."""
        s = self.settings
        for i in range(s.max_iter):
            f_z = f(z)
            residual = relative_residual(f_z.detach(), z.detach())
            z = f_z if i == 0 else (1 - damping) * z + damping * f_z
        converged = residual < s.tol if s.tol is not None else torch.ones_like(residual, dtype=torch.bool)
        self.last_stats = SolverStats(0, residual, converged, phantom_passes=s.max_iter)
        return z

    def _weights_once(self, with_gradient: bool):
        """Every pass within the context reads each weight-normalised weight computed once, here.
        With gradient, not where a pass is recomputed in backward (activation checkpointing: the
        recomputation must compute the weight as the forward did) or where ZeRO-3 releases g and v
        after each layer's backward: there every read computes the weight again."""
        layers = self._weight_normed()
        if not layers or (with_gradient and (getattr(self.backbone, "checkpoint_layers", False)
                                             or self.graph_blocker is not None)):
            return contextlib.nullcontext()
        return weight_norm.reading(layers, weight_norm.compute(layers))

    def _weight_normed(self) -> list[nn.Module]:
        """The backbone's weight-normalised layers, listed again only when weight norm was applied
        or removed somewhere since."""
        if self._normed is None or self._normed[0] != weight_norm.changes:
            self._normed = (weight_norm.changes, [layer for _, layer in weight_norm.weight_normed(self.backbone)])
        return self._normed[1]

    # ------------------------------------------------------------------ CUDA graphs

    def _graphed(self, x: torch.Tensor, seq_idx: torch.Tensor | None) -> torch.Tensor:
        """The forward with every pass replayed from a CUDA graph (see implicit.graphs). A graph's
        first use is checked against the eager passes on this forward's inputs (`_verify`)."""
        if not self.implicit:  # one pass with gradient from z0 = x
            return self._grad_graphs(x, None, seq_idx, 1, None)(x, None, seq_idx)
        norms = None
        if self._weight_normed():
            norms = self._captured(WEIGHTS_GRAPH_KEY, lambda: graphs_lib.NormGraphs(self.backbone))
            norms.refresh()
            self._verify(WEIGHTS_GRAPH_KEY, norms.verify, x.dtype)
        inj = self.injection(x) if self.injection is not None else None
        s = self.settings
        z0 = torch.zeros_like(x)
        key = ("solve", _shape(z0), _shape(inj), _shape(seq_idx))
        solver = self._captured(key, lambda: graphs_lib.SolverGraphs(self.backbone, norms, z0, inj, seq_idx,
                                                                     self._solver_pool()))
        with self._timed("solve"):
            solver.start(inj, seq_idx)
            z_star, stats = solve_with(solver.step, z0, s.cap(self.training), s.stop_tol(self.training),
                                       s.anderson, self.group, s.per_sample(self.training))
            z_star, stats.residual = z_star.clone(), stats.residual.clone()
        self._verify(key, lambda: solver.verify(z_star), x.dtype)
        if not self._finish_solve(stats):
            return z_star
        with self._timed("phantom"):
            if not torch.is_grad_enabled() or not s.phantom_steps:
                with norms.reading() if norms is not None else contextlib.nullcontext():
                    return phantom_steps(lambda z: self.backbone(z, inj, seq_idx=seq_idx), z_star,
                                         s.phantom_steps, s.damping)
            return self._grad_graphs(z_star, inj, seq_idx, s.phantom_steps, s.damping)(z_star, inj, seq_idx)

    def _verify(self, key: tuple, difference, dtype: torch.dtype) -> None:
        """Before the graphs of `key` count for the first time: their relative difference from the
        eager passes on this forward's inputs (`difference()`, see graphs.verify) must be within the
        dtype's tolerance. Otherwise "on" raises; "auto" says so once, with the figures, and the core
        runs eagerly from this forward on."""
        if key not in self._unverified:
            return
        gap, tolerance = difference(), graphs_lib.TOLERANCE.get(dtype, 1e-2)
        self._unverified.discard(key)
        if gap <= tolerance:
            return
        what = {"norms": "the weights' graph", "solve": "the solver's pass", "grad": "the passes with gradient"}[key[0]]
        message = (f"CUDA graphs differ from the eager passes: {what} by {gap:.2e} (relative; the tolerance for "
                   f"{str(dtype).removeprefix('torch.')} is {tolerance:.0e})")
        self._drop_graphs()
        if self.cuda_graphs == "on":
            raise RuntimeError(f"{message}; implicit.cuda_graphs=off runs the passes eagerly")
        self.cuda_graphs = "off"
        self._log_once(f"{message}; the passes run eagerly")
        raise _CaptureFailed(message)

    def _use_graphs(self, x: torch.Tensor, seq_idx: torch.Tensor | None) -> bool:
        """Graphs for this forward? Not for the released evaluation rule, the per-token stop and
        unrolled gradients (always eager), and only for shapes seen before: training batches recur every step, while a
        capture for each new length of an evaluation or generation would cost more than it saves."""
        if self.cuda_graphs == "off":
            return False
        reason = graphs_lib.why_not(x, self.backbone, self.graph_blocker)
        if reason is not None:
            if self.cuda_graphs == "on":
                raise RuntimeError(f"implicit.cuda_graphs=on, but {reason}")
            # Where there is no GPU at all, graphs are not missed: said at info level, not as a warning
            self._log_once(f"CUDA graphs off: {reason}; the passes run eagerly",
                           logging.INFO if x.device.type == "cpu" else logging.WARNING)
            return False
        s = self.settings
        if s is None:
            if not torch.is_grad_enabled():
                return False
        elif (s.released_eval(self.training) or s.per_token(self.training)  # these read z after each pass
              or (s.gradient != "phantom" and torch.is_grad_enabled())):
            return False
        seen = (_shape(x), _shape(seq_idx), torch.is_grad_enabled(), self.training)
        if len(self._seen) > 256:
            self._seen.clear()
        self._seen[seen] = self._seen.get(seen, 0) + 1
        if self._seen[seen] < 2:
            return False
        if self._addresses is None:
            self._addresses = graphs_lib.Addresses(self.backbone)
        addresses = self._addresses.read()
        if addresses != self._graph_addresses:
            if self._graph_addresses is not None:
                self._log_once("parameters or buffers moved to new memory: CUDA graphs re-captured")
            self._drop_graphs()
            self._graph_addresses = addresses
        return True

    def _captured(self, key: tuple, make):
        """The graphs for `key`, captured on first use. A failed capture frees every graph of this
        core; under "auto" it turns graphs off for the core with one log line, under "on" it raises.
        Beyond MAX_SHAPE_GRAPHS input shapes (evaluation at many lengths, say) the shapes' graphs are
        evicted, never the weights' graph: the solver graphs read its buffers, and a solver graph
        must not outlive, or be built on, the weights' graph it reads."""
        if key not in self._graphs:
            if len(self._graphs) >= MAX_SHAPE_GRAPHS and key != WEIGHTS_GRAPH_KEY:  # keep memory bounded
                self._graphs = {k: g for k, g in self._graphs.items() if k == WEIGHTS_GRAPH_KEY}
                self._unverified &= {WEIGHTS_GRAPH_KEY}
                self._pool = None
                torch.cuda.empty_cache()
            try:
                self._graphs[key] = make()
                self._unverified.add(key)
            except Exception as err:
                self._drop_graphs()
                if self.cuda_graphs == "on":
                    raise
                self.cuda_graphs = "off"
                self._log_once(f"CUDA graph capture failed ({type(err).__name__}: {err}); the passes run eagerly")
                raise _CaptureFailed from err
        return self._graphs[key]

    def _drop_graphs(self) -> None:
        self._graphs.clear()
        self._unverified.clear()
        self._pool = None
        torch.cuda.empty_cache()  # the graphs' pools go back to the device (a no-op where CUDA never started)

    def _solver_pool(self):
        """One memory pool for every shape's solver graph: nothing of theirs outlives a replay but
        their outputs, which stay allocated, so they may share memory."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _grad_graphs(self, z, inj, seq_idx, steps: int, damping: float | None) -> graphs_lib.GradGraphs:
        key = ("grad", _shape(z), z.requires_grad, _shape(inj), inj is not None and inj.requires_grad,
               _shape(seq_idx), steps, damping)
        graphs = self._captured(key, lambda: graphs_lib.GradGraphs(self.backbone, z, inj, seq_idx, steps, damping))
        self._verify(key, lambda: graphs.verify(z, inj, seq_idx), z.dtype)
        return graphs

    def _log_once(self, message: str, level: int = logging.WARNING) -> None:
        if message not in self._logged:
            self._logged.add(message)
            logger.log(level, message)

    # ------------------------------------------------------------------ sequential mode

    @torch.no_grad()
    def forward_sequential(self, x: torch.Tensor, state=None, max_len: int | None = None,
                           mask: torch.Tensor | None = None, last: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, object, list[SolverStats]]:
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
            state = self.backbone.allocate_state(batch, max_len or length, device=x.device, dtype=x.dtype)
        inj = self.injection(x) if self.implicit and self.injection is not None else None
        warm = self.implicit and self.settings.warm_start
        last = torch.zeros_like(x[:, 0]) if last is None else last
        outputs, stats = [], []
        for t in range(length):
            inj_t = inj[:, t] if inj is not None else None
            real = mask[:, t].to(x.device, torch.bool) if mask is not None else None
            z_t, state, token_stats = self.step(x[:, t], inj_t, state, real, start=last if warm else None)
            if real is not None:
                z_t = torch.where(real[:, None], z_t, last)
            outputs.append(z_t)
            stats.append(token_stats)
            last = z_t
        return torch.stack(outputs, dim=1), state, stats

    @torch.no_grad()
    def step(self, x_t: torch.Tensor, inj_t: torch.Tensor | None, state, real: torch.Tensor | None = None,
             start: torch.Tensor | None = None) -> tuple[torch.Tensor, object, SolverStats]:
        """One token: iterate under the committed `state`, then return (z_t, new committed state).

        Each row stops on its own residual (implicit.token_solve). `real` (B,) is false where the
        token is padding: that row is not iterated and keeps its state. `start` is the first iterate
        (warm start), zeros otherwise."""
        real = torch.ones(x_t.shape[0], dtype=torch.bool, device=x_t.device) if real is None else real
        if not self.implicit:
            z_t, candidate = self.backbone.step(x_t, state, None)
            stats = SolverStats(1, torch.zeros(x_t.shape[0]), torch.ones_like(real), row_passes=real.long())
            return z_t, commit_state(candidate, real, state), stats
        s = self.settings
        cap, tol = s.cap(self.training), s.stop_tol(self.training)
        z0 = torch.zeros_like(x_t) if start is None else start

        def step(z: torch.Tensor):
            return self.backbone.step(z, state, inj_t)

        batch_wide = s.sequential_stop == "batch"
        if s.released_eval(self.training):  # the released per-token rule; the state of the last pass
            z, candidate, stats = released_token(step, z0, real, cap, tol, s.damping, batch_wide)
        else:
            z, candidate, stats = solve_token(step, z0, real, cap, tol, batch_wide)
            if self.training and s.phantom_steps:  # as in simultaneous mode (no gradient here)
                for _ in range(s.phantom_steps):
                    f_z, candidate = step(z)
                    z = (1.0 - s.damping) * z + s.damping * f_z
                stats.phantom_passes = s.phantom_steps
        if candidate is None:  # every row was padding
            return z, state, stats
        return z, commit_state(candidate, real, state), stats
