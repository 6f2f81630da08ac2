"""The CUDA-graph runtime of the implicit core: which forwards replay graphs, and the graphs it keeps.

graphs.py says what a graph records and replays. This module keeps them for one core: which
forwards use graphs (recurring shapes only, on a device that has them), the captured graphs per
input shape and their eviction, the first use of every graph checked against the eager passes,
the parameters' addresses a replay relies on, and the solver graphs' shared memory pool.
`GraphedPasses` is one forward's passes through those graphs, with the interface of the core's
eager passes (`core.EagerPasses`), so that the method in core.py is written once for both.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from implicit_megatron.implicit import graphs as graphs_lib
from implicit_megatron.implicit.iteration import SolverStats, StopRule, iterate
from implicit_megatron.implicit.phantom import phantom_steps

logger = logging.getLogger(__name__)

WEIGHTS_GRAPH_KEY = ("norms",)  # the cache key of the weight-norm graph, which every solver graph reads
MAX_SHAPE_GRAPHS = 8  # graphs kept for input shapes before they are evicted


class CaptureFailed(Exception):
    """A graph could not be captured, or computes something else: the forward is redone eagerly."""


def _shape(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


class GraphRuntime:
    """The graphs of one core's backbone. `mode` is implicit.cuda_graphs: "auto" uses graphs where
    possible and falls back to eager passes, saying why once; "on" raises instead; "off" never
    captures. `blocker` names what makes graphs impossible (ZeRO-3), set by whoever knows it."""

    def __init__(self, backbone: nn.Module, mode: str = "auto") -> None:
        self.backbone = backbone
        self.mode = mode
        self.blocker: str | None = None
        self.cache: dict[tuple, object] = {}  # key (kind, shapes...) -> the captured graphs
        self._unverified: set[tuple] = set()  # keys of graphs not yet checked against the eager passes
        self._addresses: graphs_lib.Addresses | None = None  # of the backbone, listed at the first graph
        self._graph_addresses: tuple[int, ...] | None = None
        self._pool = None  # the solver graphs' memory pool
        self._seen: dict[tuple, int] = {}  # forwards per input shape (graphs for recurring shapes only)
        self._logged: set[str] = set()

    def passes_for(self, x: torch.Tensor, seq_idx: torch.Tensor | None, graphable: bool, training: bool,
                   weight_normed: bool) -> GraphedPasses | None:
        """This forward's graphed passes, or None where it runs eagerly: graphs off or impossible, a
        rule the core runs eagerly (`graphable` false), or a shape not seen before (training batches
        recur every step, while a capture for each new length of an evaluation or a generation
        would cost more than it saves)."""
        if self.mode == "off":
            return None
        reason = graphs_lib.why_not(x, self.backbone, self.blocker)
        if reason is not None:
            if self.mode == "on":
                raise RuntimeError(f"implicit.cuda_graphs=on, but {reason}")
            # Where there is no GPU at all, graphs are not missed: said at info level, not as a warning
            self.log_once(f"CUDA graphs off: {reason}; the passes run eagerly",
                          logging.INFO if x.device.type == "cpu" else logging.WARNING)
            return None
        if not graphable:
            return None
        seen = (_shape(x), _shape(seq_idx), torch.is_grad_enabled(), training)
        if len(self._seen) > 256:
            self._seen.clear()
        self._seen[seen] = self._seen.get(seen, 0) + 1
        if self._seen[seen] < 2:
            return None
        if self._addresses is None:
            self._addresses = graphs_lib.Addresses(self.backbone)
        addresses = self._addresses.read()
        if addresses != self._graph_addresses:
            if self._graph_addresses is not None:
                self.log_once("parameters or buffers moved to new memory: CUDA graphs re-captured")
            self.drop()
            self._graph_addresses = addresses
        return GraphedPasses(self, seq_idx, weight_normed)

    def phase_changed(self) -> None:
        """A new solver phase: the passes with gradient of the old one hold memory the new phase may
        need; the weights' and the solver's graphs stay."""
        self.cache = {key: g for key, g in self.cache.items() if key[0] != "grad"}
        self._unverified = {key for key in self._unverified if key[0] != "grad"}

    def captured(self, key: tuple, make):
        """The graphs for `key`, captured on first use. A failed capture frees every graph; under
        "auto" it turns graphs off with one log line, under "on" it raises. Beyond MAX_SHAPE_GRAPHS
        input shapes (evaluation at many lengths, say) the shapes' graphs are evicted, never the
        weights' graph: the solver graphs read its buffers, and a solver graph must not outlive,
        or be built on, the weights' graph it reads."""
        if key not in self.cache:
            if len(self.cache) >= MAX_SHAPE_GRAPHS and key != WEIGHTS_GRAPH_KEY:  # keep memory bounded
                self.cache = {k: g for k, g in self.cache.items() if k == WEIGHTS_GRAPH_KEY}
                self._unverified &= {WEIGHTS_GRAPH_KEY}
                self._pool = None
                torch.cuda.empty_cache()
            try:
                self.cache[key] = make()
                self._unverified.add(key)
            except Exception as err:
                self.drop()
                if self.mode == "on":
                    raise
                self.mode = "off"
                self.log_once(f"CUDA graph capture failed ({type(err).__name__}: {err}); the passes run eagerly")
                raise CaptureFailed from err
        return self.cache[key]

    def verify(self, key: tuple, difference, dtype: torch.dtype) -> None:
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
        self.drop()
        if self.mode == "on":
            raise RuntimeError(f"{message}; implicit.cuda_graphs=off runs the passes eagerly")
        self.mode = "off"
        self.log_once(f"{message}; the passes run eagerly")
        raise CaptureFailed(message)

    def drop(self) -> None:
        """Free every graph; their pools go back to the device (a no-op where CUDA never started)."""
        self.cache.clear()
        self._unverified.clear()
        self._pool = None
        torch.cuda.empty_cache()

    def solver_pool(self):
        """One memory pool for every shape's solver graph: nothing of theirs outlives a replay but
        their outputs, which stay allocated, so they may share memory."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def grad_graphs(self, z, inj, seq_idx, steps: int, damping: float | None) -> graphs_lib.GradGraphs:
        key = ("grad", _shape(z), z.requires_grad, _shape(inj), inj is not None and inj.requires_grad,
               _shape(seq_idx), steps, damping)
        graphs = self.captured(key, lambda: graphs_lib.GradGraphs(self.backbone, z, inj, seq_idx, steps, damping))
        self.verify(key, lambda: graphs.verify(z, inj, seq_idx), z.dtype)
        return graphs

    def log_once(self, message: str, level: int = logging.WARNING) -> None:
        if message not in self._logged:
            self._logged.add(message)
            logger.log(level, message)


class GraphedPasses:
    """One forward's passes replayed from the runtime's graphs: the weights normalised by one graph,
    the solver's passes by another, the passes with gradient as one forward and one backward graph."""

    def __init__(self, runtime: GraphRuntime, seq_idx: torch.Tensor | None, weight_normed: bool) -> None:
        self.runtime, self.seq_idx, self.weight_normed = runtime, seq_idx, weight_normed
        self.norms: graphs_lib.NormGraphs | None = None

    def explicit(self, x: torch.Tensor) -> torch.Tensor:
        """The explicit model: one pass with gradient from z0 = x."""
        return self.runtime.grad_graphs(x, None, self.seq_idx, 1, None)(x, None, self.seq_idx)

    def solve(self, z0: torch.Tensor, inj: torch.Tensor | None, rule: StopRule,
              group) -> tuple[torch.Tensor, SolverStats]:
        runtime = self.runtime
        if self.weight_normed:
            self.norms = runtime.captured(WEIGHTS_GRAPH_KEY, lambda: graphs_lib.NormGraphs(runtime.backbone))
            self.norms.refresh()
            runtime.verify(WEIGHTS_GRAPH_KEY, self.norms.verify, z0.dtype)
        key = ("solve", _shape(z0), _shape(inj), _shape(self.seq_idx))
        solver = runtime.captured(key, lambda: graphs_lib.SolverGraphs(runtime.backbone, self.norms, z0, inj,
                                                                       self.seq_idx, runtime.solver_pool()))
        solver.start(inj, self.seq_idx)
        with torch.no_grad():  # the graph computes each pass's residual itself
            solution = iterate(lambda z, need_residual: (*solver.step(z, need_residual), None), z0, rule, group=group)
        z_star, stats = solution.z.clone(), solution.stats  # out of the buffers a replay overwrites
        stats.residual = stats.residual.clone()
        runtime.verify(key, lambda: solver.verify(z_star), z0.dtype)
        return z_star, stats

    def phantom(self, z_star: torch.Tensor, inj: torch.Tensor | None, steps: int, damping: float) -> torch.Tensor:
        if not torch.is_grad_enabled() or not steps:
            with self.norms.reading() if self.norms is not None else contextlib.nullcontext():
                return phantom_steps(lambda z: self.runtime.backbone(z, inj, seq_idx=self.seq_idx), z_star,
                                     steps, damping)
        return self.runtime.grad_graphs(z_star, inj, self.seq_idx, steps, damping)(z_star, inj, self.seq_idx)
