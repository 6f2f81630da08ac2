"""CUDA graphs of the implicit core's passes: the host launches a whole pass with one call.

Eager PyTorch pays the host's cost of every kernel launch in every pass (mamba_ssm's fused Mamba2
layer alone takes about a millisecond of Python per call), and the solver repeats one pass with the
same shapes many times while the GPU waits for the host. A graph records a pass once and replays it.

- `SolverGraphs`: the passes without gradient. One graph computes every parametrised
  (weight-normalised) weight once per forward; another runs F from a static iterate and writes F(z)
  and its residual. The solver (`solve_with`) drives it as it drives eager passes, so a free phase
  takes exactly the passes the eager solver takes; the host reads one number per pass, the agreed
  residual of the stop rule.
- `GradGraphs`: the k passes with gradient (phantom steps, or the explicit model's one pass), each
  captured forward and backward by `torch.cuda.make_graphed_callables`. The weights enter as inputs
  (`Weights`), so weight normalisation runs once per forward and its backward once.

`why_not(...)` names the reason a graph cannot be used; the core then runs eagerly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parametrize

from implicit_megatron.implicit.solver import relative_residual


def why_not(x: torch.Tensor, backbone: nn.Module, blocker: str | None) -> str | None:
    """Why the passes on `x` cannot run as CUDA graphs, or None when they can."""
    if not x.is_cuda:
        return f"the tensors are on {x.device.type}"
    if blocker is not None:
        return blocker
    if getattr(backbone, "checkpoint_layers", False):
        return "activation checkpointing recomputes passes during backward"
    if torch.cuda.is_current_stream_capturing():
        return "a graph is already being captured"
    return None


Slot = tuple[nn.Module, str]  # a parametrised tensor: its module and name


def parametrised_slots(module: nn.Module) -> list[Slot]:
    """Every parametrised tensor (e.g. a weight-normalised weight) in the module."""
    return [(sub, tensor_name) for name, sub in module.named_modules()
            if "parametrizations" not in name.split(".") and parametrize.is_parametrized(sub)
            for tensor_name in sub.parametrizations]


def plain_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that are read as they are (not the originals g, v of a parametrisation)."""
    return {name: p for name, p in module.named_parameters() if "parametrizations" not in name.split(".")}


@dataclass
class Weights:
    """What one pass reads that carries gradient: each parametrised tensor computed once (with
    gradient to its originals) and the plain parameters, by name."""

    slots: list[Slot]
    normalised: list[torch.Tensor]
    plain_names: list[str]
    plain: list[nn.Parameter]

    @classmethod
    def of(cls, module: nn.Module) -> Weights:
        slots, plain = parametrised_slots(module), plain_parameters(module)
        return cls(slots, [getattr(m, name) for m, name in slots], list(plain), list(plain.values()))


@contextlib.contextmanager
def reading(slots: list[Slot], values) -> Iterator[None]:
    """Within the context each parametrised tensor reads the given value instead of being computed:
    torch's own parametrisation cache, filled in advance."""
    with parametrize.cached():
        for (module, name), value in zip(slots, values, strict=True):
            parametrize._cache[(id(module), name)] = value
        yield


def run_pass(backbone: nn.Module, weights: Weights, z: torch.Tensor, inj: torch.Tensor | None,
             seq_idx: torch.Tensor | None, normalised, plain) -> torch.Tensor:
    """F(z) reading the given tensors in place of the backbone's own: `normalised` for the
    parametrised tensors, `plain` for the other parameters (what `GradGraphs` captures)."""
    with reading(weights.slots, normalised):
        return functional_call(backbone, dict(zip(weights.plain_names, plain, strict=True)), (z, inj),
                               {"seq_idx": seq_idx})


def storage_key(module: nn.Module) -> tuple[int, ...]:
    """Where the parameters live: graphs read them by address, so a moved storage means re-capture."""
    return tuple(p.data_ptr() for p in module.parameters())


