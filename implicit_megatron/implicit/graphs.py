"""CUDA graphs of the implicit core's passes: the host launches a whole pass with one call.

Eager PyTorch pays the host's cost of every kernel launch in every pass (mamba_ssm's fused Mamba2
layer alone takes about a millisecond of Python per call), and the solver repeats one pass with the
same shapes many times while the GPU waits for the host. A graph records a pass once and replays it.
A graph reads memory by address, so everything here is about which memory a graph reads:

- `NormGraphs`: every weight-normalised weight, computed from g and v by one graph into static
  buffers, once per forward, for the solver's passes (`weight_norm.reading`).
- `SolverGraphs`: the passes without gradient for one input shape: F from a static iterate to F(z)
  and its residual. The one iteration (`iteration.iterate`) drives it as it drives eager passes; the host reads
  one number per pass, the agreed residual of the stop rule.
- `GradGraphs`: the passes with gradient of one forward (the weights normalised once with
  gradient, then the k phantom steps, or the explicit model's one pass) as one forward graph and
  one backward graph.

Gradients leave the graphs as fresh tensors. A graph's gradient buffers are overwritten by the next
micro-batch's replay: a hook that keeps the gradient it is handed (DeepSpeed's gradient buckets,
until they are reduced), or a `p.grad` adopted from it, would turn into the next micro-batch's.
Every replay bumps a generation counter, and a backward whose forward's buffers were overwritten by
a later forward raises instead of returning another forward's gradient.

Graphs whose memory must survive between two replays (saved activations between forward and
backward, the static weights) get a memory pool of their own, which no other capture can reuse;
the solver graphs share one (only their outputs outlive a replay, and those stay allocated).
Parameters and buffers are read by address, so the core re-captures when any of them moves
(`Addresses`). `why_not(...)` names the reason a graph cannot be used; the core then runs
eagerly.

A graph that captured without error may still compute something else than the eager passes (an
operation a GPU's graphs get wrong, a stream not waited on): the first use of every graph is
checked against the eager passes on the same inputs (`verify`: the largest relative difference of
its outputs, and of the gradients for a random output gradient), and the core uses it only when
that difference is within its dtype's `TOLERANCE`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import cast

import torch
from torch import nn
from torch.func import functional_call

from implicit_megatron.implicit import weight_norm
from implicit_megatron.implicit.iteration import relative_residual
from implicit_megatron.implicit.phantom import phantom_steps

TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
GRAPH_DEVICE = "cuda"  # where graphs exist (tests emulate them on "cpu": tests/support/cuda_graph_emulation.py)


def difference(got: torch.Tensor | None, expected: torch.Tensor | None) -> float:
    """||got - expected|| / ||expected|| (a missing gradient counts as zeros; NaN counts as infinite)."""
    if got is None and expected is None:
        return 0.0
    got = torch.zeros_like(cast(torch.Tensor, expected)) if got is None else got  # not both None
    expected = torch.zeros_like(got) if expected is None else expected
    gap = (got.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)
    return float("inf") if not torch.isfinite(gap) else gap.item()


def why_not(x: torch.Tensor, backbone: nn.Module, blocker: str | None) -> str | None:
    """Why the passes on `x` cannot run as CUDA graphs, or None when they can."""
    if x.device.type != GRAPH_DEVICE:
        return f"the tensors are on {x.device.type}"
    if blocker is not None:
        return blocker
    if getattr(backbone, "checkpoint_layers", False):
        return "activation checkpointing recomputes passes during backward"
    if torch.cuda.is_current_stream_capturing():
        return "a graph is already being captured"
    return None


class Addresses:
    """Where every parameter and buffer of a module lives, as a replay relies on it: address, dtype,
    shape and strides. A graph reads them by address, so a moved, replaced or reshaped tensor (a new
    RoPE table, parameters re-allocated by an engine, weight norm applied or removed) means
    re-capture. The slots are listed again only when weight norm changed the module's structure
    (weight_norm.changes) or a slot is gone; reading them is a dictionary lookup each (a module walk
    per forward cost a millisecond of host time at 1.3B parameters)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._list()

    def _list(self) -> None:
        self.changes = weight_norm.changes
        self.slots = [(table, name) for m in self.module.modules() for table in (m._parameters, m._buffers)
                      for name in table]

    def read(self) -> tuple:
        if self.changes != weight_norm.changes:
            self._list()
        try:
            return tuple(_where(table[name]) for table, name in self.slots)
        except KeyError:  # a parameter or buffer was removed (a parametrisation moved it)
            self._list()
            return tuple(_where(table[name]) for table, name in self.slots)


def _where(t: torch.Tensor | None) -> tuple:
    return (-1,) if t is None else (t.data_ptr(), t.dtype, t.shape, t.stride())


@contextlib.contextmanager
def capture(graph, **kwargs):
    """torch.cuda.graph, leaving the caller on the stream it was on whatever happens. torch's context
    goes back to that stream only when capture_end succeeds: after a failed capture, every later
    kernel (the eager fallback's, the rest of the run's) would run on the graph's side stream."""
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    finally:
        torch.cuda.set_stream(stream)


def _warm_up(run: Callable[[], object]) -> None:
    """Lazy initialisation and Triton autotuning run outside the capture, on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)


class NormGraphs:
    """Every weight-normalised weight of the backbone, computed from g and v by one graph into
    static buffers (`values`) that the solver's passes read: `refresh()` once per forward."""

    def __init__(self, backbone: nn.Module) -> None:
        self.layers = [layer for _, layer in weight_norm.weight_normed(backbone)]
        with torch.no_grad():
            _warm_up(lambda: weight_norm.compute(self.layers))
            self.graph = torch.cuda.CUDAGraph()
            with capture(self.graph, pool=torch.cuda.graph_pool_handle()):
                self.values = weight_norm.compute(self.layers)

    def refresh(self) -> None:
        """Normalise the current g and v into `values`."""
        self.graph.replay()

    def reading(self):
        """Passes within the context read the static values as the weights."""
        return weight_norm.reading(self.layers, self.values)

    @torch.no_grad()
    def verify(self) -> float:
        """The largest relative difference between the refreshed values and the weights computed eagerly."""
        return max(difference(v, e) for v, e in zip(self.values, weight_norm.compute(self.layers), strict=True))


class SolverGraphs:
    """The no-grad pass for one input shape: `start` once per forward, then `step` per pass."""

    def __init__(self, backbone: nn.Module, norms: NormGraphs | None, z: torch.Tensor, inj: torch.Tensor | None,
                 seq_idx: torch.Tensor | None, pool) -> None:
        self.backbone, self.norms = backbone, norms
        self.z = z.detach().clone()
        self.inj = None if inj is None else inj.detach().clone()
        self.seq_idx = None if seq_idx is None else seq_idx.clone()
        with torch.no_grad():
            _warm_up(self._pass)
            self.graph = torch.cuda.CUDAGraph()
            with capture(self.graph, pool=pool, capture_error_mode="thread_local"):
                self.f_z, self.residual = self._pass()

    def _pass(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.norms.reading() if self.norms is not None else contextlib.nullcontext():
            f_z = self.backbone(self.z, self.inj, seq_idx=self.seq_idx)
        return f_z, relative_residual(f_z, self.z)

    @torch.no_grad()
    def start(self, inj: torch.Tensor | None, seq_idx: torch.Tensor | None) -> None:
        """Take this forward's inputs (the weights are the core's `NormGraphs.refresh`)."""
        if inj is not None:
            cast(torch.Tensor, self.inj).copy_(inj)  # captured with an injection
        if seq_idx is not None:
            cast(torch.Tensor, self.seq_idx).copy_(seq_idx)

    def step(self, z: torch.Tensor, need_residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass: F(z) and its residual, in buffers the next step overwrites."""
        if z.data_ptr() != self.z.data_ptr():
            self.z.copy_(z)
        self.graph.replay()
        return self.f_z, self.residual

    @torch.no_grad()
    def verify(self, z: torch.Tensor) -> float:
        """The largest relative difference between one replayed pass from `z` (this forward's inputs,
        taken by `start`) and the eager pass, which computes the weights itself."""
        f_z, residual = (t.clone() for t in self.step(z, True))
        expected = self.backbone(z, self.inj, seq_idx=self.seq_idx)
        return max(difference(f_z, expected), difference(residual, relative_residual(expected, z)))


class PassesWithGradient(nn.Module):
    """The passes with gradient as a module of the backbone's parameters: the weights normalised
    once (with gradient to g and v, as the eager phantom steps do), then `steps` damped passes from
    z, or (`damping` None) z <- F(z) once, the explicit model."""

    def __init__(self, backbone: nn.Module, steps: int, damping: float | None) -> None:
        super().__init__()
        self.backbone, self.steps, self.damping = backbone, steps, damping

    def forward(self, z: torch.Tensor, inj: torch.Tensor | None, seq_idx: torch.Tensor | None) -> torch.Tensor:
        def f(v: torch.Tensor) -> torch.Tensor:
            return self.backbone(v, inj, seq_idx=seq_idx)

        layers = [layer for _, layer in weight_norm.weight_normed(self.backbone)]
        with weight_norm.reading(layers, weight_norm.compute(layers)):
            return f(z) if self.damping is None else phantom_steps(f, z, self.steps, self.damping)


class GradGraphs:
    """The passes with gradient of one forward, for one input shape, as one forward graph and one
    backward graph in a memory pool of their own. What changes between forwards (z, the injection,
    seq_idx) is copied into static buffers; every parameter is read where it lives."""

    def __init__(self, backbone: nn.Module, z: torch.Tensor, inj: torch.Tensor | None,
                 seq_idx: torch.Tensor | None, steps: int, damping: float | None) -> None:
        self.backbone, self.steps, self.damping = backbone, steps, damping
        self.params = dict(backbone.named_parameters())
        self.z = z.detach().clone().requires_grad_(z.requires_grad)
        self.inj = None if inj is None else inj.detach().clone().requires_grad_(inj.requires_grad)
        self.seq_idx = None if seq_idx is None else seq_idx.clone()
        # Leaves of our own over the parameters' memory: a parameter's gradient accumulator may have
        # been made on another stream (DeepSpeed holds them for its hooks), and a captured backward
        # that synchronised with that stream would break the capture.
        aliases = {f"backbone.{name}": p.detach().requires_grad_(p.requires_grad) for name, p in self.params.items()}
        passes = PassesWithGradient(backbone, steps, damping)
        inputs = [self.z, self.inj, *aliases.values()]
        self.wants = [t is not None and t.requires_grad for t in inputs]
        needed = cast("list[torch.Tensor]", [t for t, want in zip(inputs, self.wants, strict=True) if want])

        def run() -> torch.Tensor:
            with torch.enable_grad():
                return functional_call(passes, aliases, (self.z, self.inj, self.seq_idx))

        _warm_up(lambda: torch.autograd.grad(run(), needed, torch.ones_like(self.z), allow_unused=True))
        self.pool = torch.cuda.graph_pool_handle()
        self.forward_graph, self.backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with capture(self.forward_graph, pool=self.pool):
            out = run()
        self.grad_out = torch.empty_like(out)
        with capture(self.backward_graph, pool=self.pool):
            grads = iter(torch.autograd.grad(out, needed, self.grad_out, allow_unused=True))
        self.grads = [next(grads) if want else None for want in self.wants]
        self.out = out.detach()  # the autograd graph goes; the saved activations stay in the pool
        self.generation = 0
        self.where = [_where(p) for p in self.params.values()]  # what the backward replay reads too

    def verify(self, z: torch.Tensor, inj: torch.Tensor | None, seq_idx: torch.Tensor | None) -> float:
        """The largest relative difference between the replayed output and gradients (for a random
        output gradient) and those of the eager passes on the same inputs. Autograd reaches the
        parameters through leaves of our own, so nothing is accumulated into `.grad`."""
        with torch.no_grad():
            for static, value in ((self.seq_idx, seq_idx), (self.z, z), (self.inj, inj)):
                if value is not None:
                    cast(torch.Tensor, static).copy_(value)
            self.forward_graph.replay()
            self.generation += 1  # a backward of an earlier forward can no longer be replayed
            out = self.out.clone()
            cotangent = torch.randn(out.shape, generator=torch.Generator(out.device).manual_seed(0),
                                    device=out.device, dtype=out.dtype)
            self.grad_out.copy_(cotangent)
            self.backward_graph.replay()
            grads = [None if g is None else g.clone() for g in self.grads]
        aliases = {f"backbone.{name}": p.detach().requires_grad_(p.requires_grad) for name, p in self.params.items()}
        inputs = [z.detach().requires_grad_(self.wants[0]),
                  None if inj is None else inj.detach().requires_grad_(self.wants[1]), *aliases.values()]
        with torch.enable_grad():
            expected = functional_call(PassesWithGradient(self.backbone, self.steps, self.damping), aliases,
                                       (inputs[0], inputs[1], seq_idx))
            needed = cast("list[torch.Tensor]", [t for t, want in zip(inputs, self.wants, strict=True) if want])
            expected_grads = iter(torch.autograd.grad(expected, needed, cotangent, allow_unused=True))
        gaps = [difference(out, expected.detach())]
        for got, want in zip(grads, self.wants, strict=True):
            if want:
                gaps.append(difference(got, next(expected_grads)))
        return max(gaps)

    def __call__(self, z: torch.Tensor, inj: torch.Tensor | None, seq_idx: torch.Tensor | None) -> torch.Tensor:
        """The passes' output for this forward, differentiable in z, inj and every parameter."""
        if seq_idx is not None:
            cast(torch.Tensor, self.seq_idx).copy_(seq_idx)
        return _Replayed.apply(self, z, inj, *self.params.values())


class _Replayed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graphs: GradGraphs, z: torch.Tensor, inj: torch.Tensor | None, *params: torch.Tensor):
        if z.data_ptr() != graphs.z.data_ptr():
            graphs.z.copy_(z)
        static_inj = cast(torch.Tensor, graphs.inj)  # read only where inj is given: captured with one
        if inj is not None and inj.data_ptr() != static_inj.data_ptr():
            static_inj.copy_(inj)
        graphs.forward_graph.replay()
        graphs.generation += 1
        ctx.graphs, ctx.generation = graphs, graphs.generation
        return graphs.out.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        graphs = ctx.graphs
        if ctx.generation != graphs.generation:
            raise RuntimeError("backward of a CUDA-graphed forward after a later forward replayed the same graph: "
                               "backpropagate each forward before the next, or set implicit.cuda_graphs=off")
        for (name, p), where in zip(graphs.params.items(), graphs.where, strict=True):
            if _where(p) != where:
                raise RuntimeError(f"parameter {name} moved to other memory (or changed dtype or shape) between "
                                   "the forward and the backward of a CUDA-graphed pass: its backward graph would "
                                   "read the old memory; set implicit.cuda_graphs=off for code that does this")
        graphs.grad_out.copy_(grad)
        graphs.backward_graph.replay()
        return (None, *(None if g is None else g.clone() for g in graphs.grads))