class SolverGraphs:
    """The no-grad passes for one input shape: `start` once per forward, then `step` per pass."""

    def __init__(self, backbone: nn.Module, z: torch.Tensor, inj: torch.Tensor | None,
                 seq_idx: torch.Tensor | None, pool) -> None:
        self.backbone = backbone
        self.z = z.detach().clone()
        self.inj = None if inj is None else inj.detach().clone()
        self.seq_idx = None if seq_idx is None else seq_idx.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad(), parametrize.cached():
            for _ in range(2):  # lazy initialisation and Triton autotuning stay out of the capture
                self._pass()
        torch.cuda.current_stream().wait_stream(side)
        slots = parametrised_slots(backbone)
        self.norm_graph = torch.cuda.CUDAGraph() if slots else None
        self.pass_graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), parametrize.cached():
            if slots:
                with torch.cuda.graph(self.norm_graph, pool=pool, capture_error_mode="thread_local"):
                    self.weights = [getattr(m, name) for m, name in slots]  # cached: the pass reads them
            with torch.cuda.graph(self.pass_graph, pool=pool, capture_error_mode="thread_local"):
                self.f_z, self.residual = self._pass()

    def _pass(self) -> tuple[torch.Tensor, torch.Tensor]:
        f_z = self.backbone(self.z, self.inj, seq_idx=self.seq_idx)
        return f_z, relative_residual(f_z, self.z)

    @torch.no_grad()
    def start(self, inj: torch.Tensor | None, seq_idx: torch.Tensor | None) -> None:
        """Take this forward's inputs and normalise the current weights."""
        if inj is not None:
            self.inj.copy_(inj)
        if seq_idx is not None:
            self.seq_idx.copy_(seq_idx)
        if self.norm_graph is not None:
            self.norm_graph.replay()

    def step(self, z: torch.Tensor, need_residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass: F(z) and its residual, in buffers the next step overwrites."""
        if z.data_ptr() != self.z.data_ptr():
            self.z.copy_(z)
        self.pass_graph.replay()
        return self.f_z, self.residual


class GradGraphs:
    """k passes with gradient for one input shape, replayed in order (forward 0..k-1, backward
    k-1..0), as `make_graphed_callables` requires of callables that share a memory pool.

    `z_grad[i]` says whether pass i's input carries gradient (the first phantom step starts from the
    detached fixed point; the explicit model's input is the embedding, which does). The weights are
    inputs, copied into the graphs' own buffers each pass (a few hundred MB at 1.3B parameters).
    """

    def __init__(self, backbone: nn.Module, z: torch.Tensor, inj: torch.Tensor | None,
                 seq_idx: torch.Tensor | None, weights: Weights, z_grad: list[bool]) -> None:
        n_extra, n_normalised = (inj is not None) + (seq_idx is not None), len(weights.slots)
        has_inj = inj is not None

        def one_pass(z, *rest):
            extra, normalised = rest[:n_extra], rest[n_extra:n_extra + n_normalised]
            inj_ = extra[0] if has_inj else None
            seq_ = extra[-1] if len(extra) > has_inj else None
            return run_pass(backbone, weights, z, inj_, seq_, normalised, rest[n_extra + n_normalised:])

        def copy(t: torch.Tensor) -> torch.Tensor:
            return t.detach().clone().requires_grad_(t.requires_grad)

        # Every graph input is a fresh tensor, parameters too: a parameter's gradient accumulator
        # may have been made on another stream (DeepSpeed holds them for its gradient hooks), and
        # the captured backward would then synchronise with that stream, which breaks the capture.
        shared = [*(copy(t) for t in (inj, seq_idx) if t is not None), *map(copy, weights.normalised),
                  *map(copy, weights.plain)]
        samples = tuple((z.detach().clone().requires_grad_(g), *shared) for g in z_grad)
        self.passes = torch.cuda.make_graphed_callables(tuple(one_pass for _ in z_grad), samples)

    def __call__(self, i: int, z: torch.Tensor, inj: torch.Tensor | None, seq_idx: torch.Tensor | None,
                 weights: Weights) -> torch.Tensor:
        extra = [t for t in (inj, seq_idx) if t is not None]
        return self.passes[i](z, *extra, *weights.normalised, *weights.plain)
